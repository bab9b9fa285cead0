"""``tuner plan`` run as a real command: N JSON rows of exact argv, reproducible by seed, booting nothing.

Every run gets an empty ``TUNER_ENGINES_DIR`` (no engine environment, so nothing is even probed) and its
own ``TUNER_CACHE`` (the default models are named there, never generated).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytest

from tests.unit.study_files import H100_STUDY
from tuner.engines import ADAPTERS
from tuner.engines.base import Config, Device
from tuner.engines.models import default_model_paths
from tuner.search.space import load_space

REPO = Path(__file__).resolve().parents[3]
ROW_KEYS = {"engine", "engine_version", "kind", "params", "argv", "env"}
PLAN_DEADLINE_S = 30.0

# Runs ``python -m tuner ARGS`` with every way of starting a process replaced by one that exits 97.
NO_PROCESS_WRAPPER = """\
import os, runpy, subprocess, sys

def _refuse(*args, **kwargs):
    sys.stderr.write(f"PROCESS STARTED: {args[:1]!r}\\n")
    sys.stderr.flush()
    os._exit(97)

subprocess.Popen = _refuse
for name in ("system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve",
             "execvp", "execvpe", "spawnv", "spawnve", "spawnvp", "spawnvpe"):
    if hasattr(os, name):
        setattr(os, name, _refuse)
sys.path.insert(0, os.getcwd())
sys.argv = ["tuner", *sys.argv[1:]]
runpy.run_module("tuner", run_name="__main__", alter_sys=True)
"""


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float

    def rows(self) -> list[dict[str, Any]]:
        rows = [json.loads(line) for line in self.stdout.splitlines()]
        assert all(isinstance(r, dict) for r in rows)
        return rows


@dataclass(frozen=True)
class Dirs:
    engines: Path
    cache: Path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> Dirs:
    root = tmp_path_factory.mktemp("plan")
    engines, cache = root / "engines", root / "cache"
    engines.mkdir()
    return Dirs(engines, cache)


def _env(dirs: Dirs) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    env["TUNER_ENGINES_DIR"] = str(dirs.engines)
    env["TUNER_CACHE"] = str(dirs.cache)
    return env


def _plan(dirs: Dirs, *args: str, wrapper: Path | None = None) -> Run:
    head = [sys.executable, str(wrapper)] if wrapper is not None else [sys.executable, "-m", "tuner"]
    started = time.monotonic()
    done = subprocess.run(
        [*head, "plan", *args], cwd=REPO, env=_env(dirs), capture_output=True, text=True, timeout=120, check=False
    )
    return Run(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def _value(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, f"{flag} appears {argv.count(flag)} times in {argv}"
    return argv[argv.index(flag) + 1]


def _newest(versions: tuple[str, ...]) -> str:
    return max(versions, key=lambda v: tuple(int(part) for part in v.split(".")))


@pytest.fixture(scope="module")
def seed3(dirs: Dirs) -> Run:
    return _plan(dirs, "--workload", "rag", "--n", "20", "--seed", "3")


# --- the rows ------------------------------------------------------------------------------------


def test_plan_prints_one_json_row_per_trial(seed3: Run) -> None:
    assert seed3.returncode == 0, seed3.stderr
    assert len(seed3.stdout.splitlines()) == 20
    for row in seed3.rows():
        assert set(row) == ROW_KEYS
        assert row["engine"] in ADAPTERS
        assert isinstance(row["params"], dict)
        assert isinstance(row["env"], dict)
        assert isinstance(row["argv"], list) and all(isinstance(a, str) for a in row["argv"])


def test_what_an_engine_or_the_model_cannot_run_is_left_out_with_one_line_each(seed3: Run) -> None:
    """The default space lists every method; the generated target ships no MTP layers and SGLang has
    no suffix decoding (no environment here, so no package is known to be missing)."""
    vllm, sglang = (f"{e} {_newest(ADAPTERS[e].supported_versions)}" for e in ("vllm", "sglang"))
    lines = seed3.stderr.splitlines()
    assert sorted(line.split(" left out of its space: ")[0] for line in lines) == sorted(
        [f"{vllm}: MTP", f"{sglang}: MTP", f"{sglang}: suffix decoding"]
    ), seed3.stderr
    assert all("ships no MTP layers" in line for line in lines if ": MTP " in line)
    assert f"{sglang}: suffix decoding left out of its space: sglang has no suffix decoding" in lines
    methods = {(r["engine"], r["params"].get("spec_method")) for r in seed3.rows()}
    assert ("sglang", "suffix") not in methods and not any(m == "mtp" for _, m in methods)


def test_another_supported_version_is_planned_on_request(dirs: Dirs) -> None:
    older = ADAPTERS["vllm"].supported_versions[0]
    run = _plan(dirs, "--workload", "rag", "--engines", "vllm", "--engine-version", f"vllm={older}", "--n", "3")
    assert run.returncode == 0, run.stderr
    assert {r["engine_version"] for r in run.rows()} == {older}
    assert f"vllm {older}: MTP left out of its space" in run.stderr
    refused = _plan(dirs, "--workload", "rag", "--engine-version", "vllm=0.1", "--n", "3")
    assert refused.returncode == 2 and refused.stderr.startswith("tuner: --engine-version vllm=0.1: ")


DRAFTING_SPACE = """
engines: [vllm]
parameters:
  chunk_size: {choices: [128, 4096]}
  spec_method: {choices: [draft_model]}
  num_speculative_tokens: {choices: [2]}
  draft_model: {choices: [draft-1l]}
"""


@pytest.mark.parametrize(("version", "refused"), [("0.26.0", True), ("0.32.0", False)])
def test_a_config_the_engines_validation_refuses_is_left_out_with_one_line(
    dirs: Dirs, tmp_path: Path, version: str, refused: bool
) -> None:
    """vLLM 0.26 reserves a draft model's slot for each of its default sequences, which it caps at the
    chunk: chunk 128 leaves none to schedule on any GPU; 0.32 reserves it once. N rows all the same."""
    space = tmp_path / "space.yaml"
    space.write_text(DRAFTING_SPACE)
    run = _plan(dirs, "--workload", "rag", "--space", str(space), "--engine-version", f"vllm={version}", "--n", "6")
    assert run.returncode == 0, run.stderr
    chunks = [r["params"]["chunk_size"] for r in run.rows()]
    assert len(chunks) == 6 and 4096 in chunks
    assert (128 not in chunks) is refused
    left_out = [line for line in run.stderr.splitlines() if f"vllm {version}: left out " in line]
    assert bool(left_out) is refused, run.stderr
    assert all('"chunk_size": 128' in line and "leaving none to schedule" in line for line in left_out)


H200_SPACE = """
engines: [vllm]
parameters:
  chunk_size: {choices: [1024, 8192]}
  spec_method: {choices: [draft_model]}
  num_speculative_tokens: {choices: [1]}
  draft_model: {choices: [draft-1l]}
"""


def test_a_gpu_of_another_machine_is_planned_by_its_memory(dirs: Dirs, tmp_path: Path) -> None:
    """vLLM 0.26 gives a GPU of 70 GiB or more (an A100 apart) 1024 default sequences, and reserves a
    draft slot for each: chunk 1024 leaves none to schedule on an H200, while on a GPU of unknown
    memory (the smallest defaults, 256 sequences) it is planned. The name reaches the engine's rule."""
    space = tmp_path / "space.yaml"
    space.write_text(H200_SPACE)
    base = ("--workload", "rag", "--space", str(space), "--engine-version", "vllm=0.26.0", "--n", "6")
    h200 = _plan(dirs, *base, "--gpu-memory", "140.4", "--gpu-name", "NVIDIA H200")
    unknown = _plan(dirs, *base)
    a100 = _plan(dirs, *base, "--gpu-memory", "80", "--gpu-name", "NVIDIA A100-SXM4-80GB")
    for run in (h200, unknown, a100):
        assert run.returncode == 0, run.stderr
    assert {r["params"]["chunk_size"] for r in h200.rows()} == {8192}
    assert "reserves 1 draft slot(s) for each of 1024 sequences out of 1024 batched tokens" in h200.stderr
    assert {r["params"]["chunk_size"] for r in unknown.rows()} == {1024, 8192}, unknown.stderr
    assert {r["params"]["chunk_size"] for r in a100.rows()} == {1024, 8192}, a100.stderr
    alone = _plan(dirs, *base, "--gpu-name", "NVIDIA H200")
    assert alone.returncode == 2 and alone.stderr.startswith("tuner: --gpu-name: "), alone.stderr
    zero = _plan(dirs, *base, "--gpu-memory", "0")
    assert zero.returncode == 2 and "--gpu-memory" in zero.stderr, zero.stderr


def test_both_engines_are_planned_without_a_gpu(seed3: Run) -> None:
    """SGLang needs a GPU to run, not to be planned: plan shows its commands on any machine."""
    assert {row["engine"] for row in seed3.rows()} == {"vllm", "sglang"}


def test_argv_runs_the_engine_module(seed3: Run) -> None:
    for row in seed3.rows():
        adapter = ADAPTERS[row["engine"]]
        assert row["argv"][1:3] == ["-m", adapter.module]
        # no engine environment here: the plan names plain python3 and the newest supported version
        assert row["argv"][0] == "python3"
        assert row["engine_version"] == _newest(adapter.supported_versions)


def test_argv_is_the_adapters_command_for_the_printed_params(
    seed3: Run, dirs: Dirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNER_CACHE", str(dirs.cache))
    space = load_space(None)
    model = default_model_paths(space.static.max_model_len)
    gpu = Device("cuda", "planned", 0)
    speculating = 0
    for row in seed3.rows():
        adapter = ADAPTERS[row["engine"]]()
        config = Config(row["engine"], row["params"], enforce_eager=space.static.enforce_eager)
        launch = adapter.launch(config, model, gpu, adapter.default_port, "python3", row["engine_version"])
        assert row["argv"] == list(launch.argv)
        assert row["env"] == launch.run_env
        speculating += int(row["params"].get("num_speculative_tokens", 0) > 0)
    assert 0 < speculating < 20, "the space samples speculation both on and off"


def test_plan_boots_nothing_and_generates_nothing(seed3: Run, dirs: Dirs) -> None:
    assert seed3.wall_s < PLAN_DEADLINE_S
    for row in seed3.rows():
        assert _value(row["argv"], "--port") == str(ADAPTERS[row["engine"]].default_port)
        model_flag = "--model-path" if row["engine"] == "sglang" else "--model"
        # the default models are named where they would be generated, and left ungenerated
        assert Path(_value(row["argv"], model_flag)).is_relative_to(dirs.cache)
    assert not dirs.cache.exists() or list(dirs.cache.rglob("*")) == []


def test_plan_starts_no_process(dirs: Dirs, tmp_path: Path) -> None:
    wrapper = tmp_path / "no_process.py"
    wrapper.write_text(NO_PROCESS_WRAPPER)
    run = _plan(dirs, "--workload", "rag", "--n", "6", "--seed", "1", wrapper=wrapper)
    assert "PROCESS STARTED" not in run.stderr
    assert run.returncode == 0, run.stderr
    assert len(run.rows()) == 6


def test_the_wrapper_does_catch_a_started_process(dirs: Dirs, tmp_path: Path) -> None:
    """The check above can fail: with an engine environment to probe, the wrapper sees the probe start."""
    fake = tmp_path / "engines" / "vllm" / "bin"
    fake.mkdir(parents=True)
    (fake / "python").symlink_to(sys.executable)
    wrapper = tmp_path / "no_process.py"
    wrapper.write_text(NO_PROCESS_WRAPPER)
    run = _plan(Dirs(tmp_path / "engines", dirs.cache), "--workload", "rag", "--n", "1", wrapper=wrapper)
    assert run.returncode == 97
    assert "PROCESS STARTED" in run.stderr


# --- reproducibility and engine choice -----------------------------------------------------------


def test_same_seed_same_plan_other_seed_other_plan(seed3: Run, dirs: Dirs) -> None:
    again = _plan(dirs, "--workload", "rag", "--n", "20", "--seed", "3")
    assert again.returncode == 0
    assert again.stdout == seed3.stdout
    other = _plan(dirs, "--workload", "rag", "--n", "20", "--seed", "4")
    assert other.returncode == 0
    assert len(other.rows()) == 20
    assert other.stdout != seed3.stdout
    assert [r["params"] for r in other.rows()] != [r["params"] for r in seed3.rows()]


def test_engines_sglang_plans_only_sglang(dirs: Dirs) -> None:
    run = _plan(dirs, "--workload", "rag", "--engines", "sglang", "--n", "8", "--seed", "3")
    assert run.returncode == 0, run.stderr
    rows = run.rows()
    assert len(rows) == 8
    assert {r["engine"] for r in rows} == {"sglang"}
    assert all(r["argv"][1:3] == ["-m", ADAPTERS["sglang"].module] for r in rows)


def test_the_spaces_enqueued_configs_come_first_marked_and_those_of_engines_left_out_with_a_line(
    dirs: Dirs,
) -> None:
    """The GPU space enqueues three vLLM configs and one SGLang config: a search boots them right after
    the engine defaults, so the plan shows them first, then the N sampled ones."""
    space = str(REPO / "search_spaces" / "gpu-h200.yaml")
    run = _plan(dirs, "--workload", "rag", "--space", space, "--n", "3", "--seed", "3")
    assert run.returncode == 0, run.stderr
    rows = run.rows()
    assert [r["kind"] for r in rows] == ["enqueued"] * 4 + ["sampled"] * 3
    assert rows[0]["engine"] == "vllm" and rows[0]["params"] == {
        "chunk_size": 2048, "memory_fraction": 0.9, "spec_method": "draft_model", "num_speculative_tokens": 3,
        "draft_model": "draft-2l"}, "static: no schedule, vLLM's fixed K"  # fmt: skip
    assert rows[2]["params"] == {"chunk_size": 1024, "memory_fraction": 0.9, "spec_method": "off"}
    assert rows[3]["engine"] == "sglang" and rows[3]["params"]["spec_tree"] == [1, 2]
    only = _plan(dirs, "--workload", "rag", "--space", space, "--engines", "sglang", "--n", "1", "--seed", "3")
    assert only.returncode == 0, only.stderr
    assert [(r["engine"], r["kind"]) for r in only.rows()] == [("sglang", "enqueued"), ("sglang", "sampled")]
    left_out = [line for line in only.stderr.splitlines() if "not among this run's engines" in line]
    assert [line.split(" ")[0] for line in left_out] == ["enqueue.0", "enqueue.1", "enqueue.2"]


def test_with_a_study_what_its_trials_tell_without_a_boot_is_left_out_with_a_line(dirs: Dirs, tmp_path: Path) -> None:
    """A study holding the H100 study's trial 3 (vLLM, the generated EAGLE-3 head, which accepted next to
    nothing) and trial 2 (vLLM, ``draft-2l``, which accepted most): a search of it would not boot vLLM
    with that head again (``tuner.search.learned``), so the plan leaves out the enqueued head config and
    every sampled one, each with a line, and keeps the draft's. The study has no capacity plan, so
    nothing is fitted: the rows are the plan without a study less the head's."""
    source = optuna.load_study(study_name="rag-h100-study-1", storage=f"sqlite:///{H100_STUDY}")
    storage = f"sqlite:///{tmp_path / 'learned.db'}"
    study = optuna.create_study(study_name="learned", storage=storage, directions=source.directions)
    study.add_trial(source.trials[3])
    study.add_trial(source.trials[2])
    space = str(REPO / "search_spaces" / "gpu-h200.yaml")
    base = ("--workload", "rag", "--space", space, "--engines", "vllm", "--n", "8", "--seed", "2")

    def head(row: dict[str, Any]) -> bool:
        return row["params"].get("draft_model") == "eagle3-head"

    alone, told = _plan(dirs, *base), _plan(dirs, *base, "--study", "learned", "--storage", storage)
    assert alone.returncode == 0 and told.returncode == 0, (alone.stderr, told.stderr)
    plain = alone.rows()
    assert head(plain[1]) and plain[1]["kind"] == "enqueued"
    assert any(head(r) for r in plain if r["kind"] == "sampled"), "seed 2 samples the head: the test can fail"
    rows = told.rows()
    assert not any(head(r) for r in rows) and len(rows) == len(plain) - 1  # the 8 sampled are drawn again
    assert [r["params"] for r in rows if r["kind"] == "enqueued"] == [plain[0]["params"], plain[2]["params"]]
    assert any(r["params"].get("draft_model") == "draft-2l" for r in rows if r["kind"] == "sampled")
    left_out = [line for line in told.stderr.splitlines() if "the study would not boot it" in line]
    assert len(left_out) == sum(head(r) for r in plain), told.stderr
    assert all('"eagle3-head"' in line and "in trial 0, too little to repay" in line for line in left_out)


# --- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--workload", "rag", "--engines", "tgi"], "tgi"),
        (["--workload", "rag", "--engines", "vllm,tgi"], "tgi"),
        (["--workload", "rag", "--n", "0"], "--n"),
        (["--workload", "rag", "--n", "-2"], "--n"),
        (["--workload", "nope"], "nope"),
        (["--n", "3"], "--workload"),
    ],
)
def test_refusals_are_exit_2_with_one_line(dirs: Dirs, args: list[str], named: str) -> None:
    run = _plan(dirs, *args)
    assert run.returncode == 2
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("tuner: ")
    assert named in lines[0]

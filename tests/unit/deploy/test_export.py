"""Launch files: render_sh / read_sh round trips, shell safety checked by running bash, trial selection."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest

from tuner.deploy.export import manifest, safe_stem, select_trials
from tuner.deploy.formats import engine_args, read_sh, render_sh
from tuner.engines.base import Config, Device, ModelSpec
from tuner.engines.vllm import VllmAdapter
from tuner.errors import ExportError
from tuner.measure.trial import TrialResult
from tuner.search.objective import record
from tuner.search.scoring import DIRECTIONS
from tuner.study.attrs import bind_study_attrs

BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="bash is not installed")

DEVICE = Device("cuda", "NVIDIA H200", 150_754_820_096)
PYTHON = "/envs/vllm/bin/python"
INJECTION = '/models/x"; touch pwned; "y'
SPEC_PARAMS = {
    "chunk_size": 1024,
    "max_num_seqs": 8,
    "memory_fraction": 0.85,
    "num_speculative_tokens": 3,
    "draft_model": "draft-2l",
}


def _study(model_path: str) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="export-test", directions=DIRECTIONS)
    bind_study_attrs(
        study,
        {
            "workload": "rag",
            "workload_digest": "d" * 64,
            "model": model_path,
            "drafts": {},
            "hardware": {"kind": DEVICE.kind, "name": DEVICE.name, "memory_bytes": DEVICE.memory_bytes},
            "engines": {"vllm": {"distribution": "vllm", "version": "0.32.0"}},
        },
    )
    return study


def _add_trial(
    study: optuna.Study,
    model: ModelSpec,
    params: dict[str, Any],
    *,
    python: str = PYTHON,
    failure: str | None = None,
    error_rate: float = 0.0,
) -> optuna.trial.FrozenTrial:
    trial = study.ask()
    config = Config(engine="vllm", params=params)
    launch = VllmAdapter().launch(config, model, DEVICE, 43210, python, "0.32.0")
    metrics = {"ttft_p95_ms": 120.0, "output_throughput_tok_s": 75.0, "error_rate": error_rate}
    result = TrialResult(config=config, launch=launch, engine_version="0.32.0", failure=failure, metrics=metrics)
    study.tell(trial, list(record(trial, result, "pareto")))
    return study.get_trials(deepcopy=False)[trial.number]


def _manifest_for(model_path: str, params: dict[str, Any], python: str = PYTHON) -> dict[str, Any]:
    model = ModelSpec(path=model_path, drafts={"draft-2l": model_path + "/../draft two"}, max_model_len=2048)
    study = _study(model_path)
    ft = _add_trial(study, model, params, python=python)
    return manifest(study, ft)


def _fake_python(folder: Path) -> Path:
    """An executable that writes its arguments as JSON to $ARGV_OUT, standing in for the engine's python."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "python"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "with open(os.environ['ARGV_OUT'], 'w') as fh:\n"
        "    json.dump(sys.argv[1:], fh)\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _run_script(
    tmp_path: Path, text: str, *, engine_python: Path | None, extra_env: dict[str, str] | None = None
) -> list[str]:
    """Run the launch file with bash in ``tmp_path``; return the argv the (fake) python received."""
    assert BASH is not None
    script = tmp_path / "launch.sh"
    script.write_text(text)
    out = tmp_path / "argv.json"
    env = {k: v for k, v in os.environ.items() if k not in ("ENGINE_PYTHON", "HOST", "PORT")}
    env["ARGV_OUT"] = str(out)
    if engine_python is not None:
        env["ENGINE_PYTHON"] = str(engine_python)
    env.update(extra_env or {})
    done = subprocess.run([BASH, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    received = json.loads(out.read_text())
    assert isinstance(received, list)
    return [str(a) for a in received]


# --- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model_path",
    ["/models/target", '/models/my model\'s "v2"', INJECTION, "/models/$HOME `id` $(id) \\ *", "/models/tab\there"],
)
def test_render_read_round_trip(model_path: str) -> None:
    m = _manifest_for(model_path, SPEC_PARAMS)
    assert "--model" in m["argv"] and m["argv"][m["argv"].index("--model") + 1] == model_path
    module, args = read_sh(render_sh(m))
    assert module == m["module"] == VllmAdapter.module
    assert args == m["argv"]


def test_manifest_argv_has_no_address_but_keeps_the_rest() -> None:
    m = _manifest_for("/models/target", SPEC_PARAMS)
    assert "--host" not in m["argv"] and "--port" not in m["argv"]
    assert m["python"] == PYTHON
    assert m["argv"][m["argv"].index("--max-num-batched-tokens") + 1] == "1024"


def test_manifest_reads_the_stored_launch_and_no_trial_only_environment() -> None:
    m = _manifest_for("/models/target", SPEC_PARAMS)
    assert "VLLM_SERVER_DEV_MODE" not in json.dumps(m), "trial-only environment never reaches an export"


def test_a_trial_of_an_older_tuner_with_only_an_argv_is_refused_in_one_line() -> None:
    study = _study("/models/target")
    trial = study.ask()
    trial.set_user_attr("engine", "vllm")
    trial.set_user_attr("constraint_violation", 0.0)
    trial.set_user_attr("argv", [PYTHON, "-m", VllmAdapter.module, "--model", "/m", "--host", "h", "--port", "1"])
    study.tell(trial, [100.0, 50.0])
    with pytest.raises(ExportError, match="older tuner") as err:
        manifest(study, study.get_trials(deepcopy=False)[trial.number])
    assert "\n" not in str(err.value)


def test_speculative_config_stays_one_argument() -> None:
    m = _manifest_for("/models/target dir", SPEC_PARAMS)
    _, args = read_sh(render_sh(m))
    value = args[args.index("--speculative-config") + 1]
    assert json.loads(value) == {
        "model": "/models/target dir/../draft two",
        "num_speculative_tokens": 3,
        "method": "draft_model",
    }


def test_read_sh_refuses_a_file_without_exec() -> None:
    with pytest.raises(ExportError):
        read_sh("#!/usr/bin/env bash\necho hello\n")


# --- running the launch file ---------------------------------------------------------------------


@needs_bash
@pytest.mark.parametrize("model_path", [INJECTION, "/models/a b'c\"d", "/models/$(touch pwned)`touch pwned`"])
def test_launch_file_is_valid_bash_and_runs_the_manifest_argv(tmp_path: Path, model_path: str) -> None:
    m = _manifest_for(model_path, SPEC_PARAMS)
    text = render_sh(m)
    assert BASH is not None
    exec_statement = text[text.index('exec "$ENGINE_PYTHON"') :]
    assert exec_statement.count("\nexec ") == 0, "one exec statement, at the end"
    for source in (text, exec_statement):
        syntax = subprocess.run([BASH, "-n"], input=source, capture_output=True, text=True, timeout=30)
        assert syntax.returncode == 0, syntax.stderr

    received = _run_script(tmp_path, text, engine_python=_fake_python(tmp_path / "bin"))
    assert received == ["-m", m["module"], *m["argv"], "--host", "127.0.0.1", "--port", "8000"]
    assert received[received.index("--model") + 1] == model_path
    assert json.loads(received[received.index("--speculative-config") + 1])["num_speculative_tokens"] == 3
    assert not (tmp_path / "pwned").exists()


@needs_bash
def test_launch_file_host_and_port_overrides(tmp_path: Path) -> None:
    m = _manifest_for("/models/target", {"max_num_seqs": 2})
    received = _run_script(
        tmp_path,
        render_sh(m),
        engine_python=_fake_python(tmp_path / "bin"),
        extra_env={"HOST": "0.0.0.0", "PORT": "9123"},
    )
    assert received[-4:] == ["--host", "0.0.0.0", "--port", "9123"]
    assert received.count("--port") == 1 and received.count("--host") == 1


@needs_bash
def test_default_interpreter_path_with_shell_characters(tmp_path: Path) -> None:
    """Without ENGINE_PYTHON the recorded interpreter runs, even when its path holds quotes and $()."""
    python = _fake_python(tmp_path / "venv }$(touch pwned) 'q'\" x" / "bin")
    m = _manifest_for(INJECTION, SPEC_PARAMS, python=str(python))
    assert m["python"] == str(python)
    received = _run_script(tmp_path, render_sh(m), engine_python=None)
    assert received == ["-m", m["module"], *m["argv"], "--host", "127.0.0.1", "--port", "8000"]
    assert not (tmp_path / "pwned").exists()


@needs_bash
def test_newline_in_model_path_cannot_run_a_command(tmp_path: Path) -> None:
    model_path = "/models/x\ntouch pwned\n"
    m = _manifest_for(model_path, {"max_num_seqs": 2})
    received = _run_script(tmp_path, render_sh(m), engine_python=_fake_python(tmp_path / "bin"))
    assert not (tmp_path / "pwned").exists()
    assert received[received.index("--model") + 1] == model_path


# --- helpers -------------------------------------------------------------------------------------


def test_engine_args_drops_host_and_port() -> None:
    argv = [
        PYTHON,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/m",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--max-num-seqs",
        "4",
        "--enforce-eager",
    ]
    module, args = engine_args(argv)
    assert module == "vllm.entrypoints.openai.api_server"
    assert args == ["--model", "/m", "--max-num-seqs", "4", "--enforce-eager"]


def test_engine_args_on_a_real_launch() -> None:
    spec = VllmAdapter().launch(Config("vllm", {"max_num_seqs": 4}), ModelSpec("/m"), DEVICE, 43210, PYTHON, "0.32.0")
    module, args = engine_args(list(spec.argv))
    assert module == VllmAdapter.module
    assert "--host" not in args and "--port" not in args
    assert "127.0.0.1" not in args and "43210" not in args
    assert args == [a for a in spec.argv[3:] if a not in ("--host", "127.0.0.1", "--port", "43210")]
    assert args == list(spec.args)


@pytest.mark.parametrize("argv", [[PYTHON], [PYTHON, "serve", "/m"], [PYTHON, "-c", "print()"]])
def test_engine_args_refuses_other_commands(argv: list[str]) -> None:
    with pytest.raises(ExportError):
        engine_args(argv)


@pytest.mark.parametrize("name", ["../../etc", "..", "/etc/passwd", "a/../../b", ".hidden", "..\\..\\x", "rag-vllm"])
def test_safe_stem_stays_in_the_folder(tmp_path: Path, name: str) -> None:
    out = tmp_path / "out"
    stem = safe_stem(name, 7)
    assert "/" not in stem and "\\" not in stem
    assert not stem.startswith(".")
    assert stem.endswith("-trial7")
    for suffix in (".sh", ".json"):
        assert (out / f"{stem}{suffix}").resolve().parent == out.resolve()


def test_safe_stem_keeps_plain_names() -> None:
    assert safe_stem("rag-vllm_v1.2", 3) == "rag-vllm_v1.2-trial3"


# --- selecting trials ----------------------------------------------------------------------------


def test_select_trials_refuses_a_failed_trial_and_names_its_failure() -> None:
    study = _study("/models/target")
    model = ModelSpec("/models/target")
    ok = _add_trial(study, model, {"max_num_seqs": 4})
    bad = _add_trial(study, model, {"max_num_seqs": 8}, failure="oom_boot")
    with pytest.raises(ExportError) as info:
        select_trials(study, [bad.number])
    assert "oom_boot" in str(info.value)
    assert str(bad.number) in str(info.value)
    assert [t.number for t in select_trials(study, [ok.number])] == [ok.number]


def test_select_trials_refuses_a_trial_over_the_error_budget() -> None:
    study = _study("/models/target")
    bad = _add_trial(study, ModelSpec("/models/target"), {"max_num_seqs": 8}, error_rate=0.05)
    with pytest.raises(ExportError, match="infeasible"):
        select_trials(study, [bad.number])


def test_select_trials_unknown_number() -> None:
    study = _study("/models/target")
    _add_trial(study, ModelSpec("/models/target"), {})
    with pytest.raises(ExportError, match="no trial 5"):
        select_trials(study, [5])


def test_select_trials_default_is_the_feasible_front() -> None:
    study = _study("/models/target")
    model = ModelSpec("/models/target")
    ok = _add_trial(study, model, {"max_num_seqs": 4})
    _add_trial(study, model, {"max_num_seqs": 8}, failure="oom_load")
    assert [t.number for t in select_trials(study, None)] == [ok.number]


def test_select_trials_with_nothing_feasible() -> None:
    study = _study("/models/target")
    _add_trial(study, ModelSpec("/models/target"), {}, failure="boot_timeout")
    with pytest.raises(ExportError, match="no feasible trial"):
        select_trials(study, None)


# --- export_study: SGLang trials also get a Python launcher ---------------------------------------

SGLANG_PYTHON = "/envs/sglang/bin/python"
SGLANG_VERSION = "0.5.23"


def _joint_study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="joint/../export test", directions=DIRECTIONS)
    bind_study_attrs(
        study,
        {
            "workload": "rag",
            "workload_digest": "e" * 64,
            "model": "/models/target",
            "drafts": {"draft-2l": "/models/draft two"},
            "hardware": {"kind": DEVICE.kind, "name": DEVICE.name, "memory_bytes": DEVICE.memory_bytes},
            "engines": {
                "vllm": {"distribution": "vllm", "version": "0.32.0"},
                "sglang": {"distribution": "sglang", "version": SGLANG_VERSION},
            },
        },
    )
    return study


def _add_engine_trial(
    study: optuna.Study, engine: str, params: dict[str, Any], *, ttft: float = 120.0, tok_s: float = 75.0
) -> optuna.trial.FrozenTrial:
    """A trial recorded exactly as ``tuner search`` records one (``study.record``)."""
    from tuner.engines import ADAPTERS

    python, version = (SGLANG_PYTHON, SGLANG_VERSION) if engine == "sglang" else (PYTHON, "0.32.0")
    model = ModelSpec("/models/my 'target'", drafts={"draft-2l": "/models/draft two"}, max_model_len=2048)
    config = Config(engine=engine, params=params)
    launch = ADAPTERS[engine]().launch(config, model, DEVICE, 43210, python, version)
    metrics = {"ttft_p95_ms": ttft, "output_throughput_tok_s": tok_s, "error_rate": 0.0}
    trial = study.ask()
    trial.set_user_attr("config_kind", "sampled")
    result = TrialResult(config=config, launch=launch, engine_version=version, metrics=metrics)
    study.tell(trial, list(record(trial, result, "pareto")))
    return study.get_trials(deepcopy=False)[trial.number]


class _FakeChecks:
    """Stands in for the engine environments: probe() and the parser check, recording their calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, reject: str | None = None) -> None:
        import tuner.deploy.verify
        import tuner.engines.env
        from tuner.engines.base import EngineAdapter
        from tuner.engines.env import EngineEnv

        self.probed: list[tuple[str, Path | None]] = []
        self.checked: dict[str, list[list[str]]] = {}
        self.reject = reject

        def probe(adapter: EngineAdapter, location: Path | None = None) -> EngineEnv:
            self.probed.append((adapter.name, location))
            version = SGLANG_VERSION if adapter.name == "sglang" else "0.32.0"
            return EngineEnv(adapter.name, str(location), adapter.distributions[0], version)

        def check_argvs(env: EngineEnv, argvs: list[list[str]], timeout_s: float = 600.0) -> list[dict[str, Any]]:
            self.checked.setdefault(env.engine, []).extend(argvs)
            if env.engine == self.reject:
                return [{"ok": False, "error": "error: unrecognized arguments: --bogus"} for _ in argvs]
            return [{"ok": True, "error": None, "speculative": "--speculative-algorithm" in a} for a in argvs]

        monkeypatch.setattr(tuner.engines.env, "probe", probe)
        monkeypatch.setattr(tuner.deploy.verify, "check_argvs", check_argvs)


SGLANG_PARAMS = {**SPEC_PARAMS, "chunk_size": 2048}


def test_export_of_an_sglang_trial_writes_sh_json_and_py(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.deploy.export import export_study
    from tuner.deploy.formats import read_python

    fake = _FakeChecks(monkeypatch)
    study = _joint_study()
    ft = _add_engine_trial(study, "sglang", SGLANG_PARAMS)
    out = tmp_path / "out"
    written = export_study(study, [ft.number], out)

    stem = safe_stem(study.study_name, ft.number)
    assert sorted(p.name for p in written) == sorted(f"{stem}{ext}" for ext in (".sh", ".json", ".py"))
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in written)
    assert all(p.parent == out for p in written)

    m = json.loads((out / f"{stem}.json").read_text())
    assert m["engine"] == "sglang" and m["module"] == "sglang.launch_server"
    assert m["python"] == SGLANG_PYTHON and m["distribution"] == "sglang"
    assert m["parser_check"]["ok"] is True and m["parser_check"]["engine_version"] == SGLANG_VERSION
    assert fake.probed == [("sglang", Path(SGLANG_PYTHON))]
    assert fake.checked == {"sglang": [m["argv"]]}
    assert read_sh((out / f"{stem}.sh").read_text()) == ("sglang.launch_server", m["argv"])
    assert read_python((out / f"{stem}.py").read_text()) == m["argv"]
    assert m["argv"][m["argv"].index("--speculative-algorithm") + 1] == "STANDALONE"


def test_export_of_a_vllm_trial_writes_only_sh_and_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.deploy.export import export_study

    fake = _FakeChecks(monkeypatch)
    study = _joint_study()
    ft = _add_engine_trial(study, "vllm", SPEC_PARAMS)
    out = tmp_path / "out"
    written = export_study(study, [ft.number], out)

    stem = safe_stem(study.study_name, ft.number)
    assert sorted(p.name for p in written) == sorted([f"{stem}.sh", f"{stem}.json"])
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in written)
    m = json.loads((out / f"{stem}.json").read_text())
    assert m["engine"] == "vllm" and m["module"] == VllmAdapter.module
    assert fake.probed == [("vllm", Path(PYTHON))]
    assert fake.checked == {"vllm": [m["argv"]]}
    assert read_sh((out / f"{stem}.sh").read_text()) == (VllmAdapter.module, m["argv"])


def test_export_of_a_joint_front_writes_py_only_for_sglang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.deploy.export import export_study

    fake = _FakeChecks(monkeypatch)
    study = _joint_study()
    fast = _add_engine_trial(study, "vllm", SPEC_PARAMS, ttft=90.0, tok_s=60.0)
    wide = _add_engine_trial(study, "sglang", SGLANG_PARAMS, ttft=150.0, tok_s=120.0)
    _add_engine_trial(study, "sglang", {"max_num_seqs": 2}, ttft=200.0, tok_s=50.0)  # dominated
    out = tmp_path / "out"
    written = export_study(study, None, out)  # the feasible Pareto front
    names = sorted(p.name for p in written)
    vllm_stem, sglang_stem = safe_stem(study.study_name, fast.number), safe_stem(study.study_name, wide.number)
    assert names == sorted(
        [f"{vllm_stem}.sh", f"{vllm_stem}.json", f"{sglang_stem}.sh", f"{sglang_stem}.json", f"{sglang_stem}.py"]
    )
    assert sorted(p.name for p in out.iterdir()) == names
    assert sorted(engine for engine, _ in fake.probed) == ["sglang", "vllm"]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_rejected_command_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str) -> None:
    from tuner.deploy.export import export_study

    fake = _FakeChecks(monkeypatch, reject=engine)
    study = _joint_study()
    ft = _add_engine_trial(study, engine, SGLANG_PARAMS if engine == "sglang" else SPEC_PARAMS)
    out = tmp_path / "out"
    with pytest.raises(ExportError) as info:
        export_study(study, [ft.number], out)
    message = str(info.value)
    assert f"trial {ft.number}" in message and engine in message and "--bogus" in message
    assert fake.checked[engine], "the parser check ran"
    assert not out.exists() or list(out.iterdir()) == []


def test_one_rejected_engine_writes_nothing_for_the_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every argv is checked before any file is written: a rejected vLLM trial stops the SGLang one too."""
    from tuner.deploy.export import export_study

    _FakeChecks(monkeypatch, reject="vllm")
    study = _joint_study()
    ok = _add_engine_trial(study, "sglang", SGLANG_PARAMS)
    bad = _add_engine_trial(study, "vllm", SPEC_PARAMS)
    out = tmp_path / "out"
    with pytest.raises(ExportError, match=f"trial {bad.number}"):
        export_study(study, [ok.number, bad.number], out)
    assert not out.exists() or list(out.iterdir()) == []

"""The command line: every usage, config and storage error is exit 2 or 1 with exactly one line on stderr.

None of these may boot an engine or even probe its environment: ``subprocess.Popen`` is replaced by a
function that fails the test, and ``TUNER_ENGINES_DIR`` points at an empty folder.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tuner.cli.main import main


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Run in an empty folder, with no engine environment, no storage override, no process launches."""
    engines = tmp_path / "engines"
    engines.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("TUNER_ENGINES_DIR", str(engines))
    monkeypatch.delenv("TUNER_STORAGE", raising=False)

    def no_process(*args: Any, **kwargs: Any) -> NoReturn:
        raise AssertionError(f"the CLI started a process: {args[:1]}")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    # main() installs a SIGTERM handler; give the test process its own back afterwards
    previous = signal.getsignal(signal.SIGTERM)
    yield work
    signal.signal(signal.SIGTERM, previous)


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {captured.err!r}"
    assert lines[0].startswith("tuner: ")
    assert captured.out == ""
    return lines[0]


def _nothing_written(work: Path) -> None:
    assert list(work.iterdir()) == [], "a refused command must not write anything"


def test_no_command(capsys: pytest.CaptureFixture[str], _isolated: Path) -> None:
    assert main([]) == 2
    assert "command" in _one_line(capsys)
    _nothing_written(_isolated)


@pytest.mark.parametrize(
    "argv",
    [
        ["--bogus"],
        ["search", "--workload", "rag", "--bogus"],
        ["trials", "--study", "s", "--frobnicate", "1"],
    ],
)
def test_unknown_flag(capsys: pytest.CaptureFixture[str], _isolated: Path, argv: list[str]) -> None:
    assert main(argv) == 2
    line = _one_line(capsys)
    assert "--bogus" in line or "--frobnicate" in line or "required" in line
    _nothing_written(_isolated)


def test_unknown_flag_after_command_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "--workload", "rag", "--bogus"]) == 2
    assert "--bogus" in _one_line(capsys)


def test_unknown_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve"]) == 2
    assert "serve" in _one_line(capsys)


def test_search_without_workload(capsys: pytest.CaptureFixture[str], _isolated: Path) -> None:
    assert main(["search"]) == 2
    assert "--workload" in _one_line(capsys)
    _nothing_written(_isolated)


@pytest.mark.parametrize("value", ["bad", "=/x", "vllm=", "vllm"])
def test_bad_engine_env(capsys: pytest.CaptureFixture[str], _isolated: Path, value: str) -> None:
    assert main(["search", "--workload", "rag", "--engine-env", value]) == 2
    line = _one_line(capsys)
    assert "--engine-env" in line and "ENGINE=PATH" in line
    _nothing_written(_isolated)


def test_missing_space_file(capsys: pytest.CaptureFixture[str], _isolated: Path) -> None:
    assert main(["search", "--workload", "rag", "--space", "missing.yaml"]) == 2
    line = _one_line(capsys)
    assert "missing.yaml" in line and "cannot read" in line
    _nothing_written(_isolated)


def test_invalid_space_file(capsys: pytest.CaptureFixture[str], _isolated: Path, tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("parameters:\n  chunk_size: {choices: [0]}\n")
    assert main(["search", "--workload", "rag", "--space", str(space)]) == 2
    assert "parameters.chunk_size" in _one_line(capsys)
    _nothing_written(_isolated)


@pytest.mark.parametrize("trials", ["-1", "-3"])  # 0 is valid: no new trial, only the finalists
def test_search_with_negative_trials(capsys: pytest.CaptureFixture[str], _isolated: Path, trials: str) -> None:
    assert main(["search", "--workload", "rag", "--trials", trials]) == 2
    assert "--trials" in _one_line(capsys)
    _nothing_written(_isolated)


def test_search_trials_not_a_number(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "--workload", "rag", "--trials", "many"]) == 2
    assert "--trials" in _one_line(capsys)


@pytest.mark.parametrize("flag", ["--requests", "--concurrency"])
def test_search_with_zero_requests_or_concurrency(
    capsys: pytest.CaptureFixture[str], _isolated: Path, flag: str
) -> None:
    assert main(["search", "--workload", "rag", flag, "0"]) == 2
    assert flag in _one_line(capsys)
    _nothing_written(_isolated)


def test_search_without_engine_environment_fails_fast(capsys: pytest.CaptureFixture[str], _isolated: Path) -> None:
    """With an empty TUNER_ENGINES_DIR the engine probe fails before anything is launched or written."""
    assert main(["search", "--workload", "rag"]) == 1
    line = _one_line(capsys)
    assert "vllm" in line and "--engine-env" in line
    _nothing_written(_isolated)


def test_trials_of_a_missing_study(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path}/x.db"
    assert main(["trials", "--study", "nope", "--storage", storage]) == 2
    line = _one_line(capsys)
    assert "nope" in line
    assert not (tmp_path / "x.db").exists(), "a command that reads creates no storage"


def test_trials_with_a_broken_storage_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trials", "--study", "nope", "--storage", "nosuchdb://x/y"]) == 2
    assert "not a database URL" in _one_line(capsys)


def test_check_of_a_missing_file(capsys: pytest.CaptureFixture[str], _isolated: Path) -> None:
    assert main(["check", "missing.sh"]) == 2
    assert "missing.sh" in _one_line(capsys)
    _nothing_written(_isolated)


# --- SGLang without a GPU, and Python launchers ---------------------------------------------------


def test_search_sglang_by_name_without_a_gpu_is_a_config_error(
    capsys: pytest.CaptureFixture[str], _isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked for by name, an engine that cannot run here is refused before anything is probed or booted."""
    import tuner.search.resolve

    monkeypatch.setattr(tuner.search.resolve, "gpu_visible", lambda: False)
    assert main(["search", "--workload", "rag", "--engines", "sglang"]) == 2
    line = _one_line(capsys)
    assert "sglang" in line and "GPU" in line
    _nothing_written(_isolated)


def test_search_sglang_on_this_machine(capsys: pytest.CaptureFixture[str], _isolated: Path) -> None:
    """The same, with the machine's own answer to whether a GPU is visible (none on the test machine)."""
    from tuner.measure.telemetry import gpu_visible

    if gpu_visible():
        pytest.skip("an NVIDIA GPU is visible here")
    assert main(["search", "--workload", "rag", "--engines", "sglang"]) == 2
    line = _one_line(capsys)
    assert "sglang" in line and "GPU" in line
    _nothing_written(_isolated)


def test_search_unknown_engine_by_name(capsys: pytest.CaptureFixture[str], _isolated: Path) -> None:
    assert main(["search", "--workload", "rag", "--engines", "tgi"]) == 2
    assert "tgi" in _one_line(capsys)
    _nothing_written(_isolated)


def test_check_of_a_python_launcher_without_kwargs(
    capsys: pytest.CaptureFixture[str], _isolated: Path, tmp_path: Path
) -> None:
    launcher = tmp_path / "launch.py"
    launcher.write_text("import sglang\n\nruntime = sglang.Runtime(model_path='/models/target')\n")
    assert main(["check", str(launcher)]) != 0
    assert "KWARGS" in _one_line(capsys)
    _nothing_written(_isolated)


def test_check_of_a_python_launcher_is_checked_by_sglang(
    capsys: pytest.CaptureFixture[str], _isolated: Path, tmp_path: Path
) -> None:
    """A KWARGS launcher is an SGLang command: with no SGLang environment here, that is what is missing."""
    launcher = tmp_path / "launch.py"
    launcher.write_text("KWARGS = {'model_path': '/models/target', 'enable_metrics': True}\n")
    assert main(["check", str(launcher)]) == 1
    line = _one_line(capsys)
    assert "sglang" in line and "--engine-env" in line
    _nothing_written(_isolated)


def test_check_of_a_py_file_that_is_not_python(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    launcher = tmp_path / "launch.py"
    launcher.write_text("#!/usr/bin/env bash\nexec python3 -m sglang.launch_server --model-path /m\n")
    assert main(["check", str(launcher)]) != 0
    _one_line(capsys)


def test_check_of_a_json_file_that_is_not_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    manifest = tmp_path / "launch.json"
    manifest.write_text("#!/usr/bin/env bash\n")
    assert main(["check", str(manifest)]) != 0
    _one_line(capsys)


def test_check_of_a_json_file_that_is_not_a_manifest(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    manifest = tmp_path / "launch.json"
    manifest.write_text('{"argv": ["--model", "/m"]}\n')
    assert main(["check", str(manifest)]) != 0
    _one_line(capsys)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--rate", "0"], "argument --rate: must be above 0, got 0"),
        (["--rate", "-3"], "argument --rate: must be above 0, got -3"),
        (["--rate", "2"], "no OpenAI-compatible /v1/models there"),
    ],
)
def test_verify_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], _isolated: Path, extra: list[str], said: str
) -> None:
    """A rate of no load, or a URL with no server (port 9 is discard, nothing listens there)."""
    assert main(["verify", "--url", "http://127.0.0.1:9", "--workload", "rag", *extra]) == 2
    assert said in _one_line(capsys)
    _nothing_written(_isolated)


def _study_with_trial(tmp_path: Path, attrs: dict[str, Any]) -> str:
    import optuna

    url = f"sqlite:///{tmp_path / 'v.db'}"
    study = optuna.create_study(study_name="v", storage=url)
    trial = study.ask()
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    study.tell(trial, 1.0)
    return url


@pytest.mark.parametrize(
    ("attrs", "trial", "said"),
    [
        ({}, "7", "--trial 7: study 'v' has no such trial"),
        ({}, "0", "--trial 0: it recorded no capacity above 0 req/s"),
        ({"capacity": {"tiers": {"interactive": {"capacity_req_s": 0.0, "slo": {}, "target": 0.9}}}}, "0",
         "no capacity above 0"),
    ],
)  # fmt: skip
def test_verify_of_a_trial_without_a_claim_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, attrs: dict[str, Any], trial: str, said: str
) -> None:
    url = _study_with_trial(tmp_path, attrs)
    capsys.readouterr()
    assert main(["verify", "--study", "v", "--storage", url, "--trial", trial, "--workload", "rag"]) == 2
    assert said in _one_line(capsys)


def test_verify_needs_a_url_and_rate_or_a_study_and_trial(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--url", "http://127.0.0.1:9", "--workload", "rag"]) == 2
    assert "--study NAME --trial N" in _one_line(capsys)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("#!/usr/bin/env bash\necho hello\n", "no 'exec' line"),
        ('#!/usr/bin/env bash\nexec "$P" -m http.server --model m\n', "runs 'http.server', no engine the tuner knows"),
    ],
)
def test_verify_of_a_launch_file_no_engine_runs_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, said: str
) -> None:
    launch = tmp_path / "launch.sh"
    launch.write_text(text)
    assert main(["verify", str(launch), "--workload", "rag", "--rate", "1"]) == 2
    assert said in _one_line(capsys)


def test_verify_takes_a_url_or_a_launch_file_not_both(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["verify", str(tmp_path / "x.sh"), "--url", "http://127.0.0.1:9", "--workload", "rag",
                 "--rate", "1"]) == 2  # fmt: skip
    assert "--url URL (or FILE)" in _one_line(capsys)

"""Bad capacity input is one line on stderr and exit 2, before any engine is probed or model made."""

from __future__ import annotations

import contextlib
import io
import subprocess
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tuner.cli.main import main

SCHEDULE_OVERLAP = """engines: [vllm]
parameters:
  num_speculative_tokens: {choices: [2]}
  spec_schedule:
    choices:
      broken: [[1, 8, 3], [8, 4096, 0]]
"""


@pytest.fixture(autouse=True)
def _no_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engines = tmp_path / "engines"
    engines.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNER_ENGINES_DIR", str(engines))
    monkeypatch.delenv("TUNER_STORAGE", raising=False)

    def no_process(*args: Any, **kwargs: Any) -> NoReturn:
        raise AssertionError(f"the CLI started a process: {args[:1]}")

    monkeypatch.setattr(subprocess, "Popen", no_process)


def _run(*args: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["search", "--workload", "rag", *args])
    return code, err.getvalue()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--attainment", "0"), "--attainment"),
        (("--attainment", "1.5"), "--attainment"),
        (("--attainment", "nan"), "--attainment"),
        (("--resolution", "0"), "--resolution"),
        (("--resolution", "-0.1"), "--resolution"),
        (("--slo", "interactive:ttft_p95_ms=0.5"), "no request could meet it"),
        (("--slo", "relaxed:ttft_p95_ms=500,e2e_p95_ms=400"), "a request ends after its first token"),
        (("--slo", "fast:ttft_p95_ms=200"), "unknown tier"),
        (("--objective", "capacity-pareto", "--slo", "ttft_p95_ms=200"), "name each"),
        (("--tier", "fast"), "--tier"),
    ],
)
def test_bad_capacity_input_is_one_line_and_exit_2(args: tuple[str, ...], said: str) -> None:
    code, err = _run(*args)
    assert code == 2 and said in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_schedule_whose_ranges_overlap_is_refused(tmp_path: Path) -> None:
    (tmp_path / "space.yaml").write_text(SCHEDULE_OVERLAP)
    code, err = _run("--space", str(tmp_path / "space.yaml"))
    assert code == 2 and "overlap at batch size 8" in err, err
    assert len(err.strip().splitlines()) == 1, err

"""The package's shape holds: layers only import downward, no import cycles, ruff and mypy clean.

These run the real tools on the real tree, so the test command fails on an upward import, a cycle,
a lint error or a type error, as CI must.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_subpackages_import_only_downward_and_no_module_cycles() -> None:
    done = _run(str(BIN / "lint-imports"))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken" in done.stdout, done.stdout[-2000:]


@pytest.mark.parametrize("argv", [("ruff", "check", "tuner", "tests"), ("ruff", "format", "--check", "tuner"),
                                  ("mypy", "tuner", "tests/benchmarks")])  # fmt: skip
def test_the_code_is_lint_and_type_clean(argv: tuple[str, ...]) -> None:
    done = _run(str(BIN / argv[0]), *argv[1:])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_the_layers_check_fails_on_an_upward_import(tmp_path: Path) -> None:
    """The contract is not vacuous: an engine adapter importing the CLI breaks it."""
    shutil.copytree(ROOT / "tuner", tmp_path / "tuner")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    base = tmp_path / "tuner" / "engines" / "base.py"
    base.write_text(base.read_text() + "\nimport tuner.cli.main  # noqa: E402\n")
    done = subprocess.run([str(BIN / "lint-imports")], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(tmp_path), "PATH": str(BIN)}, check=False)  # fmt: skip
    assert done.returncode != 0 and "tuner.engines.base -> tuner.cli.main" in done.stdout, done.stdout[-3000:]


# A measured figure belongs in a report, stamped with the run that measured it; code and docs say
# the reason in words and link the report section. What gives one away: a number with a unit of
# time, rate or share on the same line as a word that says it was observed.
FIGURE = re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|req/s|tok/s|%|s)(?![\w/])")
OBSERVED = re.compile(
    r"\b(measured|took|saw|came out|on an? H200|on the H200|on 2 cores|in a CI run|saved|queued)\b", re.I
)


def measured_figures(paths: list[Path], base: Path = ROOT) -> list[str]:
    found = []
    for path in paths:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if FIGURE.search(line) and OBSERVED.search(line):
                found.append(f"{path.relative_to(base)}:{number}: {line.strip()[:120]}")
    return found


def test_no_measured_figure_in_code_or_docs() -> None:
    paths = sorted((ROOT / "tuner").rglob("*.py")) + sorted((ROOT / "docs").rglob("*.md"))
    assert measured_figures(paths) == []


def test_the_figure_check_finds_one(tmp_path: Path) -> None:
    """Not vacuous: a comment quoting what a boot took on the H200 is caught, a stated bound is not."""
    planted = tmp_path / "planted.py"
    planted.write_text("# boots took 70-175 s on the H200\nGRACE_S = 10.0  # SIGKILL after 10 s\n")
    assert measured_figures([planted], tmp_path) == ["planted.py:1: # boots took 70-175 s on the H200"]


def test_every_report_benchmark_is_run_by_the_one_command() -> None:
    """``python -m tests.benchmarks all`` regenerates every report section: a benchmark module left
    out of its list (as ``bench_known_search`` was) goes stale unseen. Only the grid measurements,
    which measure the committed tables rather than a report, are run by name."""
    from tests.benchmarks.__main__ import ALL, benchmarks

    assert set(benchmarks()) - {name for name, _ in ALL} == {"measure_grid", "measure_capacity_grid"}

"""The package's shape holds: layers only import downward, no import cycles, ruff and mypy clean.

These run the real tools on the real tree, so the test command fails on an upward import, a cycle,
a lint error or a type error, as CI must.
"""

from __future__ import annotations

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

"""The package installs and runs away from the checkout: its wheel, in a fresh environment elsewhere.

The wheel is built by ``pip wheel`` from a copy of the sources (so the build's ``build/`` and
``*.egg-info`` folders never land in the checkout), with build isolation, as ``pip install .``
builds it: the build backend declared in ``pyproject.toml`` is what builds it.

The environment is a fresh venv made with ``--without-pip`` (a tenth of a second), into which this
environment's pip installs the wheel (``pip --python``), console script included. Its dependencies
are not downloaded again: a ``.pth`` file adds this environment's site-packages as a plain path.
A path named in a ``.pth`` file is only appended to ``sys.path``; the ``.pth`` files inside it
are not run, so the checkout's editable install (``__editable__.tuner-*.pth``) stays inactive and
``import tuner`` finds the installed wheel alone, which the test checks. Then ``tuner plan`` (it
needs the default search space, package data) and ``tuner drive --help`` run from a folder outside
the checkout, with no ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _run(args: list[str | Path], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv outside the checkout holding the wheel of this checkout; its folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    assert not tmp.is_relative_to(ROOT), "the install must happen outside the checkout"
    src = tmp / "src"
    src.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", src)
    shutil.copytree(ROOT / "tuner", src / "tuner", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp / "dist", src], cwd=tmp)
    (wheel,) = (tmp / "dist").glob("tuner-*.whl")
    assert "tuner/search/default_space.yaml" in zipfile.ZipFile(wheel).namelist(), "package data left out"

    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel], cwd=tmp)
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp).stdout
    (Path(purelib.strip()) / "_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


@pytest.fixture
def elsewhere(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A folder outside the checkout, and an environment with no PYTHONPATH and no engine environment."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"TUNER_ENGINES_DIR": str(tmp_path / "no-engines"), "TUNER_CACHE": str(tmp_path / "cache")}
    return tmp_path, env


def test_the_installed_package_is_the_wheel(installed: Path, elsewhere: tuple[Path, dict[str, str]]) -> None:
    cwd, env = elsewhere
    found = _run([installed / "bin" / "python", "-c", "import tuner; print(tuner.__file__)"], cwd, env).stdout
    assert Path(found.strip()).is_relative_to(installed), found


def test_plan_runs_from_anywhere_with_the_packaged_space(
    installed: Path, elsewhere: tuple[Path, dict[str, str]]
) -> None:
    cwd, env = elsewhere
    done = _run([installed / "bin" / "tuner", "plan", "--workload", "rag"], cwd, env)
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(rows) == 10 and all(row["argv"] and row["engine"] in ("vllm", "sglang") for row in rows)
    assert not list(cwd.glob("studies")), "plan writes nothing"


def test_drive_help_runs_from_anywhere(installed: Path, elsewhere: tuple[Path, dict[str, str]]) -> None:
    cwd, env = elsewhere
    done = _run([installed / "bin" / "tuner", "drive", "--help"], cwd, env)
    assert done.stdout.startswith("usage: tuner drive") and "--url URL" in done.stdout
    assert "--space" not in done.stdout, "drive needs no search space"

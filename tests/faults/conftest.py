"""Fixtures of the fault-injection suite: a tiny model, a fault engine, a study, and the leak check;
and the run's summary of the fault tests that were skipped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.faults import procs
from tests.faults.harness import FaultEngine, Study, make_engine, make_model, make_study
from tests.faults.outcomes import NEEDS_ROOT

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaultEngine:
    fault = make_engine(tmp_path / "engine")
    monkeypatch.setenv("TUNER_FAULT_DIR", str(fault.folder))
    monkeypatch.setenv("TUNER_FAULT", "ok")
    monkeypatch.chdir(tmp_path)  # studies/ and its logs go to the test's folder
    return fault


@pytest.fixture
def study(tmp_path: Path, tiny_model: Path, engine: FaultEngine) -> Study:
    return make_study(tmp_path, tiny_model, engine)


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """No engine, fault engine or reaper of this run may outlive a test, pass or fail."""
    yield
    left = procs.left_after(20.0)
    named = procs.describe(left)
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    assert not left, f"processes left behind: {named}"


def skipped_faults(reports: list[pytest.TestReport], root: Path) -> list[tuple[str, str]]:
    """The fault tests among ``reports`` that were skipped, each with its reason."""
    found = []
    for report in reports:
        if (root / report.fspath).resolve().is_relative_to(HERE):
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            found.append((report.nodeid, reason.removeprefix("Skipped: ")))
    return found


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Name each skipped fault test and why, those that need root first: ``-ra`` names only the line
    that skipped, and a fault not tested must never read as one that held (its row says so too)."""
    skipped = skipped_faults(terminalreporter.stats.get("skipped", []), config.rootpath)
    if not skipped:
        return
    skipped.sort(key=lambda found: not found[1].startswith(NEEDS_ROOT))
    for_root = sum(reason.startswith(NEEDS_ROOT) for _, reason in skipped)
    terminalreporter.write_sep(
        "=",
        f"{len(skipped)} fault test{'' if len(skipped) == 1 else 's'} skipped, {for_root} for lack of root",
        yellow=True,
    )
    for nodeid, reason in skipped:
        terminalreporter.write_line(f"SKIPPED {nodeid}: {reason}")

"""Fixtures of the fault-injection suite: a tiny model, a fault engine, a study, and the leak check."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.faults import procs
from tests.faults.harness import FaultEngine, Study, make_engine, make_model, make_study


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

"""Shared fixtures for tests that run the real vLLM CPU build (marked ``engine``)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tuner.engines.env import EngineEnv, probe
from tuner.engines.vllm import VllmAdapter
from tuner.measure.capacity import Step, leans_pass

ROOT = Path(__file__).resolve().parents[2]
ENGINE_MARKERS = ("vllm.entrypoints.openai.api_server", "VLLM::", "EngineCore")


# Every process this test run starts inherits this marker, so the leak check sees only our engines,
# never another run's on the same machine.
RUN_MARKER = ("TUNER_TEST_RUN", uuid.uuid4().hex)
os.environ[RUN_MARKER[0]] = RUN_MARKER[1]


def marked_processes(marker: tuple[str, str], signs: tuple[str, ...]) -> list[psutil.Process]:
    """Live processes (zombies are dead already) that look like one of ``signs`` and carry ``marker``
    in their environment: every process a test run starts inherits it, another run's never do."""
    found = []
    for proc in psutil.process_iter(["cmdline", "name", "status"]):
        try:
            text = " ".join(proc.info["cmdline"] or []) + " " + (proc.info["name"] or "")
            if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            if any(sign in text for sign in signs) and proc.environ().get(marker[0]) == marker[1]:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def engine_processes() -> list[psutil.Process]:
    """Every live process of this test run that looks like a vLLM server or one of its workers."""
    return marked_processes(RUN_MARKER, ENGINE_MARKERS)


@pytest.fixture(scope="session")
def vllm_env() -> EngineEnv:
    return probe(VllmAdapter())


@pytest.fixture(autouse=True)
def no_engine_left_behind() -> Iterator[None]:
    """Every engine test must leave no engine process, pass or fail."""
    before = {p.pid for p in engine_processes()}
    yield
    leaked = [p for p in engine_processes() if p.pid not in before]
    for proc in leaked:
        proc.kill()
    assert not leaked, f"engine processes left behind: {[p.pid for p in leaked]}"


def tuner(*args: str, env: dict[str, str] | None = None, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    """Run the real CLI, as a user would, from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def search_study(study: str, storage: str, trials: int, *extra: str) -> subprocess.CompletedProcess[str]:
    """`tuner search` of the e2e studies: rag, capacity under both tiers, steps that decide soon."""
    return tuner(
        "search", "--workload", "rag", "--study", study, "--storage", storage, "--trials", str(trials),
        "--requests", "8", "--seed", "1", "--objective", "capacity-pareto",
        # one doubling is close enough here: the tests check the search's plumbing, not its precision
        "--resolution", "1.0",
        "--confidence", "0.6",  # and steps that decide sooner than at the CPU default, for the same reason
        *extra,
    )  # fmt: skip


def capacity_of(steps: list[dict[str, Any]], target: float) -> float:
    """The capacity a search's recorded steps give: the highest pass below every fail, a fail being a
    step that did not pass, other than one that leans to a pass (``leans_pass``: only undecided, at or
    above the target), which the search climbs past (docs/metrics.md). A rate served whole to confirm a
    claim stands for that rate where it refutes the early look's pass (it neither passed nor leans to a
    pass): the early step there is then left out."""
    refuted = {s["rate_req_s"] for s in steps
               if s.get("held", True) and not s["passed"] and not leans_pass(Step(**s), target)}  # fmt: skip
    steps = [s for s in steps if s.get("held", True) or s["rate_req_s"] not in refuted]
    fails = [s["rate_req_s"] for s in steps if not s["passed"] and not leans_pass(Step(**s), target)]
    return max((s["rate_req_s"] for s in steps if s["passed"] and s["rate_req_s"] < min(fails, default=math.inf)),
               default=0.0)  # fmt: skip

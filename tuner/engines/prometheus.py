"""Samples from a server's Prometheus ``/metrics`` page, and the deltas between two scrapes.

The adapters read their engine's counters and histograms with these (``server_stats``).
"""

from __future__ import annotations

from collections.abc import Mapping


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text exposition -> ``{"name{labels}" or "name": value}``; bad lines are skipped."""
    samples: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:  # label values may hold spaces, so split after the closing brace
            close = line.rfind("}")
            key, rest = line[: close + 1], line[close + 1 :]
            if close < line.index("{"):
                continue
        else:
            key, _, rest = line.partition(" ")
        fields = rest.split()
        if not key or key.startswith("{") or not fields:
            continue
        try:
            samples[key] = float(fields[0])  # a trailing timestamp, if any, is ignored
        except ValueError:
            continue
    return samples


def has_metric(samples: Mapping[str, float], name: str) -> bool:
    """Whether metric ``name`` is exported at all, under any label set (a counter at 0 is)."""
    return any(key.partition("{")[0] == name for key in samples)


def metric_total(samples: Mapping[str, float], name: str) -> float:
    """Sum of every sample of metric ``name`` across all its label sets."""
    return sum(value for key, value in samples.items() if key.partition("{")[0] == name)


def metric_deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """``after - before`` for each key of ``after``; a key new in ``after`` counts from 0."""
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


def histogram_mean_delta(before: Mapping[str, float], after: Mapping[str, float], base: str) -> float | None:
    """Mean of the observations a histogram gained between two scrapes, or None if it gained none.

    ``base`` is the histogram's name, e.g. ``vllm:time_to_first_token_seconds``; its ``_sum`` and
    ``_count`` series are summed across labels before the division.
    """
    count_delta = metric_total(after, f"{base}_count") - metric_total(before, f"{base}_count")
    if count_delta <= 0:  # nothing observed, or the server restarted and its counters reset
        return None
    return (metric_total(after, f"{base}_sum") - metric_total(before, f"{base}_sum")) / count_delta

"""Goodput under SLOs, steady-state throughput, SLO strings and objective modes."""

from __future__ import annotations

import math

import optuna
import pytest

from tuner.client.driver import DriveResult, RequestRecord
from tuner.errors import ConfigError
from tuner.measure.goodput import goodput, parse_slo, steady_throughput, steady_window
from tuner.search.scoring import check_objective, directions, slo_excess, values


def _record(rid: str, sent: float, ttft: float, done: float, tokens: int, error: str | None = None) -> RequestRecord:
    times = tuple(sent + ttft + (done - sent - ttft) * i / max(tokens - 1, 1) for i in range(tokens))
    return RequestRecord(rid, sent, sent + ttft, done, times, (1,) * tokens, tokens, 10, error)


def test_parse_slo_accepts_the_three_bounds() -> None:
    assert parse_slo("ttft_p95_ms=500, tpot_p95_ms=50,e2e_p95_ms=3000") == {
        "ttft_p95_ms": 500.0, "tpot_p95_ms": 50.0, "e2e_p95_ms": 3000.0,
    }  # fmt: skip


@pytest.mark.parametrize("text", ["", "ttft=5", "ttft_p95_ms", "ttft_p95_ms=abc", "ttft_p95_ms=-1", "ttft_p95_ms=inf"])
def test_parse_slo_refuses_with_a_message_naming_the_part(text: str) -> None:
    with pytest.raises(ConfigError, match="--slo"):
        parse_slo(text)


def test_goodput_counts_errors_in_the_denominator() -> None:
    records = (
        _record("a", 0.0, 0.1, 1.0, 10),  # good
        _record("b", 0.0, 0.9, 2.0, 10),  # TTFT over the bound
        _record("c", 0.0, 0.1, 9.0, 10),  # TPOT (8.9 s / 9 tokens) over the bound
        _record("d", 0.0, 0.1, 0.5, 5, error="HTTP 500"),
    )
    out = goodput(DriveResult(records, 0.0, 10.0), {"ttft_p95_ms": 500.0, "tpot_p95_ms": 200.0})
    assert out["good_fraction"] == pytest.approx(0.25)
    assert out["goodput_req_s"] == pytest.approx(0.1)


def test_steady_window_drops_ramp_up_and_drain() -> None:
    # Four requests overlap only between t=3 and t=6; the ramp (0-3) and drain (6-10) are outside.
    records = tuple(_record(str(i), float(i), 0.1, 6.0 + i, 20) for i in range(4))
    lo, hi = steady_window(DriveResult(records, 0.0, 10.0)) or (math.nan, math.nan)
    assert (lo, hi) == (3.0, 6.0)
    inside = sum(1 for r in records for t in r.token_times_s if 3.0 <= t <= 6.0)
    assert steady_throughput(DriveResult(records, 0.0, 10.0)) == pytest.approx(inside / 3.0)


def test_objectives_have_their_directions_and_worst_values() -> None:
    assert directions("pareto") == [optuna.study.StudyDirection.MINIMIZE, optuna.study.StudyDirection.MAXIMIZE]
    assert directions("goodput") == [optuna.study.StudyDirection.MAXIMIZE]
    metrics = {"ttft_p95_ms": 100.0, "output_throughput_tok_s": 50.0, "goodput_req_s": 2.0}
    assert values("pareto", metrics, failed=False) == [100.0, 50.0]
    assert values("pareto", metrics, failed=True) == [math.inf, 0.0]
    assert values("goodput", metrics, failed=False) == [2.0]


def test_throughput_objective_makes_slo_breaches_infeasible() -> None:
    slo = {"ttft_p95_ms": 200.0}
    assert slo_excess("throughput", {"ttft_p95_ms": 300.0}, slo) == pytest.approx(0.5)
    assert slo_excess("throughput", {"ttft_p95_ms": 150.0}, slo) == 0.0
    assert slo_excess("pareto", {"ttft_p95_ms": 300.0}, slo) == 0.0


@pytest.mark.parametrize(("objective", "slo"), [("speed", {"ttft_p95_ms": 1.0}), ("goodput", {}), ("throughput", {})])
def test_objective_checks(objective: str, slo: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="--objective"):
        check_objective(objective, slo)

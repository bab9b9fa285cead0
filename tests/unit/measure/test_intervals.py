"""Within-trial 95 % intervals: they cover the truth about as often as they should."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tuner.measure.statistics import trial_intervals, wilson


def _rows(ttfts_s: list[float], gap_s: float = 0.5, tokens: int = 48) -> list[dict[str, object]]:
    rows, t = [], 0.0
    for ttft in ttfts_s:
        rows.append({"sent_s": t, "first_s": t + ttft, "done_s": t + ttft + gap_s, "output_tokens": tokens,
                     "prompt_tokens": 900, "error": None})  # fmt: skip
        t += ttft + gap_s
    return rows


def test_the_bootstrap_interval_of_ttft_p95_covers_the_true_p95_about_95_percent_of_the_time() -> None:
    rng, true_p95, covered = random.Random(1), float(np.exp(1.645 * 0.5) * 0.2 * 1e3), 0
    for _ in range(60):
        rows = _rows([rng.lognormvariate(np.log(0.2), 0.5) for _ in range(200)])
        ci = trial_intervals(rows, {})["ttft_p95_ms"]
        covered += ci["low"] <= true_p95 <= ci["high"]
    assert 51 <= covered <= 60, covered  # 95 % of 60 is 57


def test_every_reported_figure_gets_its_interval_around_its_estimate() -> None:
    rows = _rows([0.1 + 0.01 * (i % 7) for i in range(40)])
    ci = trial_intervals(rows, {"good_fraction": 0.75})
    assert set(ci) == {"ttft_p50_ms", "ttft_p95_ms", "tpot_p95_ms", "e2e_p95_ms", "output_throughput_tok_s",
                       "good_fraction"}  # fmt: skip
    steady = 48 / (0.13 + 0.5)
    assert (
        ci["output_throughput_tok_s"]["low"] < steady * 1.05 and ci["output_throughput_tok_s"]["high"] > steady * 0.95
    )
    assert (
        ci["ttft_p95_ms"]["method"] == "bootstrap"
        and 100 <= ci["ttft_p95_ms"]["low"] <= ci["ttft_p95_ms"]["high"] <= 160.001
    )


def test_no_interval_is_negative_however_skewed_the_requests() -> None:
    """Throughput slices this uneven put a plain t-interval's low end at -15 tok/s (seed 0); latency and
    throughput are positive, so their intervals are too."""
    rng = random.Random(0)
    rows = _rows([rng.lognormvariate(np.log(0.05), 2.0) for _ in range(16)], gap_s=0.01, tokens=2)
    ci = trial_intervals(rows, {"good_fraction": 0.1})
    assert set(ci) >= {"ttft_p95_ms", "output_throughput_tok_s", "good_fraction"}
    assert all(0 <= c["low"] <= c["high"] for c in ci.values()), ci
    assert ci["output_throughput_tok_s"]["low"] > 0


def test_too_few_requests_give_no_interval_rather_than_a_made_up_one() -> None:
    assert trial_intervals(_rows([0.1, 0.2, 0.3]), {}) == {}


@pytest.mark.parametrize(("good", "n", "low", "high"), [(8, 10, 0.49, 0.94), (0, 10, 0.0, 0.28), (10, 10, 0.72, 1.0)])
def test_wilson_matches_its_textbook_values(good: int, n: int, low: float, high: float) -> None:
    lo, hi = wilson(good, n)  # type: ignore[misc]
    assert lo == pytest.approx(low, abs=0.01) and hi == pytest.approx(high, abs=0.01)

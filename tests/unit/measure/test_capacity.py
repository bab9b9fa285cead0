"""Capacity search: synthetic attainment curves, request rows, and the H200 capacity-ladder capture."""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.batching_server import batched_rows
from tuner.errors import ConfigError
from tuner.measure.capacity import (
    MIN_WATCH_S,
    UNDECIDED,
    CapacityResult,
    CapacitySearch,
    Step,
    attainment_of,
    cut_reason,
    judged_step,
    ladder_rates,
    saturated,
    should_abort,
    steady_rows,
    summarize_step,
)
from tuner.measure.rate_steps import seen_at
from tuner.study.attrs import step_at_capacity

LADDERS = Path(__file__).resolve().parents[2] / "data" / "captures" / "vllm-0.26-h200" / "capacity-ladders.json"
STRICT = {"ttft_p95_ms": 200.0, "tpot_p95_ms": 6.0}
RELAXED = {"ttft_p95_ms": 1000.0, "tpot_p95_ms": 20.0}


def knee_curve(knee: float) -> Callable[[float], float]:
    """A monotone attainment falling through 0.9 exactly at ``knee``."""
    return lambda rate: 1.0 / (1.0 + (1.0 / 9.0) * math.exp(min(700.0, 8.0 * (rate / knee - 1.0))))


def run(search: CapacitySearch, attainment: Callable[[float], float], **step: Any) -> CapacityResult:
    while (rate := search.next_rate()) is not None:
        search.record(judged_step(rate, attainment(rate), search.target, **step))
    return search.result()


def test_monotone_knee_found_within_resolution_in_few_steps() -> None:
    for knee in (0.7, 3.0, 13.7, 50.0):
        result = run(CapacitySearch(start_rate=1.0, growth=2.0, resolution=0.10, max_steps=30), knee_curve(knee))
        assert result.stop_reason == "resolved"
        assert result.capacity_req_s <= knee < result.capacity_req_s * 1.10
        # climbing (or halving) to the first bracket, then halving log2 of the bracket ratio down to log2(1.1)
        bound = math.ceil(abs(math.log2(knee))) + 1 + math.ceil(math.log2(math.log2(2.0) / math.log2(1.10)))
        assert len(result.steps) <= bound


def test_noisy_curves_terminate_conservatively() -> None:
    for seed in range(50):
        rng = random.Random(seed)
        curve = knee_curve(rng.uniform(0.5, 40.0))

        def noisy(rate: float, curve: Callable[[float], float] = curve, rng: random.Random = rng) -> float:
            return min(1.0, curve(rate) + rng.gauss(0, 0.05))

        result = run(CapacitySearch(max_steps=12), noisy)
        assert len(result.steps) <= 12 and result.stop_reason != "unfinished"
        fails = [s.rate_req_s for s in result.steps if not s.passed]
        if result.capacity_req_s > 0:
            assert any(s.passed and s.rate_req_s == result.capacity_req_s for s in result.steps)
            assert all(result.capacity_req_s < f for f in fails)


def test_non_monotone_curve_capacity_stays_below_every_fail() -> None:
    # fails at 2 req/s, passes at 1 and everywhere from 3 to 8
    result = run(CapacitySearch(), lambda r: 0.5 if 1.9 <= r <= 2.1 or r > 8 else 0.95)
    assert result.stop_reason == "resolved"
    assert 1.0 <= result.capacity_req_s < 2.0
    # a pass recorded above a fail does not count
    search = CapacitySearch()
    for rate, a in ((4.0, 0.95), (2.0, 0.5), (1.0, 0.95)):
        search.record(judged_step(rate, a, 0.9))
    assert search.capacity() == 1.0 and search.next_rate() == math.sqrt(2.0)


def test_first_step_fails_halves_to_a_floor() -> None:
    result = run(CapacitySearch(start_rate=1.0), lambda r: 0.0)
    assert [s.rate_req_s for s in result.steps] == [1.0, 0.5, 0.25, 0.125]
    assert (result.capacity_req_s, result.stop_reason, result.pruned) == (0.0, "no_capacity", False)
    result = run(CapacitySearch(start_rate=4.0), knee_curve(1.5))
    assert result.capacity_req_s <= 1.5 < result.capacity_req_s * 1.1


def test_incumbent_equal_brackets_in_two_steps() -> None:
    result = run(CapacitySearch(incumbent=5.0, resolution=0.1), knee_curve(5.2))
    assert [s.rate_req_s for s in result.steps] == [5.0, pytest.approx(5.5)]
    assert (result.capacity_req_s, result.stop_reason) == (5.0, "resolved")


def test_incumbent_much_worse_is_pruned_after_two_steps() -> None:
    result = run(CapacitySearch(incumbent=8.0), knee_curve(2.0))
    assert [s.rate_req_s for s in result.steps] == [8.0, 6.0]
    assert (result.capacity_req_s, result.stop_reason, result.pruned) == (0.0, "pruned", True)
    # a little worse: the rescue probe passes and bisection takes over
    result = run(CapacitySearch(incumbent=8.0), knee_curve(7.0))
    assert not result.pruned and result.capacity_req_s <= 7.0 < result.capacity_req_s * 1.1


def test_incumbent_better_config_continues_upward() -> None:
    result = run(CapacitySearch(incumbent=4.0, max_steps=20), knee_curve(20.0))
    assert [s.rate_req_s for s in result.steps][:3] == [4.0, pytest.approx(4.4), pytest.approx(8.8)]
    assert result.capacity_req_s <= 20.0 < result.capacity_req_s * 1.1


def test_saturated_step_is_a_fail_and_nothing_above_is_tried() -> None:
    search = CapacitySearch(max_steps=20)
    while (rate := search.next_rate()) is not None:
        search.record(judged_step(rate, 1.0, 0.9, is_saturated=rate >= 8.0))
    result = search.result()
    assert max(s.rate_req_s for s in result.steps) == 8.0
    assert 4.0 <= result.capacity_req_s < 8.0 and result.stop_reason == "resolved"


def test_bounds_max_steps_and_max_rate() -> None:
    result = run(CapacitySearch(max_steps=3), lambda r: 1.0)
    assert (len(result.steps), result.stop_reason, result.capacity_req_s) == (3, "max_steps", 4.0)
    result = run(CapacitySearch(max_rate=10.0), lambda r: 1.0)
    assert [s.rate_req_s for s in result.steps] == [1.0, 2.0, 4.0, 8.0, 10.0]
    assert (result.stop_reason, result.capacity_req_s) == ("max_rate", 10.0)


def test_result_as_dict_is_json_safe() -> None:
    result = run(CapacitySearch(), knee_curve(3.0))
    data = json.loads(json.dumps(result.as_dict(), allow_nan=False))
    assert data["capacity_req_s"] == result.capacity_req_s and len(data["steps"]) == len(result.steps)
    assert [s["rate_req_s"] for s in data["steps"]] == [s.rate_req_s for s in result.steps]
    step = Step(1.0, 1.0, True, server={"preemptions": math.nan, "spec_acceptance": 0.7})
    assert json.loads(json.dumps(step.as_dict(), allow_nan=False))["server"] == {
        "preemptions": None,
        "spec_acceptance": 0.7,
    }


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"target": 0.0}, "--attainment"),
        ({"target": 1.5}, "--attainment"),
        ({"resolution": 0.0}, "--resolution"),
        ({"growth": 1.0}, "--growth"),
        ({"start_rate": -1.0}, "--start-rate"),
        ({"max_steps": 0}, "--max-steps"),
        ({"max_rate": 0.5}, "--max-rate"),
    ],
)
def test_bad_search_settings_raise_config_error(kwargs: dict[str, Any], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        CapacitySearch(**kwargs)


def test_ladder_rates_reach_the_resolution() -> None:
    rates = ladder_rates(1.0, 16.0, 0.10)
    assert rates[0] == 1.0 and rates[-1] == pytest.approx(16.0)
    assert all(b / a <= 1.10 + 1e-12 for a, b in zip(rates, rates[1:], strict=False))
    assert len(rates) == math.ceil(math.log(16.0) / math.log(1.1)) + 1
    with pytest.raises(ConfigError, match="--resolution"):
        ladder_rates(1.0, 2.0, 0.0)


# --- request rows -----------------------------------------------------------------------------------


def row(
    sent: float, ttft: float | None, e2e: float | None, tokens: int = 11, error: str | None = None
) -> dict[str, Any]:
    return {
        "sent_s": sent,
        "first_s": None if ttft is None else sent + ttft,
        "done_s": None if e2e is None else sent + e2e,
        "output_tokens": tokens,
        "prompt_tokens": 100,
        "error": error,
    }


def steady(rate: float, duration: float, latency: float = 0.5) -> list[dict[str, Any]]:
    return [row(i / rate, 0.05, latency) for i in range(int(rate * duration))]


def queued(rate: float, duration: float, service: float) -> list[dict[str, Any]]:
    """FIFO single server slower than the arrivals: the queue, and so in-flight, keeps growing."""
    rows, free = [], 0.0
    for i in range(int(rate * duration)):
        sent = i / rate
        free = max(free, sent) + service
        rows.append(row(sent, free - sent - 0.01, free - sent))
    return rows


def test_saturation_growing_in_flight_vs_steady() -> None:
    assert saturated(queued(10.0, 20.0, 0.2), 2.0, 18.0)
    assert not saturated(steady(10.0, 20.0), 2.0, 18.0)
    assert not saturated(steady(0.5, 20.0, latency=3.0), 2.0, 18.0)
    # mid-step: the rows seen so far, unfinished ones without done_s, already show the pile-up
    # (the climb is read from the ended requests' lifetimes, so the cut needs MIN_WATCH_S past them,
    # and a rise over each third of the window)
    seen = [r if r["done_s"] <= 11.0 else {**r, "first_s": None, "done_s": None} for r in queued(10.0, 11.0, 0.2)]
    assert saturated(seen, 1.0, 11.0)
    assert should_abort(seen, STRICT, 0.9, now_s=11.0, warmup_s=1.0)
    assert cut_reason(seen, STRICT, 0.9, now_s=11.0, warmup_s=1.0) == "saturated"
    assert not should_abort(steady(10.0, 8.0), {"e2e_p95_ms": 1000.0}, 0.9, now_s=8.0, warmup_s=1.0)


def test_a_cut_says_collapsed_when_requests_miss_the_slo_but_the_queue_is_steady() -> None:
    slow = steady(10.0, 8.0, latency=3.0)  # keeps up (in flight steady), but every request misses a 1 s e2e bound
    assert not saturated(slow, 1.0, 8.0)
    assert cut_reason(slow, {"e2e_p95_ms": 1000.0}, 0.9, now_s=8.0, warmup_s=1.0) == "collapsed"
    assert cut_reason(slow, {"e2e_p95_ms": 5000.0}, 0.9, now_s=8.0, warmup_s=1.0) is None


def test_summarize_step_counts_failures_as_misses_and_drops_ramp_and_drain() -> None:
    slo = {"ttft_p95_ms": 200.0, "tpot_p95_ms": 50.0}
    rows = steady(10.0, 20.0)  # ttft 50 ms, tpot (500 - 50) / 10 = 45 ms: all good
    for r in rows:
        if r["sent_s"] < 2.0 or r["sent_s"] > 18.0:
            r["first_s"] = r["sent_s"] + 5.0  # ramp-up and drain misses: excluded from attainment
            r["done_s"] = r["sent_s"] + 6.0
    for r in rows[30:190:16]:
        r.update(error="HTTP 500", done_s=None)  # failed inside the window, spread over it: misses
    step = summarize_step(10.0, rows, slo, 0.9, 20.0, itl_ms=[40.0, 50.0])
    counted = steady_rows(rows, 20.0)
    assert step.n_requests == 200 and step.n_counted == len(counted) == 161 and step.n_errors == 10
    assert step.attainment == pytest.approx(151 / 161)
    assert step.attainment_low is not None and step.attainment_low >= 0.9, "161 requests decide 0.94 against 0.9"
    assert step.decision == "pass" and step.passed and not step.saturated and not step.collapsed
    # The same ten failures in one burst: requests of a step are not independent, and the interval
    # widens by the design effect its batch means show, so the same share no longer decides a pass.
    burst = [dict(r, error=None, done_s=r["sent_s"] + 0.5) if r.get("error") else dict(r) for r in rows]
    for r in burst[50:60]:
        r.update(error="HTTP 500", done_s=None)
    clustered = summarize_step(10.0, burst, slo, 0.9, 20.0)
    assert clustered.attainment == pytest.approx(151 / 161)
    assert clustered.decision == "undecided" and not clustered.passed
    assert step.ttft_p50_ms == pytest.approx(50.0) and step.tpot_p95_ms == pytest.approx(45.0)
    assert step.itl_p50_ms == pytest.approx(45.0)
    assert step.request_throughput_req_s == pytest.approx(190 / 20.0)
    assert step.output_throughput_tok_s == pytest.approx(190 * 11 / 20.0)
    empty = summarize_step(1.0, [], slo, 0.9, 20.0)
    assert (empty.attainment, empty.passed, empty.ttft_p95_ms) == (0.0, False, None)
    assert json.dumps(empty.as_dict(), allow_nan=False)


def test_summarize_step_saturated_rows_fail_even_with_good_attainment() -> None:
    step = summarize_step(10.0, queued(10.0, 20.0, 0.2), {"e2e_p95_ms": 1e9}, 0.9, 20.0)
    assert step.attainment == 1.0 and step.saturated and not step.passed


def test_bad_slo_raises_config_error() -> None:
    from tuner.measure.capacity import check_slo

    for slo in ({}, {"itl_p95_ms": 10.0}, {"ttft_p95_ms": 0.0}, {"tpot_p95_ms": math.inf}):
        with pytest.raises(ConfigError, match="--slo"):
            check_slo(slo)


# --- the H200 capture -------------------------------------------------------------------------------


def ladder_measure(ladder: dict[str, Any], slo: dict[str, float], target: float) -> Callable[[float], Step]:
    """Answers a requested rate with the attainment measured at the nearest rate at or above it."""
    measured = sorted(float(r) for r in ladder)

    def measure(rate: float) -> Step:
        at = next(m for m in measured if m >= rate - 1e-9)
        entry = ladder[f"{at:g}"]
        return judged_step(rate, attainment_of(entry["ttft_ms"], entry["tpot_ms"], slo), target)

    return measure


def search_ladder(ladder: dict[str, Any], slo: dict[str, float], **kwargs: Any) -> CapacityResult:
    search = CapacitySearch(target=0.9, start_rate=2.0, growth=2.0, resolution=1.0, **kwargs)
    measure = ladder_measure(ladder, slo, 0.9)
    while (rate := search.next_rate()) is not None:
        search.record(measure(rate))
    return search.result()


def test_h200_capture_strict_and_relaxed_capacity() -> None:
    ladders = json.loads(LADDERS.read_text())["ladders"]
    default, k3 = ladders["default"], ladders["k3"]
    top = max(float(r) for r in default)

    strict_default = search_ladder(default, STRICT, max_rate=top)
    strict_k3 = search_ladder(k3, STRICT, max_rate=max(float(r) for r in k3))
    assert strict_default.capacity_req_s == 2.0 and strict_default.stop_reason == "resolved"
    assert strict_k3.capacity_req_s == 4.0 and strict_k3.stop_reason == "resolved"
    assert strict_k3.capacity_req_s == 2 * strict_default.capacity_req_s

    # k3 misses the target at no measured rate below 6, although its attainment is not monotone there
    k3_passes = {r: attainment_of(e["ttft_ms"], e["tpot_ms"], STRICT) >= 0.9 for r, e in k3.items()}
    assert k3_passes == {"2": True, "4": True, "6": False}

    relaxed = search_ladder(default, RELAXED, max_rate=top)
    assert (relaxed.capacity_req_s, relaxed.stop_reason) == (16.0, "max_rate")
    assert all(attainment_of(e["ttft_ms"], e["tpot_ms"], RELAXED) >= 0.9 for e in default.values())

    # k3 with the defaults as incumbent climbs past them; the defaults against a k3 incumbent are pruned
    versus = search_ladder(k3, STRICT, incumbent=2.0, max_rate=6.0)
    assert versus.capacity_req_s == 4.0 and not versus.pruned
    pruned = search_ladder(default, STRICT, incumbent=4.0, max_rate=top)
    assert pruned.pruned and pruned.capacity_req_s == 0.0 and len(pruned.steps) == 2


def poisson_rows(rate: float, duration: float, latency: float, seed: int) -> list[dict[str, Any]]:
    """Seeded Poisson arrivals to a server that keeps up: every request takes ``latency``, no queue."""
    rng, rows, at = random.Random(seed), [], 0.0
    while True:
        at += rng.expovariate(rate)
        if at > duration:
            return rows
        rows.append(row(at, 0.05, latency, tokens=128))


def test_a_busy_server_that_keeps_up_is_not_called_saturated_early() -> None:
    """As on the H200: 13 req/s of one-second requests, judged 3 s into a step. In-flight climbs to
    its level in the first second and then only wanders (Poisson), which must not stop the step."""
    slo = {"ttft_p95_ms": 1000.0, "tpot_p95_ms": 20.0}
    for seed in range(40):
        rows = poisson_rows(13.0, 15.0, 1.0, seed)
        seen = [r if r["done_s"] <= 3.0 else {**r, "first_s": None, "done_s": None} for r in rows if r["sent_s"] <= 3.0]
        assert not should_abort(seen, slo, 0.9, now_s=3.0, warmup_s=1.5), seed
        assert not saturated(rows, 1.5, 13.5), seed
    # the same rate against a server that serves one at a time (each 0.1 s) still piles up, and says so
    # (a rise of 3 req/s, told over each third of the window once the window is long enough)
    overload = queued(13.0, 15.0, 0.1)
    seen = [
        r if r["done_s"] <= 12.0 else {**r, "first_s": None, "done_s": None} for r in overload if r["sent_s"] <= 12.0
    ]
    assert should_abort(seen, {"e2e_p95_ms": 1e9}, 0.9, now_s=12.0, warmup_s=1.5)


# --- decided, not drawn -----------------------------------------------------------------------------


def _outcomes(n: int, misses_every: int) -> list[bool]:
    return [i % misses_every != 0 for i in range(1, n + 1)]


def test_a_step_at_exactly_the_targets_edge_is_undecided_however_many_requests_it_sent() -> None:
    from tuner.measure.capacity import attainment_interval, decide, look_z

    for n in (100, 1000, 10000):
        outcomes = _outcomes(n, 10)  # exactly 90 % met the SLO
        assert sum(outcomes) / n == pytest.approx(0.9)
        low, high = attainment_interval(outcomes, look_z(3))
        assert low < 0.9 < high and decide(low, high, 0.9) == "undecided"
    # as rows through summarize_step: the edge never passes, where the old point rule passed it
    rows = steady(10.0, 100.0)
    for r in rows[5::10]:
        r["first_s"] = r["sent_s"] + 5.0
    step = summarize_step(10.0, rows, {"ttft_p95_ms": 200.0}, 0.9, 100.0)
    assert step.attainment == pytest.approx(0.9, abs=0.002) and step.decision == "undecided" and not step.passed


def test_an_interval_decides_once_the_share_is_clearly_on_one_side() -> None:
    from tuner.measure.capacity import attainment_interval, decide, look_z

    z = look_z(3)
    assert decide(*attainment_interval(_outcomes(400, 50), z), 0.9) == "pass"  # 98 %
    assert decide(*attainment_interval(_outcomes(400, 4), z), 0.9) == "fail"  # 75 %
    assert decide(*attainment_interval(_outcomes(12, 50), z), 0.9) == "undecided", "12 requests cannot tell"
    assert attainment_interval([], z) == (0.0, 1.0)
    for outcomes in ([True] * 300, [False] * 300, [True] * 7):  # the ends hold the share exactly
        low, high = attainment_interval(outcomes, z)
        share = sum(outcomes) / len(outcomes)
        assert low <= share <= high
    # more looks, each at a stricter level: the same requests decide later
    assert look_z(5) > look_z(3) > look_z(1)


def test_a_look_counts_only_requests_whose_outcome_is_known_in_send_order() -> None:
    from tuner.measure.capacity import resolved_until

    rows = [{"sent_s": float(i), "first_s": i + 0.1, "done_s": i + 0.2, "output_tokens": 8, "error": None}
            for i in range(10)]  # fmt: skip
    rows[4] = {**rows[4], "done_s": None}  # still running, its first token in time: the slow one
    assert resolved_until(rows, {"ttft_p95_ms": 200.0}, 1.0, now_s=10.0) == 3.0
    assert resolved_until(rows, {"e2e_p95_ms": 1000.0}, 1.0, now_s=10.0) == 9.0, "past its e2e bound: a known miss"
    rows[4] = {**rows[4], "first_s": None}  # no first token 6 s after it was sent: a known miss too
    assert resolved_until(rows, {"ttft_p95_ms": 200.0}, 1.0, now_s=10.0) == 9.0


def test_the_servers_waiting_queue_growing_is_told_from_noise() -> None:
    from tuner.measure.capacity import growing

    times = [float(t) for t in range(20)]
    assert growing(times, [2.0 * t for t in times], arrival_rate=10.0)
    assert not growing(times, [3.0 + (t % 3) for t in times], arrival_rate=10.0)
    assert not growing(times[:2], [0.0, 50.0], arrival_rate=10.0), "two samples are no trend"


def test_a_capacity_records_the_bracket_it_was_resolved_in_and_the_interval_at_it() -> None:
    search = CapacitySearch(target=0.9, resolution=0.1, start_rate=1.0)
    while (rate := search.next_rate()) is not None:
        rows = steady(rate, 60.0, latency=0.1 if rate <= 3.0 else 2.0)
        search.record(summarize_step(rate, rows, {"e2e_p95_ms": 1000.0}, 0.9, 60.0))
    result = search.result()
    low, high = result.bracket_req_s
    assert low == result.capacity_req_s and high is not None and low <= 3.0 < high and (high - low) / low <= 0.1
    record = result.as_dict()
    assert record["bracket_req_s"] == [low, high] and record["attainment_interval"][0] >= 0.9


# --- undecided steps: where the search goes next ---------------------------------------------------

CHECK6 = Path(__file__).resolve().parents[2] / "data" / "captures" / "vllm-0.26-h200-capacity-check-6"
STEP_LINE = re.compile(r"interactive: ([\d.]+) req/s, .*attainment (\d+)% \[(\d+)%, (\d+)%\] (pass|fail|undecided)")


def decided_step(rate: float, attainment: float, decision: str, low: float = 0.0, high: float = 1.0) -> Step:
    return Step(rate, attainment, decision == "pass", decision=decision, attainment_low=low, attainment_high=high)


def captured_steps(name: str) -> dict[float, Step]:
    """A drive's step lines (``tuner drive --capacity`` on the H200) as Steps, by rate to 0.01 req/s."""
    steps = {}
    for line in (CHECK6 / name).read_text().splitlines():
        if match := STEP_LINE.match(line):
            rate, share, low, high, decision = match.groups()
            steps[round(float(rate), 2)] = decided_step(
                float(rate), int(share) / 100, decision, int(low) / 100, int(high) / 100
            )
    return steps


def test_the_h200_drive_whose_first_step_was_undecided_now_climbs_past_it() -> None:
    # Capacity check 6: drive 1's 2.67 req/s step ended undecided at 0.95 [0.86, 0.98], and the search
    # took it for a fail and halved to 1.33; drive 2 passed the same rate and went on to 4.48.
    first, second = captured_steps("drive_draft_1.err"), captured_steps("drive_draft_2.err")
    assert first[2.67].decision == "undecided" and first[1.33].passed and second[5.33].decision == "fail"
    answers = {2.67: first[2.67], 5.33: second[5.33], 3.77: second[3.77], 4.48: second[4.48]}
    search = CapacitySearch(target=0.9, resolution=0.1, start_rate=8 / 3, growth=2.0)
    proposed = []
    while (rate := search.next_rate()) is not None and round(rate, 2) in answers:
        proposed.append(round(rate, 2))
        search.record(replace(answers[round(rate, 2)], rate_req_s=rate))
    assert proposed == [2.67, 5.33, 3.77, 4.48], "drive 2's path, from drive 1's undecided first step"
    assert rate is not None and 4.48 < rate < 5.33 and search.capacity() == pytest.approx(4.485, abs=0.01)


def test_an_undecided_step_below_the_target_caps_the_search_as_a_fail_does() -> None:
    search = CapacitySearch(target=0.9, resolution=0.1, start_rate=2.0)
    assert search.next_rate() == 2.0
    search.record(decided_step(2.0, 0.88, "undecided", 0.80, 0.93))
    assert search.next_rate() == 1.0 and search.lowest_fail() == 2.0


def test_a_capacity_is_always_a_decided_pass_below_an_undecided_top() -> None:
    # passes up to 3, undecided (leaning to a pass) from 3.5 to 4.5, fails above: the knee is in the
    # undecided stretch, and the capacity the highest decided pass under its lowest undecided rate
    def measure(rate: float) -> Step:
        if rate <= 3.5:
            return decided_step(rate, 0.97, "pass", 0.92, 0.99)
        return decided_step(rate, 0.93, "undecided", 0.85, 0.97) if rate <= 4.5 else decided_step(rate, 0.6, "fail")

    search = CapacitySearch(target=0.9, resolution=0.1, start_rate=1.0, max_steps=30)
    while (rate := search.next_rate()) is not None:
        search.record(measure(rate))
    result = search.result()
    low, high = result.bracket_req_s
    assert result.stop_reason == "resolved" and result.at_capacity() is not None
    assert low == result.capacity_req_s <= 3.5 < high <= 4.5 and (high - low) / low <= 0.1
    assert any(s.rate_req_s > 4.5 for s in result.steps), "the search looked above the undecided steps"


BLOCK12_LOG = Path(__file__).resolve().parents[3] / "reports" / "gpu-h100" / "study-1" / "block12" / "search.log"


def test_a_repeat_with_no_decided_pass_steps_down_one_resolution_below_its_undecided_steps() -> None:
    """The vLLM defaults' second repeat on the H100 (block 12): its own capacity 6.34 and the 6.65 it
    bisected to were undecided at 95 % and 92 % (leaning to a pass), the claim at 6.98 a look had passed
    was refuted served whole (90 % printed, under the target), and no rate had a decided pass. The
    search halved to 3.17, climbed back in three passing steps and stopped on ``max_steps`` at 5.33.
    Now it steps down one resolution below the lowest such step, and a pass there resolves it."""
    logged = [float(m.group(1)) for m in re.finditer(r"interactive: ([\d.]+) req/s", BLOCK12_LOG.read_text())]
    second = logged[logged.index(14.0, 5) - 2 :]  # the second repeat's interactive steps, from its incumbent
    cut = {"collapsed": True}
    outcomes = [  # the log's lines, in order (tests the path the search took up to its halving)
        (0.95, "undecided", 0.89, 0.97, {}),
        (1.00, "pass", 0.94, 1.00, {"held": False}),
        (0.00, "undecided", 0.00, 1.00, {"cut_reason": "collapsed", **cut}),
        (0.00, "undecided", 0.00, 1.00, {"cut_reason": "collapsed", **cut}),
        (0.76, "undecided", 0.49, 0.92, {"cut_reason": "saturated"}),
        (0.73, "undecided", 0.46, 0.90, {}),
        (0.897, "undecided", 0.80, 0.95, {}),  # the confirmation: "90 %" in the log, refuted, so under 0.9
        (0.92, "undecided", 0.85, 0.96, {}),
    ]
    incumbent = 6.342437946681179  # the trial's own capacity (study file, trial 0)
    search = CapacitySearch(target=0.9, resolution=0.1, incumbent=incumbent, max_steps=10, prune=False)
    for (attainment, decision, low, high, extra), rate_logged in zip(outcomes, second, strict=False):
        rate = search.next_rate()
        assert rate is not None and rate == pytest.approx(rate_logged, rel=0.006)  # printed to 3 figures
        search.record(replace(decided_step(rate, attainment, decision, low, high), **extra))
    assert [round(r, 2) for r in second[8:11]] == [3.17, 4.48, 5.33], "the halving the repeat took"
    down = search.next_rate()
    assert down == pytest.approx(incumbent / 1.1)
    search.record(decided_step(down, 0.99, "pass", 0.95, 1.0))
    mid = search.next_rate()
    assert mid == pytest.approx(math.sqrt(down * incumbent))
    search.record(decided_step(mid, 0.97, "pass", 0.92, 0.99))
    assert search.next_rate() is None
    result = search.result()
    assert (result.stop_reason, result.capacity_req_s) == ("resolved", mid)
    assert result.bracket_req_s == (mid, incumbent) and search.measured <= 10


def test_with_no_pass_below_a_decided_fail_the_search_still_halves() -> None:
    search = CapacitySearch(target=0.9, resolution=0.1, incumbent=5.0, prune=False)
    search.record(decided_step(5.0, 0.95, "undecided", 0.88, 0.98))  # leans, but a fail lies below it
    search.record(decided_step(4.0, 0.5, "fail"))
    assert search.next_rate() == 2.0


def test_an_undecided_incumbent_is_rescued_below_it_before_it_is_pruned() -> None:
    search = CapacitySearch(target=0.9, resolution=0.1, incumbent=5.0)
    assert search.next_rate() == 5.0
    search.record(decided_step(5.0, 0.93, "undecided", 0.86, 0.96))
    assert search.next_rate() == pytest.approx(5.5)
    search.record(decided_step(5.5, 0.5, "fail"))
    assert search.next_rate() == pytest.approx(3.75)
    search.record(decided_step(3.75, 0.6, "fail"))
    assert search.next_rate() is None and search.result().pruned


# --- long answers: a request lives seconds, and the monitor must not read that as a pile-up -------


def long_answers(rate: float, until: float, life: float = 4.5, ttft: float = 0.15) -> list[dict[str, Any]]:
    """A server that keeps up: every request gets its first token in ``ttft`` and ends ``life`` after
    it was sent; those still running at ``until`` have their first token (heard live) but no end."""
    rows = []
    for i in range(int(rate * until)):
        sent = i / rate
        done = sent + life
        rows.append({**row(sent, ttft, life, tokens=512), **({"done_s": None} if done > until else {})})
    return rows


def test_the_climb_of_long_answers_is_no_saturation_and_no_collapse() -> None:
    slo = {"ttft_p95_ms": 300.0, "tpot_p95_ms": 100.0}
    for now in (6.6, 8.4, 12.0, 17.0):  # where the H200 drives were cut (capacity-check-2)
        seen = long_answers(3.17, now)
        assert cut_reason(seen, slo, 0.9, now_s=now, warmup_s=1.5) is None, now
        assert not saturated(seen, 1.5, now)
    # the same server, had the first tokens of running requests not been heard: every one past 300 ms
    blind = [{**r, "first_s": None} if r["done_s"] is None else r for r in long_answers(3.17, 8.4)]
    assert cut_reason(blind, slo, 0.9, now_s=8.4, warmup_s=1.5) == "collapsed"


def test_a_real_pile_up_of_long_answers_is_still_saturation() -> None:
    """Lifetimes that grow with the queue: the ended requests tell the climb, the rest pile up. The
    climb is read from the lifetimes that have ended, which lag a queue that grows, so a slow pile-up
    is told later than by the first requests alone, but told."""
    rows, free = [], 0.0
    for i in range(int(4.0 * 40.0)):  # 4 req/s into a server that finishes one every 0.4 s after 4 s
        sent = i / 4.0
        free = max(free, sent + 4.0) + 0.4 if i else sent + 4.0
        rows.append(row(sent, 0.15, free - sent, tokens=512))
    assert saturated(rows, 3.0, 36.0)


# --- a continuous-batching server: lifetimes grow with the batch, and in-flight wanders -----------

LOOKS_S = (8.0, 12.0, 16.0, 21.0, 27.0)  # where a 30 s step's monitor may cut


def cut_saturated(rate: float, seed: int) -> bool:
    rows = batched_rows(rate, LOOKS_S[-1] + 1.0, seed)
    return any(saturated(seen_at(rows, now), 1.5, now, min_span_s=MIN_WATCH_S) for now in LOOKS_S)


def test_a_batching_server_that_keeps_up_is_seldom_cut_as_saturated() -> None:
    """As on the H200 (capacity-check-5), where the monitor cut steps that vLLM's own client then
    carried at 1.2x: its answers of 256-768 tokens live longer as the batch grows, so in-flight climbs
    past the first requests' lifetimes and wanders. The rule before judged from the longest of the
    first requests' lifetimes over one window, and cut 4 and 10 of these 30 steps."""
    for rate in (3.0, 5.33):
        cuts = sum(cut_saturated(rate, seed) for seed in range(30))
        assert cuts <= 3, (rate, cuts)


def test_a_batching_server_that_cannot_keep_up_is_cut_as_saturated() -> None:
    """Above the server's token rate the batch grows without end. The rule of capacity check 5 waited for
    the first requests to end, which under such a load end late, and cut 1 and 0 of these 30 steps.
    Growth over each third of the window is told later than over each half, so at 15 req/s, 1.25x
    the server's rate, fewer are cut by 27 s (reports/capacity.md, "The saturation test"); a step
    not cut goes on to be judged on its whole window."""
    for rate, least in ((15.0, 15), (20.0, 24)):
        cuts = sum(cut_saturated(rate, seed) for seed in range(30))
        assert cuts >= least, (rate, cuts)


def test_a_step_waits_as_long_as_a_passing_request_can_take() -> None:
    from tuner.measure.rate_steps import CapacityPlan, StepWatch, slowest_passing_s

    plan = CapacityPlan(tiers={"interactive": {"ttft_p95_ms": 300.0, "tpot_p95_ms": 100.0},
                               "relaxed": {"ttft_p95_ms": 600.0, "tpot_p95_ms": 200.0}},
                        scored=("interactive",))  # fmt: skip
    assert slowest_passing_s(plan, 768) == pytest.approx(0.3 + 0.1 * 767)  # the longest answer, just in time
    watch = StepWatch(plan, rate=4.0, schedule_s=36.0, longest=768)
    assert watch.deadline_s == pytest.approx(36.0 + 0.3 + 0.1 * 767), "the drain lets the longest answer end"
    e2e = CapacityPlan(tiers={"interactive": {"e2e_p95_ms": 3000.0}}, scored=("interactive",))
    assert slowest_passing_s(e2e, 768) == pytest.approx(3.0)
    assert StepWatch(e2e, rate=4.0, schedule_s=36.0, longest=768).deadline_s == pytest.approx(36.0 + 6.0), (
        "never less than half a look's length (12 s here) past the last release"
    )


# --- a claim served whole: a look's early pass is confirmed before the search stops on it -----------


def _run_with_looks(
    search: CapacitySearch, early: Callable[[float], float], whole: Callable[[float], float]
) -> tuple[CapacityResult, list[float]]:
    """A server whose attainment over a look's first part is ``early`` and over the whole step ``whole``
    (the queue builds after the first look at the knee): a step passes early at a look where ``early``
    clears the target, else is served whole. Returns the result and the rates confirmed."""
    confirmed = []
    while (rate := search.next_rate()) is not None:
        if search.whole:
            confirmed += [rate] if search.confirming else []
            search.record(judged_step(rate, whole(rate), search.target))
        elif early(rate) >= search.target:
            search.record(replace(judged_step(rate, early(rate), search.target), held=False))
        else:
            search.record(judged_step(rate, whole(rate), search.target))
    return search.result(), confirmed


def test_a_claim_a_look_passed_early_is_served_whole_and_a_fail_there_lowers_it() -> None:
    # The CPU build's defaults: steps passed at their first look up to 17.4 req/s, and vLLM's own client
    # at 17.4 for the length of a whole step read 0.70 (reports/capacity.md, "Capacity you can trust").
    result, confirmed = _run_with_looks(
        CapacitySearch(start_rate=1.0, max_steps=12), knee_curve(17.4), knee_curve(12.0)
    )
    assert result.capacity_req_s <= 12.0, "the claim holds over a whole step, not only up to a look"
    assert result.capacity_req_s >= 12.0 / 1.1, "and is resolved as finely as before"
    assert confirmed and confirmed[0] > 12.0, "the first early claim was served whole, and failed"
    at = result.at_capacity()
    assert at is not None and at.held and at.passed, "the capacity stands on a step served whole"
    assert result.stop_reason == "resolved"
    failed = next(i for i, s in enumerate(result.steps) if s.held and s.rate_req_s == confirmed[0])
    assert all(s.held for s in result.steps[failed:]), "once looks misled it, every step is served whole"
    assert result.bracket_req_s[1] is not None and result.bracket_req_s[1] <= result.capacity_req_s * 1.1 + 1e-9


def test_a_claim_that_holds_costs_one_more_step_and_a_search_served_whole_none() -> None:
    early, _ = _run_with_looks(CapacitySearch(start_rate=1.0), knee_curve(13.7), knee_curve(13.7))
    whole = run(CapacitySearch(start_rate=1.0), knee_curve(13.7))
    assert early.capacity_req_s == whole.capacity_req_s
    assert len(early.steps) == len(whole.steps) + 1, "the claim, served once more, whole"
    assert [s.rate_req_s for s in early.steps[-2:]] == [early.steps[-2].rate_req_s, early.capacity_req_s]


def test_a_confirmation_is_served_past_max_steps() -> None:
    search = CapacitySearch(start_rate=1.0, max_steps=3)
    result, confirmed = _run_with_looks(search, lambda r: 1.0, lambda r: 1.0 if r <= 2.0 else 0.5)
    assert result.stop_reason == "max_steps" and confirmed == [4.0, 2.0]
    assert result.capacity_req_s == 2.0 and result.at_capacity() is not None and result.at_capacity().held  # type: ignore[union-attr]


def test_a_whole_step_read_after_another_tier_s_early_pass_that_refutes_it_serves_the_rest_whole() -> None:
    """A looser tier reads both steps a stricter tier's confirmation left at a rate, the early pass and
    the whole serving (``tuner.measure.rate_steps``); a whole serving that refutes the early pass there
    misleads it as its own confirmation would, and one that upholds it does not."""
    for whole, misled in ((0.5, True), (1.0, False)):
        search = CapacitySearch(start_rate=1.0)
        rate = search.next_rate()
        assert rate is not None
        search.record(replace(judged_step(rate, 1.0, search.target), held=False), measured=False)
        search.record(judged_step(rate, whole, search.target), measured=False)
        assert not search.confirming and search.misled is misled
        search.next_rate()
        assert search.whole is misled, "the next step is served whole once looks have misled the search"


def test_a_caller_that_cannot_serve_a_step_whole_is_asked_once() -> None:
    search = CapacitySearch(start_rate=1.0, max_steps=3)
    while (rate := search.next_rate()) is not None:
        search.record(replace(judged_step(rate, 1.0, search.target), held=False))
    result = search.result()
    assert [s.rate_req_s for s in result.steps] == [1.0, 2.0, 4.0, 4.0] and result.capacity_req_s == 4.0


def test_the_stored_record_names_the_step_served_whole_as_the_one_at_capacity() -> None:
    result, _ = _run_with_looks(CapacitySearch(start_rate=1.0), lambda r: 1.0 if r <= 8.0 else 0.5, knee_curve(8.5))
    early = [s for s in result.steps if s.rate_req_s == result.capacity_req_s]
    assert [s.held for s in early] == [False, True] and early[0].attainment != early[1].attainment
    stored = json.loads(json.dumps(result.as_dict()))
    at = step_at_capacity(stored)
    assert at is not None and at["held"] and at["attainment"] == pytest.approx(early[1].attainment)
    assert stored["steps"][stored["at_step"]] == at, "the record names the step the search decided at"
    legacy = {k: v for k, v in stored.items() if k != "at_step"}  # a record stored before at_step
    assert step_at_capacity(legacy) == at
    assert step_at_capacity({**stored, "at_step": None}) is None
    assert step_at_capacity({**stored, "at_step": len(stored["steps"])}) is None, "a malformed index names none"


@pytest.mark.parametrize(("whole", "upheld"), [(0.93, True), (0.88, False)])
def test_a_confirmation_undecided_above_the_target_upholds_the_claim_and_one_below_refutes_it(
    whole: float, upheld: bool
) -> None:
    # A step served whole near the knee is often undecided: its interval spans the target. At or above
    # the target nothing in it refutes the look's early pass, and the claim stands (on a simulated
    # server, taking it for a refutation made claims far under the knee: reports/capacity.md, "The
    # search on a known server"). Below the target it refutes the pass, as 7.54 req/s did on the H200.
    search = CapacitySearch(start_rate=1.0, max_steps=10)
    while (rate := search.next_rate()) is not None:
        if search.whole and rate == 8.0:
            search.record(replace(judged_step(rate, whole, 0.9), decision=UNDECIDED, passed=False))
        elif search.whole:
            search.record(judged_step(rate, 1.0 if rate < 8.0 else 0.0, 0.9))
        else:
            search.record(replace(judged_step(rate, 1.0 if rate <= 8.0 else 0.0, 0.9), held=rate > 8.0))
    result = search.result()
    assert (result.capacity_req_s == 8.0) is upheld and search.misled is not upheld
    assert result.capacity_req_s >= 8.0 / 1.1 - 1e-9 or not upheld
    assert [s.rate_req_s for s in result.steps].count(8.0) == 2, "the claim was served again, whole"

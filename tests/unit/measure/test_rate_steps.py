"""The capacity search's steps: which requests a step sends, and how tiers share measured steps."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from tuner.errors import WorkloadError
from tuner.measure import rate_steps
from tuner.measure.capacity import (
    FAIL,
    SATURATED,
    SATURATION_EVERY_S,
    SLO_KEYS,
    attainment_interval,
    cut_reason,
    decide,
    outcomes_in,
    resolved_until,
    saturation_due,
    summarize_step,
)
from tuner.measure.rate_steps import CapacityPlan, Measured, judge_served, search_capacity, seen_at, step_requests
from tuner.measure.supply import RequestSupply
from tuner.search.resolve import GPU_STEPS
from tuner.workloads import build_workload
from tuner.workloads.base import Request

STRICT = {"ttft_p95_ms": 200.0, "tpot_p95_ms": 6.0}
RELAXED = {"ttft_p95_ms": 1000.0, "tpot_p95_ms": 20.0}


def _pool(n: int, session_every: int = 0) -> list[Request]:
    out = []
    for i in range(n):
        session = f"s{i // session_every}" if session_every else None
        out.append(
            Request(
                f"r{i}", "/v1/completions", {"prompt": "x"}, 10, 8, session_id=session, turn=i % max(session_every, 1)
            )
        )
    return out


def _plan(**kw: object) -> CapacityPlan:
    base: dict[str, object] = {"tiers": {"interactive": STRICT, "relaxed": RELAXED}, "scored": ("interactive",)}
    return CapacityPlan(**{**base, **kw})  # type: ignore[arg-type]


def test_a_step_takes_distinct_requests_from_a_finite_pool_and_says_how_many_it_replayed() -> None:
    plan = _plan(min_requests=10, min_step_s=10.0, step_limit=1)
    supply = RequestSupply(_pool(4))
    steps, replayed = step_requests(supply, rate=3.0, plan=plan)
    assert len(steps) == 30  # 3 req/s for 10 s is more than the 10 requests asked for
    assert replayed == 26, "a pool of 4 holds 4 of the 30; the rest are replays, and the step says so"
    assert len({r.request_id for r in steps}) == 30, "a replayed request must not share its id with its first pass"
    assert [r.request_id for r in steps[:8]] == ["r0", "r1", "r2", "r3", "r0~1", "r1~1", "r2~1", "r3~1"]
    times = [r.arrival_s for r in steps]
    assert all(t is not None for t in times) and times == sorted(times)
    assert math.isclose(max(t for t in times if t is not None), 30 / 3.0, rel_tol=0.05)


def test_a_step_asks_for_enough_requests_for_every_look() -> None:
    plan = _plan(min_requests=10, min_step_s=10.0, step_limit=3)
    steps, _ = step_requests(RequestSupply(_pool(100)), rate=2.0, plan=plan)
    assert len(steps) == 60  # three looks of 10 s at 2 req/s


def test_a_session_is_released_once_and_keeps_its_turns_in_order() -> None:
    plan = _plan(min_requests=12, min_step_s=1.0, step_limit=1)
    steps, _ = step_requests(RequestSupply(_pool(6, session_every=3)), rate=1.0, plan=plan)
    sessions: dict[str | None, list[Request]] = {}
    for r in steps:
        sessions.setdefault(r.session_id, []).append(r)
    assert len(sessions) == 4 and all(len(turns) == 3 for turns in sessions.values())
    for turns in sessions.values():
        assert turns[0].arrival_s is not None and all(t.arrival_s is None for t in turns[1:])


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    def times(seed: int) -> list[float | None]:
        return [r.arrival_s for r in step_requests(RequestSupply(_pool(5)), 2.0, _plan(seed=seed))[0]]

    assert times(1) == times(1) and times(1) != times(2)


def test_a_supply_never_hands_a_request_out_twice_and_takes_back_what_was_never_released() -> None:
    grown: list[int] = []

    def grow(n: int) -> list[Request]:
        grown.append(n)
        return _pool(n)

    supply = RequestSupply(_pool(4), grow)
    first, _ = supply.take(3)
    second, replayed = supply.take(10)
    ids = [u[0].request_id for u in first + second]
    assert ids == [f"r{i}" for i in range(13)] and replayed == 0 and grown, "a preset grows instead of cycling"
    supply.give_back(4)  # the step was decided before its last four were released
    third, _ = supply.take(2)
    assert [u[0].request_id for u in third] == ["r9", "r10"]


def test_a_workload_that_does_not_grow_by_appending_is_refused() -> None:
    supply = RequestSupply(_pool(4), lambda n: [replace(r, body={"prompt": "other"}) for r in _pool(n)])
    with pytest.raises(WorkloadError, match="did not grow by appending"):
        supply.take(10)


def test_a_preset_grows_by_appending_so_no_request_repeats_within_a_search(tokenizer: Tokenizer) -> None:
    """The real rag preset, grown by a search's steps: every prompt sent is sent once."""
    workload = build_workload("rag", tokenizer, seed=0, n_requests=8, max_model_len=2048, rate=1.0)
    supply = RequestSupply.of(workload)
    plan = _plan(min_requests=10, min_step_s=4.0, step_limit=2)
    sent: list[Request] = []
    for rate in (1.0, 2.0, 4.0, 2.83):
        requests, replayed = step_requests(supply, rate, plan)
        assert replayed == 0
        sent += requests
    prompts = [r.body["prompt"] for r in sent]
    assert len(sent) > 4 * len(workload.requests) and len(set(prompts)) == len(prompts)
    assert [r.body for r in sent[:8]] == [r.body for r in workload.requests], "the study's pool comes first"


def _measured_at(rate: float, knee_strict: float, knee_relaxed: float) -> Measured:
    """Forty requests whose latency grows with the rate: strict fails above one knee, relaxed above another."""
    ttft = 100.0 if rate <= knee_strict else 500.0 if rate <= knee_relaxed else 3000.0
    rows = [{"sent_s": i * 0.25, "first_s": i * 0.25 + ttft / 1e3, "done_s": i * 0.25 + ttft / 1e3 + 0.3,
             "output_tokens": 101, "prompt_tokens": 10, "error": None} for i in range(40)]  # fmt: skip
    return Measured(rate, rows, [], 10.0)


def test_tiers_share_the_steps_they_both_need() -> None:
    calls: list[float] = []

    def measure(rate: float) -> Measured:
        calls.append(rate)
        return _measured_at(rate, knee_strict=2.0, knee_relaxed=8.0)

    plan = _plan(scored=("interactive", "relaxed"), start_rate=1.0, resolution=0.5)
    out = search_capacity(measure, plan)
    assert 2.0 / 1.5 <= out.results["interactive"].capacity_req_s <= 2.0
    assert 8.0 / 1.5 <= out.results["relaxed"].capacity_req_s <= 8.0
    assert len(calls) == len(set(calls)), "a rate is measured once, whichever tiers judge it"
    assert len(out.measured) == len(calls)
    assert out.as_dict(plan)["tiers"]["relaxed"]["slo"] == RELAXED


def test_steps_another_tier_measured_do_not_count_against_max_steps() -> None:
    """The H200 block's vLLM default: the relaxed search reused 7 of the interactive tier's steps
    and stopped at the step limit unresolved (128 passed, 181 failed)."""
    calls: list[float] = []

    def measure(rate: float) -> Measured:
        calls.append(rate)
        return _measured_at(rate, knee_strict=32.0, knee_relaxed=150.0)

    plan = _plan(scored=("interactive", "relaxed"), start_rate=1.0, resolution=0.1, max_steps=10)
    out = search_capacity(measure, plan)
    relaxed = out.results["relaxed"]
    assert relaxed.stop_reason == "resolved", relaxed.stop_reason
    assert 150.0 / 1.1 <= relaxed.capacity_req_s <= 150.0
    reused = sum(1 for s in relaxed.steps if s.rate_req_s <= 32.0)
    assert reused >= 6 and len(relaxed.steps) > plan.max_steps, "reused steps came free"
    assert len(calls) - len(out.results["interactive"].steps) <= plan.max_steps, "its own steps stay bounded"


def test_a_step_the_monitor_cut_never_passes_and_says_when_it_was_cut() -> None:
    def measure(rate: float) -> Measured:
        m = _measured_at(rate, knee_strict=2.0, knee_relaxed=100.0)
        cut = rate > 4.0
        return replace(m, aborted=cut, cut_reason="saturated" if cut else None, duration_s=6.8 if cut else m.duration_s)

    said: list[str] = []
    plan = _plan(scored=("interactive", "relaxed"), start_rate=1.0, resolution=0.5)
    out = search_capacity(measure, plan, said=lambda tier, m, verdict: said.append(f"{tier} {m.rate_req_s} {verdict}"))
    cut = [s for s in out.results["relaxed"].steps if s.rate_req_s > 4.0]
    assert cut and all(not s.passed and s.cut_s == 6.8 and s.cut_reason == "saturated" for s in cut)
    assert all(s.attainment >= 0.9 for s in cut), "what was served met the SLO: the cut alone fails it"
    assert 4.0 / 1.5 <= out.results["relaxed"].capacity_req_s <= 4.0
    assert any("(cut at 7 s: saturated)" in line for line in said), said
    uncut = [s for s in out.results["relaxed"].steps if s.rate_req_s <= 4.0]
    assert all(s.cut_s is None and s.cut_reason is None for s in uncut) and "cut_reason" in uncut[0].as_dict()


def test_an_unscored_tier_costs_no_step() -> None:
    out = search_capacity(lambda r: _measured_at(r, 2.0, 8.0), _plan(scored=("interactive",), resolution=0.5))
    assert set(out.results) == {"interactive"}


def test_a_config_far_below_the_incumbent_is_pruned_in_two_steps_and_a_repeat_is_not() -> None:
    plan = _plan(resolution=0.1)
    pruned = search_capacity(lambda r: _measured_at(r, 1.0, 2.0), plan, incumbents={"interactive": 8.0})
    assert pruned.results["interactive"].pruned and len(pruned.measured) == 2
    kept = search_capacity(lambda r: _measured_at(r, 1.0, 2.0), plan, incumbents={"interactive": 8.0}, prune=False)
    assert not kept.results["interactive"].pruned
    assert 1.0 / 1.1 <= kept.results["interactive"].capacity_req_s <= 1.0


@pytest.mark.parametrize("key", SLO_KEYS)
def test_every_slo_key_can_bound_a_tier(key: str) -> None:
    plan = _plan(tiers={"interactive": {key: 1e6}}, resolution=1.0, max_rate=4.0)
    out = search_capacity(lambda r: _measured_at(r, 2.0, 8.0), plan)
    assert out.results["interactive"].capacity_req_s == 4.0


def test_a_cancel_of_the_step_itself_is_not_swallowed_with_the_monitors_own_cut() -> None:
    """Ctrl-C reaches asyncio as a cancel of the main task; it must not be lost when it arrives just
    as the monitor cuts the step (the step would end as if nothing happened and the study go on)."""

    async def main() -> None:
        async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(1 << 16)
            await asyncio.sleep(60)  # a server that never answers

        server = await asyncio.start_server(hang, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        requests = [Request(f"r{i}", "/v1/completions", {"prompt": "x"}, 10, 8, arrival_s=0.0) for i in range(3)]
        outer = asyncio.current_task()
        assert outer is not None

        def cut_and_interrupt(rows: object, now: float) -> bool:
            outer.cancel()  # the interrupt lands while the monitor is cutting the step
            return True

        async with server:
            with pytest.raises(asyncio.CancelledError):
                await rate_steps._serve_step(f"http://127.0.0.1:{port}", "m", requests, 30.0, cut_and_interrupt)
            outer.uncancel()

    asyncio.run(main())


# --- a look's sample: the H200 step of capacity check 7 ----------------------------------------------

CHECK7 = Path(__file__).resolve().parents[2] / "data" / "captures" / "vllm-0.26-h200-capacity-check-7"


def _captured_step(drive: str, rate: float) -> tuple[CapacityPlan, list[dict[str, Any]], float]:
    """The GPU plan under the drive's own tier, and the rows and duration of its step at ``rate``."""
    data = json.loads((CHECK7 / drive).read_text())["capacity"]
    slo = data["tiers"]["interactive"]["slo"]
    plan = CapacityPlan(tiers={"interactive": slo}, scored=("interactive",), **GPU_STEPS)
    step = next(m for m in data["measured"] if round(m["rate_req_s"], 2) == rate)
    return plan, [dict(zip(rate_steps.ROW_FIELDS, row, strict=True)) for row in step["rows"]], step["duration_s"]


def test_a_look_does_not_decide_on_the_few_outcomes_one_burst_left_known() -> None:
    # Drive 1 failed its 6.92 req/s step at the first look, 15 s in: 50 % [20 %, 80 %] over 6 requests,
    # the 3 misses from one burst just after the warm-up. Drive 2, on the same boot, served the same rate
    # for its whole 52 s and passed it at 0.96.
    plan, rows, duration = _captured_step("drive_defaults_1.json", 6.92)
    assert duration == pytest.approx(15.0, abs=0.1)
    # the requests still running at the cut had had their first token (a look counts a running request
    # without one, past the TTFT bound, as a miss); with that, the look below is the one the drive logged
    at_look = [{**r, "first_s": r["sent_s"] + 0.1} if r["done_s"] is None else r for r in rows]
    looks = rate_steps.Looks(plan, 6.92, [])
    end = resolved_until(at_look, plan.tiers["interactive"], looks.warmup_s, 15.0)
    outcomes = outcomes_in(at_look, plan.tiers["interactive"], looks.warmup_s, end)
    assert (len(outcomes), sum(outcomes)) == (6, 3), "the drive's log: 50 % over the 6 requests it knew"
    assert decide(*attainment_interval(outcomes, plan.z), plan.target) == FAIL, "alone, they fail the step"
    assert looks(at_look, 15.0) is None and looks.taken == 0, "fewer than min_requests: no look yet"
    _, passed, _ = _captured_step("drive_defaults_2.json", 6.92)
    whole = outcomes_in(passed, plan.tiers["interactive"], looks.warmup_s, 0.9 * 52.5)
    assert len(whole) >= plan.min_requests and sum(whole) / len(whole) > plan.target


def _early_on_time_rows(rate: float) -> list[dict[str, Any]]:
    """A step at ``rate`` seen 6 s in: the requests of its first 2 s ended on time, the rest still run."""
    rows = []
    for i in range(int(rate * 6)):
        sent = i / rate
        done = sent + 0.3 if sent < 2.0 else None
        rows.append({"sent_s": sent, "first_s": sent + 0.05, "done_s": done, "output_tokens": 101, "error": None})
    return rows


@pytest.mark.parametrize(("waiting", "decided"), [((0, 0, 5, 15, 30, 50), False), ((0, 0, 0, 1, 0, 0), True)])
def test_a_pass_at_a_look_needs_a_queue_that_did_not_grow_up_to_the_look(
    waiting: tuple[int, ...], decided: bool
) -> None:
    # The CPU build at 32 req/s: the requests counted at the first look (those sent before the first one
    # still running) had all ended on time, while the server's queue built up behind them after the last
    # of them was sent; the step passed where two drives before had failed it.
    plan = _plan(tiers={"interactive": RELAXED}, min_step_s=6.0, min_requests=12, step_limit=2, confidence=0.6)
    queue = [(float(t), float(n)) for t, n in enumerate(waiting, start=1)]
    looks = rate_steps.Looks(plan, 32.0, queue)
    assert looks(_early_on_time_rows(32.0), 6.0) == (rate_steps.DECIDED if decided else None)
    assert looks.decided_s == (6.0 if decided else None)
    assert looks.queue_growing(2.0) is False, "over the counted sends alone the queue shows no growth"


# --- a wander of in-flight: the H200 step of capacity check 8 --------------------------------------

CHECK8 = Path(__file__).resolve().parents[2] / "data" / "captures" / "vllm-0.26-h200-capacity-check-8"


def _boot_a_step() -> tuple[CapacityPlan, list[dict[str, Any]], float]:
    """The vLLM defaults' 5.33 req/s step on a fresh boot, as its monitor saw it. The drive then kept
    no first token for a request still running at the cut; the monitor had heard them (it cut for
    saturation, not for a collapse, which a running request past the TTFT bound would have been), and
    the finished requests' TTFT p95 was under the bound, so each is given one 150 ms after its send
    (reports/gpu-h200/capacity-check-8/NOTES.md)."""
    data = json.loads((CHECK8 / "drive_defaults_boot_a.json").read_text())["capacity"]
    slo = data["tiers"]["interactive"]["slo"]
    plan = CapacityPlan(tiers={"interactive": slo}, scored=("interactive",), **GPU_STEPS)
    step = next(m for m in data["measured"] if round(m["rate_req_s"], 2) == 5.33)
    rows = [dict(zip(rate_steps.ROW_FIELDS, row, strict=True)) for row in step["rows"]]
    return plan, [{**r, "first_s": r["sent_s"] + 0.15} if r["done_s"] is None else r for r in rows], step["duration_s"]


def test_a_wander_of_in_flight_is_judged_every_few_seconds_not_at_every_tick() -> None:
    # Judged at every tick, the monitor cut this step at 24.3 s as saturated. On the next boot the same
    # requests at the same rate passed, and vLLM's own client carried higher rates on
    # the same config at capacity checks 5 and 7 (reports/gpu-h200/capacity-check-8/NOTES.md).
    plan, rows, duration = _boot_a_step()
    assert duration == pytest.approx(24.3, abs=0.1)
    slo = plan.tiers["interactive"]
    ticks = [rate_steps.MONITOR_EVERY_S * i for i in range(1, int(duration / rate_steps.MONITOR_EVERY_S) + 1)]
    warmup = rate_steps.Looks(plan, 5.33, []).warmup_s
    every_tick = [t for t in ticks if cut_reason(seen_at(rows, t), slo, plan.target, t, warmup) is not None]
    assert every_tick and every_tick[0] >= 24.0, "the drive's own cut, replayed"
    watch = rate_steps.StepWatch(plan, 5.33, schedule_s=45.0, longest=1024)
    assert all(watch(seen_at(rows, t), t) is None for t in ticks), "judged every 5 s: no cut, no look decided"


def test_the_monitor_judges_saturation_only_at_multiples_of_its_period() -> None:
    assert saturation_due(4.9, 5.1) and saturation_due(9.75, 10.0) and not saturation_due(10.0, 10.25)
    plan = _plan(tiers={"interactive": RELAXED}, min_step_s=15.0, min_requests=40, step_limit=3)
    # in-flight piles up: a request every 0.05 s, and one ends every 0.1 s after the first second
    rows = [{"sent_s": i * 0.05, "first_s": i * 0.05 + 0.01, "done_s": None, "output_tokens": 0, "error": None}
            for i in range(600)]  # fmt: skip
    for i, row in enumerate(rows[:200]):
        row.update(done_s=1.0 + i * 0.1, output_tokens=10)
    watch = rate_steps.StepWatch(plan, 20.0, schedule_s=30.0, longest=10)
    cuts = [t for t in (0.25 * i for i in range(1, 100)) if watch(seen_at(rows, t), t) == SATURATED]
    assert cuts and all(t % SATURATION_EVERY_S == 0 for t in cuts), cuts
    assert any(cut_reason(seen_at(rows, t), RELAXED, 0.9, t, 1.5) == SATURATED for t in (8.25, 8.5, 8.75, 9.25))


def test_a_cut_step_counts_the_requests_whose_outcome_was_known_at_the_cut() -> None:
    # the same step, had the monitor cut it where it did: counted up to the cut, the requests still
    # running (with their first token, well inside both bounds) read as misses, as the drive recorded
    plan, rows, duration = _boot_a_step()
    watch = rate_steps.StepWatch(plan, 5.33, schedule_s=45.0, longest=1024)
    measured = watch.ended(seen_at(rows, duration), [], duration, SATURATED)
    assert measured.aborted and measured.cut_reason == SATURATED
    slo = plan.tiers["interactive"]
    known = summarize_step(5.33, measured.rows, slo, plan.target, duration, window_s=measured.window_s, z=plan.z)
    to_cut = summarize_step(5.33, measured.rows, slo, plan.target, duration, window_s=(watch.looks.warmup_s, duration))
    assert to_cut.attainment < 0.6 < plan.target < known.attainment and known.n_counted >= 40
    decided = watch.ended(seen_at(rows, duration), [], duration, None)
    assert decided.window_s is not None and decided.window_s[1] > measured.window_s[1], "a step not cut: unchanged"


def test_the_first_tokens_of_requests_still_running_at_a_cut_are_kept() -> None:
    async def main() -> tuple[list[Any], dict[str, float]]:
        async def first_then_hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(1 << 16)
            chunk = json.dumps({"choices": [{"index": 0, "text": "a"}]})
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + f"data: {chunk}\n\n".encode())
            await writer.drain()
            await asyncio.sleep(30)

        server = await asyncio.start_server(first_then_hang, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        requests = [Request("r0", "/v1/completions", {"prompt": "x"}, 10, 8, arrival_s=0.0)]

        def cut_once_heard(rows: list[dict[str, Any]], now: float) -> str | None:
            return SATURATED if rows and rows[0]["first_s"] is not None else None

        async with server:
            records, started, ended, reason, firsts = await rate_steps._serve_step(
                f"http://127.0.0.1:{port}", "m", requests, 10.0, cut_once_heard
            )
        assert reason == SATURATED and not records
        return rate_steps._rows(records, requests, started, ended - started, firsts), firsts

    rows, firsts = asyncio.run(main())
    assert set(firsts) == {"r0"} and rows[0]["done_s"] is None and rows[0]["first_s"] is not None


def test_an_interrupted_search_keeps_what_it_judged_only_when_asked() -> None:
    calls: list[float] = []

    def measure(rate: float) -> Measured:
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C, or SIGTERM as the CLI turns it, while the third step serves
        calls.append(rate)
        return _measured_at(rate, knee_strict=32.0, knee_relaxed=150.0)

    plan = _plan(scored=("interactive", "relaxed"), start_rate=1.0, resolution=0.1)
    out = search_capacity(measure, plan, keep_on_interrupt=True)
    assert out.interrupted and out.as_dict(plan)["interrupted"] is True
    assert set(out.results) == {"interactive"}, "the tier being searched; the next one never started"
    found = out.results["interactive"]
    assert found.stop_reason == "interrupted" and [s.rate_req_s for s in found.steps] == calls
    assert found.capacity_req_s == max(calls) and len(out.measured) == 2
    calls.clear()
    with pytest.raises(KeyboardInterrupt):  # a trial's search: the trial must be marked failed
        search_capacity(measure, plan)
    assert search_capacity(lambda r: _measured_at(r, 32.0, 150.0), plan).interrupted is False


def test_a_step_served_whole_is_passed_by_no_look_but_failed_by_one() -> None:
    plan = _plan(tiers={"interactive": RELAXED}, min_step_s=6.0, min_requests=12, step_limit=2, confidence=0.6)
    on_time = _early_on_time_rows(32.0)
    assert rate_steps.Looks(plan, 32.0, [])(on_time, 6.0) == rate_steps.DECIDED, "a look passes it early"
    assert rate_steps.Looks(plan, 32.0, [], hold=True)(on_time, 6.0) is None, "served whole: no early pass"
    late = [{**r, "first_s": r["sent_s"] + 5.0} if r["done_s"] is not None else r for r in on_time]
    assert rate_steps.Looks(plan, 32.0, [], hold=True)(late, 6.0) == rate_steps.DECIDED, "a fail still ends it"
    watch = rate_steps.StepWatch(plan, 32.0, schedule_s=12.0, longest=101)
    assert watch(on_time, 6.0) == rate_steps.DECIDED
    assert watch.ended(on_time, [], 6.0, rate_steps.DECIDED).held is False
    assert watch.ended(on_time, [], 12.0, None).held is True


def test_a_claim_passed_at_a_look_is_served_again_whole_and_both_steps_are_kept() -> None:
    calls: list[tuple[float, bool]] = []

    def measure(rate: float, hold: bool = False) -> Measured:
        calls.append((rate, hold))
        # a look passes rates up to 6 req/s early; served whole, only those up to 4 pass
        m = _measured_at(rate, knee_strict=4.0 if hold else 6.0, knee_relaxed=100.0)
        return replace(m, held=hold or rate > 6.0)

    said: list[str] = []
    plan = _plan(scored=("interactive",), start_rate=1.0, resolution=0.5)
    out = search_capacity(measure, plan, said=lambda tier, m, verdict: said.append(verdict))
    found = out.results["interactive"]
    assert 4.0 / 1.5 <= found.capacity_req_s <= 4.0, "the claim is where a whole step holds"
    assert calls[:4] == [(1.0, False), (2.0, False), (4.0, False), (8.0, False)]
    assert (4.0, True) in calls, "the early claim at 4 req/s was served again, whole"
    assert len(out.measured) == len(calls), "every step served is kept, the early one and the whole one"
    at = found.at_capacity()
    assert at is not None and at.held
    assert any("served whole to confirm the claim" in line for line in said), said


def test_a_looser_tier_reads_the_early_pass_a_stricter_tier_s_claim_stood_on() -> None:
    """The H100 study's SGLang defaults (block 16): the interactive tier claimed a rate a look passed
    early and the same rate served whole upheld (undecided, at or above the target); the relaxed tier
    read only the whole serving, undecided, and claimed a rung less from the same steps. Every tier
    now reads both, so the looser tier claims at least what the stricter one does."""
    calls: list[tuple[float, bool]] = []

    def measure(rate: float, hold: bool = False) -> Measured:
        calls.append((rate, hold))
        if rate > 6.0:  # too much for either tier
            return replace(_measured_at(rate, 0.0, 0.0), held=True)
        m = _measured_at(rate, knee_strict=100.0, knee_relaxed=100.0)
        if rate <= 4.0 or not hold:
            return replace(m, held=hold or rate <= 4.0)  # up to 4 req/s every step holds; above, a look passes it
        # served whole above 4 req/s: one request in thirteen misses both tiers' TTFT bound
        rows = [{**r, "first_s": r["sent_s"] + 3.0} if i % 13 == 6 else r for i, r in enumerate(m.rows)]
        return replace(m, rows=rows, held=True)

    plan = _plan(scored=("interactive", "relaxed"), start_rate=1.0, resolution=0.5)
    said: list[str] = []
    out = search_capacity(measure, plan, said=lambda tier, m, verdict: said.append(f"{tier} {m.rate_req_s} {verdict}"))
    interactive, relaxed = out.results["interactive"], out.results["relaxed"]
    whole = [m for m in out.measured if m.held and 4.0 < m.rate_req_s <= 6.0]
    assert len(whole) == 1, "one rate above 4 req/s was confirmed, served whole"
    for slo in (STRICT, RELAXED):
        judged = judge_served(whole[0], slo, plan)
        assert not judged.passed and judged.attainment >= plan.target, "undecided, leaning to a pass"
    assert interactive.capacity_req_s == whole[0].rate_req_s, "the early pass, upheld by the whole step"
    assert relaxed.capacity_req_s >= interactive.capacity_req_s
    assert [s.held for s in relaxed.steps if s.rate_req_s == whole[0].rate_req_s] == [False, True]
    assert len(calls) == len(set(calls)), "no rate served again for the looser tier"
    early = [line for line in said if line.endswith(", decided early by a look")]
    assert early == [f"relaxed {whole[0].rate_req_s} 100% [91%, 100%] pass, decided early by a look"], said


def test_a_step_a_look_stopped_is_judged_over_the_look_s_window_not_the_steady_one() -> None:
    """A look decided the step at 6 s and stopped it: the requests sent in its last second were still
    running, unfinished. ``judge_served`` (the search's judgement, and the benchmarks' fixed ladders')
    counts the look's window, where every request met the SLO; the default steady window would count
    the unfinished ones as misses and fail a step that passed (the heavy CPU table's climbs stopped
    on such fails)."""
    plan = CapacityPlan(tiers={"interactive": {"ttft_p95_ms": 1000.0}}, scored=("interactive",), min_requests=10)
    rows = [{"sent_s": i * 0.1, "first_s": i * 0.1 + 0.05, "done_s": i * 0.1 + 0.3, "output_tokens": 8,
             "prompt_tokens": 100, "error": None} for i in range(50)]  # fmt: skip
    rows += [{"sent_s": 5.0 + i * 0.1, "first_s": None, "done_s": None, "output_tokens": 0, "prompt_tokens": 100,
              "error": None} for i in range(10)]  # fmt: skip
    stopped = Measured(4.0, rows, [], 6.0, window_s=(0.5, 4.9), looks=1, held=False)
    slo = plan.tiers["interactive"]
    judged = rate_steps.judge_served(stopped, slo, plan)
    assert judged.passed and judged.attainment == 1.0 and judged.window_s == (0.5, 4.9) and not judged.held
    steady = summarize_step(4.0, rows, slo, plan.target, 6.0, z=plan.z)
    assert not steady.passed and steady.attainment < plan.target, "unfinished requests count as misses there"
    cut = rate_steps.judge_served(replace(stopped, aborted=True, cut_reason="saturated"), slo, plan)
    assert not cut.passed and cut.cut_reason == "saturated" and cut.cut_s == 6.0


def test_a_simulated_step_is_watched_by_a_real_step_s_looks_and_its_waiting_queue() -> None:
    """``watch_offline``: a step whose every time is known stops at the look that passes it, unless the
    waiting queue it reports keeps growing (then it serves on and fails), or it is held whole."""
    plan = _plan(tiers={"interactive": RELAXED}, min_step_s=6.0, min_requests=12, step_limit=2)
    # 10 req/s for 12 s, every answer quick and on time: the latencies alone pass it at the first look
    rows = [{"sent_s": i * 0.1, "first_s": i * 0.1 + 0.05, "done_s": i * 0.1 + 0.15, "output_tokens": 8, "error": None}
            for i in range(120)]  # fmt: skip
    early = rate_steps.watch_offline(plan, 10.0, rows)
    assert not early.held and early.duration_s == pytest.approx(plan.look_s(10.0), abs=0.5)
    assert judge_served(early, RELAXED, plan).passed
    # the same answers while the server's queue rises by 3 requests a second: no look passes it
    rising = [(0.5 * i, 1.5 * i) for i in range(30)]
    queued = rate_steps.watch_offline(plan, 10.0, rows, rising)
    assert queued.held and queued.queue_growing and not judge_served(queued, RELAXED, plan).passed
    held = rate_steps.watch_offline(plan, 10.0, rows, hold=True)
    assert held.held and held.duration_s > 11.0 and judge_served(held, RELAXED, plan).passed

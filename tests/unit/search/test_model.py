"""The performance model (``tuner.search.model``) on synthetic engines whose true costs are known.

The simulator is checked against schedules worked out by hand (budget, sequence limit, KV pool,
prefix cache, speculation); the fit must recover the costs that generated its data; the prediction
must land near the capacity those true costs give; and what the study never measured (a draft never
booted, an engine never booted) must come out as a range or as unknown, never as a point.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest
from tokenizers import Tokenizer

from tuner.engines.base import Device
from tuner.engines.sglang import SglangAdapter
from tuner.engines.speculation import proposer_of
from tuner.engines.vllm import VllmAdapter
from tuner.measure.rate_steps import CapacityPlan, Measured
from tuner.search.model import fit as fit_module
from tuner.search.model.fit import Fit, ObservedStep, fit_costs, nnls
from tuner.search.model.history import Served, computed_prompts, speculation
from tuner.search.model.predict import EngineModel, Prediction, bisect_capacity, expected_improvement, model_sigma
from tuner.search.model.requests import GROWTH_CAP, Shape, StudyRequests
from tuner.search.model.simulate import Limits, Speculation, Work, acceptance_of, simulate
from tuner.workloads import build_workload
from tuner.workloads.inspection import BLOCK_TOKENS

UNIT = np.array([1.0, 0.0, 0.0, 0.0])  # one second per iteration, nothing else: schedules read as counts
TRUE = np.array([0.012, 3e-4, 2e-3, 0.05])  # iteration, token, sequence, attention (s)
TRUE_DRAFT = (0.004, 5e-5)
OVERHEAD = 0.03
CPU = Device("cpu", "cpu", 2**30)
PLAN = CapacityPlan(
    tiers={"interactive": {"ttft_p95_ms": 800.0, "tpot_p95_ms": 40.0}, "relaxed": {"ttft_p95_ms": 3000.0}},
    scored=("interactive", "relaxed"), start_rate=0.5, min_step_s=6.0, min_requests=24, step_limit=1,
    confidence=0.5,
)  # fmt: skip


def test_a_prompt_longer_than_the_budget_is_prefilled_in_chunks() -> None:
    line = simulate([Work(0.0, 1000, 5)], Limits(256, None, None), UNIT)[0]
    assert line.first_s == 4.0  # ceil(1000 / 256) iterations, the last one samples the first token
    assert line.done_s == 8.0  # then one iteration per further token


def test_the_sequence_limit_serialises_requests() -> None:
    lines = simulate([Work(0.0, 10, 3), Work(0.0, 10, 3)], Limits(None, 1, None), UNIT)
    assert (lines[0].first_s, lines[0].done_s) == (1.0, 3.0)
    assert (lines[1].first_s, lines[1].done_s) == (4.0, 6.0)  # admitted only once the first left
    together = simulate([Work(0.0, 10, 3), Work(0.0, 10, 3)], Limits(None, 2, None), UNIT)
    assert together[1].done_s == 3.0


def test_a_closed_loop_sends_each_next_request_the_moment_one_ends() -> None:
    """One client: each request is sent when the one before ends, so with one iteration per token
    request i ends after all the tokens up to it. Open loop, the same works all arrive at once."""
    works = [Work(0.0, 10, n) for n in (3, 5, 2, 4)]
    lines = simulate(works, Limits(None, None, None), UNIT, concurrency=1)
    ends = [3.0, 8.0, 10.0, 14.0]
    assert [t.done_s for t in lines] == ends
    assert [t.sent_s for t in lines] == [0.0, *ends[:-1]]
    assert [t.first_s for t in lines] == [1.0, 4.0, 9.0, 11.0]
    assert [t.sent_s for t in simulate(works, Limits(None, None, None), UNIT)] == [0.0] * 4


@pytest.mark.parametrize("prefill_first", [False, True])
def test_a_closed_loop_never_holds_more_requests_than_its_clients(prefill_first: bool) -> None:
    rng = random.Random(3)
    works = [Work(0.0, rng.randint(20, 400), rng.randint(2, 30)) for _ in range(40)]
    lines = simulate(works, Limits(128, 8, 4096, prefill_first), TRUE, concurrency=4)
    assert all(t.sent_s is not None and t.done_s is not None for t in lines)
    sent = [float(t.sent_s or 0.0) for t in lines]
    assert sent == sorted(sent) and sent[:4] == [0.0] * 4
    ends = sorted(float(t.done_s or 0.0) for t in lines)
    for i, at in enumerate(sent[4:]):
        assert at == ends[i]  # the (i + 1)-th request to end frees the client that sends request i + 4
    for at in sent:
        in_flight = sum(1 for t, s in zip(lines, sent, strict=True) if s <= at < float(t.done_s or 0.0))
        assert in_flight <= 4


def test_prefill_first_makes_the_decoding_requests_wait_for_a_new_prompt() -> None:
    works = [Work(0.0, 10, 4), Work(1.5, 10, 2)]
    mixed = simulate(works, Limits(None, None, None), UNIT)
    alone = simulate(works, Limits(None, None, None, prefill_first=True), UNIT)
    # mixed (vLLM): the first request decodes in the iteration that prefills the second
    assert (mixed[0].done_s, mixed[1].first_s, mixed[1].done_s) == (4.0, 3.0, 4.0)
    # prefill first (SGLang): the second's prefill runs alone, and the first waits one iteration
    assert (alone[0].done_s, alone[1].first_s, alone[1].done_s) == (5.0, 3.0, 4.0)


def test_prefill_first_decodes_every_running_request_whatever_the_token_budget() -> None:
    works = [Work(0.0, 1, 3) for _ in range(4)]
    mixed = simulate(works, Limits(2, None, None), UNIT)
    alone = simulate(works, Limits(2, None, None, prefill_first=True), UNIT)
    # the budget holds two prompts an iteration; vLLM's decodes spend it too, so the last two wait
    assert [line.done_s for line in mixed] == [3.0, 3.0, 6.0, 6.0]
    # SGLang admits all four first (two prefill iterations), then decodes them together
    assert [line.first_s for line in alone] == [1.0, 1.0, 2.0, 2.0]
    assert [line.done_s for line in alone] == [4.0, 4.0, 4.0, 4.0]


def test_a_full_kv_pool_keeps_the_next_request_waiting() -> None:
    lines = simulate([Work(0.0, 96, 4), Work(0.0, 96, 4)], Limits(None, 8, 112), UNIT)
    assert lines[0].done_s == 4.0
    assert lines[1].first_s is not None and lines[1].first_s > lines[0].done_s


def test_the_prefix_cache_spares_what_an_earlier_request_computed() -> None:
    token = np.array([0.0, 1e-3, 0.0, 0.0])
    shared = (1, 2, 3)  # three blocks of 16 tokens in common
    lines = simulate([Work(0.0, 64, 1, (*shared, 4)), Work(10.0, 64, 1, (*shared, 5))], Limits(None, 8, None), token)
    assert lines[0].first_s == pytest.approx(0.064)
    assert lines[1].first_s == pytest.approx(10.0 + 0.016)  # only its own last block
    cold = simulate([Work(0.0, 64, 1, (*shared, 4)), Work(0.0, 64, 1, (*shared, 5))], Limits(None, 8, None), token)
    assert cold[1].first_s == pytest.approx(0.128)  # arriving together, nothing was cached yet


def test_a_prefix_that_running_requests_share_takes_its_pool_blocks_once() -> None:
    shared = (1, 2, 3)  # one request's first token makes its prompt's blocks a prefix others hit
    pool = 6 * BLOCK_TOKENS  # the first's five blocks and the second's own one, not its prefix again
    lines = simulate([Work(0.0, 64, 4, (*shared, 4)), Work(0.5, 64, 1, (*shared, 5))], Limits(None, 8, pool), UNIT)
    assert lines[0].done_s == 4.0
    assert lines[1].first_s == 2.0, "admitted beside the first, whose prefix it shares"


def test_a_hit_on_a_cached_prefix_no_running_request_holds_takes_pool_room_again() -> None:
    """vLLM keeps a cached block among the free ones, and a hit takes it back out of them: a request
    whose prefix is cached but held by nobody needs the pool room of that prefix."""
    works = [Work(0.0, 64, 1, (1, 2, 3, 4)), Work(2.0, 48, 2, (6, 7, 8)), Work(2.5, 32, 1, (1, 2))]
    lines = simulate(works, Limits(None, 8, 5 * BLOCK_TOKENS), UNIT)
    assert lines[0].done_s == 1.0 and lines[1].done_s == 4.0
    # its two cached blocks and one of its own do not fit beside the second's four: it waits for it
    assert lines[2].first_s == 5.0
    roomy = simulate(works, Limits(None, 8, None), UNIT)
    assert roomy[2].first_s == 4.0 and roomy[2].first_s < lines[2].first_s


def test_speculation_emits_the_accepted_run_and_the_bonus_token() -> None:
    spec = Speculation("d", 3, 1.0)
    line = simulate([Work(0.0, 10, 9)], Limits(None, None, None), np.concatenate([UNIT, [0.0, 0.0]]), spec)[0]
    assert line.done_s == 3.0  # the first token at prefill, then 4 a step
    assert Speculation("d", 2, 0.5).emitted(2) == pytest.approx(1.75)
    assert acceptance_of((0.5 + 0.25) / 2, 2) == pytest.approx(0.5, abs=1e-6)


@pytest.mark.parametrize(("share", "done"), [(1.0, 4.0), (0.5, 5.0), (0.0, 9.0)])
def test_a_lookup_that_proposes_in_a_share_of_its_steps_emits_one_token_in_the_others(
    share: float, done: float
) -> None:
    """K=2 at acceptance 1: a proposing step emits 3 tokens, any other 1. Nine tokens: the first from
    the prefill, then 3+3+3 (every step proposes), 1+3+1+3 (every other one), or eight single ones."""
    spec = Speculation("ngram", 2, 1.0, share=share)
    line = simulate([Work(0.0, 10, 9)], Limits(None, None, None), np.concatenate([UNIT, [0.0, 0.0]]), spec)[0]
    assert line.first_s == 1.0 and line.done_s == done


def test_nnls_keeps_every_cost_non_negative() -> None:
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    assert nnls(a, np.array([3.0, 2.0, 1.0])) == pytest.approx([2.0, 0.0], abs=1e-9)


def _steps(
    limits: Limits, spec: Speculation | None, seed: int, rates: tuple[float, ...] = (0.5, 1.0, 2.0), n: int = 30
) -> list[ObservedStep]:
    """Steps of a synthetic engine running ``TRUE``: every token time exactly what its costs give."""
    rng, out = random.Random(seed), []
    theta = TRUE if spec is None else np.concatenate([TRUE, TRUE_DRAFT])
    for rate in rates:
        t, works = 0.0, []
        for _ in range(n):
            t += rng.expovariate(rate)
            works.append(Work(t, rng.randint(300, 1000), rng.randint(20, 60)))
        lines = simulate(works, limits, theta, spec)
        out.append(ObservedStep(limits, spec, tuple(works), tuple(x.first_s + OVERHEAD for x in lines),  # type: ignore[operator]
                                tuple(x.done_s + OVERHEAD for x in lines)))  # type: ignore[operator]  # fmt: skip
    return out


def test_the_fit_recovers_the_costs_of_a_synthetic_engine() -> None:
    steps = (_steps(Limits(512, 4, 4000), None, 1) + _steps(Limits(2048, 2, 8000), None, 2)
             + _steps(Limits(512, 8, 8000), Speculation("d1", 3, 0.6), 3))  # fmt: skip
    fit = fit_costs(steps)
    assert fit is not None
    iteration, token, sequence, _ = fit.target
    assert iteration == pytest.approx(TRUE[0], rel=0.05)
    assert token == pytest.approx(TRUE[1], rel=0.05)
    assert sequence == pytest.approx(TRUE[2], rel=0.10)
    assert fit.drafts["d1"] == pytest.approx(TRUE_DRAFT, rel=0.10)
    assert fit.overhead_s == pytest.approx(OVERHEAD, rel=0.10)
    assert fit.residual < 0.03  # the token times it gives are within a few per cent of the true ones


def test_on_a_loaded_engine_the_fit_goes_further_than_the_plain_fixed_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps near saturation, every token time exact: costs simulated too high hold more waiting and
    larger batches, under which the least squares asks for costs nearly as high again, and the plain
    fixed point (each round's move taken once, no polish) settles far from the truth. The line search
    along each round's move and the polish on the simulated residual must end well below it."""
    steps = (_steps(Limits(512, 8, 8000), None, 1, (2.0, 3.0, 4.0), 40)
             + _steps(Limits(2048, 8, 8000), None, 2, (2.0, 3.0, 4.0), 40))  # fmt: skip
    fit = fit_costs(steps)
    monkeypatch.setattr("tuner.search.model.fit.LONGEST_MOVE", fit_module.RELAX)
    monkeypatch.setattr("tuner.search.model.fit.POLISH_EVALUATIONS", 0)
    plain = fit_costs(steps)
    assert fit is not None and plain is not None
    assert fit.residual < 0.5 * plain.residual, (fit.residual, plain.residual)


def test_the_fit_recovers_the_costs_of_an_engine_that_prefills_first() -> None:
    # SGLang's scheduler (prefill batches alone, decode batches of every running request): the same
    # costs, other schedules, and the fit must read them back through that scheduler
    steps = (_steps(Limits(512, 4, 4000, prefill_first=True), None, 1)
             + _steps(Limits(2048, None, 8000, prefill_first=True), None, 2))  # fmt: skip
    fit = fit_costs(steps)
    assert fit is not None
    assert fit.residual < 0.03

    # Prefill batches run alone here, so a prompt's linear and quadratic (attention) costs are told
    # apart only by the spread of prompt lengths: what the data fixes is what an iteration costs,
    # and that the fit must give back. Within 10 %, not 5: whether an iteration prefills or decodes
    # turns on whether a request has arrived by its start, so the schedule jumps with the costs, and
    # the fixed point settles a few per cent from the truth even when started next to it.
    def prefill_s(costs: np.ndarray, tokens: int) -> float:
        return float(costs @ np.array([1.0, tokens, 1.0, tokens * tokens / 2e6]))

    def decode_s(costs: np.ndarray, seqs: int, context: int) -> float:
        return float(costs @ np.array([1.0, seqs, seqs, seqs * context / 1e6]))

    fitted = np.array(fit.target)
    for tokens in (300, 650, 1000):
        assert prefill_s(fitted, tokens) == pytest.approx(prefill_s(TRUE, tokens), rel=0.10)
    for seqs in (1, 4, 8):
        assert decode_s(fitted, seqs, 700) == pytest.approx(decode_s(TRUE, seqs, 700), rel=0.10)
    # and the same steps read through vLLM's mixed scheduler are explained worse
    mixed = fit_costs([replace(s, limits=replace(s.limits, prefill_first=False)) for s in steps])
    assert mixed is not None and mixed.residual > 2 * fit.residual


def _noisy(steps: list[ObservedStep], sigma: float, seed: int) -> list[ObservedStep]:
    """The steps with each latency (from its arrival) times a log-normal factor of median 1."""
    rng, out = random.Random(seed), []
    for step in steps:
        factors = [math.exp(rng.gauss(0.0, sigma)) for _ in step.works]
        arrivals = [w.arrival_s for w in step.works]
        first = tuple(a + (f - a) * x for a, f, x in zip(arrivals, step.first_s, factors, strict=True))  # type: ignore[operator]
        done = tuple(a + (d - a) * x for a, d, x in zip(arrivals, step.done_s, factors, strict=True))  # type: ignore[operator]
        out.append(ObservedStep(step.limits, step.spec, step.works, first, done))
    return out


def test_noisy_latencies_leave_the_fit_centred_on_them() -> None:
    """Relative weights taken from the measured latencies alone favour the fast ones and pull the
    fitted latencies below them; from the simulated ones alone they favour the slowly simulated and
    push them above (on these steps, by about 0.35 on the log scale either way). From both, the
    fitted latencies are the measured ones on the log scale, within the fixed point's own jitter."""
    steps: list[ObservedStep] = []
    for i in range(4):
        steps += _steps(Limits(512, 4, 4000), None, 10 + 2 * i) + _steps(Limits(2048, 2, 8000), None, 11 + 2 * i)
    steps = _noisy(steps, 0.5, 6)
    fit = fit_costs(steps)
    assert fit is not None
    theta = fit.theta(None)
    assert theta is not None
    logs = []
    for step in steps:
        lines = simulate(step.works, step.limits, theta)
        for work, line, first, done in zip(step.works, lines, step.first_s, step.done_s, strict=True):
            assert None not in (line.first_s, line.done_s, first, done)
            for measured, simulated in ((first, line.first_s), (done, line.done_s)):
                assert measured is not None and simulated is not None
                logs.append(math.log((measured - work.arrival_s) / (simulated + fit.overhead_s - work.arrival_s)))
    assert float(np.mean(logs)) == pytest.approx(0.0, abs=0.15)


SHAPES = [Shape(random.Random(i).randint(200, 600), 32) for i in range(24)]


def _truth(costs: tuple[float, ...] = tuple(TRUE), drafts: dict[str, tuple[float, float]] | None = None,
           acceptance: dict[str, float] | None = None,
           shares: dict[str, float] | None = None) -> EngineModel:  # fmt: skip
    """A model that knows the synthetic engine's true costs: its predictions are the engine's capacities."""
    fit = Fit(costs, drafts or {}, OVERHEAD)
    requests = StudyRequests(SHAPES)
    return EngineModel({"vllm": VllmAdapter()}, CPU, PLAN, requests, {"vllm": fit}, {"vllm": acceptance or {}}, 0.0, 1,
                       shares={"vllm": shares or {}})  # fmt: skip


def _served(truth: EngineModel, params: dict[str, object]) -> Served:
    """The steps a trial of ``params`` would serve on the synthetic engine, at a few rates."""
    adapter = VllmAdapter()
    scheduler = adapter.scheduler_limits(params, CPU)
    limits = Limits(scheduler.token_budget, scheduler.max_seqs, None)
    k = int(params.get("num_speculative_tokens") or 0)  # type: ignore[call-overload]
    proposer = proposer_of(params) or ""
    share = truth.shares["vllm"].get(proposer)
    spec = Speculation(proposer, k, truth.acceptance["vllm"][proposer], share=share or 1.0) if k else None
    theta = truth.fits["vllm"].theta(spec)
    assert theta is not None
    steps = []
    for rate in (0.5, 1.0, 2.0, 4.0):
        rows = truth.step_rows(rate, limits, theta, spec, OVERHEAD)
        server: dict[str, float] = {}
        if spec:
            server["spec_acceptance_rate"] = sum(spec.accept**i for i in range(1, k + 1)) / k
            if share is not None:
                server["spec_draft_share"] = share
        steps.append(Measured(rate, rows, [], max(r["done_s"] for r in rows), server))
    return Served("vllm", params, None, tuple(steps))


def test_a_config_never_booted_is_predicted_near_its_true_capacity() -> None:
    truth = _truth()
    served = [_served(truth, {"max_num_seqs": 8, "chunk_size": 512}), _served(truth, {"max_num_seqs": 1})]
    model = EngineModel.fit(served, {"vllm": VllmAdapter()}, CPU, PLAN, SHAPES)
    unseen = {"max_num_seqs": 4, "chunk_size": 1024}
    predicted, real = model.predict("vllm", unseen, None), truth.predict("vllm", unseen, None)
    for tier in PLAN.scored:
        assert real[tier].capacity_req_s and real[tier].capacity_req_s > 0
        assert predicted[tier].capacity_req_s == pytest.approx(real[tier].capacity_req_s, rel=0.10)


def test_a_closed_loop_drive_of_a_config_never_booted_is_predicted_from_capacity_steps() -> None:
    """The objectives other than capacity drive a config closed loop: fitted on open-loop steps of
    two configs, the model predicts a third's drive as the true engine serves it; a draft it never
    measured has no drive to predict."""
    truth = _truth(drafts={"d": TRUE_DRAFT}, acceptance={"d": 0.7})
    spec = {"max_num_seqs": 4, "num_speculative_tokens": 2, "draft_model": "d"}
    served = [_served(truth, {"max_num_seqs": 8, "chunk_size": 512}), _served(truth, {"max_num_seqs": 1}),
              _served(truth, spec)]  # fmt: skip
    model = EngineModel.fit(served, {"vllm": VllmAdapter()}, CPU, PLAN, SHAPES)
    for unseen in ({"max_num_seqs": 4, "chunk_size": 1024}, {**spec, "num_speculative_tokens": 3}):
        predicted, real = model.drive_rows("vllm", unseen, None, 40, 4), truth.drive_rows("vllm", unseen, None, 40, 4)
        assert predicted is not None and real is not None
        assert sum(1 for r in real if r["sent_s"] == 0.0) == 4  # four clients start at once, the rest take turns
        for pick in ("first_s", "done_s"):
            ours = sorted(float(r[pick]) - float(r["sent_s"]) for r in predicted)
            theirs = sorted(float(r[pick]) - float(r["sent_s"]) for r in real)
            assert np.median(ours) == pytest.approx(np.median(theirs), rel=0.10)
            assert ours[-2] == pytest.approx(theirs[-2], rel=0.10)  # the p95 of 40
    assert model.drive_rows("vllm", {**spec, "draft_model": "other"}, None, 40, 4) is None
    assert model.drive_rows("sglang", {}, None, 40, 4) is None


def test_a_lookup_that_proposes_in_few_steps_is_learned_from_its_share_not_its_acceptance_alone() -> None:
    """n-gram lookup on an engine where it proposes in a fifth of the decode steps, accepted well where it
    does: the model learns the share and predicts a K it never ran near the truth; told only the
    acceptance (as vLLM's draft counters alone say it), it predicts far more."""
    truth = _truth(drafts={"ngram": (0.001, 1e-5)}, acceptance={"ngram": 0.9}, shares={"ngram": 0.2})
    ngram = {"max_num_seqs": 4, "num_speculative_tokens": 2, "spec_method": "ngram"}
    served = [_served(truth, {"max_num_seqs": 4}), _served(truth, ngram)]
    model = EngineModel.fit(served, {"vllm": VllmAdapter()}, CPU, PLAN, SHAPES)
    assert model.shares["vllm"]["ngram"] == pytest.approx(0.2)
    unseen = {**ngram, "num_speculative_tokens": 4}
    real, predicted = truth.predict("vllm", unseen, None), model.predict("vllm", unseen, None)
    blind = replace(model, shares={})
    for tier in PLAN.scored:
        assert predicted[tier].capacity_req_s == pytest.approx(real[tier].capacity_req_s, rel=0.10)
        assert (blind.predict("vllm", unseen, None)[tier].capacity_req_s or 0) > 1.15 * (real[tier].capacity_req_s or 0)


def test_a_draft_never_booted_is_a_range_and_a_booted_one_is_learned_for_every_k() -> None:
    truth = _truth(drafts={"d": TRUE_DRAFT}, acceptance={"d": 0.7})
    served = [_served(truth, {"max_num_seqs": 4}), _served(truth, {"max_num_seqs": 4, "num_speculative_tokens": 2,
                                                                   "draft_model": "d"})]  # fmt: skip
    model = EngineModel.fit(served, {"vllm": VllmAdapter()}, CPU, PLAN, SHAPES)
    assert model.acceptance["vllm"]["d"] == pytest.approx(0.7, abs=0.01)
    other_k = {"max_num_seqs": 4, "num_speculative_tokens": 4, "draft_model": "d"}
    known = model.predict("vllm", other_k, None)["relaxed"]
    assert known.low_req_s == known.high_req_s == known.capacity_req_s
    assert known.capacity_req_s == pytest.approx(truth.predict("vllm", other_k, None)["relaxed"].capacity_req_s,
                                                 rel=0.15)  # fmt: skip
    unknown = model.predict("vllm", {"max_num_seqs": 4, "num_speculative_tokens": 2, "draft_model": "e"}, None)
    low, high = unknown["relaxed"].low_req_s, unknown["relaxed"].high_req_s
    assert low is not None and high is not None and low < high and "never booted" in unknown["relaxed"].basis
    never = model.predict("sglang", {}, None)["relaxed"]
    assert never.capacity_req_s is None and expected_improvement(never, 1.0, 0.2) == math.inf


def test_the_target_alone_is_worth_a_boot_until_a_step_without_speculation_served() -> None:
    """Fitted on speculative steps alone, a target iteration always came with its drafting passes and
    verify tokens in fixed proportion: the target's own costs are not identified, so a config without
    speculation keeps its ranking prediction but no range, and is worth a boot."""
    truth = _truth(drafts={"d": TRUE_DRAFT}, acceptance={"d": 0.7})
    drafted = _served(truth, {"max_num_seqs": 4, "num_speculative_tokens": 2, "draft_model": "d"})
    model = EngineModel.fit([drafted], {"vllm": VllmAdapter()}, CPU, PLAN, SHAPES)
    alone = model.predict("vllm", {"max_num_seqs": 4}, None)["relaxed"]
    assert alone.capacity_req_s is not None and alone.low_req_s is None and alone.high_req_s is None
    assert "never served without speculation" in alone.basis
    assert expected_improvement(alone, 1e6, 0.2) == math.inf
    spec = model.predict("vllm", {"max_num_seqs": 4, "num_speculative_tokens": 2, "draft_model": "d"}, None)
    assert spec["relaxed"].high_req_s == spec["relaxed"].capacity_req_s  # what it served stays a claim
    both = EngineModel.fit([drafted, _served(truth, {"max_num_seqs": 1})], {"vllm": VllmAdapter()}, CPU, PLAN, SHAPES)
    known = both.predict("vllm", {"max_num_seqs": 4}, None)["relaxed"]
    assert known.capacity_req_s is not None and known.low_req_s == known.high_req_s == known.capacity_req_s


def test_expected_improvement_prefers_more_and_values_what_is_not_known() -> None:
    def at(c: float, low: float | None = None, high: float | None = None) -> Prediction:
        return Prediction("t", c, low or c, high or c, "")

    assert expected_improvement(at(2.0), 1.0, 0.2) > expected_improvement(at(1.5), 1.0, 0.2) > 0
    assert expected_improvement(at(0.5, 0.25, 1.0), 1.0, 0.2) > expected_improvement(at(0.5), 1.0, 0.2)
    # a range's ends are bounds: one reaching far above the best is worth a boot, one wholly below is not
    assert expected_improvement(at(1.0, 0.0, 4.0), 1.0, 0.2) > expected_improvement(at(1.0), 1.0, 0.2)
    assert expected_improvement(at(0.2, 0.0, 0.4), 1.0, 0.2) < 1e-4
    assert expected_improvement(at(0.0), 1.0, 0.2) == 0.0


def test_bisection_finds_the_knee_and_the_error_record_replaces_the_prior() -> None:
    assert bisect_capacity(lambda r: r <= 3.3, 0.5, 0.05) == pytest.approx(3.3, rel=0.03)
    assert bisect_capacity(lambda r: False, 0.5, 0.05) == 0.0
    assert model_sigma([(1.0, 1.0)]) == 0.25  # too few to say: the prior
    assert model_sigma([(1.1, 1.0), (0.9, 1.0), (1.0, 1.0)]) == pytest.approx(0.0820, abs=1e-3)


def test_a_steps_hits_spare_the_later_requests_and_keep_their_total() -> None:
    computed = computed_prompts([1000, 1000, 1000], 0.5)
    assert computed[0] == 1000 and sum(computed) == 1500


def test_a_draft_one_engine_ran_brings_its_acceptance_to_the_other_engine() -> None:
    """Acceptance is a fact of target, draft and workload: an engine that never ran a draft another
    engine of the study ran starts from its measured acceptance, and only its drafting costs are
    unknown, so its range is narrower than that of a draft no engine ran."""
    truth = _truth(drafts={"d": TRUE_DRAFT}, acceptance={"d": 0.7})
    vllm_plain = _served(truth, {"max_num_seqs": 4})
    drafted = _served(truth, {"max_num_seqs": 4, "num_speculative_tokens": 2, "draft_model": "d"})
    sglang_plain = replace(_served(truth, {"max_num_seqs": 4}), engine="sglang")
    adapters = {"vllm": VllmAdapter(), "sglang": SglangAdapter()}
    config = {"max_num_seqs": 4, "num_speculative_tokens": 2, "draft_model": "d"}
    ran = EngineModel.fit([vllm_plain, drafted, sglang_plain], adapters, CPU, PLAN, SHAPES)
    nobody = EngineModel.fit([vllm_plain, sglang_plain], adapters, CPU, PLAN, SHAPES)
    assert ran.shared_acceptance == {"d": pytest.approx(0.7, abs=0.01)} and nobody.shared_acceptance == {}
    known, unknown = ran.predict("sglang", config, None)["relaxed"], nobody.predict("sglang", config, None)["relaxed"]
    assert "never booted on sglang: per-position acceptance 0.70" in known.basis
    assert "acceptance 0 to 1" in unknown.basis
    for p in (known, unknown):
        assert p.low_req_s is not None and p.high_req_s is not None and p.low_req_s < p.high_req_s
    assert known.high_req_s - known.low_req_s < unknown.high_req_s - unknown.low_req_s  # type: ignore[operator]


def test_each_model_free_method_is_its_own_proposer() -> None:
    """n-gram and suffix decoding name no draft: each is its own proposer, with its own acceptance and
    drafting costs, not one shared under a missing draft's name."""
    ngram, suffix = ({"max_num_seqs": 4, "spec_method": m, "num_speculative_tokens": 2} for m in ("ngram", "suffix"))
    assert [speculation(p, 0.5).draft for p in (ngram, suffix)] == ["ngram", "suffix"]  # type: ignore[union-attr]
    legacy = {"draft_model": "ngram", "num_speculative_tokens": 2}  # recorded before the method was a parameter
    assert speculation(legacy, 0.5).draft == "ngram"  # type: ignore[union-attr]
    drafted = {"spec_method": "draft_model", "num_speculative_tokens": 2, "draft_model": "d"}
    assert speculation(drafted, 0.5).draft == "d" and speculation({"spec_method": "off"}, 0.5) is None  # type: ignore[union-attr]
    truth = _truth(drafts={"ngram": TRUE_DRAFT, "suffix": TRUE_DRAFT}, acceptance={"ngram": 0.8, "suffix": 0.3})
    model = EngineModel.fit([_served(truth, {"max_num_seqs": 4}), _served(truth, ngram), _served(truth, suffix)],
                            {"vllm": VllmAdapter()}, CPU, PLAN, SHAPES)  # fmt: skip
    assert model.acceptance["vllm"] == {"ngram": pytest.approx(0.8, abs=0.01), "suffix": pytest.approx(0.3, abs=0.01)}
    assert set(model.fits["vllm"].drafts) == {"ngram", "suffix"}


def test_a_step_longer_than_the_known_requests_does_not_hit_the_cache_on_their_repeats() -> None:
    """Prompts that share nothing, known by their blocks: a predicted step that needs more requests
    than the workload's known ones sends them again for their lengths, and must not find them cached
    (a real step's requests are distinct), so the capacity does not depend on how many are known."""
    distinct = [Shape(400, 32, tuple(range(100 * i, 100 * i + 25))) for i in range(len(SHAPES))]  # alike but for blocks
    few, many = (replace(_truth(), requests=StudyRequests(distinct[:k])) for k in (4, len(distinct)))
    limits = Limits(512, 8, None)
    rows = few.step_rows(4.0, limits, np.array(TRUE), None, OVERHEAD)
    assert len(rows) > 4 and all(r["blocks"] is None for r in rows), "beyond the known requests: the hit rate"
    assert all(r["blocks"] is not None for r in many.step_rows(0.5, limits, np.array(TRUE), None, OVERHEAD))
    at_few, at_many = (m.predict("vllm", {"max_num_seqs": 8, "chunk_size": 512}, None) for m in (few, many))
    for tier in PLAN.scored:
        assert at_few[tier].capacity_req_s == pytest.approx(at_many[tier].capacity_req_s, rel=0.15), tier


def test_the_study_s_requests_grow_as_a_search_grows_them(tokenizer: Tokenizer) -> None:
    """The real rag preset: a predicted step of more requests than the workload was built with sends
    the ones the search would grow it to, each cut into blocks numbered once (equal numbers, equal
    prefixes, whatever the growth), and a served step's grown requests are found by their ids."""
    workload = build_workload("rag", tokenizer, seed=0, n_requests=8, max_model_len=2048, rate=1.0)
    assert workload.grow is not None
    requests = StudyRequests.of_workload(workload.requests, workload.grow, tokenizer)
    assert len(requests) == 8
    shapes = requests.first(30)
    grown = workload.grow(30)
    assert len(requests) >= 30 and [s.prompt_tokens for s in shapes] == [r.prompt_tokens for r in grown[:30]]
    assert all(s.blocks is not None for s in shapes)
    # numbered at once over all thirty, the blocks are the same numbers
    at_once = StudyRequests.of_workload(grown[:30], None, tokenizer)
    assert [s.blocks for s in at_once.first(30)] == [s.blocks for s in shapes]
    later = workload.grow(80)[70].request_id
    assert later not in requests.blocks and later in requests.cover([later])
    assert StudyRequests(shapes[:4]).first(10) == shapes[:4], "without a grow: the known ones only"


def test_the_simulator_reports_a_waiting_queue_that_grows_only_past_what_the_engine_carries() -> None:
    """``waiting_trace``: what a step's monitor samples from the server's gauge, so a simulated step
    is failed for a growing queue as a real one is (``tuner.measure.rate_steps.watch_offline``)."""
    truth = _truth()
    limits = Limits(512, 4, None)
    capacity = truth.predict("vllm", {"max_num_seqs": 4, "chunk_size": 512}, None)["relaxed"].capacity_req_s
    assert capacity
    for rate, grows in ((0.5 * capacity, False), (3 * capacity, True)):
        trace: list[tuple[float, int]] = []
        truth.step_rows(rate, limits, np.array(TRUE), None, OVERHEAD, trace)
        late = [n for t, n in trace if t > trace[-1][0] / 2]
        assert trace and (max(late) > 10) == grows, (rate, max(late))


def test_ids_the_workload_never_has_stop_its_growth(tokenizer: Tokenizer) -> None:
    """Another workload's request ids (a study resumed with another preset) cannot grow it forever."""
    workload = build_workload("rag", tokenizer, seed=0, n_requests=8, max_model_len=2048, rate=1.0)
    requests = StudyRequests.of_workload(workload.requests, workload.grow, tokenizer)
    blocks = requests.cover(["elsewhere-1", "elsewhere-2"])
    grown = len(requests)
    assert "elsewhere-1" not in blocks and grown <= 2 * GROWTH_CAP * 8
    requests.cover(["elsewhere-1", "elsewhere-2"])  # a study refits after every trial
    assert len(requests) == grown, "asked again, it grows no further"


def test_a_run_whose_demand_stayed_within_its_pool_is_the_same_run_with_any_pool_that_large() -> None:
    works = [Work(0.05 * i, 300, 20) for i in range(30)]
    unbounded: list[int] = []
    free = simulate(works, Limits(512, 8, None), TRUE, demand=unbounded)
    asked = unbounded[0] * BLOCK_TOKENS  # the pool is given in tokens
    for pool in (asked, asked + BLOCK_TOKENS, 10 * asked):
        roomy = simulate(works, Limits(512, 8, pool), TRUE)
        assert [(t.first_s, t.done_s) for t in roomy] == [(t.first_s, t.done_s) for t in free]
    tight: list[int] = []
    held_back = simulate(works, Limits(512, 8, asked // 2), TRUE, demand=tight)
    assert tight[0] > asked // (2 * BLOCK_TOKENS), "a pool the run outgrew says so"
    assert [t.done_s for t in held_back] != [t.done_s for t in free]


def test_a_prediction_reuses_a_simulation_only_where_the_pool_could_not_change_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Candidates that differ only in a pool none of their steps filled are predicted once; a pool
    small enough to hold requests back is simulated on its own. Every prediction is the one a fresh
    model gives."""
    from tuner.search.model import predict as predict_module

    calls = [0]
    real_simulate = predict_module.simulate

    def counted(*args: object, **kwargs: object) -> object:
        calls[0] += 1
        return real_simulate(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(predict_module, "simulate", counted)
    model = _truth()
    params = {"max_num_seqs": 4, "chunk_size": 512}
    first = model.predict("vllm", params, None)
    once = calls[0]
    for kv in (None, 100_000, 50_000):
        assert model.predict("vllm", params, kv) == first
    assert calls[0] == once, "a pool no step filled was simulated again"
    tight = model.predict("vllm", params, 600)
    assert calls[0] > once, "a pool that holds requests back was not simulated"
    assert tight == _truth().predict("vllm", params, 600)
    assert tight["interactive"].capacity_req_s != first["interactive"].capacity_req_s

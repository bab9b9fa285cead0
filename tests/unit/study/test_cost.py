"""What a capacity is worth: output tokens/s per GPU at the SLO, and dollars per million of them."""

from __future__ import annotations

import pytest

from tuner.study.cost import cost_text, gpus_of, tok_s_per_gpu, usd_per_million_tokens


def _attrs(capacity: float, tok_s: float, env: dict[str, str] | None = None) -> dict[str, object]:
    """A tier whose capacity step answered ``capacity`` req/s at ``tok_s`` (every request answered)."""
    steps = [{"rate_req_s": capacity, "passed": True, "output_throughput_tok_s": tok_s,
              "request_throughput_req_s": capacity},
             {"rate_req_s": capacity * 1.1, "passed": False, "output_throughput_tok_s": tok_s * 1.05,
              "request_throughput_req_s": capacity * 1.1}]  # fmt: skip
    tier = {"capacity_req_s": capacity, "steps": steps}
    return {"capacity": {"tiers": {"interactive": tier}}, "launch": {"env": env or {}}}


def test_a_step_cut_short_by_an_early_look_prices_the_rate_it_carried_not_its_window() -> None:
    # study 1's block 1: a look passed 5.82 req/s early, its window answered 3.05 req/s of ~502
    # tokens each (the rest still in flight): 1530 tok/s in the window, 5.82 x 502 carried
    early = {"rate_req_s": 5.82, "passed": True, "held": False, "output_throughput_tok_s": 1530.0,
             "request_throughput_req_s": 3.05}  # fmt: skip
    tier = {"capacity_req_s": 5.82, "at_step": 0, "steps": [early]}
    rate = tok_s_per_gpu({"capacity": {"tiers": {"interactive": tier}}}, "interactive")
    assert rate == pytest.approx(5.82 * 1530.0 / 3.05) and rate == pytest.approx(2919.5, abs=1.0)
    older = {"capacity_req_s": 5.82, "at_step": 0, "steps": [{"rate_req_s": 5.82, "passed": True}]}
    assert tok_s_per_gpu({"capacity": {"tiers": {"interactive": older}}}, "interactive") is None, "no rates: unknown"


def test_the_rate_is_the_one_at_the_capacity_step_per_gpu_given() -> None:
    assert tok_s_per_gpu(_attrs(30.0, 1440.0), "interactive") == 1440.0
    assert tok_s_per_gpu(_attrs(30.0, 1440.0, {"CUDA_VISIBLE_DEVICES": "0,1"}), "interactive") == 720.0
    assert gpus_of({}) == 1 and gpus_of({"launch": {"env": {"CUDA_VISIBLE_DEVICES": "3"}}}) == 1
    assert tok_s_per_gpu(_attrs(0.0, 0.0), "interactive") is None, "no capacity: nothing to price"
    assert tok_s_per_gpu({"capacity": "junk"}, "interactive") is None and tok_s_per_gpu({}, "relaxed") is None


def test_a_million_tokens_cost_the_gpu_hours_they_take() -> None:
    # 1000 tok/s is 3.6 M tokens an hour: at $3.60 an hour a million costs $1
    assert usd_per_million_tokens(1000.0, 3.6) == pytest.approx(1.0)
    assert usd_per_million_tokens(2000.0, 3.6) == pytest.approx(0.5), "twice the rate, half the price"
    assert usd_per_million_tokens(1000.0, None) is None and usd_per_million_tokens(None, 3.6) is None
    assert cost_text(_attrs(30.0, 1000.0), "interactive", 3.6) == (
        "1000 tok/s per GPU, $1 per million output tokens at $3.6/GPU-hour"
    )
    assert cost_text(_attrs(30.0, 1000.0), "interactive", None) == "1000 tok/s per GPU"


def test_a_finalists_repeats_mean_is_priced_at_the_trials_tokens_per_request() -> None:
    """The verdict reads the repeats' mean capacity, so the cost beside it is priced at that rate: the
    trial's step gives the tokens per answered request (48 here), the mean the requests per second."""
    attrs = _attrs(30.0, 1440.0)
    assert tok_s_per_gpu(attrs, "interactive", 25.0) == pytest.approx(25.0 * 48.0)
    assert cost_text(attrs, "interactive", 3.6, 25.0).startswith("1200 tok/s per GPU, $0.833 per million")
    assert tok_s_per_gpu(attrs, "interactive", 0.0) is None, "repeats that carried nothing: nothing to price"
    assert tok_s_per_gpu({"capacity": {"tiers": {}}}, "interactive", 25.0) is None, "no step: no tokens per request"

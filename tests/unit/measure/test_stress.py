"""The stress check's requests and its judgement."""

from __future__ import annotations

from dataclasses import replace

from tuner.measure.stress import COLLAPSE_FACTOR, PEAK_TOLERANCE, judge, longest_requests, stress_requests
from tuner.workloads.base import CHAT_ENDPOINT, COMPLETIONS_ENDPOINT, Request, Workload


def _workload(concurrency: int = 4) -> Workload:
    reqs = tuple(
        Request(f"r{i}", COMPLETIONS_ENDPOINT, {"prompt": f"shared preamble {i}", "max_tokens": 48}, 800 + 50 * i, 48)
        for i in range(5)
    )
    follow = Request("s1", CHAT_ENDPOINT, {"messages": [{"role": "user", "content": "x"}]}, 5000, 48,
                     session_id="a", turn=1, extends_session=True)  # fmt: skip
    return Workload("rag", 0, (*reqs, follow), (), concurrency, "test")


def test_the_longest_standalone_requests_at_peak_concurrency_in_a_closed_loop() -> None:
    w = _workload()
    assert [r.request_id for r in longest_requests(w, 3)] == ["r4", "r3", "r2"]  # a follow-up turn does not count
    copies = stress_requests(w, rounds=2)
    assert len(copies) == 8 and len({c.request_id for c in copies}) == 8
    prompts = [c.body["prompt"] for c in copies]
    assert prompts[:5] == [f"shared preamble {i}" for i in (4, 3, 2, 1, 0)], (
        "the workload's own requests, longest first"
    )
    assert prompts[5:] == prompts[:3], "cycled when the workload has fewer than needed"
    assert all(c.arrival_s is None and c.session_id is None and not c.extends_session for c in copies)


def test_an_open_loop_workload_meets_its_whole_cap_at_peak() -> None:
    open_loop = replace(
        _workload(16), requests=tuple(replace(r, arrival_s=2.0 * i) for i, r in enumerate(_workload().requests))
    )
    copies = stress_requests(open_loop)
    assert len(copies) == 32 and all(c.arrival_s is None for c in copies)


SLO = {"ttft_p95_ms": 2000.0, "e2e_p95_ms": 3000.0}
OK = {"ttft_p95_ms": 900.0, "e2e_p95_ms": 1500.0, "error_rate": 0.0}


def test_a_crash_under_stress_is_oom_load_with_an_oom_signature_or_sigkill() -> None:
    assert judge(OK, OK, SLO, alive=False, log_since_stress="torch.OutOfMemoryError: CUDA out of memory") == "oom_load"
    assert judge(OK, OK, SLO, alive=False, log_since_stress="", killed=True) == "oom_load"
    assert judge(OK, OK, SLO, alive=False, log_since_stress="Segmentation fault") == "crash_on_request"
    assert judge({**OK, "error_rate": 0.2}, OK, SLO, alive=True, log_since_stress="") == "crash_on_request"


def test_without_a_stressed_default_a_bound_broken_at_peak_is_judged_against_the_trial() -> None:
    queued = {"ttft_p95_ms": 7900.0, "e2e_p95_ms": 9000.0, "error_rate": 0.0}
    assert judge(queued, OK, SLO, alive=True, log_since_stress="") == "slo_collapse"
    assert judge(OK, OK, SLO, alive=True, log_since_stress="") is None
    # just over a bound it just met is the stress run's noise, not a collapse
    near = {"ttft_p95_ms": 1900.0, "e2e_p95_ms": 1500.0}
    assert judge({**near, "ttft_p95_ms": 2100.0, "error_rate": 0.0}, near, SLO, True, "") is None
    # an SLO the config already missed in its trial, no worse at peak
    missed = {"ttft_p95_ms": 2500.0, "e2e_p95_ms": 2900.0}
    assert judge({**missed, "e2e_p95_ms": 2950.0, "error_rate": 0.0}, missed, SLO, True, "") is None


def test_a_bound_broken_at_peak_is_judged_against_both_the_trial_and_the_defaults_peak() -> None:
    bound = {"ttft_p95_ms": 6000.0}
    default_at_peak = {"ttft_p95_ms": 6671.0, "e2e_p95_ms": 2500.0, "error_rate": 0.0}
    # bench_stress_demo's starved config: it missed the bound in its trial too, and queued at peak to
    # nearly three times the default's figure. Having missed the bound already is no pass.
    starved_trial = {"ttft_p95_ms": 7553.0, "e2e_p95_ms": 2800.0}
    starved_peak = {"ttft_p95_ms": 18565.0, "e2e_p95_ms": 2900.0, "error_rate": 0.0}
    assert judge(starved_peak, starved_trial, bound, True, "", default_stress=default_at_peak) == "slo_collapse"
    # a config that met the bound in its trial and breaks it at peak about as the default did
    near = {**default_at_peak, "ttft_p95_ms": 6671.0 * PEAK_TOLERANCE * 0.99}
    assert judge(near, OK, bound, True, "", default_stress=default_at_peak) is None
    past = {**default_at_peak, "ttft_p95_ms": 6671.0 * PEAK_TOLERANCE * 1.01}
    assert judge(past, OK, bound, True, "", default_stress=default_at_peak) == "slo_collapse"
    # slow everywhere: far past the default at peak, but no worse than in its own trial
    slow = {"ttft_p95_ms": 9000.0 * PEAK_TOLERANCE}
    assert judge({**slow, "error_rate": 0.0}, slow, bound, True, "", default_stress={"ttft_p95_ms": 2000.0}) is None
    # within the bound at peak passes, however far above the default's peak
    assert judge(OK, OK, SLO, True, "", default_stress={"ttft_p95_ms": 100.0, "e2e_p95_ms": 200.0}) is None


def test_the_default_is_its_own_reference_so_only_survival_judges_it() -> None:
    # bench_stress_demo's default: it met the bound in its trial and broke it at peak, as the peak does
    # on this hardware; judged against itself it passes, and a crash still fails it
    trial, peak = {"ttft_p95_ms": 2489.0}, {"ttft_p95_ms": 6671.0, "error_rate": 0.0}
    assert judge(peak, trial, {"ttft_p95_ms": 6000.0}, True, "", default_stress=peak) is None
    assert judge({**peak, "error_rate": 0.5}, trial, {"ttft_p95_ms": 6000.0}, True, "", default_stress=peak) == (
        "crash_on_request"
    )


def test_a_collapse_against_the_defaults_peak_shows_even_without_reachable_slos() -> None:
    fine_in_its_trial = {"ttft_p95_ms": 2100.0, "e2e_p95_ms": 3500.0}  # misses the SLO, as every config here
    at_peak = {"ttft_p95_ms": 2100.0 * 1.1, "e2e_p95_ms": 3900.0, "error_rate": 0.0}
    default = {"ttft_p95_ms": 2000.0, "e2e_p95_ms": 3800.0}
    assert judge(at_peak, fine_in_its_trial, SLO, True, "", default_stress=default) is None
    queued = {**at_peak, "ttft_p95_ms": 2100.0 * COLLAPSE_FACTOR * 1.01}  # the H200's 0.135: 7.9 s against 0.86 s
    assert judge(queued, fine_in_its_trial, SLO, True, "", default_stress=default) == "slo_collapse"
    # a capacity objective judges no bound at peak: the TTFT rule alone
    assert judge(queued, fine_in_its_trial, {}, True, "", default_stress=default) == "slo_collapse"
    assert judge(at_peak, fine_in_its_trial, {}, True, "", default_stress=default) is None


def test_slow_everywhere_or_a_peak_heavy_for_all_is_no_collapse() -> None:
    slow = {"ttft_p95_ms": 9000.0, "e2e_p95_ms": 12000.0}
    same_at_peak = {"ttft_p95_ms": 9500.0, "e2e_p95_ms": 12500.0, "error_rate": 0.0}
    assert judge(same_at_peak, slow, SLO, True, "", default_stress={"ttft_p95_ms": 2000.0}) is None  # 4.75x
    heavy = {"ttft_p95_ms": 2300.0 * COLLAPSE_FACTOR, "e2e_p95_ms": 9000.0, "error_rate": 0.0}
    default = {"ttft_p95_ms": 2300.0 * 1.6, "e2e_p95_ms": 8000.0}
    assert judge(heavy, {"ttft_p95_ms": 2100.0, "e2e_p95_ms": 2500.0}, SLO, True, "", default_stress=default) is None

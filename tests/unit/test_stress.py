"""The stress check's requests and its judgement."""

from __future__ import annotations

from dataclasses import replace

from tuner.stress import COLLAPSE_FACTOR, judge, longest_request, stress_requests
from tuner.workloads.base import CHAT_ENDPOINT, COMPLETIONS_ENDPOINT, Request, Workload


def _workload(concurrency: int = 4) -> Workload:
    reqs = tuple(
        Request(f"r{i}", COMPLETIONS_ENDPOINT, {"prompt": f"shared preamble {i}", "max_tokens": 48}, 800 + 50 * i, 48)
        for i in range(5)
    )
    follow = Request("s1", CHAT_ENDPOINT, {"messages": [{"role": "user", "content": "x"}]}, 5000, 48,
                     session_id="a", turn=1, extends_session=True)  # fmt: skip
    return Workload("rag", 0, (*reqs, follow), (), concurrency, "test")


def test_the_longest_standalone_request_at_peak_concurrency_made_unique() -> None:
    w = _workload()
    assert longest_request(w).request_id == "r4"  # a session's follow-up turn does not stand alone
    copies = stress_requests(w, rounds=2)
    assert len(copies) == 8 and len({c.request_id for c in copies}) == 8
    prompts = [c.body["prompt"] for c in copies]
    assert len(set(prompts)) == 8 and all(p.endswith("shared preamble 4") for p in prompts)
    assert len({p.split("]")[0] for p in prompts}) == 8, "the copies differ at their very start"
    assert all(c.arrival_s is None and c.session_id is None for c in copies)


def test_chat_bodies_are_made_unique_in_their_first_message() -> None:
    chat = Request("c", CHAT_ENDPOINT, {"messages": [{"role": "system", "content": "rules"}]}, 900, 48)
    w = replace(_workload(2), requests=(chat,))
    firsts = [c.body["messages"][0]["content"] for c in stress_requests(w)]
    assert len(set(firsts)) == 4 and all(f.endswith("rules") for f in firsts)
    assert chat.body["messages"][0]["content"] == "rules", "the workload itself is left untouched"


SLO = {"ttft_p95_ms": 2000.0, "e2e_p95_ms": 3000.0}
OK = {"ttft_p95_ms": 900.0, "e2e_p95_ms": 1500.0, "error_rate": 0.0}


def test_a_crash_under_stress_is_oom_load_with_an_oom_signature_or_sigkill() -> None:
    assert judge(OK, OK, SLO, alive=False, log_since_stress="torch.OutOfMemoryError: CUDA out of memory") == "oom_load"
    assert judge(OK, OK, SLO, alive=False, log_since_stress="", killed=True) == "oom_load"
    assert judge(OK, OK, SLO, alive=False, log_since_stress="Segmentation fault") == "crash_on_request"
    assert judge({**OK, "error_rate": 0.2}, OK, SLO, alive=True, log_since_stress="") == "crash_on_request"


def test_surviving_but_breaking_an_slo_it_met_is_slo_collapse() -> None:
    queued = {"ttft_p95_ms": 7900.0, "e2e_p95_ms": 9000.0, "error_rate": 0.0}
    assert judge(queued, OK, SLO, alive=True, log_since_stress="") == "slo_collapse"
    assert judge(OK, OK, SLO, alive=True, log_since_stress="") is None
    # an SLO the config already missed in its trial is not news at peak...
    missed = {"ttft_p95_ms": 2500.0, "e2e_p95_ms": 2900.0}
    assert judge({**missed, "e2e_p95_ms": 2950.0, "error_rate": 0.0}, missed, SLO, True, "") is None


def test_a_collapse_against_the_defaults_peak_shows_even_without_reachable_slos() -> None:
    slow = {"ttft_p95_ms": 5000.0, "e2e_p95_ms": 6000.0}
    at_peak = {"ttft_p95_ms": 5000.0 * 1.1, "e2e_p95_ms": 6500.0, "error_rate": 0.0}
    assert judge(at_peak, slow, SLO, True, "", default_ttft_p95_ms=5200.0) is None
    much_worse = {**at_peak, "ttft_p95_ms": 5200.0 * COLLAPSE_FACTOR * 1.01}
    assert judge(much_worse, slow, SLO, True, "", default_ttft_p95_ms=5200.0) == "slo_collapse"

"""``tuner verify``'s reading of an engine client's per-request output, on real captures.

The captures are ``vllm bench serve --save-detailed`` runs on one H200 (vLLM 0.26.0) at the
interactive capacity ``tuner drive --capacity`` claimed (tests/data/captures/README.md). Their README
states the interactive attainment over *all* requests of each run; verify judges as a trial judges a
step, through ``summarize_step``, so it counts only the requests sent in the middle 80 % of the run
(``STEADY_TRIM`` each side dropped as ramp-up and drain). Both are asserted: the README's figure
with no trim, through the same function, and what the product reports.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from tuner.engines.sglang import SglangAdapter
from tuner.engines.vllm import VllmAdapter
from tuner.measure.capacity import STEADY_TRIM, request_ms, summarize_step
from tuner.measure.verify import QueueWatch, client_requests, judge, read_result
from tuner.workloads.base import CHAT_ENDPOINT, COMPLETIONS_ENDPOINT, Request

CAPTURES = Path(__file__).resolve().parents[2] / "data" / "captures" / "vllm-0.26-h200-verify"
INTERACTIVE = {"ttft_p95_ms": 200.0, "tpot_p95_ms": 6.0}


def _capture(name: str) -> dict[str, Any]:
    with gzip.open(CAPTURES / name, "rt") as f:
        result: dict[str, Any] = json.load(f)
    return result


@pytest.mark.parametrize(
    ("name", "rate", "readme_all", "sent", "steady", "counted"),
    [
        ("vllm_bench_serve_at_35.88.json.gz", 35.88, 0.601, 1076, 0.573, 860),
        ("vllm_bench_serve_defaults_at_30.17.json.gz", 30.17, 0.964, 905, 0.957, 719),
    ],
)
def test_verify_reads_vllm_bench_serve_as_a_trial_judges_a_step(
    name: str, rate: float, readme_all: float, sent: int, steady: float, counted: int
) -> None:
    result = _capture(name)
    bench = VllmAdapter().bench_rows(result)
    assert bench.timed and len(bench.rows) == sent and min(r["sent_s"] for r in bench.rows) == 0.0
    # the capture README's TPOT, sum(itl) / (out - 1): a row ends at its first token plus the gaps
    times = request_ms(bench.rows[0])
    assert times is not None
    assert times[1] == pytest.approx(sum(result["itls"][0]) * 1e3 / (result["output_lens"][0] - 1))
    # the README's figure was over every request: summarize_step with no trim reproduces it
    everything = summarize_step(rate, bench.rows, INTERACTIVE, 0.9, bench.duration_s, trim=0.0)
    assert everything.n_counted == sent and everything.attainment == pytest.approx(readme_all, abs=5e-4)
    # the product's figure: the steady window a trial's step counts
    verdict = judge(rate, bench, {"interactive": INTERACTIVE}, 0.9)["interactive"]
    assert verdict["n_requests"] == sent and verdict["n_counted"] == counted
    assert verdict["attainment"] == pytest.approx(steady, abs=5e-4)
    assert f"[{STEADY_TRIM:.0%}" in verdict["counted"] and verdict["passed"] is (steady >= 0.9)


def test_a_failed_request_is_a_miss_and_jsonl_reads_its_last_line(tmp_path: Path) -> None:
    """SGLang's --output-file is JSONL, appended to; its details carry no start times (0.5.23's
    sglang/benchmark/serving.py ``result_details``), so every request is counted."""
    run = {"ttfts": [0.05, 0.0, 0.3], "itls": [[0.004] * 3, [], [0.004] * 3], "output_lens": [4, 0, 4],
           "errors": ["", "Connection reset", ""], "completed": 2}  # fmt: skip
    path = tmp_path / "sglang.jsonl"
    path.write_text(json.dumps({"stale": True}) + "\n" + json.dumps(run) + "\n")
    bench = read_result(path, SglangAdapter())
    assert not bench.timed and [r["error"] for r in bench.rows] == [None, "Connection reset", None]
    verdict = judge(2.0, bench, {"interactive": INTERACTIVE}, 0.9)["interactive"]
    assert verdict["n_counted"] == 3 and verdict["attainment"] == pytest.approx(1 / 3)
    assert verdict["counted"].startswith("all requests")


def _request(i: int, endpoint: str = COMPLETIONS_ENDPOINT, tokens: int = 48, prompt_tokens: int = 10,
             session: str | None = None) -> Request:  # fmt: skip
    body: dict[str, Any] = {"prompt": f"p{i}"} if endpoint == COMPLETIONS_ENDPOINT else {"messages": []}
    return Request(f"r{i}", endpoint, body, prompt_tokens, tokens, session_id=session)


class OneLengthClient(SglangAdapter):
    """A client that takes one output length for every request, as SGLang's did before the tuner
    replaced its ShareGPT reader (tuner/engines/sglang.py, BENCH_SERVING)."""

    bench_own_output_lens = False


def test_what_the_client_cannot_send_is_left_out_and_said() -> None:
    requests = [_request(0), _request(1, CHAT_ENDPOINT, session="s"), _request(2, tokens=16),
                _request(3, prompt_tokens=2000), _request(4)]  # fmt: skip
    for adapter in (VllmAdapter(), SglangAdapter()):  # each request at its own length, long prompts too
        chosen = client_requests(requests, adapter)
        assert chosen.prompts == ["p0", "p2", "p3", "p4"] and chosen.output_lens == [48, 16, 48, 48]
        assert chosen.output_len is None
        assert len(chosen.notes) == 1 and "single-turn completions" in chosen.notes[0]
    one = client_requests(requests, OneLengthClient())  # one --sharegpt-output-len for all: the commonest
    assert one.prompts == ["p0", "p3", "p4"] and one.output_len == 48 and one.output_lens == [48, 48, 48]
    assert len(one.notes) == 2 and "another output length than 48" in one.notes[1]


def test_the_queue_while_the_client_sends_is_judged_as_a_steps_without_its_startup_or_drain() -> None:
    # the client spends seconds importing and tokenizing before its first request, and at a rate the
    # server cannot carry its drain is long: the queue empties there whatever the rate. The samples of
    # either must not make a flat queue look like a growing one, nor hide a growing one.
    watch = QueueWatch("http://127.0.0.1:9", "vllm:num_requests_waiting")
    watch.ended_s = 100.0  # the client exited 100 s in, after a run it timed at 40 s, sending for 30 s
    startup = [(float(t), 0.0) for t in range(40, 60)]
    flat = [(float(t), 5.0 + (t % 2)) for t in range(60, 90)]
    drain = [(float(t), max(0.0, 60.0 - 6.0 * (t - 90))) for t in range(90, 100)]
    watch.samples = startup + flat + drain
    assert [t for t, _ in watch.window(40.0, 30.0)] == [float(t) for t in range(3, 28)]
    assert watch.growing(watch.window(40.0, 30.0), rate=10.0) is False
    watch.samples = startup + [(float(t), 2.0 * (t - 60)) for t in range(60, 90)] + drain
    rising = watch.window(40.0, 30.0)
    assert watch.growing(rising, rate=10.0) is True, "2 more waiting each second at 10 req/s, then a drain"
    assert QueueWatch("http://127.0.0.1:9", None).growing(rising, rate=10.0) is None, "no gauge: not judged"

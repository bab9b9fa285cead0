"""Trial metrics (vLLM definitions) and Prometheus sample parsing."""

from __future__ import annotations

import math

import pytest

from tuner.client.driver import DriveResult, RequestRecord
from tuner.engines.prometheus import histogram_mean_delta, metric_deltas, metric_total, parse_prometheus
from tuner.measure.metrics import summarize


def _record(
    rid: str,
    ttft_s: float,
    e2e_s: float,
    *,
    sent_s: float = 0.0,
    output_tokens: int = 1,
    prompt_tokens: int = 10,
    times: tuple[float, ...] | None = None,
    tokens: tuple[int, ...] | None = None,
    error: str | None = None,
) -> RequestRecord:
    times = times if times is not None else (sent_s + ttft_s,)
    return RequestRecord(
        request_id=rid,
        sent_s=sent_s,
        first_token_s=sent_s + ttft_s,
        done_s=sent_s + e2e_s,
        token_times_s=times,
        chunk_tokens=tokens if tokens is not None else (1,) * len(times),
        output_tokens=output_tokens,
        prompt_tokens=prompt_tokens,
        error=error,
    )


def test_ttft_and_e2e_percentiles_on_known_values() -> None:
    records = tuple(_record(f"r{i}", ttft_s=0.01 * (i + 1), e2e_s=0.1 * (i + 1)) for i in range(5))
    summary = summarize(DriveResult(records, 0.0, 1.0))
    # numpy linear percentiles of 10, 20, 30, 40, 50 ms
    assert summary["ttft_p50_ms"] == pytest.approx(30.0)
    assert summary["ttft_p90_ms"] == pytest.approx(46.0)
    assert summary["ttft_p95_ms"] == pytest.approx(48.0)
    assert summary["ttft_p99_ms"] == pytest.approx(49.6)
    assert summary["ttft_mean_ms"] == pytest.approx(30.0)
    assert summary["e2e_p50_ms"] == pytest.approx(300.0)
    assert summary["e2e_p95_ms"] == pytest.approx(480.0)


def test_tpot_only_counts_requests_with_two_or_more_tokens() -> None:
    records = (
        _record("a", ttft_s=0.1, e2e_s=1.1, output_tokens=11),  # 1000 ms / 10 = 100 ms
        _record("b", ttft_s=0.2, e2e_s=1.2, output_tokens=3),  # 1000 ms / 2 = 500 ms
        _record("c", ttft_s=0.1, e2e_s=5.0, output_tokens=1),  # one token: no TPOT
    )
    summary = summarize(DriveResult(records, 0.0, 5.0))
    assert summary["tpot_p50_ms"] == pytest.approx(300.0)
    assert summary["tpot_p95_ms"] == pytest.approx(100.0 + 0.95 * 400.0)


def test_itl_splits_multi_token_chunks_into_equal_gaps() -> None:
    record = _record("a", ttft_s=0.1, e2e_s=0.9, output_tokens=5, times=(0.1, 0.2, 0.8), tokens=(1, 1, 3))
    summary = summarize(DriveResult((record,), 0.0, 1.0))
    # gaps: 100 ms for one token, then 600 ms over three tokens -> 200, 200, 200
    assert summary["itl_p50_ms"] == pytest.approx(200.0)
    assert summary["itl_p95_ms"] == pytest.approx(200.0)
    single = _record("b", ttft_s=0.1, e2e_s=0.5, output_tokens=3, times=(0.1, 0.2, 0.5))
    single_summary = summarize(DriveResult((single,), 0.0, 1.0))  # gaps 100 and 300 ms
    assert single_summary["itl_p50_ms"] == pytest.approx(200.0)
    assert single_summary["itl_p95_ms"] == pytest.approx(290.0)


def test_errors_count_in_error_rate_but_not_in_latency_or_throughput() -> None:
    records = (
        _record("a", ttft_s=0.1, e2e_s=1.0, output_tokens=10, prompt_tokens=5),
        _record("b", ttft_s=0.3, e2e_s=1.0, output_tokens=20, prompt_tokens=7),
        _record("c", ttft_s=9.0, e2e_s=9.0, output_tokens=99, error="HTTP 500"),
        _record("d", ttft_s=9.0, e2e_s=9.0, output_tokens=99, error="timeout"),
    )
    summary = summarize(DriveResult(records, 10.0, 12.0))
    assert summary["n_requests"] == 4 and summary["n_errors"] == 2
    assert summary["error_rate"] == pytest.approx(0.5)
    assert summary["ttft_p50_ms"] == pytest.approx(200.0)
    assert summary["duration_s"] == pytest.approx(2.0)
    assert summary["output_tokens_total"] == 30 and summary["prompt_tokens_total"] == 12
    assert summary["output_throughput_tok_s"] == pytest.approx(15.0)
    assert summary["request_throughput_req_s"] == pytest.approx(1.0)


def test_no_success_gives_nan_latencies_and_zero_throughput() -> None:
    records = (_record("a", 0.1, 0.2, error="HTTP 503"),)
    summary = summarize(DriveResult(records, 0.0, 1.0))
    assert summary["error_rate"] == 1.0
    for key in ("ttft_p50_ms", "ttft_p99_ms", "ttft_mean_ms", "tpot_p50_ms", "itl_p95_ms", "e2e_p50_ms"):
        assert math.isnan(summary[key])
    assert summary["output_throughput_tok_s"] == 0.0 and summary["request_throughput_req_s"] == 0.0
    empty = summarize(DriveResult((), 0.0, 0.0))
    assert empty["n_requests"] == 0 and empty["error_rate"] == 0.0


def test_summary_keys_are_complete_and_float() -> None:
    summary = summarize(DriveResult((_record("a", 0.1, 0.3, output_tokens=3),), 0.0, 1.0))
    expected = {
        "n_requests", "n_errors", "error_rate", "ttft_p50_ms", "ttft_p90_ms", "ttft_p95_ms",
        "ttft_p99_ms", "ttft_mean_ms", "tpot_p50_ms", "tpot_p95_ms", "itl_p50_ms", "itl_p95_ms",
        "e2e_p50_ms", "e2e_p95_ms", "output_throughput_tok_s", "request_throughput_req_s",
        "duration_s", "output_tokens_total", "prompt_tokens_total",
    }  # fmt: skip
    assert set(summary) == expected
    assert all(type(v) is float for v in summary.values())


PROMETHEUS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="my model"} 3.0
vllm:time_to_first_token_seconds_sum{model_name="m",engine="0"} 12.5
vllm:time_to_first_token_seconds_sum{model_name="m",engine="1"} 2.5
vllm:time_to_first_token_seconds_count{model_name="m",engine="0"} 40
vllm:time_to_first_token_seconds_count{model_name="m",engine="1"} 10
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 50
process_open_fds 17 1712345678000
this line is garbage
broken{label="x" 5
no_value{a="b"}
bad_value 1.2.3
weird_value NaN
"""


def test_parse_prometheus_with_labels_timestamps_and_garbage() -> None:
    samples = parse_prometheus(PROMETHEUS)
    assert samples['vllm:num_requests_running{engine="0",model_name="my model"}'] == 3.0
    assert samples['vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"}'] == 50.0
    assert samples["process_open_fds"] == 17.0
    assert math.isnan(samples["weird_value"])
    assert not any(k.startswith(("this", "broken", "no_value", "bad_value", "#")) for k in samples)
    assert len(samples) == 8


def test_metric_total_sums_across_labels_only_for_that_name() -> None:
    samples = parse_prometheus(PROMETHEUS)
    assert metric_total(samples, "vllm:time_to_first_token_seconds_count") == 50.0
    assert metric_total(samples, "vllm:time_to_first_token_seconds") == 0.0
    assert metric_total(samples, "process_open_fds") == 17.0


def test_metric_deltas_take_keys_from_after() -> None:
    assert metric_deltas({"a": 1.0, "gone": 5.0}, {"a": 4.0, "new": 2.0}) == {"a": 3.0, "new": 2.0}


def test_histogram_mean_delta() -> None:
    base = "vllm:time_to_first_token_seconds"
    before = parse_prometheus(PROMETHEUS)
    after = dict(before)
    after[base + '_sum{model_name="m",engine="0"}'] += 3.0
    after[base + '_count{model_name="m",engine="0"}'] += 4.0
    after[base + '_sum{model_name="m",engine="1"}'] += 1.0
    after[base + '_count{model_name="m",engine="1"}'] += 1.0
    assert histogram_mean_delta(before, after, base) == pytest.approx(4.0 / 5.0)
    assert histogram_mean_delta(before, before, base) is None
    assert histogram_mean_delta({}, {}, base) is None

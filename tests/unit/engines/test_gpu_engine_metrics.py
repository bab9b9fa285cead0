"""The engines' ``/metrics`` as scraped on the H200 beside the study (scripts/gpu/sidecar.py), fed to
the adapters' ``server_stats``, and SGLang's ready line in its real boot logs.

Each scrape pair is the sidecar's first (after boot or warmup) and latest scrape of one trial's
server. For trial 0 (vLLM defaults) the two fell exactly where the tuner's own scrapes did (after
the warmup, after the drive), so ``server_stats`` must give what the study recorded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.study_files import H200_FIRST, recorded_attrs
from tuner.engines.base import Config, Device, ModelSpec
from tuner.engines.prometheus import metric_total, parse_prometheus
from tuner.engines.sglang import SglangAdapter
from tuner.engines.vllm import VllmAdapter
from tuner.measure.process import ServerProcess

ROOT = Path(__file__).resolve().parents[3]
VLLM = ROOT / "tests" / "data" / "captures" / "vllm-0.26.0-h200-2026-12-01"
SGLANG = ROOT / "tests" / "data" / "captures" / "sglang-0.5.17-h200-2026-12-01"
READY = "The server is fired up and ready to roll!"


def scrapes(folder: Path, number: int, engine: str) -> tuple[dict[str, float], dict[str, float]]:
    first, last = (
        parse_prometheus((folder / f"metrics-trial-{number:04d}-{engine}-{which}.prom").read_text())
        for which in ("first", "last")
    )
    return first, last


def recorded_server(number: int) -> dict[str, float | None]:
    result: dict[str, float | None] = recorded_attrs(H200_FIRST)[number]["server"]
    return result


def test_real_vllm_scrape_parses_with_labels_and_created_series() -> None:
    _, last = scrapes(VLLM, 0, "vllm")
    assert metric_total(last, "vllm:prefix_cache_queries_total") == 145738.0
    assert metric_total(last, "vllm:time_to_first_token_seconds_count") == 162.0  # 2 warmup + 160
    assert not any(k.startswith("vllm:spec_decode") for k in last)  # no speculation configured


def test_vllm_defaults_server_stats_are_what_the_study_recorded() -> None:
    first, last = scrapes(VLLM, 0, "vllm")
    stats = VllmAdapter().server_stats(first, last)
    recorded = recorded_server(0)
    assert {k: stats[k] for k in recorded} == pytest.approx(recorded)
    assert stats["prefix_cache_hit_rate"] == pytest.approx((128912 - 736) / (145738 - 1844))
    assert stats["spec_acceptance_rate"] is None and stats["preemptions"] == 0.0
    assert stats["spec_draft_share"] is None  # no speculation: no spec-decode series at all


def test_vllm_ngram_that_never_drafted_has_no_acceptance() -> None:
    """Trial 10 (ngram, K=5) on a model whose output never repeats its prompt: vLLM exports the
    spec-decode counters, all zero, so there is no acceptance to report (None, not 0)."""
    first, last = scrapes(VLLM, 10, "vllm")
    assert metric_total(last, "vllm:spec_decode_num_drafts_total") == 0.0
    assert any(k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total") for k in last)
    stats = VllmAdapter().server_stats(first, last)
    assert stats["spec_acceptance_rate"] is None and stats["spec_mean_accept_len"] is None
    assert stats["spec_draft_share"] == 0.0  # it speculated, and proposed in no step
    assert 0.8 < stats["prefix_cache_hit_rate"] < 0.95  # type: ignore[operator]
    assert recorded_server(10)["spec_acceptance_rate"] is None


def test_vllm_ngram_drafts_in_a_share_of_its_decode_steps_that_its_counters_alone_hide() -> None:
    """The CPU build, n-gram at K=4 under the rag preset (captures/vllm-0.32-cpu/metrics-ngram-k4-*):
    the counters' acceptance is that of the steps that proposed; the share says how many did."""
    folder = ROOT / "tests" / "data" / "captures" / "vllm-0.32-cpu"
    first, last = (parse_prometheus((folder / f"metrics-ngram-k4-{w}.prom").read_text()) for w in ("first", "last"))
    stats = VllmAdapter().server_stats(first, last)
    delta = {n: metric_total(last, f"vllm:{n}") - metric_total(first, f"vllm:{n}") for n in (
        "spec_decode_num_drafts_total", "generation_tokens_total", "spec_decode_num_accepted_tokens_total",
        "request_success_total")}  # fmt: skip
    steps = delta["generation_tokens_total"] - delta["spec_decode_num_accepted_tokens_total"]
    steps -= delta["request_success_total"]  # each request's first token came from its prefill
    assert stats["spec_draft_share"] == pytest.approx(delta["spec_decode_num_drafts_total"] / steps)
    assert 0.0 < stats["spec_draft_share"] < 0.5  # type: ignore[operator]
    assert stats["spec_acceptance_rate"] is not None and stats["spec_mean_accept_len"] > 2.0  # type: ignore[operator]


def test_sglang_standalone_draft_acceptance_from_real_gauges() -> None:
    """Trial 7: STANDALONE with the agreeing 2-layer draft, 2 steps (so at most 3 tokens a step)."""
    first, last = scrapes(SGLANG, 7, "sglang")
    stats = SglangAdapter().server_stats(first, last)
    assert stats["spec_acceptance_rate"] == pytest.approx(0.7732463295269169)
    assert 1.0 < stats["spec_mean_accept_len"] <= 3.0  # type: ignore[operator]
    assert stats["spec_mean_accept_len"] == pytest.approx(2.5464926590538335)
    assert stats["preemptions"] == 0
    # TTFT mean over the scrapes' window: both label sets (streaming or not) of the histogram
    ttft_sum = metric_total(last, "sglang:time_to_first_token_seconds_sum") - metric_total(
        first, "sglang:time_to_first_token_seconds_sum"
    )
    ttft_n = metric_total(last, "sglang:time_to_first_token_seconds_count") - metric_total(
        first, "sglang:time_to_first_token_seconds_count"
    )
    assert ttft_n == 128.0
    assert stats["server_ttft_mean_ms"] == pytest.approx(1000.0 * ttft_sum / ttft_n)
    # what the study recorded from its own scrapes, a few seconds apart from these
    assert recorded_server(7)["spec_acceptance_rate"] == pytest.approx(0.78, abs=0.02)


def test_sglang_ngram_acceptance_is_low_but_real() -> None:
    first, last = scrapes(SGLANG, 5, "sglang")
    stats = SglangAdapter().server_stats(first, last)
    assert 0.0 < stats["spec_acceptance_rate"] < 0.1  # type: ignore[operator]
    assert 1.0 < stats["spec_mean_accept_len"] < 1.1  # type: ignore[operator]


def test_sglang_defaults_export_speculation_gauges_at_zero() -> None:
    _, last = scrapes(SGLANG, 1, "sglang")
    assert metric_total(last, "sglang:spec_accept_rate") == 0.0
    assert metric_total(last, "sglang:spec_accept_length") == 0.0
    # its prefix cache served most prompt tokens, though the gauge says 0
    cached = metric_total(last, "sglang:cached_tokens_total")
    assert cached / metric_total(last, "sglang:prompt_tokens_total") > 0.8
    assert metric_total(last, "sglang:cache_hit_rate") == 0.0


def test_sglang_without_speculation_should_report_no_acceptance() -> None:
    first, last = scrapes(SGLANG, 1, "sglang")
    assert SglangAdapter().server_stats(first, last)["spec_acceptance_rate"] is None


def test_sglang_prefix_cache_hit_rate_should_follow_its_counters() -> None:
    first, last = scrapes(SGLANG, 1, "sglang")
    assert SglangAdapter().server_stats(first, last)["prefix_cache_hit_rate"] > 0.5  # type: ignore[operator]


def _sglang_server(log: Path) -> ServerProcess:
    spec = SglangAdapter().launch(
        Config(engine="sglang", params={}, is_default=True),
        ModelSpec("<model>", {}, 2048),
        Device("cuda", "NVIDIA H200", 150754820096),
        port=57849,
        python="python3",
        version="0.5.17",
    )
    assert spec.ready_line == READY
    return ServerProcess(spec, log)


@pytest.mark.parametrize(
    "name", ["trial-0001-sglang-defaults-served.log", "trial-0007-sglang-standalone-k2-served.log"]
)
def test_sglang_ready_line_in_real_boot_logs(tmp_path: Path, name: str) -> None:
    """SGLang counts as ready only once its log shows the ready line; uvicorn's startup line comes
    earlier, while the server still warms up. A log cut just before the ready line is not ready."""
    text = (SGLANG / name).read_text()
    lines = text.splitlines()
    ready_at = next(i for i, ln in enumerate(lines) if READY in ln)
    startup_at = next(i for i, ln in enumerate(lines) if "Application startup complete." in ln)
    assert startup_at < ready_at
    log = tmp_path / name
    log.write_text("\n".join(lines[:ready_at]) + "\n")
    assert not _sglang_server(log)._ready_line_seen()
    log.write_text(text)
    assert _sglang_server(log)._ready_line_seen()

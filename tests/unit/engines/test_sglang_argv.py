"""SglangAdapter: the ``sglang.launch_server`` argv for each parameter, versions, and ``sglang:*`` /metrics."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tuner.engines.base import Config, Device, LaunchSpec, ModelSpec
from tuner.engines.prometheus import parse_prometheus
from tuner.engines.sglang import SglangAdapter
from tuner.errors import ConfigError, EnvironmentSetupError

PYTHON = "/envs/sglang/bin/python"
CAPTURES = Path(__file__).resolve().parents[2] / "data" / "captures"
VERSION = "0.5.23"
PORT = 41235
MODEL = ModelSpec(
    path="/models/target",
    drafts={"draft-2l": "/models/drafts/draft two-l", "draft-1l": "/models/drafts/draft-1l"},
    max_model_len=1536,
)
CUDA = Device("cuda", "NVIDIA H200", 150_754_820_096)
TUNED_FLAGS = ("--chunked-prefill-size", "--mem-fraction-static", "--max-running-requests")
ALL_PARAMS: dict[str, Any] = {
    "chunk_size": 1024,
    "max_num_seqs": 8,
    "memory_fraction": 0.85,
    "num_speculative_tokens": 3,
    "draft_model": "draft-2l",
}


def _launch(params: Mapping[str, Any], *, model: ModelSpec = MODEL, version: str = VERSION, **kw: Any) -> LaunchSpec:
    config = Config(engine="sglang", params=dict(params), **kw)
    return SglangAdapter().launch(config, model, CUDA, PORT, PYTHON, version)


@pytest.mark.parametrize("draft", ["my-draft", "/no/such/draft"])
def test_a_draft_the_model_lacks_is_bad_input_not_a_path(draft: str) -> None:
    # before: the bare name went to --speculative-draft-model-path and the engine failed at boot
    with pytest.raises(ConfigError, match=f"no draft '{draft}' here"):
        _launch({"num_speculative_tokens": 2, "draft_model": draft})


def _value(argv: Sequence[str], flag: str) -> str:
    """The value after ``flag``, which must appear exactly once."""
    args = list(argv)
    assert args.count(flag) == 1, f"{flag} appears {args.count(flag)} times in {args}"
    i = args.index(flag)
    assert i + 1 < len(args), f"{flag} has no value"
    assert not args[i + 1].startswith("--"), f"{flag} is followed by another flag: {args}"
    return args[i + 1]


def _spec_flags(argv: Sequence[str]) -> list[str]:
    return [a for a in argv if a.startswith("--speculative")]


# --- the command ---------------------------------------------------------------------------------


@pytest.mark.parametrize("params", [{}, ALL_PARAMS, {"num_speculative_tokens": 2, "draft_model": "ngram"}])
def test_fixed_flags_are_always_there(params: dict[str, Any]) -> None:
    spec = _launch(params)
    argv = spec.argv
    assert not isinstance(argv, str)
    assert all(isinstance(a, str) for a in argv)
    assert argv[0] == PYTHON
    assert argv[1:3] == ("-m", SglangAdapter.module) == ("-m", "sglang.launch_server")
    assert _value(argv, "--model-path") == MODEL.path
    assert _value(argv, "--context-length") == str(MODEL.max_model_len)
    assert _value(argv, "--port") == str(PORT)
    assert _value(argv, "--host") == "127.0.0.1"
    assert argv.count("--enable-metrics") == 1, "/metrics exists only with --enable-metrics"
    assert "--model" not in argv, "SGLang's flag is --model-path"
    assert spec.engine == "sglang"
    assert spec.port == PORT
    assert spec.served_model == MODEL.path
    assert spec.health_path == "/health_generate"
    assert spec.ready_line is not None and spec.ready_line == SglangAdapter.ready_line


def test_health_path_is_health_generate() -> None:
    # /health answers before a generation can run; /health_generate only once one did
    assert SglangAdapter.health_path == "/health_generate"
    assert SglangAdapter().health_path == "/health_generate"
    assert SglangAdapter.needs_gpu is True


def test_model_path_with_spaces_and_quotes_stays_one_argument() -> None:
    model = ModelSpec(path='/models/my model\'s "v2"; touch pwned', drafts={}, max_model_len=4096)
    argv = _launch({}, model=model).argv
    assert _value(argv, "--model-path") == model.path
    assert _value(argv, "--context-length") == "4096"


def test_load_format() -> None:
    argv = _launch({}, model=ModelSpec(path="/m", load_format="dummy")).argv
    assert _value(argv, "--load-format") == "dummy"
    assert "--load-format" not in _launch({}).argv


@pytest.mark.parametrize("chunk", [512, 2048, 8192])
def test_chunk_size(chunk: int) -> None:
    argv = _launch({"chunk_size": chunk}).argv
    assert int(_value(argv, "--chunked-prefill-size")) == chunk
    assert "--max-running-requests" not in argv and "--mem-fraction-static" not in argv
    assert "--max-num-batched-tokens" not in argv and "--enable-chunked-prefill" not in argv, "vLLM flags"


@pytest.mark.parametrize("fraction", [0.2, 0.35, 0.85, 0.95])
def test_memory_fraction(fraction: float) -> None:
    argv = _launch({"memory_fraction": fraction}).argv
    assert float(_value(argv, "--mem-fraction-static")) == pytest.approx(fraction)
    assert "--gpu-memory-utilization" not in argv and "--kv-cache-memory-bytes" not in argv, "vLLM flags"


def test_memory_fraction_from_the_step_grid_is_written_short() -> None:
    argv = _launch({"memory_fraction": 0.1 + 0.2}).argv  # 0.30000000000000004
    value = _value(argv, "--mem-fraction-static")
    assert float(value) == pytest.approx(0.3)
    assert len(value) <= len("0.3")


@pytest.mark.parametrize("seqs", [2, 4, 64])
def test_max_num_seqs(seqs: int) -> None:
    argv = _launch({"max_num_seqs": seqs}).argv
    assert int(_value(argv, "--max-running-requests")) == seqs
    assert "--max-num-seqs" not in argv, "vLLM flag"


def test_every_parameter_at_once() -> None:
    argv = _launch(ALL_PARAMS).argv
    assert int(_value(argv, "--chunked-prefill-size")) == ALL_PARAMS["chunk_size"]
    assert float(_value(argv, "--mem-fraction-static")) == pytest.approx(ALL_PARAMS["memory_fraction"])
    assert int(_value(argv, "--max-running-requests")) == ALL_PARAMS["max_num_seqs"]
    assert _value(argv, "--speculative-algorithm") == "STANDALONE"


@pytest.mark.parametrize("is_default", [False, True])
def test_empty_params_emit_no_tuned_flag(is_default: bool) -> None:
    adapter = SglangAdapter()
    for params in ({}, adapter.default_params(CUDA)):
        argv = _launch(params, is_default=is_default).argv
        assert [f for f in TUNED_FLAGS if f in argv] == []
        assert _spec_flags(argv) == []


# --- speculative decoding ------------------------------------------------------------------------


@pytest.mark.parametrize("draft", sorted(MODEL.drafts))
@pytest.mark.parametrize("k", [1, 3, 5])
def test_draft_model_is_standalone_with_a_chain_of_k(draft: str, k: int) -> None:
    argv = _launch({"num_speculative_tokens": k, "draft_model": draft}).argv
    assert _value(argv, "--speculative-algorithm") == "STANDALONE"
    assert _value(argv, "--speculative-draft-model-path") == MODEL.drafts[draft]
    assert int(_value(argv, "--speculative-num-steps")) == k
    assert int(_value(argv, "--speculative-eagle-topk")) == 1
    # top-k 1: the draft tree is a chain of K steps, so K + 1 tokens are verified
    assert int(_value(argv, "--speculative-num-draft-tokens")) == k + 1
    assert "--speculative-ngram-max-bfs-breadth" not in argv


@pytest.mark.parametrize("k", [1, 2, 4])
def test_ngram_needs_no_draft_model(k: int) -> None:
    argv = _launch({"num_speculative_tokens": k, "draft_model": "ngram"}).argv
    assert _value(argv, "--speculative-algorithm") == "NGRAM"
    assert int(_value(argv, "--speculative-ngram-max-bfs-breadth")) == 1
    assert int(_value(argv, "--speculative-num-draft-tokens")) == k
    assert "--speculative-draft-model-path" not in argv
    assert "--speculative-eagle-topk" not in argv


@pytest.mark.parametrize(
    "params",
    [
        {"num_speculative_tokens": 1, "draft_model": "draft-1l"},
        {"num_speculative_tokens": 4, "draft_model": "draft-2l"},
        {"num_speculative_tokens": 2, "draft_model": "ngram"},
        {"num_speculative_tokens": 3, "draft_model": "A_FOLDER"},  # a model folder given by path
        ALL_PARAMS,
    ],
)
def test_a_draft_path_never_comes_without_the_algorithm(params: dict[str, Any], tmp_path: Path) -> None:
    """SGLang's default algorithm is None: a draft path alone resolves silently with speculation off."""
    if params.get("draft_model") == "A_FOLDER":
        (tmp_path / "config.json").write_text("{}")
        params = {**params, "draft_model": str(tmp_path)}
    argv = _launch(params).argv
    if "--speculative-draft-model-path" in argv:
        assert _value(argv, "--speculative-algorithm") == "STANDALONE"
    assert argv.count("--speculative-algorithm") == 1
    # the algorithm comes with the number of steps it verifies
    assert "--speculative-num-draft-tokens" in argv


@pytest.mark.parametrize(
    "params",
    [
        {"num_speculative_tokens": 0, "draft_model": "draft-2l"},
        {"num_speculative_tokens": 0, "draft_model": "ngram"},
        {"num_speculative_tokens": 0},
        {"draft_model": "draft-2l"},
        {"chunk_size": 2048, "max_num_seqs": 2, "memory_fraction": 0.9, "num_speculative_tokens": 0},
        {},
    ],
)
def test_speculation_off_emits_no_speculative_flag(params: dict[str, Any]) -> None:
    argv = _launch(params).argv
    assert _spec_flags(argv) == []


@pytest.mark.parametrize(
    "params",
    [
        {},
        ALL_PARAMS,
        {"num_speculative_tokens": 2, "draft_model": "ngram", "max_num_seqs": 64},
        {"chunk_size": 512, "max_num_seqs": 2, "memory_fraction": 0.2},
    ],
)
@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_never_the_ambiguous_cuda_graph_flag(params: dict[str, Any], eager: bool, version: str) -> None:
    """``--cuda-graph-max-bs`` is an ambiguous prefix in 0.5.23 (``..-decode`` / ``..-prefill``)."""
    argv = _launch(params, enforce_eager=eager, version=version).argv
    assert not any(a == "--cuda-graph-max-bs" or a.startswith("--cuda-graph-max-bs=") for a in argv), argv
    flags = [a for a in argv if a.startswith("--")]
    assert len(flags) == len(set(flags)), f"a flag is given twice: {argv}"


# --- versions ------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23", "0.5.23.post1"])
def test_supported_versions(version: str) -> None:
    assert _launch({}, version=version).argv[0] == PYTHON


@pytest.mark.parametrize("version", ["0.4.0", "0.5.2", "0.5.230", "0.5.1", "0.5.24", "1.0.0", ""])
def test_unsupported_version_is_refused_naming_the_supported_ones(version: str) -> None:
    with pytest.raises(EnvironmentSetupError) as info:
        _launch(ALL_PARAMS, version=version)
    message = str(info.value)
    assert "not supported" in message
    assert "sglang" in message
    for supported in SglangAdapter.supported_versions:
        assert supported in message


# --- server stats from two /metrics scrapes ------------------------------------------------------

LABEL = 'model_name="/models/target",engine_type="unified",tp_rank="0",pp_rank="0"'


def _scrape(
    *,
    accept_length: float | None,
    accept_rate: float | None,
    hit_rate: float | None,
    retracted: float,
    ttft_sum: float,
    ttft_count: float,
) -> dict[str, float]:
    """A /metrics page as SGLang writes it; a gauge given as None is left out of the page."""
    lines = ["# HELP sglang:num_running_reqs The number of running requests.", "# TYPE sglang:num_running_reqs gauge"]
    lines.append(f"sglang:num_running_reqs{{{LABEL}}} 3.0")
    gauges = {
        "sglang:spec_accept_length": accept_length,
        "sglang:spec_accept_rate": accept_rate,
        "sglang:cache_hit_rate": hit_rate,
    }
    for name, value in gauges.items():
        if value is not None:
            lines += [f"# TYPE {name} gauge", f"{name}{{{LABEL}}} {value}"]
    lines += [
        "# TYPE sglang:num_retracted_requests_total counter",
        f"sglang:num_retracted_requests_total{{{LABEL}}} {retracted}",
        "# TYPE sglang:time_to_first_token_seconds histogram",
        f'sglang:time_to_first_token_seconds_bucket{{{LABEL},le="0.1"}} {ttft_count / 2}',
        f'sglang:time_to_first_token_seconds_bucket{{{LABEL},le="+Inf"}} {ttft_count}',
        f"sglang:time_to_first_token_seconds_sum{{{LABEL}}} {ttft_sum}",
        f"sglang:time_to_first_token_seconds_count{{{LABEL}}} {ttft_count}",
    ]
    samples = parse_prometheus("\n".join(lines) + "\n")
    expected = sum(1 for line in lines if not line.startswith("#"))
    assert len(samples) == expected  # every sample line parsed
    return samples


BEFORE = _scrape(accept_length=1.5, accept_rate=0.2, hit_rate=0.1, retracted=4, ttft_sum=2.0, ttft_count=8)
STAT_KEYS = {
    "spec_acceptance_rate",
    "spec_mean_accept_len",
    "preemptions",
    "prefix_cache_hit_rate",
    "server_ttft_mean_ms",
}


def test_server_stats_from_two_scrapes() -> None:
    after = _scrape(accept_length=2.85, accept_rate=0.62, hit_rate=0.45, retracted=7, ttft_sum=5.0, ttft_count=20)
    stats = SglangAdapter().server_stats(BEFORE, after)
    assert set(stats) == STAT_KEYS
    # gauges: the value at the end of the run, not a difference
    assert stats["spec_mean_accept_len"] == pytest.approx(2.85)
    assert stats["spec_acceptance_rate"] == pytest.approx(0.62)
    assert stats["prefix_cache_hit_rate"] == pytest.approx(0.45)
    # counter: the difference
    assert stats["preemptions"] == pytest.approx(3.0)
    # histogram: 3.0 s over 12 new first tokens
    assert stats["server_ttft_mean_ms"] == pytest.approx(250.0)


def test_gauges_are_read_from_the_after_scrape_even_when_they_fell() -> None:
    after = _scrape(accept_length=1.1, accept_rate=0.05, hit_rate=0.0, retracted=4, ttft_sum=2.0, ttft_count=8)
    stats = SglangAdapter().server_stats(BEFORE, after)
    assert stats["spec_mean_accept_len"] == pytest.approx(1.1)
    assert stats["spec_acceptance_rate"] == pytest.approx(0.05)
    assert stats["prefix_cache_hit_rate"] == 0.0, "a reported 0 is a value, not a missing gauge"
    assert stats["preemptions"] == 0.0
    assert stats["server_ttft_mean_ms"] is None, "no first token between the scrapes"


@pytest.mark.parametrize(
    ("missing", "keys"),
    [
        # without an accept length no speculation is known to have run: neither figure is claimed
        ("accept_length", {"spec_mean_accept_len", "spec_acceptance_rate"}),
        ("accept_rate", {"spec_acceptance_rate"}),
        ("hit_rate", {"prefix_cache_hit_rate"}),
    ],
)
def test_an_absent_gauge_is_none(missing: str, keys: set[str]) -> None:
    values: dict[str, Any] = {"accept_length": 3.0, "accept_rate": 0.7, "hit_rate": 0.5}
    values[missing] = None
    after = _scrape(**values, retracted=5, ttft_sum=4.0, ttft_count=12)
    stats = SglangAdapter().server_stats(BEFORE, after)
    assert all(stats[k] is None for k in keys)
    others = {"spec_mean_accept_len", "spec_acceptance_rate", "prefix_cache_hit_rate"} - keys
    assert all(stats[k] is not None for k in others)
    assert stats["preemptions"] == pytest.approx(1.0)
    assert stats["server_ttft_mean_ms"] == pytest.approx(500.0)


def test_a_gauge_only_in_the_before_scrape_is_none() -> None:
    after = _scrape(accept_length=None, accept_rate=None, hit_rate=None, retracted=4, ttft_sum=2.0, ttft_count=8)
    stats = SglangAdapter().server_stats(BEFORE, after)
    assert stats["spec_mean_accept_len"] is None
    assert stats["spec_acceptance_rate"] is None
    assert stats["prefix_cache_hit_rate"] is None


def test_vllm_samples_are_not_read_as_sglang_ones() -> None:
    after = {
        'vllm:num_preemptions_total{engine="0"}': 9.0,
        'vllm:time_to_first_token_seconds_sum{engine="0"}': 3.0,
        'vllm:time_to_first_token_seconds_count{engine="0"}': 3.0,
        'vllm:prefix_cache_hits_total{engine="0"}': 5.0,
    }
    stats = SglangAdapter().server_stats({}, after)
    assert stats["preemptions"] == 0.0
    assert stats["server_ttft_mean_ms"] is None
    assert stats["prefix_cache_hit_rate"] is None
    assert stats["spec_acceptance_rate"] is None and stats["spec_mean_accept_len"] is None


def test_counters_and_histograms_summed_across_label_sets() -> None:
    before = {
        'sglang:num_retracted_requests_total{dp_rank="0"}': 1.0,
        'sglang:num_retracted_requests_total{dp_rank="1"}': 2.0,
        'sglang:time_to_first_token_seconds_sum{dp_rank="0"}': 1.0,
        'sglang:time_to_first_token_seconds_count{dp_rank="0"}': 4.0,
    }
    after = {
        'sglang:num_retracted_requests_total{dp_rank="0"}': 3.0,
        'sglang:num_retracted_requests_total{dp_rank="1"}': 6.0,
        'sglang:time_to_first_token_seconds_sum{dp_rank="0"}': 2.0,
        'sglang:time_to_first_token_seconds_count{dp_rank="0"}': 8.0,
        'sglang:time_to_first_token_seconds_sum{dp_rank="1"}': 1.0,
        'sglang:time_to_first_token_seconds_count{dp_rank="1"}': 4.0,
    }
    stats = SglangAdapter().server_stats(before, after)
    assert stats["preemptions"] == pytest.approx(6.0)
    # 2.0 s over 8 new first tokens, across both ranks
    assert stats["server_ttft_mean_ms"] == pytest.approx(250.0)


def test_rate_gauges_with_several_label_sets_stay_rates() -> None:
    after = {
        'sglang:spec_accept_rate{dp_rank="0"}': 0.6,
        'sglang:spec_accept_rate{dp_rank="1"}': 0.8,
        'sglang:spec_accept_length{dp_rank="0"}': 2.0,
        'sglang:spec_accept_length{dp_rank="1"}': 3.0,
        'sglang:cache_hit_rate{dp_rank="0"}': 0.5,
        'sglang:cache_hit_rate{dp_rank="1"}': 0.7,
    }
    stats = SglangAdapter().server_stats({}, after)
    rate, hits, length = stats["spec_acceptance_rate"], stats["prefix_cache_hit_rate"], stats["spec_mean_accept_len"]
    assert rate is not None and 0.6 <= rate <= 0.8
    assert hits is not None and 0.5 <= hits <= 0.7
    assert length is not None and 2.0 <= length <= 3.0


# --- every speculative method --------------------------------------------------------------------

HEADS = ModelSpec(
    path="/models/target",
    drafts={"eagle3-head": "/models/eagle3-head", "eagle-head": "/models/eagle-head"},
    draft_kinds={"eagle3-head": "eagle3", "eagle-head": "eagle"},
    mtp_layers=1,
)


@pytest.mark.parametrize(
    ("method", "draft", "algorithm", "path"),
    [
        ("eagle3", "eagle3-head", "EAGLE3", "/models/eagle3-head"),
        ("eagle", "eagle-head", "EAGLE", "/models/eagle-head"),
        ("mtp", None, "NEXTN", "/models/target"),  # the target's own MTP layers
    ],
)
@pytest.mark.parametrize(("k", "tree", "topk", "tokens"), [(3, None, 1, 4), (3, [1, 9], 1, 4), (3, [4, 8], 4, 8),
                                                           (1, [4, 8], 4, 5), (2, [2, 99], 2, 7)])  # fmt: skip
def test_the_eagle_family_sets_its_three_tree_flags_together(
    method: str, draft: str | None, algorithm: str, path: str, k: int, tree: list[int] | None, topk: int, tokens: int
) -> None:
    params: dict[str, Any] = {"spec_method": method, "num_speculative_tokens": k}
    params.update({"draft_model": draft} if draft else {})
    params.update({"spec_tree": tree} if tree else {})
    argv = _launch(params, model=HEADS).argv
    assert _value(argv, "--speculative-algorithm") == algorithm
    assert _value(argv, "--speculative-draft-model-path") == path
    assert int(_value(argv, "--speculative-num-steps")) == k
    # top-k 1 is a chain of K + 1; a wider tree keeps at most what K steps of it propose, plus one
    assert (int(_value(argv, "--speculative-eagle-topk")), int(_value(argv, "--speculative-num-draft-tokens"))) == (
        topk, tokens,
    )  # fmt: skip


def test_sglang_has_no_suffix_decoding() -> None:
    assert "suffix" not in SglangAdapter().spec_methods
    assert set(SglangAdapter().spec_methods) == {"draft_model", "eagle", "eagle3", "mtp", "ngram"}


def test_the_scheduler_limits_are_sglangs_own_defaults_by_gpu_memory() -> None:
    adapter = SglangAdapter()
    h200 = adapter.scheduler_limits({}, CUDA)  # 140 GiB: ServerArgs' 8192 for "H20, H200"
    assert (h200.token_budget, h200.max_seqs, h200.prefill_first) == (8192, None, True)
    assert adapter.scheduler_limits({}, Device("cuda", "NVIDIA B200", 180 * 2**30)).token_budget == 16384
    assert adapter.scheduler_limits({}, Device("cuda", "NVIDIA L4", 24 * 2**30)).token_budget == 2048
    assert adapter.scheduler_limits({}, Device("cuda", "", 0)).token_budget == 4096  # memory unknown
    given = adapter.scheduler_limits({"chunk_size": 1024, "max_num_seqs": 64}, CUDA)
    assert (given.token_budget, given.max_seqs, given.prefill_first) == (1024, 64, True)


def test_speculation_caps_the_running_requests_as_sglang_does_when_none_are_given() -> None:
    # SGLang 0.5.17 on the H200, the same draft at K=3 as this config, --max-running-requests not given:
    # its resolved server_args hold the cap the scheduler then runs with
    captured = CAPTURES / "sglang-0.5.17-h200" / "boot_ok_8b_standalone_draft_k3.log"
    resolved = [int(n) for n in re.findall(r"max_running_requests=(\d+)", captured.read_text())]
    assert resolved and "reset to 48 for speculative decoding" in captured.read_text()
    spec = {"spec_method": "draft_model", "draft_model": "draft-2l", "num_speculative_tokens": 3, "spec_tree": [1, 2]}
    adapter = SglangAdapter()
    assert adapter.scheduler_limits(spec, CUDA).max_seqs == resolved[-1]
    assert adapter.scheduler_limits({**spec, "max_num_seqs": 256}, CUDA).max_seqs == 256  # given, it stands
    assert adapter.scheduler_limits({**spec, "spec_method": "ngram"}, CUDA).max_seqs == resolved[-1]
    # without speculation the default log resolves thousands from the pool: unbounded for the model
    assert adapter.scheduler_limits({"num_speculative_tokens": 0}, CUDA).max_seqs is None

"""SGLang adapter: ``sglang.launch_server`` argv and ``sglang:*`` metrics. Needs an NVIDIA GPU.

Parameter → flag mapping:

* ``chunk_size`` → ``--chunked-prefill-size N``
* ``memory_fraction`` → ``--mem-fraction-static F``
* ``max_num_seqs`` → ``--max-running-requests N``
* ``tensor_parallel`` → ``--tp-size N``
* speculation (``tuner.engines.speculation``), K > 0 → ``--speculative-algorithm A`` with SGLang's
  name for the method (``SPEC_METHODS``: the same in 0.5.17 and 0.5.23, read in each version's
  ``server_args.py`` and ``speculative/spec_info.py``; suffix decoding is not among them). The
  algorithm is always given: a draft path without it starts with speculation silently off.

  * ``draft_model`` (STANDALONE), ``eagle`` (EAGLE), ``eagle3`` (EAGLE3), ``mtp`` (NEXTN, which
    SGLang runs through EAGLE) → ``--speculative-draft-model-path PATH`` (the draft's or head's
    folder; for MTP the target's own, where its MTP layers are) with the three tree flags always
    together (SGLang derives the missing ones, or fails on a bare assert): ``--speculative-num-steps
    K --speculative-eagle-topk T --speculative-num-draft-tokens D``. K is the number of draft steps,
    as in vLLM. ``spec_tree`` [T, D] sets the tree; without it, or with T = 1, the tree is a chain
    and D = K + 1 (SGLang's own rule for top-k 1). A wider tree proposes T + (K - 1) x T x T
    candidates, from which it keeps D - 1 (``organize_draft_results`` of 0.5.23's
    ``eagle_utils.py``), so D is capped at that + 1.
  * ``ngram`` (NGRAM) → ``--speculative-ngram-max-bfs-breadth 1 --speculative-num-draft-tokens K``:
    n-gram lookup in the prompt, no model. Breadth 1 makes the proposal a chain of K tokens, as
    vLLM's ``ngram`` with K speculative tokens (left at its default of 10, SGLang would overwrite
    top-k and derive steps = draft tokens // 10).

``--enable-metrics`` is always on (``/metrics`` exists only then). Readiness is
``/health_generate``, which answers 200 only once a generation ran.

Benchmark client (``tuner verify``): ``python -m sglang.bench_serving --backend sglang-oai`` (the
OpenAI completions endpoint the tuner drives) on a ShareGPT file, through its own parser and
``cli_main`` (``BENCH_SERVING``), with its ShareGPT reader replaced by one that keeps the file's
entries in order at each entry's ``output_tokens``; ignore_eos is its default. Its reader, the same in
0.5.17 and 0.5.23 (``sglang/benchmark/datasets/sharegpt.py``), always shuffles, and takes one
``--sharegpt-output-len`` for every request or else each reply's token count: with the rag preset's
answers of 256 to 768 tokens, one length for all would leave a few requests of a step for the client
to send. ``--output-details`` writes ``ttfts``, ``itls``, ``output_lens``, ``errors`` but no start
times, so its rows carry no send times (``BenchRows.timed`` False).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from tuner.engines.base import (
    SCRIPTS,
    BenchRows,
    Config,
    Device,
    EngineAdapter,
    LaunchSpec,
    ModelSpec,
    SchedulerLimits,
    rows_from_lists,
)
from tuner.engines.prometheus import histogram_mean_delta, metric_total
from tuner.engines.speculation import OFF, WITH_DRAFT, WITH_TARGET_LAYERS, SpecSupport, draft_of, method_of

# SGLang's own client with its ShareGPT reader told two things of the tuner's file, as vLLM's is
# (tuner/engines/vllm.py): every entry is kept, in order, and each request asks for its entry's
# "output_tokens" (unless --sharegpt-output-len names one for all). Sending, timing and the
# per-request output are the client's own (``sglang.benchmark.serving``, where ``python -m
# sglang.bench_serving`` leads in 0.5.17 and 0.5.23).
BENCH_DATASET = (
    "import json\n"
    "from sglang.benchmark.datasets import sharegpt\n"
    "from sglang.benchmark.datasets.common import DatasetRow\n"
    "def _in_order(dataset_path, num_requests, tokenizer, fixed_output_len=None, **_):\n"
    "    with open(dataset_path) as f:\n"
    "        entries = json.load(f)[:num_requests]\n"
    "    return [DatasetRow(prompt=e['conversations'][0]['value'],\n"
    "                       prompt_len=len(tokenizer.encode(e['conversations'][0]['value'])),\n"
    "                       output_len=fixed_output_len or int(e['output_tokens'])) for e in entries]\n"
    "sharegpt.sample_sharegpt_requests = _in_order\n"
)
BENCH_SERVING = BENCH_DATASET + "from sglang.benchmark.serving import cli_main\ncli_main()\n"

_TREE = ("spec_tree",)  # the EAGLE family's draft tree: top-k and draft tokens, K being the steps
SPEC_METHODS = MappingProxyType({
    "draft_model": SpecSupport("STANDALONE", _TREE),
    "eagle": SpecSupport("EAGLE", _TREE),
    "eagle3": SpecSupport("EAGLE3", _TREE),
    "mtp": SpecSupport("NEXTN", _TREE),
    "ngram": SpecSupport("NGRAM"),
})  # fmt: skip
# --max-running-requests as SGLang sets it when the config speculates and leaves it out (scheduler_limits)
SPEC_MAX_RUNNING = 48
# Failure signatures: SGLang's own log lines (tests/data/captures), most specific first.
SIGNATURES: tuple[tuple[str, str], ...] = (
    (r"Loaded weights leave no GPU memory for the KV cache", "kv_insufficient"),  # 0.5.17
    (r"Not enough memory\. Please try to increase --mem-fraction-static", "kv_insufficient"),  # 0.5.23
    (r"Capture cuda graph failed", "oom_boot"),
)

# What SGLang logs when it changes the config it was given (its server_args and
# arg_groups/speculative_hook.py; 0.5.17 on the H200, tests/data/captures/sglang-0.5.17-h200): with
# speculation and no --max-running-requests it caps the running requests, and a method that takes
# one value of a flag overrides the one given.
OVERRIDES: tuple[tuple[str, str], ...] = (
    (r"Max running requests is reset to (?P<n>\d+) for speculative decoding",
     "at most {n} running requests (SGLang's cap with speculation; --max-running-requests not given)"),
    (r"overriding (?P<flag>\w+)=(?P<was>\S+) to (?P<now>[^\s.]+)", "{flag} {now}, not {was}"),
    (r"Overlap schedule is not implemented for (?P<what>[^.]+)", "no overlap schedule ({what})"),
)  # fmt: skip


def tree(k: int, given: Sequence[int] | None) -> tuple[int, int]:
    """Top-k and draft tokens of the draft tree for K steps: a chain of K + 1 without ``given`` or at
    top-k 1, else the draft tokens given, capped at what K steps of that top-k propose, plus one."""
    if not given or int(given[0]) <= 1:
        return 1, k + 1
    topk = int(given[0])
    return topk, max(2, min(int(given[1]), topk + (k - 1) * topk * topk + 1))


class SglangAdapter(EngineAdapter):
    name = "sglang"
    distributions = ("sglang",)
    module = "sglang.launch_server"
    supported_versions = ("0.5.17", "0.5.23")
    image = "lmsysorg/sglang"
    default_port = 30000
    health_path = "/health_generate"
    ready_line = "The server is fired up and ready to roll!"
    spec_methods = SPEC_METHODS
    check_script = str(SCRIPTS / "check_sglang.py")
    failure_signatures = SIGNATURES
    config_overrides = OVERRIDES
    export_formats = ("sh", "json", "python")  # SGLang's users launch from Python as often as from a shell
    runtime_class = "sglang.Runtime"
    reset_cache_path = "/flush_cache"
    # SGLang answers 400 ("Cache not flushed because there are pending requests") until the
    # requests it is running or queueing are gone, such as those of a step the tuner cut short.
    reset_busy_status = 400
    ttft_histogram = "sglang:time_to_first_token_seconds"
    waiting_gauge = "sglang:num_queue_reqs"
    needs_gpu = True
    bench_module = "sglang.bench_serving"
    bench_own_output_lens = True  # BENCH_SERVING reads each entry's output_tokens

    def bench_argv(
        self, python: str, base_url: str, model: str, tokenizer: str, dataset: str, result: str, rate: float,
        n: int, output_len: int | None, seed: int,
    ) -> list[str]:  # fmt: skip
        one_length = [] if output_len is None else ["--sharegpt-output-len", str(output_len)]
        return [
            python, "-c", BENCH_SERVING, "--backend", "sglang-oai", "--base-url", base_url, "--model", model,
            "--tokenizer", tokenizer, "--dataset-name", "sharegpt", "--dataset-path", dataset, *one_length,
            "--temperature", "0", "--request-rate", f"{rate:.6g}", "--num-prompts", str(n),
            "--warmup-requests", "0", "--seed", str(seed), "--disable-tqdm", "--output-file", result,
            "--output-details",
        ]  # fmt: skip

    def bench_rows(self, result: Mapping[str, Any]) -> BenchRows:
        return rows_from_lists(result["ttfts"], result["itls"], result["output_lens"], result["errors"], None)

    def launch(
        self, config: Config, model: ModelSpec, device: Device, port: int, python: str, version: str
    ) -> LaunchSpec:
        self.check_version(version)
        args = ["--model-path", model.path, "--context-length", str(model.max_model_len), "--enable-metrics"]
        if model.load_format:
            args += ["--load-format", model.load_format]
        args += self._tuned_flags(config.params, model)
        return LaunchSpec(
            engine=self.name,
            python=python,
            module=self.module,
            args=tuple(args),
            host="127.0.0.1",
            port=port,
            health_path=self.health_path,
            served_model=model.path,
            ready_line=self.ready_line,
        )

    def _tuned_flags(self, params: Mapping[str, Any], model: ModelSpec) -> list[str]:
        flags: list[str] = []
        if "chunk_size" in params:
            flags += ["--chunked-prefill-size", str(params["chunk_size"])]
        if "memory_fraction" in params:
            flags += ["--mem-fraction-static", f"{float(params['memory_fraction']):g}"]
        if "max_num_seqs" in params:
            flags += ["--max-running-requests", str(params["max_num_seqs"])]
        if "tensor_parallel" in params:
            flags += ["--tp-size", str(params["tensor_parallel"])]
        if method_of(params) != OFF:
            flags += self._spec_flags(params, model)
        return flags

    def _spec_flags(self, params: Mapping[str, Any], model: ModelSpec) -> list[str]:
        method, k = method_of(params), int(params["num_speculative_tokens"])
        support = self.spec_methods[method]
        flags = ["--speculative-algorithm", support.name]
        if "spec_tree" not in support.params:
            # n-gram: breadth 1 makes the proposal a chain, SGLang then sets steps = draft tokens = K
            return [*flags, "--speculative-ngram-max-bfs-breadth", "1", "--speculative-num-draft-tokens", str(k)]
        if method in WITH_DRAFT:
            flags += ["--speculative-draft-model-path", model.draft_path(draft_of(params) or "")]
        elif method in WITH_TARGET_LAYERS:
            flags += ["--speculative-draft-model-path", model.path]
        topk, tokens = tree(k, params.get("spec_tree"))
        return [*flags, "--speculative-num-steps", str(k), "--speculative-eagle-topk", str(topk),
                "--speculative-num-draft-tokens", str(tokens)]  # fmt: skip

    def server_stats(self, before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float | None]:
        def gauge(name: str) -> float | None:
            # SGLang reports acceptance as gauges: the value at the end of the run, averaged over
            # label sets (one per DP rank), since a rate must not be summed.
            values = [v for k, v in after.items() if k.split("{")[0] == name]
            return sum(values) / len(values) if values else None

        def delta(name: str) -> float:
            return metric_total(after, name) - metric_total(before, name)

        # With speculation off SGLang still exports the gauges, at 0: an accept length below 1 means
        # no speculation ran (with it on, every step accepts at least the verified token).
        accept_len = gauge("sglang:spec_accept_length")
        speculating = accept_len is not None and accept_len >= 1.0
        prompts = delta("sglang:prompt_tokens_total")
        # The cache_hit_rate gauge read 0.0 through a whole H200 study whose counters showed most prompt
        # tokens cached (reports/gpu-h200.md, "What surprised me"): the counters over the drive are the measure.
        hit_rate = delta("sglang:cached_tokens_total") / prompts if prompts > 0 else gauge("sglang:cache_hit_rate")
        ttft_mean = histogram_mean_delta(before, after, self.ttft_histogram)
        return {
            "spec_acceptance_rate": gauge("sglang:spec_accept_rate") if speculating else None,
            "spec_mean_accept_len": accept_len if speculating else None,
            "preemptions": delta("sglang:num_retracted_requests_total"),
            "prefix_cache_hit_rate": hit_rate,
            "server_ttft_mean_ms": None if ttft_mean is None else ttft_mean * 1000.0,
        }

    def default_params(self, device: Device) -> dict[str, Any]:
        return {}  # SGLang derives chunk size and memory fraction from the GPU itself

    def scheduler_limits(self, params: Mapping[str, Any], device: Device) -> SchedulerLimits:
        # ServerArgs._handle_gpu_memory_settings (0.5.17; 0.5.23's memory_hook gives the same): the
        # chunked-prefill size by the GPU's total memory, 4096 where it is unknown
        gib = device.memory_bytes / 2**30
        default = 4096 if gib <= 0 else 2048 if gib < 35 else 4096 if gib < 60 else 8192 if gib < 160 else 16384
        # --max-running-requests, when not given, comes from the KV pool (resolve_max_num_reqs: at least
        # 2048 where the pool allows), above any batch a capacity step here reaches: unbounded. With
        # speculation SGLang sets it to SPEC_MAX_RUNNING instead ("Max running requests is reset to 48
        # for speculative decoding", speculative_hook of 0.5.23 for every algorithm this adapter passes;
        # 0.5.17's server_args read max_running_requests=48 in study 1's trial 6 on the H200)
        seqs = params.get("max_num_seqs")
        if seqs is None and method_of(params) != OFF:
            seqs = SPEC_MAX_RUNNING
        # Without --enable-mixed-chunk (the default, and no parameter of the space sets it), the scheduler
        # runs a prefill batch whenever a request can be admitted or a prompt is mid-way, and the
        # running requests decode only in the iterations between (Scheduler.get_next_batch_to_run)
        return SchedulerLimits(int(params.get("chunk_size", default)), None if seqs is None else int(seqs), True)

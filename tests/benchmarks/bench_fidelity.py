"""Fidelity against the engine: does the tuner's driver measure what vLLM and ``vllm bench serve`` see?

Run: ``.venv/bin/python -m tests.benchmarks.bench_fidelity [--requests N] [--rounds R]
[--concurrency 1 2 4]`` (about 20 minutes on 2 cores with the defaults, 400 requests x 3 rounds).
Not part of the default test run; boots vLLM, so run it under ``flock /tmp/tuner-engine.lock``.

One real vLLM CPU server is booted the way a trial boots it (``VllmAdapter.launch``,
``ServerProcess``, the generated default model, ``memory_fraction`` 0.9 of a 32 MiB KV budget,
``--enforce-eager``), plus ``VLLM_SERVER_DEV_MODE=1`` so the prefix cache can be reset between
runs: the rag prompts share a system prompt and passages, and without a reset whichever tool ran
second would find the other's prefixes cached. After one discarded warmup pass, each round sends,
at each concurrency, the same ``rag`` requests (seed 0) twice, once by each tool, the tool that
goes first alternating from one concurrency and one round to the next:

* ``tuner``: ``tuner.client.driver.drive_sync`` and ``tuner.measure.metrics.summarize``, as a trial does;
* ``vllm``: ``vllm bench serve`` (its module, run from the vLLM environment's Python; the console
  script fails in the CPU build) on a dataset file holding the same prompts in the same order
  (``--disable-shuffle``), ``--sharegpt-output-len 48 --ignore-eos --temperature 0``,
  ``--max-concurrency C`` and an infinite request rate: a closed loop at C. The file is in ShareGPT
  form (one human turn per prompt, sent as is, no chat template): the ``custom`` JSONL dataset
  needs pandas, which the vLLM CPU environment lacks. ShareGPT drops prompts over 1024 tokens;
  rag's are at most 1000, and the run checks, request by request, that both tools sent the same
  prompt tokens.

Around every run ``/metrics`` is scraped, so each run also has the server's own mean TTFT
(``vllm:time_to_first_token_seconds`` sum / count deltas: an exact mean, not a bucket estimate).
Compared: (a) the client mean TTFT against the server's mean, per tool; (b) the tuner against
``vllm bench serve``: TTFT p50/p95, mean E2E and output throughput.

Resolution. Request i is the same prompt, with the same cache hits, in both tools' runs of a round,
so request i of the tuner's run and request i of vllm's form a pair; most of a rag TTFT's spread is
the prompt (cached or not), common to both. The 95 % intervals of the TTFT and E2E differences are
therefore a paired bootstrap over the pairs of all rounds (resampling pairs, not each side apart):
they hold the tools' and the machine's noise, not the prompt mix both tools share. The unpaired
interval (each side resampled alone, what earlier runs reported) is kept beside it. Output
throughput is one number per run, so its spread is only across rounds; the mean E2E of a closed loop
at C is its inverse (Little's law: throughput ~ C x tokens / mean E2E), which gives it a paired
interval too.

What limits it on a small machine: while vLLM's CPU build generates, its worker and engine-core
processes keep most of two cores busy, so a client sharing them is now and then kept off the CPU
(the stall columns: a probe process's wake-up lateness during each run) and then reads a stream late,
in one piece (the merged column). Runs with different stall levels disagree whatever the tools do,
which is why the tools alternate and each round's differences are shown apart.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tests.benchmarks import _engine, _report
from tuner.client.driver import RequestRecord, drive_sync
from tuner.engines.base import Config, Device
from tuner.engines.models import default_models
from tuner.engines.prometheus import histogram_mean_delta, metric_total
from tuner.engines.vllm import VllmAdapter
from tuner.measure.metrics import summarize
from tuner.measure.process import ServerProcess, free_port
from tuner.measure.trial import reset_prefix_cache
from tuner.workloads import build_workload
from tuner.workloads.base import Request, load_tokenizer

NAME = "fidelity"
MAX_MODEL_LEN = 2048
TTFT = "vllm:time_to_first_token_seconds"
BOOTSTRAP = 2000
STALL_PROBE = (
    "import json, sys, threading, time\n"
    "lags, stop = [], threading.Event()\n"
    "threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()\n"
    "while not stop.is_set():\n"
    "    t0 = time.perf_counter(); time.sleep(0.005); lags.append(time.perf_counter() - t0 - 0.005)\n"
    "lags.sort()\n"
    "print(json.dumps({'p99_ms': lags[int(0.99 * (len(lags) - 1))] * 1e3, 'max_ms': lags[-1] * 1e3}))\n"
)
GOAL_PCT = 5.0
SERVER_CORE, CLIENT_CORE = 1, 0  # --pin
QUIET_STALL_MS = 20.0
VLLM_BENCH = (
    "import argparse, sys\n"
    "from vllm.benchmarks import serve\n"
    "parser = argparse.ArgumentParser()\n"
    "serve.add_cli_args(parser)\n"
    "serve.main(parser.parse_args(sys.argv[1:]))\n"
)


@dataclass
class ToolRun:
    """One tool's run at one concurrency in one round; the per-request lists are in request order."""

    tool: str
    concurrency: int
    round: int
    ttft_ms: list[float | None]  # None where the request failed
    e2e_ms: list[float | None]
    prompt_tokens: list[int | None]
    ttft_mean_ms: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    output_throughput_tok_s: float
    duration_s: float
    completed: int
    failed: int
    prompt_tokens_total: int
    output_tokens_total: int
    server_ttft_mean_ms: float | None = None
    server_ttft_count: float = 0.0
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def run_tuner(base_url: str, model: str, requests: tuple[Request, ...], concurrency: int, rnd: int) -> ToolRun:
    drove = drive_sync(None, base_url, model, requests, concurrency=concurrency)
    m = summarize(drove)
    timed = [_elapsed_ms(r) for r in drove.records]
    return ToolRun(
        "tuner", concurrency, rnd, [t for t, _ in timed], [e for _, e in timed],
        [r.prompt_tokens or None for r in drove.records],
        m["ttft_mean_ms"], m["ttft_p50_ms"], m["ttft_p95_ms"], m["output_throughput_tok_s"], m["duration_s"],
        sum(t is not None for t, _ in timed), int(m["n_errors"]), int(m["prompt_tokens_total"]),
        int(m["output_tokens_total"]),
    )  # fmt: skip


def _elapsed_ms(r: RequestRecord) -> tuple[float | None, float | None]:
    """(TTFT, E2E) of a request that succeeded; (None, None) for one that failed."""
    if r.error is not None or r.first_token_s is None or r.done_s is None:
        return None, None
    return (r.first_token_s - r.sent_s) * 1e3, (r.done_s - r.sent_s) * 1e3


def run_vllm_bench(
    python: str, port: int, model: str, dataset: Path, n: int, concurrency: int, rnd: int, out: Path
) -> ToolRun:
    name = f"vllm-bench-c{concurrency}-r{rnd}"
    argv = [
        python, "-c", VLLM_BENCH, "--backend", "openai", "--host", "127.0.0.1", "--port", str(port),
        "--endpoint", "/v1/completions", "--model", model, "--tokenizer", model,
        "--dataset-name", "sharegpt", "--dataset-path", str(dataset), "--num-prompts", str(n),
        "--disable-shuffle", "--sharegpt-output-len", "48", "--no-oversample", "--ignore-eos",
        "--temperature", "0", "--max-concurrency", str(concurrency), "--num-warmups", "0", "--seed", "0",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95", "--disable-tqdm",
        "--save-result", "--save-detailed", "--result-dir", str(out), "--result-filename", f"{name}.json",
    ]  # fmt: skip
    code = _engine.run_group(argv, out / f"{name}.log", timeout_s=1200)
    if code != 0:
        raise RuntimeError(f"vllm bench serve exited with {code}; see {out / f'{name}.log'}")
    result = json.loads((out / f"{name}.json").read_text())
    good = [not e and bool(t) for t, e in zip(result["ttfts"], result["errors"], strict=True)]
    ttft = [t * 1e3 if g else None for t, g in zip(result["ttfts"], good, strict=True)]
    e2e = [t * 1e3 if g else None for t, g in zip(result["latencies"], good, strict=True)]
    return ToolRun(
        "vllm", concurrency, rnd, ttft, e2e, [int(x) for x in result["input_lens"]],
        result["mean_ttft_ms"], result["p50_ttft_ms"], result["p95_ttft_ms"],
        result["output_throughput"], result["duration"], result["completed"], result["failed"],
        int(sum(result["input_lens"])), int(result["total_output_tokens"]),
    )  # fmt: skip


def write_dataset(requests: tuple[Request, ...], path: Path) -> None:
    """The requests' prompts as a ShareGPT file: one human turn each (the reply is never sent)."""
    for r in requests:
        assert r.body.get("ignore_eos") and r.body.get("temperature") == 0.0, "rag must be greedy, ignore_eos"
        assert r.max_tokens == 48, "vllm bench is given --sharegpt-output-len 48"
    rows = [{"conversations": [{"from": "human", "value": r.body["prompt"]}, {"from": "gpt", "value": ""}]}
            for r in requests]  # fmt: skip
    path.write_text(json.dumps(rows))


@contextmanager
def stall_probe(found: dict[str, float]) -> Iterator[None]:
    """How late a process that sleeps 5 ms at a time wakes up meanwhile: the machine's scheduling stalls.

    Its own process and session, so it competes for the cores as either tool's client does and perturbs
    neither; a client stalled this long reads a stream late, and its TTFT grows by the stall.
    """
    probe = subprocess.Popen([sys.executable, "-c", STALL_PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, start_new_session=True)  # fmt: skip
    try:
        yield
    finally:
        out, _ = probe.communicate(input="", timeout=30)  # closing its stdin ends it
        found.update(json.loads(out))


def measured(run: Any, client: httpx.Client, base_url: str) -> ToolRun:
    """Reset the prefix cache, scrape, run, scrape: the run with the server's own TTFT mean."""
    if not reset_prefix_cache(client, base_url, VllmAdapter()):
        raise SystemExit(f"{base_url}: the prefix cache was not emptied (is VLLM_SERVER_DEV_MODE=1 set?)")
    before = _engine.scrape(client, base_url)
    started = time.monotonic()
    stalls: dict[str, float] = {}
    with stall_probe(stalls):
        result: ToolRun = run()
    result.wall_s = time.monotonic() - started
    result.extra |= {f"stall_{k}": v for k, v in stalls.items()}
    after = _engine.scrape(client, base_url)
    mean_s = histogram_mean_delta(before, after, TTFT)
    result.server_ttft_mean_ms = None if mean_s is None else mean_s * 1e3
    result.server_ttft_count = metric_total(after, f"{TTFT}_count") - metric_total(before, f"{TTFT}_count")
    hits = metric_total(after, "vllm:prefix_cache_hits_total") - metric_total(before, "vllm:prefix_cache_hits_total")
    queries = metric_total(after, "vllm:prefix_cache_queries_total") - metric_total(
        before, "vllm:prefix_cache_queries_total"
    )
    result.extra["prefix_cache_hit_rate"] = hits / queries if queries else None
    return result


Statistic = Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]]


def _percentile(q: float) -> Statistic:
    return lambda x: np.percentile(x, q, axis=-1)


def _mean(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.asarray(np.mean(x, axis=-1))


def bootstrap_rel_diff(
    a: list[float], b: list[float], stat: Statistic, paired: bool, seed: int = 0
) -> tuple[float, float]:
    """95 % interval of stat(a) / stat(b) - 1, in percent: pairs resampled together, or each side alone."""
    rng = np.random.default_rng(seed)
    xa, xb = np.asarray(a), np.asarray(b)
    ia = rng.integers(0, len(xa), size=(BOOTSTRAP, len(xa)))
    ib = ia if paired else rng.integers(0, len(xb), size=(BOOTSTRAP, len(xb)))
    diffs = (stat(xa[ia]) / stat(xb[ib]) - 1) * 100
    low, high = np.percentile(diffs, [2.5, 97.5])
    return float(low), float(high)


def run(n: int, rounds: int, concurrencies: list[int], pin: bool = False) -> dict[str, Any]:
    started = _report.stamp()
    machine_before = _report.machine()
    env = _engine.vllm_env()
    model = default_models(env.python, MAX_MODEL_LEN)
    out = _engine.run_dir(NAME)
    adapter = VllmAdapter()
    config = Config("vllm", {"memory_fraction": 0.9}, enforce_eager=True)
    spec = adapter.launch(config, model, Device("cpu", "cpu", 32 * 2**20), free_port(), env.python, env.version)
    spec = replace(spec, env={**spec.env, "VLLM_SERVER_DEV_MODE": "1"})
    if pin:  # the server's whole tree on one core (its OMP threads too), the clients on the other
        pinned = out / "pinned-python"  # the engine's python under taskset: a launch runs one interpreter
        pinned.write_text(f'#!/bin/sh\nexec taskset -c {SERVER_CORE} {shlex.quote(spec.python)} "$@"\n')
        pinned.chmod(0o755)
        spec = replace(spec, python=str(pinned),
                       env={**spec.env, "VLLM_CPU_OMP_THREADS_BIND": str(SERVER_CORE)})  # fmt: skip
        os.sched_setaffinity(0, {CLIENT_CORE})  # inherited by vllm bench serve and the stall probe
    tokenizer = load_tokenizer(Path(model.path))
    workload = build_workload("rag", tokenizer, seed=0, n_requests=n, max_model_len=MAX_MODEL_LEN, concurrency=1)
    dataset = out / "rag-prompts.sharegpt.json"
    write_dataset(workload.requests, dataset)
    runs: list[ToolRun] = []
    with ServerProcess(spec, out / "vllm-server.log") as server, httpx.Client(timeout=30.0) as client:
        boot_s = server.wait_ready(300.0)
        print(f"booted in {boot_s:.0f} s; warmup", flush=True)
        drive_sync(None, server.base_url, spec.served_model, workload.warmup, concurrency=1)
        for rnd in range(rounds):
            for i, c in enumerate(concurrencies):
                tools = {
                    "tuner": lambda c=c, rnd=rnd: run_tuner(server.base_url, spec.served_model, workload.requests,
                                                            c, rnd),
                    "vllm": lambda c=c, rnd=rnd: run_vllm_bench(env.python, spec.port, spec.served_model, dataset,
                                                                n, c, rnd, out),
                }  # fmt: skip
                for tool in ["tuner", "vllm"] if (i + rnd) % 2 == 0 else ["vllm", "tuner"]:
                    runs.append(measured(tools[tool], client, server.base_url))
                    _progress(runs[-1])
        alive = server.alive()
        tree = _engine.process_tree(server.pid)
    leftover = _engine.still_alive(tree)
    return {
        "stamp": started, "machine_before": machine_before, "machine_after": _report.machine(),
        "engine_version": env.version, "workload_digest": workload.digest(), "argv": list(spec.argv), "boot_s": boot_s,
        "requests": n, "rounds": rounds, "concurrencies": concurrencies,
        "pinned": {"server_core": SERVER_CORE, "client_core": CLIENT_CORE} if pin else None,
        "prompt_tokens": [r.prompt_tokens for r in workload.requests], "server_alive_at_end": alive,
        "logs": str(out.relative_to(_report.ROOT)), "engine_processes_after": leftover,
        "runs": [_as_dict(r) for r in runs], "comparisons": [_compare(runs, c) for c in concurrencies],
    }  # fmt: skip


def _progress(r: ToolRun) -> None:
    print(f"round {r.round} c={r.concurrency} {r.tool:<5} ttft mean {r.ttft_mean_ms:.0f} ms (server "
          f"{r.server_ttft_mean_ms}) p95 {r.ttft_p95_ms:.0f} ms, {r.output_throughput_tok_s:.1f} tok/s, "
          f"{r.wall_s:.0f} s", flush=True)  # fmt: skip


def _as_dict(r: ToolRun) -> dict[str, Any]:
    rounded = {k: [None if v is None else round(v, 3) for v in getattr(r, k)] for k in ("ttft_ms", "e2e_ms")}
    kept = {k: v for k, v in r.__dict__.items() if k != "prompt_tokens"}  # checked pair by pair in _compare
    return kept | rounded | {"merged_fraction": merged_fraction(r)}


def merged_fraction(r: ToolRun) -> float:
    """Share of requests whose first token came in the last quarter of their time: the stream arrived in one piece.

    The chunks are still separate; they were read late, all at once, because the client (or vLLM's API
    process) was kept off the CPU while they were produced. Its TTFT is then nearly its E2E.
    """
    both = [(t, e) for t, e in zip(r.ttft_ms, r.e2e_ms, strict=True) if t is not None and e is not None]
    return sum(e - t < 0.25 * e for t, e in both) / len(both) if both else float("nan")


def _pairs(tuner: list[ToolRun], vllm: list[ToolRun], key: str) -> tuple[list[float], list[float], bool]:
    """The values of requests that succeeded in both tools' runs of a round; and whether prompts matched."""
    a: list[float] = []
    b: list[float] = []
    same = True
    for t, v in zip(tuner, vllm, strict=True):
        same &= t.prompt_tokens == v.prompt_tokens
        for x, y in zip(getattr(t, key), getattr(v, key), strict=True):
            if x is not None and y is not None:
                a.append(x)
                b.append(y)
    return a, b, same


def _pooled_vs_server(runs: list[ToolRun]) -> float:
    """Client mean TTFT against the server's, over all the runs' requests (count-weighted)."""
    count = sum(r.server_ttft_count for r in runs)
    if not count or any(r.server_ttft_mean_ms is None for r in runs):
        return float("nan")
    server = sum((r.server_ttft_mean_ms or 0.0) * r.server_ttft_count for r in runs) / count
    client = sum(r.ttft_mean_ms * r.completed for r in runs) / sum(r.completed for r in runs)
    return _report.pct_diff(client, server)


def _compare(runs: list[ToolRun], c: int) -> dict[str, Any]:
    t = sorted((r for r in runs if r.tool == "tuner" and r.concurrency == c), key=lambda r: r.round)
    v = sorted((r for r in runs if r.tool == "vllm" and r.concurrency == c), key=lambda r: r.round)
    ttft_t, ttft_v, same_prompts = _pairs(t, v, "ttft_ms")
    e2e_t, e2e_v, _ = _pairs(t, v, "e2e_ms")
    out: dict[str, Any] = {
        "concurrency": c, "pairs": len(ttft_t), "same_prompt_tokens": same_prompts,
        "same_output_tokens": all(a.output_tokens_total == b.output_tokens_total for a, b in zip(t, v, strict=True)),
        "tuner_vs_server_mean_pct": _pooled_vs_server(t), "vllm_vs_server_mean_pct": _pooled_vs_server(v),
        "tuner_vs_server_mean_pct_runs": [_pct(r.ttft_mean_ms, r.server_ttft_mean_ms) for r in t],
        "vllm_vs_server_mean_pct_runs": [_pct(r.ttft_mean_ms, r.server_ttft_mean_ms) for r in v],
        "tuner_minus_server_mean_ms": _report.median([r.ttft_mean_ms - (r.server_ttft_mean_ms or math.nan) for r in t]),
        "vllm_minus_server_mean_ms": _report.median([r.ttft_mean_ms - (r.server_ttft_mean_ms or math.nan) for r in v]),
        "output_throughput_pct_rounds": [_report.pct_diff(a.output_throughput_tok_s, b.output_throughput_tok_s)
                                         for a, b in zip(t, v, strict=True)],
    }  # fmt: skip
    out["output_throughput_pct"] = statistics.fmean(out["output_throughput_pct_rounds"])
    for q in (50, 95):  # each round alone: a check on the pooled interval, whose pairs share one loop's timing
        out[f"ttft_p{q}_pct_rounds"] = [
            _report.pct_diff(a.ttft_p50_ms if q == 50 else a.ttft_p95_ms, b.ttft_p50_ms if q == 50 else b.ttft_p95_ms)
            for a, b in zip(t, v, strict=True)
        ]
    for name, xa, xb, stat in (
        ("ttft_p50", ttft_t, ttft_v, _percentile(50)),
        ("ttft_p95", ttft_t, ttft_v, _percentile(95)),
        ("ttft_mean", ttft_t, ttft_v, _mean),
        ("e2e_mean", e2e_t, e2e_v, _mean),
    ):
        out[f"{name}_pct"] = float((stat(np.asarray(xa)) / stat(np.asarray(xb)) - 1) * 100)
        out[f"{name}_pct_ci95"] = bootstrap_rel_diff(xa, xb, stat, paired=True)
        out[f"{name}_pct_ci95_unpaired"] = bootstrap_rel_diff(xa, xb, stat, paired=False)
    return out  # fmt: skip


def _pct(value: float, reference: float | None) -> float:
    return _report.pct_diff(value, reference) if reference else float("nan")


def verdict(ci: tuple[float, float], goal_pct: float = GOAL_PCT) -> str:
    """Whether a 95 % interval settles "within goal_pct": inside it, wholly outside it, or neither."""
    low, high = ci
    if -goal_pct < low and high < goal_pct:
        return "within"
    if low >= goal_pct or high <= -goal_pct:
        return "outside"
    return "unresolved"


def _ci(c: dict[str, Any], name: str) -> str:
    low, high = c[f"{name}_pct_ci95"]
    ulow, uhigh = c[f"{name}_pct_ci95_unpaired"]
    paired = f"{c[f'{name}_pct']:+.1f} [{low:+.1f}, {high:+.1f}] {verdict((low, high))}"
    return f"{paired} (unpaired [{ulow:+.0f}, {uhigh:+.0f}])"


def _spread(values: list[float]) -> str:
    return f"{statistics.fmean(values):+.1f} ({min(values):+.1f} to {max(values):+.1f})"


def resolution(data: dict[str, Any]) -> str:
    """What the intervals resolve, how far single rounds stray from them, and the rounds run without stalls."""
    comps, runs = data["comparisons"], data["runs"]
    parts = []
    for name in ("ttft_p50", "ttft_p95"):
        widths = "/".join(f"{c[f'{name}_pct_ci95'][1] - c[f'{name}_pct_ci95'][0]:.1f}" for c in comps)
        spreads = "/".join(f"{max(c[f'{name}_pct_rounds']) - min(c[f'{name}_pct_rounds']):.0f}" for c in comps)
        parts.append(f"{name.replace('ttft_', 'TTFT ')}: interval {widths} points wide, rounds {spreads} points apart")
    quiet = []
    for c in data["concurrencies"]:
        for rnd in range(data["rounds"]):
            pair = {r["tool"]: r for r in runs if r["concurrency"] == c and r["round"] == rnd}
            if all((r["extra"].get("stall_p99_ms") or math.inf) < QUIET_STALL_MS for r in pair.values()):
                t, v = pair["tuner"], pair["vllm"]
                quiet.append(f"{c}/{rnd}: {_report.pct_diff(t['ttft_p50_ms'], v['ttft_p50_ms']):+.1f}, "
                             f"{_report.pct_diff(t['ttft_p95_ms'], v['ttft_p95_ms']):+.1f}")  # fmt: skip
    return (
        f"Resolution reached, at concurrency {'/'.join(map(str, data['concurrencies']))}: "
        + "; ".join(parts)
        + ". A 5 % goal needs an interval inside +-5; the intervals resample requests within runs, so they do not "
        "hold what differs between runs (a stall holds up consecutive requests together), which the rounds show. "
        f"Rounds where neither tool's run had a stall p99 over {QUIET_STALL_MS:.0f} ms (conc./round: TTFT p50 %, "
        f"p95 %): {'; '.join(quiet) if quiet else 'none'}."
    )


def markdown(data: dict[str, Any], title: str = "## Fidelity against the engine (`bench_fidelity`)") -> str:
    runs, comps = data["runs"], data["comparisons"]
    run_rows = [
        [r["round"], r["concurrency"], r["tool"], r["completed"], r["failed"], r["ttft_mean_ms"],
         r["server_ttft_mean_ms"], int(r["server_ttft_count"]), r["ttft_p50_ms"], r["ttft_p95_ms"],
         r["output_throughput_tok_s"], r["duration_s"], r["prompt_tokens_total"], r["output_tokens_total"],
         r["extra"]["prefix_cache_hit_rate"], r["merged_fraction"], r["extra"].get("stall_p99_ms"),
         r["extra"].get("stall_max_ms")]
        for r in runs
    ]  # fmt: skip
    comp_rows = [
        [c["concurrency"], c["pairs"], _spread(c["tuner_vs_server_mean_pct_runs"]), c["tuner_minus_server_mean_ms"],
         _spread(c["vllm_vs_server_mean_pct_runs"]), c["vllm_minus_server_mean_ms"], _ci(c, "ttft_p50"),
         _ci(c, "ttft_p95"), " / ".join(f"{p50:+.1f}, {p95:+.1f}" for p50, p95 in
                                         zip(c["ttft_p50_pct_rounds"], c["ttft_p95_pct_rounds"], strict=True)),
         _ci(c, "ttft_mean"), _ci(c, "e2e_mean"), _spread(c["output_throughput_pct_rounds"]),
         c["same_prompt_tokens"] and c["same_output_tokens"]]
        for c in comps
    ]  # fmt: skip
    m0, m1 = data["machine_before"], data["machine_after"]
    lens = data["prompt_tokens"]
    return "\n\n".join(
        [
            title,
            f"vLLM {data['engine_version']} CPU build, booted in {data['boot_s']:.0f} s; "
            f"{data['requests']} rag requests (seed 0, prompts {min(lens)}-{max(lens)} tokens, 48 output tokens, "
            f"ignore_eos, temperature 0) per tool, concurrency and round, {data['rounds']} rounds, the prefix cache "
            "reset before every run, tools alternated. "
            + (
                f"Pinned: vLLM's whole process tree on core {data['pinned']['server_core']} (`taskset`, "
                f"`VLLM_CPU_OMP_THREADS_BIND`), both clients and the stall probe on core "
                f"{data['pinned']['client_core']}. "
                if data.get("pinned")
                else ""
            )
            + "Logs and raw `vllm bench serve` JSON: "
            f"`{data['logs']}`. {_report.contention(m0, m1)}",
            "Each run (server = the server's own TTFT histogram, sum/count deltas over that run; merged = share of "
            "requests whose first token came in the last quarter of their E2E, i.e. the stream arrived in one piece, "
            "when the client or vLLM's API process is kept off the CPU; stall = how late a probe process sleeping "
            "5 ms at a time woke up during the run, p99 and max):",
            _report.table(
                [
                    "round",
                    "conc.",
                    "tool",
                    "ok",
                    "failed",
                    "TTFT mean ms",
                    "server TTFT mean ms",
                    "server count",
                    "TTFT p50 ms",
                    "TTFT p95 ms",
                    "out tok/s",
                    "duration s",
                    "prompt tok",
                    "output tok",
                    "prefix hit rate",
                    "merged",
                    "stall p99 ms",
                    "stall max ms",
                ],
                run_rows,
            ),  # fmt: skip
            f"Comparisons (goal: within {GOAL_PCT:.0f} %). Client vs server: (client mean - server mean) / server "
            "mean, mean of the rounds (min to max); the ms columns are medians of the runs. Tuner vs vllm bench: "
            "(tuner - vllm) / vllm over the requests of all rounds, with the paired bootstrap 95 % interval and "
            f"whether it settles the goal (within / outside / unresolved), the unpaired interval in brackets after it; "
            "out tok/s: mean of the rounds' differences (min to max):",
            _report.table(
                [
                    "conc.",
                    "pairs",
                    "tuner vs server %",
                    "tuner - server ms",
                    "vllm vs server %",
                    "vllm - server ms",
                    "TTFT p50 % [95 % CI]",
                    "TTFT p95 % [95 % CI]",
                    "TTFT p50, p95 % per round",
                    "TTFT mean % [95 % CI]",
                    "E2E mean % [95 % CI]",
                    "out tok/s %",
                    "same tokens",
                ],
                comp_rows,
            ),  # fmt: skip
            resolution(data),
            f"Server alive at the end: {data['server_alive_at_end']}; processes of its tree still running after the "
            f"stop: {len(data['engine_processes_after'])}.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--pin", action="store_true", help="vLLM on core 1, both clients on core 0 (taskset)")
    args = parser.parse_args()
    data = run(args.requests, args.rounds, args.concurrency, args.pin)
    if args.pin:
        title = "## Fidelity against the engine, server and clients on separate cores (`bench_fidelity --pin`)"
        text = markdown(data, title)
        _report.write_section(f"{NAME}_pinned", text, data)
    else:
        text = markdown(data)
        _report.write_section(NAME, text, data)
    print(text)
    if data["engine_processes_after"]:
        print("engine processes still alive:", *data["engine_processes_after"], sep="\n", file=sys.stderr)


if __name__ == "__main__":
    main()

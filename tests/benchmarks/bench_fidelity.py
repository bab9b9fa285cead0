"""Fidelity against the engine: does the tuner's driver measure what vLLM and ``vllm bench serve`` see?

Run: ``.venv/bin/python -m tests.benchmarks.bench_fidelity [--requests N] [--concurrency 1 2 4]``
(about 10 minutes on 2 cores with the defaults). Not part of the default test run.

One real vLLM CPU server is booted the way a trial boots it (``VllmAdapter.launch``,
``ServerProcess``, the generated default model, ``memory_fraction`` 0.9 of a 32 MiB KV budget,
``--enforce-eager``), plus ``VLLM_SERVER_DEV_MODE=1`` so the prefix cache can be reset between
runs: the rag prompts share a system prompt and passages, and without a reset whichever tool ran
second would find the other's prefixes cached. After one discarded warmup pass, at each
concurrency the same ``rag`` requests (seed 0) are sent twice, once by each tool, the tool that
goes first alternating from one concurrency to the next:

* ``tuner``: ``tuner.driver.drive_sync`` and ``tuner.metrics.summarize``, as a trial does;
* ``vllm``: ``vllm bench serve`` (its module, run from the vLLM environment's Python; the console
  script fails in the CPU build) on a dataset file holding the same prompts in the same order
  (``--disable-shuffle``), ``--sharegpt-output-len 48 --ignore-eos --temperature 0``,
  ``--max-concurrency C`` and an infinite request rate: a closed loop at C. The file is in ShareGPT
  form (one human turn per prompt, sent as is, no chat template): the ``custom`` JSONL dataset
  needs pandas, which the vLLM CPU environment lacks. ShareGPT drops prompts over 1024 tokens;
  rag's are at most 1000, and the run checks that both tools sent the same prompt tokens.

Around every run ``/metrics`` is scraped, so each run also has the server's own mean TTFT
(``vllm:time_to_first_token_seconds`` sum / count deltas: an exact mean, not a bucket estimate).
Compared: (a) the client mean TTFT against the server's mean, per tool; (b) the tuner against
``vllm bench serve``: TTFT p50/p95 and output throughput, with bootstrap 95 % intervals of the
relative TTFT differences (resampling the requests of each run), so a 5 % goal can be told apart
from the noise of N requests.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tests.benchmarks import _engine, _report
from tuner.driver import drive_sync
from tuner.engines.base import Config, Device
from tuner.engines.vllm import VllmAdapter
from tuner.metrics import histogram_mean_delta, metric_total, summarize
from tuner.models import default_models
from tuner.process import ServerProcess, free_port
from tuner.workloads import build_workload
from tuner.workloads.base import Request, load_tokenizer

NAME = "fidelity"
MAX_MODEL_LEN = 2048
TTFT = "vllm:time_to_first_token_seconds"
BOOTSTRAP = 2000
VLLM_BENCH = (
    "import argparse, sys\n"
    "from vllm.benchmarks import serve\n"
    "parser = argparse.ArgumentParser()\n"
    "serve.add_cli_args(parser)\n"
    "serve.main(parser.parse_args(sys.argv[1:]))\n"
)


@dataclass
class ToolRun:
    tool: str
    concurrency: int
    ttft_ms: list[float]
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


def run_tuner(base_url: str, model: str, requests: tuple[Request, ...], concurrency: int) -> ToolRun:
    drove = drive_sync(None, base_url, model, requests, concurrency=concurrency)
    m = summarize(drove)
    ok = [r for r in drove.records if r.error is None and r.first_token_s is not None]
    return ToolRun(
        "tuner", concurrency, [(r.first_token_s - r.sent_s) * 1e3 for r in ok if r.first_token_s is not None],
        m["ttft_mean_ms"], m["ttft_p50_ms"], m["ttft_p95_ms"], m["output_throughput_tok_s"], m["duration_s"],
        len(ok), int(m["n_errors"]), int(m["prompt_tokens_total"]), int(m["output_tokens_total"]),
    )  # fmt: skip


def run_vllm_bench(python: str, port: int, model: str, dataset: Path, n: int, concurrency: int, out: Path) -> ToolRun:
    name = f"vllm-bench-c{concurrency}"
    argv = [
        python, "-c", VLLM_BENCH, "--backend", "openai", "--host", "127.0.0.1", "--port", str(port),
        "--endpoint", "/v1/completions", "--model", model, "--tokenizer", model,
        "--dataset-name", "sharegpt", "--dataset-path", str(dataset), "--num-prompts", str(n),
        "--disable-shuffle", "--sharegpt-output-len", "48", "--no-oversample", "--ignore-eos",
        "--temperature", "0", "--max-concurrency", str(concurrency), "--num-warmups", "0", "--seed", "0",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95", "--disable-tqdm",
        "--save-result", "--save-detailed", "--result-dir", str(out), "--result-filename", f"{name}.json",
    ]  # fmt: skip
    code = _engine.run_group(argv, out / f"{name}.log", timeout_s=600)
    if code != 0:
        raise RuntimeError(f"vllm bench serve exited with {code}; see {out / f'{name}.log'}")
    result = json.loads((out / f"{name}.json").read_text())
    ttft_ms = [t * 1e3 for t, e in zip(result["ttfts"], result["errors"], strict=True) if not e and t]
    return ToolRun(
        "vllm", concurrency, ttft_ms, result["mean_ttft_ms"], result["p50_ttft_ms"], result["p95_ttft_ms"],
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


def measured(run: Any, client: httpx.Client, base_url: str) -> ToolRun:
    """Reset the prefix cache, scrape, run, scrape: the run with the server's own TTFT mean."""
    client.post(base_url + "/reset_prefix_cache").raise_for_status()
    before = _engine.scrape(client, base_url)
    started = time.monotonic()
    result: ToolRun = run()
    result.wall_s = time.monotonic() - started
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


def bootstrap_rel_diff(a: list[float], b: list[float], q: float, seed: int = 0) -> tuple[float, float]:
    """95 % interval of (q-th percentile of a) / (of b) - 1, in percent, resampling each side."""
    rng = random.Random(seed)
    xa, xb = np.asarray(a), np.asarray(b)
    diffs = []
    for _ in range(BOOTSTRAP):
        ra = xa[[rng.randrange(len(xa)) for _ in xa]]
        rb = xb[[rng.randrange(len(xb)) for _ in xb]]
        diffs.append((np.percentile(ra, q) / np.percentile(rb, q) - 1) * 100)
    low, high = np.percentile(diffs, [2.5, 97.5])
    return float(low), float(high)


def run(n: int, concurrencies: list[int]) -> dict[str, Any]:
    code = _report.code_state()
    machine_before = _report.machine()
    env = _engine.vllm_env()
    model = default_models(env.python, MAX_MODEL_LEN)
    out = _engine.run_dir(NAME)
    adapter = VllmAdapter()
    config = Config("vllm", {"memory_fraction": 0.9}, enforce_eager=True)
    spec = adapter.launch(config, model, Device("cpu", "cpu", 32 * 2**20), free_port(), env.python, env.version)
    spec = replace(spec, env={**spec.env, "VLLM_SERVER_DEV_MODE": "1"})
    tokenizer = load_tokenizer(Path(model.path))
    workload = build_workload("rag", tokenizer, seed=0, n_requests=n, max_model_len=MAX_MODEL_LEN, concurrency=1)
    dataset = out / "rag-prompts.sharegpt.json"
    write_dataset(workload.requests, dataset)
    runs: list[ToolRun] = []
    with ServerProcess(spec, out / "vllm-server.log") as server, httpx.Client(timeout=30.0) as client:
        boot_s = server.wait_ready(300.0)
        print(f"booted in {boot_s:.0f} s; warmup", flush=True)
        drive_sync(None, server.base_url, spec.served_model, workload.warmup, concurrency=1)
        for i, c in enumerate(concurrencies):
            tools = {
                "tuner": lambda c=c: run_tuner(server.base_url, spec.served_model, workload.requests, c),
                "vllm": lambda c=c: run_vllm_bench(env.python, spec.port, spec.served_model, dataset, n, c, out),
            }
            for tool in (["tuner", "vllm"] if i % 2 == 0 else ["vllm", "tuner"]):
                runs.append(measured(tools[tool], client, server.base_url))
                r = runs[-1]
                print(f"c={c} {tool:<5} ttft mean {r.ttft_mean_ms:.0f} ms (server {r.server_ttft_mean_ms}) "
                      f"p95 {r.ttft_p95_ms:.0f} ms, {r.output_throughput_tok_s:.1f} tok/s, {r.wall_s:.0f} s",
                      flush=True)  # fmt: skip
        alive = server.alive()
        tree = _engine.process_tree(server.pid)
    leftover = _engine.still_alive(tree)
    return {
        "code": code, "machine_before": machine_before, "machine_after": _report.machine(),
        "engine_version": env.version, "workload_digest": workload.digest(), "argv": list(spec.argv), "boot_s": boot_s,
        "requests": n, "concurrencies": concurrencies,
        "prompt_tokens": [r.prompt_tokens for r in workload.requests], "server_alive_at_end": alive,
        "logs": str(out.relative_to(_report.ROOT)), "engine_processes_after": leftover,
        "runs": [_as_dict(r) for r in runs], "comparisons": [_compare(runs, c) for c in concurrencies],
    }  # fmt: skip


def _as_dict(r: ToolRun) -> dict[str, Any]:
    return {k: v for k, v in r.__dict__.items() if k != "ttft_ms"} | {"ttft_ms": [round(t, 3) for t in r.ttft_ms]}


def _compare(runs: list[ToolRun], c: int) -> dict[str, Any]:
    t = next(r for r in runs if r.tool == "tuner" and r.concurrency == c)
    v = next(r for r in runs if r.tool == "vllm" and r.concurrency == c)
    first = next(r.tool for r in runs if r.concurrency == c)
    return {
        "concurrency": c,
        "first": first,
        "tuner_vs_server_mean_pct": _pct(t.ttft_mean_ms, t.server_ttft_mean_ms),
        "vllm_vs_server_mean_pct": _pct(v.ttft_mean_ms, v.server_ttft_mean_ms),
        "tuner_minus_server_mean_ms": t.ttft_mean_ms - (t.server_ttft_mean_ms or float("nan")),
        "vllm_minus_server_mean_ms": v.ttft_mean_ms - (v.server_ttft_mean_ms or float("nan")),
        "ttft_p50_pct": _report.pct_diff(t.ttft_p50_ms, v.ttft_p50_ms),
        "ttft_p50_pct_ci95": bootstrap_rel_diff(t.ttft_ms, v.ttft_ms, 50),
        "ttft_p95_pct": _report.pct_diff(t.ttft_p95_ms, v.ttft_p95_ms),
        "ttft_p95_pct_ci95": bootstrap_rel_diff(t.ttft_ms, v.ttft_ms, 95),
        "output_throughput_pct": _report.pct_diff(t.output_throughput_tok_s, v.output_throughput_tok_s),
        "same_prompt_tokens": t.prompt_tokens_total == v.prompt_tokens_total,
        "same_output_tokens": t.output_tokens_total == v.output_tokens_total,
    }


def _pct(value: float, reference: float | None) -> float:
    return _report.pct_diff(value, reference) if reference else float("nan")


def markdown(data: dict[str, Any], title: str = "## Fidelity against the engine (`bench_fidelity`)") -> str:
    runs, comps = data["runs"], data["comparisons"]
    run_rows = [
        [r["concurrency"], r["tool"], r["completed"], r["failed"], r["ttft_mean_ms"], r["server_ttft_mean_ms"],
         int(r["server_ttft_count"]), r["ttft_p50_ms"], r["ttft_p95_ms"], r["output_throughput_tok_s"],
         r["duration_s"], r["prompt_tokens_total"], r["output_tokens_total"], r["extra"]["prefix_cache_hit_rate"]]
        for r in runs
    ]  # fmt: skip
    comp_rows = [
        [c["concurrency"], c["first"], c["tuner_vs_server_mean_pct"], c["tuner_minus_server_mean_ms"],
         c["vllm_vs_server_mean_pct"], c["vllm_minus_server_mean_ms"],
         f"{c['ttft_p50_pct']:+.1f} [{c['ttft_p50_pct_ci95'][0]:+.1f}, {c['ttft_p50_pct_ci95'][1]:+.1f}]",
         f"{c['ttft_p95_pct']:+.1f} [{c['ttft_p95_pct_ci95'][0]:+.1f}, {c['ttft_p95_pct_ci95'][1]:+.1f}]",
         f"{c['output_throughput_pct']:+.1f}", c["same_prompt_tokens"] and c["same_output_tokens"]]
        for c in comps
    ]  # fmt: skip
    m0, m1 = data["machine_before"], data["machine_after"]
    lens = data["prompt_tokens"]
    return "\n\n".join([
        title,
        f"Run {m0['date_utc']}, vLLM {data['engine_version']} CPU build, booted in {data['boot_s']:.0f} s; "
        f"{data['requests']} rag requests (seed 0, prompts {min(lens)}-{max(lens)} tokens, 48 output tokens, "
        "ignore_eos, temperature 0) per tool and concurrency, the prefix cache reset before every run, tools "
        f"alternated. Logs and raw `vllm bench serve` JSON: `{data['logs']}`. {_report.contention(m0, m1)} "
        + (_report.describe_code(data["code"]) if "code" in data else data.get("code_note", "")),
        "Each run (server = the server's own TTFT histogram, sum/count deltas over that run):",
        _report.table(["conc.", "tool", "ok", "failed", "TTFT mean ms", "server TTFT mean ms", "server count",
                       "TTFT p50 ms", "TTFT p95 ms", "out tok/s", "duration s", "prompt tok", "output tok",
                       "prefix hit rate"], run_rows),  # fmt: skip
        "Comparisons (goal: within 5 %). Client vs server: (client mean - server mean) / server mean. Tuner vs "
        "vllm bench: (tuner - vllm) / vllm, with a bootstrap 95 % interval over the requests of both runs:",
        _report.table(["conc.", "first", "tuner vs server %", "tuner - server ms", "vllm vs server %",
                       "vllm - server ms", "TTFT p50 % [95 % CI]", "TTFT p95 % [95 % CI]", "out tok/s %",
                       "same tokens"], comp_rows),  # fmt: skip
        f"Server alive at the end: {data['server_alive_at_end']}; processes of its tree still running after the "
        f"stop: {len(data['engine_processes_after'])}.",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    data = run(args.requests, args.concurrency)
    text = markdown(data)
    _report.write_section(NAME, text, data)
    print(text)
    if data["engine_processes_after"]:
        print("engine processes still alive:", *data["engine_processes_after"], sep="\n", file=sys.stderr)


if __name__ == "__main__":
    main()

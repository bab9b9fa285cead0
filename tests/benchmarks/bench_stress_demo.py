"""The stress check catching a config that boots and serves its trial, then breaks at peak load.

Run: ``.venv/bin/python -m tests.benchmarks.bench_stress_demo`` (about 6 minutes on 2 cores; real vLLM
CPU engines). Not part of the default test run. Writes
``reports/search_stress.md``.

The case is built on purpose, as on the H200 (a memory fraction of 0.135 booted fine with 20,800 KV
tokens, then queued 53 requests at concurrency 64): a trace of long answers (distinct prompts of
about 700 tokens from the packaged corpus, 256 tokens out, so each request holds about 1,000 tokens
of KV cache while it decodes) arrives in an open loop at a low rate with a cap of ``PEAK`` requests
in flight, so a trial rarely has more than one request at once, and a config whose KV cache holds
only about two of them serves that trial as well as the default. ``tuner search`` runs the engine
default and that config (memory fraction 0.27 of the 32 MiB KV budget), then stress-checks both at
``PEAK`` concurrency. Everything below comes from the study the real `tuner search` wrote.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna

from tests.benchmarks import _report
from tuner.workloads.base import load_corpus

PEAK = 8
RATE = 0.25
REQUESTS = 16
SLO = "ttft_p95_ms=6000"
STARVED = {"engine": "vllm", "vllm.memory_fraction": 0.27, "vllm.chunk_size": 2048}
SPACE = "engines: [vllm]\nparameters:\n  memory_fraction: {choices: [0.27, 0.95]}\n  chunk_size: {choices: [2048]}\n"


def write_trace(path: Path) -> None:
    """Distinct prompts of about 700 words of the packaged corpus, each asking for 256 tokens."""
    words = " ".join(load_corpus()).split()
    with path.open("w") as out:
        for i in range(REQUESTS):
            prompt = " ".join(words[i * 550 : i * 550 + 550]) + "\nSummarise the passage above:"
            body = {"prompt": prompt, "max_tokens": 256, "temperature": 0.0, "ignore_eos": True}
            out.write(json.dumps(body) + "\n")


def main() -> None:
    started = _report.stamp()
    work = _report.ROOT / "studies" / "logs" / "benchmarks" / f"stress-demo-{time.strftime('%Y%m%d-%H%M%S')}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "space.yaml").write_text(SPACE)
    write_trace(work / "long-answers.jsonl")
    storage, name = f"sqlite:///{work / 'demo.db'}", f"stress-demo-{uuid.uuid4().hex[:6]}"
    pre = optuna.create_study(study_name=name, storage=storage, directions=["minimize", "maximize"])
    pre.enqueue_trial(STARVED, user_attrs={"config_kind": "sampled"})
    # a fixed load (--objective pareto), as the collapse this builds needs, rather than a capacity search
    args = ["search", "--workload", str(work / "long-answers.jsonl"), "--study", name, "--storage", storage,
            "--space", str(work / "space.yaml"), "--rate", str(RATE), "--concurrency", str(PEAK), "--slo", SLO,
            "--trials", "2", "--finalists", "1", "--repeats", "1", "--no-prune",
            "--objective", "pareto"]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "tuner", *args], cwd=_report.ROOT, capture_output=True, text=True)
    (work / "search.log").write_text(done.stderr)
    assert done.returncode == 0, done.stderr[-3000:]
    study = optuna.load_study(study_name=name, storage=storage)
    rows = []
    for number, check in sorted(study.user_attrs["stress"].items(), key=lambda kv: int(kv[0])):
        t = study.trials[int(number)]
        m = t.user_attrs["metrics"]
        kv = t.user_attrs["memory_facts"].get("kv_tokens")
        rows.append([number, t.user_attrs.get("config_kind"), json.dumps(t.user_attrs.get("config")), kv,
                     f"{m['ttft_p95_ms']:.0f}", f"{check.get('ttft_p95_ms') or float('nan'):.0f}",
                     f"{check.get('e2e_p95_ms') or float('nan'):.0f}", check["failure"] or "passed"])  # fmt: skip
    text = "\n".join([
        "# Stress check, built on purpose (`tests/benchmarks/bench_stress_demo.py`)", "",
        "A real `tuner search` on the vLLM CPU build "
        f"(log: `{work / 'search.log'}`). Workload: a trace of {REQUESTS} distinct ~700-token prompts with 256 "
        f"tokens out, open loop at {RATE}/s with at most {PEAK} in flight; SLO {SLO}. The stress check: the "
        f"{2 * PEAK} longest requests at concurrency {PEAK}, prefix cache emptied first.", "",
        _report.table(["trial", "kind", "config", "KV cache tokens", "trial TTFT p95 ms", "stress TTFT p95 ms",
                       "stress E2E p95 ms", "stress check"], rows), "",
        f"Verdict of the study: {study.user_attrs['verdict']}.", "",
    ])  # fmt: skip
    text = _report.stamped(text, started) + "\n"
    (_report.REPORTS / "search_stress.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

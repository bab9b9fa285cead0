"""The engine's own benchmark client at a claimed capacity, judged as a trial judges a step.

``tuner verify`` runs the client of the engine that serves (``EngineAdapter.bench_argv``: ``vllm
bench serve``, SGLang's ``bench_serving``) open loop (Poisson) on the requests a trial's capacity
step sends, reads its per-request output into request rows (``EngineAdapter.bench_rows``) and
hands them to ``tuner.measure.capacity.summarize_step``: the attainment is the trial's own, over
the same steady window (requests sent in the middle 80 % of the run), from another client's clock.

What the client can take is what a dataset file holds: single-turn completions, each at its own
output length where the client takes that (``EngineAdapter.bench_own_output_lens``), else at one.
Anything else in the workload (chat or multi-turn requests, other output lengths where the client
takes one) is left out and said in ``notes``, never silently.

While the client runs, the server's waiting queue is sampled (``QueueWatch``) and judged as a step's
is (``tuner.measure.capacity.growing``) while the client sends: an attainment over one step's length
says nothing of a queue still building at its end, which breaks any SLO in time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tuner.engines.base import BenchRows, EngineAdapter
from tuner.engines.prometheus import has_metric, metric_total
from tuner.errors import EngineError, WorkloadError
from tuner.measure.capacity import STEADY_TRIM, Step, growing, summarize_step
from tuner.measure.metrics import scrape_metrics
from tuner.workloads.base import COMPLETIONS_ENDPOINT, Request

__all__ = ["ClientRequests", "QueueWatch", "client_requests", "judge", "read_result", "run_client"]

STEP_FIELDS_OF_OTHERS = ("attainment_low", "attainment_high", "decision")  # shown when Step has them
MAX_EXTRA_S = 300.0  # the client may run this long past its schedule before it is stopped
QUEUE_EVERY_S = 1.0  # how often the server's waiting queue is sampled while the client runs, as in a step


@dataclass(frozen=True)
class ClientRequests:
    """The prompts the client is given, in the step's order, their output lengths, and what was left out;
    ``output_len``: the one length the client is told for all (None: each its own, from the file)."""

    prompts: list[str]
    output_lens: list[int]
    output_len: int | None
    notes: list[str]


def client_requests(requests: Sequence[Request], adapter: EngineAdapter) -> ClientRequests:
    """The requests a dataset file can carry: single-turn completions, each at its own output length
    where the client takes one per request, else those of the commonest length."""
    single = [r for r in requests if r.endpoint == COMPLETIONS_ENDPOINT and r.session_id is None
              and isinstance(r.body.get("prompt"), str)]  # fmt: skip
    notes = []
    if len(single) < len(requests):
        notes.append(f"{len(requests) - len(single)} of {len(requests)} requests are chat or multi-turn, which "
                     f"{adapter.name}'s client cannot replay: only single-turn completions are verified")  # fmt: skip
    if not single:
        raise WorkloadError("the workload has no single-turn completion requests for the engine's client to send")
    output_len: int | None = None
    kept = single
    if not adapter.bench_own_output_lens:
        output_len = Counter(r.max_tokens for r in single).most_common(1)[0][0]
        kept = [r for r in single if r.max_tokens == output_len]
    if len(kept) < len(single):
        notes.append(f"{len(single) - len(kept)} requests ask for another output length than {output_len} tokens; "
                     "the client takes one, so they are left out")  # fmt: skip
    if not kept:
        raise WorkloadError("no request of the workload is one the engine's client can send")
    return ClientRequests([str(r.body["prompt"]) for r in kept], [r.max_tokens for r in kept], output_len, notes)


def run_client(argv: Sequence[str], log: Path, timeout_s: float) -> None:
    """Run the client in its own process group, output to ``log``; the whole group is killed when it
    overruns ``timeout_s`` or anything (Ctrl-C included) interrupts the wait."""
    with log.open("wb") as out:
        proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip
        try:
            code = proc.wait(timeout=timeout_s)
        except BaseException as exc:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            if isinstance(exc, subprocess.TimeoutExpired):
                raise EngineError(f"the engine's benchmark client ran past {timeout_s:.0f} s; see {log}",
                                  "bench_timeout") from exc  # fmt: skip
            raise
    if code != 0:
        raise EngineError(f"the engine's benchmark client exited with {code}; see {log}", "bench_failed")


def read_result(path: Path, adapter: EngineAdapter) -> BenchRows:
    """The client's per-request output as rows: its file holds one JSON object (or JSONL: the last line)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise EngineError(f"the engine's benchmark client wrote no result at {path}", "bench_failed") from exc
    try:
        result = json.loads(text)
    except ValueError:
        result = json.loads(text.strip().splitlines()[-1])
    try:
        return adapter.bench_rows(result)
    except KeyError as exc:
        raise EngineError(f"{path}: the client's output has no {exc} (per-request output missing)",
                          "bench_failed") from exc  # fmt: skip


def judge(
    rate: float, bench: BenchRows, tiers: Mapping[str, Mapping[str, float]], target: float
) -> dict[str, dict[str, Any]]:
    """Each tier's verdict on the client's rows through ``summarize_step``: its steady window when the
    client timed its requests, else all of them (it recorded no send times to cut a window by)."""
    trim = STEADY_TRIM if bench.timed else 0.0
    out = {}
    for tier, slo in tiers.items():
        step = summarize_step(rate, bench.rows, slo, target, max(bench.duration_s, 1e-9), trim=trim)
        out[tier] = _verdict(step, dict(slo), target, trim)
    return out


def _verdict(step: Step, slo: dict[str, float], target: float, trim: float) -> dict[str, Any]:
    found = step.as_dict()
    extra = {key: found[key] for key in STEP_FIELDS_OF_OTHERS if key in found}
    return {
        "slo": slo, "target": target, "attainment": step.attainment, "n_requests": step.n_requests,
        "n_counted": step.n_counted, "n_errors": step.n_errors, "counted": _counted(trim),
        "passed": step.passed, "saturated": step.saturated, "duration_s": step.duration_s,
        "ttft_p95_ms": step.ttft_p95_ms, "tpot_p95_ms": step.tpot_p95_ms, **extra,
    }  # fmt: skip


def _counted(trim: float) -> str:
    if trim == 0:
        return "all requests (the client records no send times)"
    return (f"requests sent in [{trim:.0%}, {1 - trim:.0%}] of the run, from its first request's send "
            "to its last request's end")  # fmt: skip


class QueueWatch:
    """The server's waiting queue (the adapter's ``waiting_gauge``), sampled every ``QUEUE_EVERY_S`` from a
    thread while the client runs: ``with QueueWatch(...) as watch: run_client(...)``, then
    ``watch.growing(duration_s, send_s, rate)``. An engine without the gauge is not sampled."""

    def __init__(self, url: str, gauge: str | None, every_s: float = QUEUE_EVERY_S) -> None:
        self.url, self.gauge, self.every_s = url.rstrip("/"), gauge, every_s
        self.samples: list[tuple[float, float]] = []  # (monotonic s, requests waiting)
        self.ended_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> QueueWatch:
        if self.gauge is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ended_s = time.monotonic()
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _sample(self) -> None:
        assert self.gauge is not None
        with httpx.Client(timeout=5.0) as client:
            while not self._stop.is_set():
                samples = scrape_metrics(client, self.url)
                if has_metric(samples, self.gauge):
                    self.samples.append((time.monotonic(), metric_total(samples, self.gauge)))
                self._stop.wait(self.every_s)

    def window(self, duration_s: float, send_s: float, trim: float = STEADY_TRIM) -> list[tuple[float, float]]:
        """The samples taken while the client sent, less ``trim`` of that at each end, in seconds from
        its first send: its run lasted the ``duration_s`` it reported, ending when it exited, and it
        sent over the first ``send_s`` of it. The drain after the last send is left out: there the
        queue empties whatever the rate, and at a rate the server cannot carry it is longest."""
        start = self.ended_s - duration_s
        kept = [(t - start, n) for t, n in self.samples if start <= t <= self.ended_s]
        return [(t, n) for t, n in kept if trim * send_s <= t <= (1 - trim) * send_s]

    def growing(self, kept: list[tuple[float, float]], rate: float) -> bool | None:
        """Whether the queue kept growing over ``kept`` (``window``'s samples), as a step's is judged
        (None: not sampled)."""
        if self.gauge is None or len(kept) < 3:
            return None
        return growing([t for t, _ in kept], [n for _, n in kept], rate)

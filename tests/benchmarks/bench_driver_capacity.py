"""Driver capacity: how many streamed requests per second ``tuner.client.driver`` sustains, and what it adds.

Run: ``.venv/bin/python -m tests.benchmarks.bench_driver_capacity [--requests N] [--repeats R]``
(3 to 11 minutes on the 2 shared cores, depending on their load). Not part of the default test run.

An instant OpenAI streaming server (``_instant_server``, its own process) answers every
``/v1/completions`` request at once. These clients drive it, interleaved in one run at each
concurrency, the first one rotated from repeat to repeat:

* ``tuner``: ``tuner.client.driver.drive_sync`` (httpx over ``tuner.client.transport.StreamTransport``, SSE
  parsing, records), exactly as a trial drives;
* ``tuner+httpcore``: the same driver given an ``httpx.AsyncClient`` on httpx's default transport
  (httpcore), pooled to the concurrency: what the driver cost before ``StreamTransport``
  (diagnostic: the difference is what the transport saves);
* ``raw``: a minimal asyncio raw-socket client (one keep-alive connection per worker, the request
  bytes prebuilt, chunked framing read with no JSON parsing): the floor of this machine's
  loopback round trip plus the server, so ``tuner - raw`` is what the driver adds;
* ``raw-newconn``: the raw client opening a new connection for every request (diagnostic: what
  losing keep-alive costs on loopback).

The instant server counts the connections it accepted, so each row also says how many requests
each connection carried.

Reported per client and concurrency: request rate (median of the repeats, min-max), TTFT and E2E
p50/p95 over the requests, and the client's CPU time per request (``time.process_time``): when
that times the rate is close to 1 s per second, one core is the limit. The goal (issue 5) is
>= 500 req/s with < 1 ms added TTFT p50, judged at each concurrency against ``raw`` there.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import psutil

from tests.benchmarks import _report
from tuner.client.driver import drive_sync
from tuner.workloads.base import Request

NAME = "driver_capacity"
CONCURRENCIES = (1, 2, 4, 8, 16, 64)
PROMPT = "word " * 800  # about a rag prompt's size on the wire (4 KB)
MAX_TOKENS = 3


@dataclass(frozen=True)
class Run:
    client: str
    concurrency: int
    rate_req_s: float
    ttft_ms: list[float]
    e2e_ms: list[float]
    errors: int
    client_cpu_s: float
    server_cpu_s: float
    n: int
    connections: int


@contextmanager
def instant_server() -> Iterator[tuple[int, psutil.Process]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.benchmarks._instant_server"],
        cwd=_report.ROOT,
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,  # closed when this process ends, however it ends: the server then exits
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield port, psutil.Process(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@functools.lru_cache(maxsize=4)
def requests(n: int) -> tuple[Request, ...]:
    body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
    return tuple(
        Request(request_id=f"r{i:05d}", endpoint="/v1/completions", body=body, prompt_tokens=800, max_tokens=3)
        for i in range(n)
    )


def run_tuner(
    port: int, n: int, concurrency: int, httpcore: bool = False
) -> tuple[float, list[float], list[float], int]:
    """``drive_sync`` as a trial calls it; ``httpcore`` injects a client on httpx's default transport."""
    url = f"http://127.0.0.1:{port}"
    client = None
    if httpcore:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        client = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(limits=limits), timeout=120.0)
    result = drive_sync(client, url, "instant", requests(n), concurrency=concurrency)
    ok = [r for r in result.records if r.error is None and r.first_token_s is not None and r.done_s is not None]
    ttft = [(r.first_token_s - r.sent_s) * 1e3 for r in ok if r.first_token_s is not None]
    e2e = [(r.done_s - r.sent_s) * 1e3 for r in ok if r.done_s is not None]
    return n / (result.ended_s - result.started_s), ttft, e2e, n - len(ok)


def raw_request_bytes(port: int) -> bytes:
    payload = {
        "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True, "model": "instant",
        "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }  # fmt: skip
    body = json.dumps(payload).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
        f"accept: */*\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _raw_worker(port: int, todo: list[int], out: list[tuple[float, float, float]], reuse: bool) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = raw_request_bytes(port)
    try:
        while todo:
            todo.pop()
            sent = time.perf_counter()
            if not reuse:
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            await reader.readuntil(b"\r\n\r\n")
            first = None
            while True:
                size = int((await reader.readline()).strip(), 16)
                data = await reader.readexactly(size + 2)
                if first is None and b'"text": "' in data:
                    first = time.perf_counter()
                if size == 0:
                    break
            done = time.perf_counter()
            out.append((sent, first if first is not None else done, done))
    finally:
        writer.close()


def run_raw(port: int, n: int, concurrency: int, reuse: bool = True) -> tuple[float, list[float], list[float], int]:
    async def main() -> tuple[float, list[tuple[float, float, float]]]:
        todo, out = list(range(n)), []  # type: list[int], list[tuple[float, float, float]]
        started = time.perf_counter()
        await asyncio.gather(*(_raw_worker(port, todo, out, reuse) for _ in range(concurrency)))
        return time.perf_counter() - started, out

    duration, out = asyncio.run(main())
    ttft = [(first - sent) * 1e3 for sent, first, _ in out]
    e2e = [(done - sent) * 1e3 for sent, _, done in out]
    return len(out) / duration, ttft, e2e, n - len(out)


def run_raw_newconn(port: int, n: int, concurrency: int) -> tuple[float, list[float], list[float], int]:
    return run_raw(port, n, concurrency, reuse=False)


Client = Callable[[int, int, int], tuple[float, list[float], list[float], int]]
CLIENTS: dict[str, Client] = {
    "tuner": run_tuner,
    "tuner+httpcore": functools.partial(run_tuner, httpcore=True),
    "raw": run_raw,
    "raw-newconn": run_raw_newconn,
}
GOAL_RATE_REQ_S, GOAL_ADDED_MS = 500.0, 1.0


def server_connections(port: int) -> int:
    return int(httpx.get(f"http://127.0.0.1:{port}/stats").json()["connections"])


def measure(client: str, port: int, server: psutil.Process, n: int, concurrency: int) -> Run:
    connections = server_connections(port)
    server_cpu = sum(server.cpu_times()[:2])
    cpu = time.process_time()
    rate, ttft, e2e, errors = CLIENTS[client](port, n, concurrency)
    client_cpu = time.process_time() - cpu
    server_cpu = sum(server.cpu_times()[:2]) - server_cpu
    connections = server_connections(port) - connections - 1  # the first /stats call's own connection
    return Run(client, concurrency, rate, ttft, e2e, errors, client_cpu, server_cpu, n, connections)


def summarize(runs: list[Run]) -> dict[str, Any]:
    rates = [r.rate_req_s for r in runs]
    ttft = [t for r in runs for t in r.ttft_ms]
    e2e = [t for r in runs for t in r.e2e_ms]
    n = sum(r.n for r in runs)
    low, high = _report.spread(rates)
    return {
        "rate_req_s_median": _report.median(rates),
        "rate_req_s_min": low,
        "rate_req_s_max": high,
        "rates_req_s": rates,
        "ttft_p50_ms": float(np.percentile(ttft, 50)),
        "ttft_p95_ms": float(np.percentile(ttft, 95)),
        "e2e_p50_ms": float(np.percentile(e2e, 50)),
        "e2e_p95_ms": float(np.percentile(e2e, 95)),
        "errors": sum(r.errors for r in runs),
        "requests": n,
        "client_cpu_ms_per_req": sum(r.client_cpu_s for r in runs) * 1e3 / n,
        "server_cpu_ms_per_req": sum(r.server_cpu_s for r in runs) * 1e3 / n,
        "requests_per_connection": n / max(sum(r.connections for r in runs), 1),
    }


def run(n: int, repeats: int) -> dict[str, Any]:
    runs: list[Run] = []
    started = _report.stamp()
    load_before = _report.machine()
    with instant_server() as (port, server):
        for client in CLIENTS:  # one discarded pass each: imports, connection setup, allocator warmup
            measure(client, port, server, 200, 4)
        for concurrency in CONCURRENCIES:
            for rep in range(repeats):
                names = list(CLIENTS)
                shift = (rep + CONCURRENCIES.index(concurrency)) % len(names)
                for client in names[shift:] + names[:shift]:  # rotate who goes first
                    runs.append(measure(client, port, server, n, concurrency))
                    r = runs[-1]
                    print(
                        f"c={concurrency:>3} {client:<5} rep {rep}: {r.rate_req_s:7.0f} req/s "
                        f"ttft p50 {np.median(r.ttft_ms):.2f} ms errors {r.errors}",
                        flush=True,
                    )
    cells = {
        f"{client}@{c}": summarize([r for r in runs if r.client == client and r.concurrency == c])
        for c in CONCURRENCIES
        for client in CLIENTS
    }
    return {
        "stamp": started,
        "machine_before": load_before,
        "machine_after": _report.machine(),
        "requests_per_run": n,
        "repeats": repeats,
        "concurrencies": list(CONCURRENCIES),
        "clients": list(CLIENTS),
        "cells": cells,
    }


def markdown(data: dict[str, Any], title: str = "## Driver capacity (`bench_driver_capacity`)") -> str:
    cells, clients = data["cells"], data["clients"]
    header = [
        "conc.",
        "client",
        "req/s median",
        "req/s min-max",
        "TTFT p50 ms",
        "TTFT p95 ms",
        "E2E p50 ms",
        "E2E p95 ms",
        "client CPU ms/req",
        "server CPU ms/req",
        "req/conn",
        "errors",
    ]
    rows = []
    for c in data["concurrencies"]:
        for name in clients:
            cell = cells[f"{name}@{c}"]
            low_high = f"{cell['rate_req_s_min']:.0f}-{cell['rate_req_s_max']:.0f}"
            rows.append(
                [
                    c,
                    name,
                    cell["rate_req_s_median"],
                    low_high,
                    cell["ttft_p50_ms"],
                    cell["ttft_p95_ms"],
                    cell["e2e_p50_ms"],
                    cell["e2e_p95_ms"],
                    cell["client_cpu_ms_per_req"],
                    cell["server_cpu_ms_per_req"],
                    cell["requests_per_connection"],
                    cell["errors"],
                ]
            )
    added, met = [], []
    for c in data["concurrencies"]:
        tuner, raw = cells[f"tuner@{c}"], cells[f"raw@{c}"]
        extra_ms = tuner["ttft_p50_ms"] - raw["ttft_p50_ms"]
        ok = tuner["rate_req_s_median"] >= GOAL_RATE_REQ_S and extra_ms < GOAL_ADDED_MS
        met += [c] if ok else []
        added.append(
            [
                c,
                tuner["rate_req_s_median"],
                extra_ms,
                tuner["ttft_p95_ms"] - raw["ttft_p95_ms"],
                tuner["e2e_p50_ms"] - raw["e2e_p50_ms"],
                tuner["rate_req_s_median"] / raw["rate_req_s_median"],
                "yes" if ok else "no",
            ]
        )
    best = max(data["concurrencies"], key=lambda c: cells[f"tuner@{c}"]["rate_req_s_median"])
    verdict = (
        f"Goal (>= {GOAL_RATE_REQ_S:.0f} req/s with < {GOAL_ADDED_MS:.0f} ms added TTFT p50) met at "
        f"concurrency {', '.join(map(str, met))}."
        if met
        else "Goal not met at any concurrency."
    )
    m0, m1 = data["machine_before"], data["machine_after"]
    return "\n\n".join(
        [
            title,
            _report.contention(m0, m1),
            f"{data['requests_per_run']} requests per run, {data['repeats']} repeats per "
            "client and concurrency, interleaved with the first client rotated. Instant server: its own process, "
            "plain asyncio, 3 text chunks + usage + [DONE] per request; request body about 4 KB. Latency "
            "percentiles pool every request of the cell's repeats; CPU is per request over the cell.",
            _report.table(header, rows),
            "What `drive_sync` adds over the raw keep-alive floor (medians of the pooled requests):",
            _report.table(
                [
                    "conc.",
                    "tuner req/s",
                    "TTFT p50 added ms",
                    "TTFT p95 added ms",
                    "E2E p50 added ms",
                    "tuner/raw rate",
                    "goal met",
                ],
                added,
            ),
            f"Highest median rate of `drive_sync`: {cells[f'tuner@{best}']['rate_req_s_median']:.0f} req/s "
            f"at concurrency {best}. {verdict} Past the concurrency where one core is busy, a closed loop's added "
            "TTFT is queueing behind the client's own CPU work (about concurrency x its CPU per request).",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=800)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for n in (200, args.requests):
        requests(n)  # built before any timing, so no client pays for it
    data = run(args.requests, args.repeats)
    _report.write_section(NAME, markdown(data), data)
    print(markdown(data))


if __name__ == "__main__":
    main()

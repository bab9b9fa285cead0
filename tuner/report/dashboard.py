"""``tuner dashboard``: optuna-dashboard on a study storage, stopped cleanly by Ctrl-C or SIGTERM.

optuna-dashboard's own ``run_server`` lets a Ctrl-C land wherever the server happens to be; when it
lands inside a response, wsgiref reports it as a failed request and keeps serving, so the process
does not stop. Here the server runs in a thread and the main thread only waits for the signal,
then shuts the server down between requests.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from wsgiref.simple_server import WSGIRequestHandler, make_server

import optuna


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass  # one line per request would bury the address line on a busy dashboard


def serve(storage: optuna.storages.BaseStorage, host: str, port: int) -> None:
    from optuna_dashboard import wsgi

    server = make_server(host, port, wsgi(storage), handler_class=_QuietHandler)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    thread = threading.Thread(target=server.serve_forever, name="dashboard", daemon=True)
    thread.start()
    print(f"optuna-dashboard on http://{host}:{server.server_port}/dashboard", file=sys.stderr, flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
        for sig, handler in previous.items():
            signal.signal(sig, handler)

"""``ServerProcess``: one engine server in its own process group, always stopped.

The server gets a free loopback port, writes stdout and stderr to a log file (never a pipe that
nobody reads), and is polled for readiness until a deadline. Leaving the ``with`` block, for any
reason including Ctrl-C, sends SIGTERM to the whole process group, then SIGKILL to whatever is left
of the group and of the process tree (engines fork workers that may start their own sessions).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import httpx
import psutil

from tuner.engines.base import LaunchSpec
from tuner.errors import EngineLaunchError
from tuner.failures import classify_boot

STOP_GRACE_S = 10.0


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago; the engine binds it next."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, max_lines: int = 100, start: int = 0) -> str:
    """The last lines of a log file from byte offset ``start``; empty if it does not exist."""
    try:
        with path.open("rb") as fh:
            fh.seek(start)
            data = fh.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-max_lines:])


def head(path: Path, max_bytes: int = 4 * 2**20) -> str:
    """The start of a log file (where engines print their memory at boot); empty if it does not exist."""
    try:
        with path.open("rb") as fh:
            return fh.read(max_bytes).decode("utf-8", "replace")
    except OSError:
        return ""


class ServerProcess:
    """Start ``spec`` on enter, stop its whole process group on exit."""

    def __init__(self, spec: LaunchSpec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        self.base_url = f"http://127.0.0.1:{spec.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._tree: dict[int, psutil.Process] = {}

    def __enter__(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.spec.env}
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(  # an argv list: never through a shell
                list(self.spec.argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self._proc is not None, "server not started"
        return self._proc.pid

    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def wait_ready(self, deadline_s: float, poll_s: float = 1.0) -> float:
        """Block until the health path answers 200; return the boot time in seconds."""
        started = time.monotonic()
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() - started < deadline_s:
                self._remember_tree()
                if not self.alive():
                    self._fail(timed_out=False)
                try:
                    healthy = client.get(self.base_url + self.spec.health_path).status_code == 200
                    if healthy and self._ready_line_seen():
                        return time.monotonic() - started
                except httpx.HTTPError:
                    pass  # connection refused until the engine is up
                time.sleep(poll_s)
        self._fail(timed_out=True)
        raise AssertionError("unreachable")

    def _ready_line_seen(self) -> bool:
        return self.spec.ready_line is None or self.spec.ready_line in tail(self.log_path, max_lines=2000)

    def _fail(self, timed_out: bool) -> None:
        code = self.returncode()
        log = tail(self.log_path, max_lines=400)
        failure = classify_boot(log, code, timed_out)
        what = "not ready before the deadline" if timed_out and code is None else f"exited with {code}"
        raise EngineLaunchError(f"{self.spec.engine} {what} ({failure})", failure, tail(self.log_path))

    def _remember_tree(self) -> None:
        """Record descendants while they live, to kill any that left the process group."""
        try:
            self._tree.update((p.pid, p) for p in psutil.Process(self.pid).children(recursive=True))
        except psutil.Error:
            pass

    def stop(self) -> None:
        if self._proc is None:
            return
        self._remember_tree()
        self._signal_group(signal.SIGTERM)
        try:
            self._proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        self._signal_group(signal.SIGKILL)
        for child in self._tree.values():
            try:
                child.kill()  # psutil refuses if the pid was reused meanwhile
            except psutil.Error:
                pass
        self._proc.wait()

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

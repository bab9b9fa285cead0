"""``ServerProcess``: one engine server in its own process group, always stopped.

The server gets a free loopback port, writes stdout and stderr to a log file (never a pipe that
nobody reads), and is polled for readiness until a deadline. Leaving the ``with`` block, for any
reason including Ctrl-C, sends SIGTERM to the whole process group, then SIGKILL to whatever is left
of the group and of the process tree (engines fork workers that may start their own sessions).

The engine runs under ``tuner.measure.reaper``, which stops it when the tuner dies, SIGKILL included (so
``ServerProcess`` must be entered from a thread that outlives it: the kernel's parent-death signal
follows the thread that started the reaper). ``pid`` is the engine's own.

Two failures around the boot are the machine's, not the config's: the port chosen a moment
earlier was taken by someone else before the engine bound it ("address already in use": the boot
is retried once on a fresh port, and a second failure is classified ``port_in_use``), and no room
left for the log (``LogWriteError`` before anything starts: the search stops with one line rather
than recording a failure for every config it would go on to try).

What surrounds an engine server's process: its port, and its log file (made, read back).

``new_log`` refuses to start anything when the log's file system has no room left: a trial's log
is 20-200 KB, and an engine that cannot write it leaves no trace of why it failed, so the search
stops with one line (``LogWriteError``) instead of recording a failure for every config it tries.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import httpx
import psutil

from tuner.engines import ADAPTERS
from tuner.engines.base import EngineAdapter, LaunchSpec
from tuner.errors import EngineLaunchError, TunerError
from tuner.measure import reaper
from tuner.measure.failures import classify_boot, match_signature

__all__ = ["STOP_GRACE_S", "LogWriteError", "ServerProcess", "free_port", "head", "tail"]

STOP_GRACE_S = 10.0


class ServerProcess:
    """Start ``spec`` on enter, stop its whole process group on exit."""

    def __init__(self, spec: LaunchSpec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        self.base_url = f"http://{spec.host}:{spec.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._engine: psutil.Process | None = None
        self._engine_pid = 0
        self._tree: dict[int, psutil.Process] = {}
        self._log_start = 0  # where this boot's lines begin (a retried boot appends)
        self._rebound = False

    @property
    def adapter(self) -> EngineAdapter | None:
        """The adapter of the engine it runs, whose log lines tell why a boot failed (None: not registered)."""
        found = ADAPTERS.get(self.spec.engine)
        return found() if found is not None else None

    def __enter__(self) -> ServerProcess:
        new_log(self.log_path)
        self._start()
        return self

    def _start(self) -> None:
        env = {**os.environ, **self.spec.run_env}
        with self.log_path.open("ab") as log:
            self._proc, self._engine_pid = reaper.spawn(self.spec.argv, env, log, STOP_GRACE_S)
        try:
            self._engine = psutil.Process(self._engine_pid)
        except psutil.Error:
            self._engine = None  # already gone: returncode() says how

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self._proc is not None, "server not started"
        return self._engine_pid

    def returncode(self) -> int | None:
        """The engine's exit status (the reaper exits with it), None while it runs."""
        if self._proc is None:
            return None
        code = self._proc.poll()
        if code is None and not self._engine_running():
            try:
                code = self._proc.wait(timeout=5.0)  # the reaper is clearing the engine's workers
            except subprocess.TimeoutExpired:
                pass
        return code

    def _engine_running(self) -> bool:
        try:
            return self._engine is not None and self._engine.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and self._engine_running()

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
                    if not self._rebound and self._port_taken():
                        self._rebind()
                        continue
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

    def _port_taken(self) -> bool:
        log = tail(self.log_path, max_lines=400, start=self._log_start)
        return match_signature(log, self.adapter) == "port_in_use"

    def _rebind(self) -> None:
        """Someone took the port between ``free_port()`` and the engine's bind: boot once more elsewhere."""
        self.stop()
        self.spec = self.spec.with_port(free_port())
        self.base_url = f"http://{self.spec.host}:{self.spec.port}"
        self._rebound, self._tree = True, {}
        with self.log_path.open("ab") as log:
            log.write(
                f"\ntuner: the port was taken before the engine bound it; retrying on {self.spec.port}\n".encode()
            )
        self._log_start = self.log_size()
        self._start()

    def _ready_line_seen(self) -> bool:
        return self.spec.ready_line is None or self.spec.ready_line in tail(self.log_path, max_lines=2000)

    def _fail(self, timed_out: bool) -> None:
        code = self.returncode()
        log = tail(self.log_path, max_lines=400, start=self._log_start)
        failure = classify_boot(log, code, timed_out, self.adapter)
        what = "not ready before the deadline" if timed_out and code is None else f"exited with {code}"
        raise EngineLaunchError(f"{self.spec.engine} {what} ({failure})", failure, tail(self.log_path))

    def _remember_tree(self) -> None:
        """Record descendants while they live, to kill any that left the process group."""
        try:
            self._tree.update((p.pid, p) for p in psutil.Process(self.pid).children(recursive=True))
        except psutil.Error:
            pass

    def stop(self) -> None:
        """The reaper stops the group (SIGTERM, grace, SIGKILL); then SIGKILL, in case it could not."""
        if self._proc is None:
            return
        self._remember_tree()
        self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(timeout=STOP_GRACE_S + 5.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._signal_group(signal.SIGKILL)
        reaper.kill_and_wait(self._tree.values())
        self._proc.wait()

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self._engine_pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


# The server's log file: room on its disk, and what a failed write means.
MIN_LOG_ROOM_BYTES = 1 << 20


class LogWriteError(TunerError):
    """The trial's log cannot be written (no room, no permission): nothing was started."""


def new_log(path: Path) -> None:
    """Create ``path`` empty, in a folder made if needed, on a file system with room for a log."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(path.parent).free
        path.write_bytes(b"")
    except OSError as exc:
        raise LogWriteError(f"cannot write the trial log {path}: {exc.strerror or exc}") from exc
    if free < MIN_LOG_ROOM_BYTES:
        raise LogWriteError(f"no room for the trial log in {path.parent}: {free} bytes free")


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

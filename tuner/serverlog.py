"""What surrounds an engine server's process: its port, and its log file (made, read back).

``new_log`` refuses to start anything when the log's file system has no room left: a trial's log
is 20-200 KB, and an engine that cannot write it leaves no trace of why it failed, so the search
stops with one line (``LogWriteError``) instead of recording a failure for every config it tries.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from tuner.errors import TunerError

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

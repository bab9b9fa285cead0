"""A private PostgreSQL that a test may stop and start again, made as ``scripts/test.sh`` makes its own
(initdb and pg_ctl from /usr/lib/postgresql/*/bin, as the ``postgres`` user when run as root)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def _bin() -> Path | None:
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: [int(x) for x in p.split("/")[4].split(".")]
    )
    return Path(found[-1]).parent if found else None


class Postgres:
    """``start()``, ``stop()``, ``remove()``; ``url`` is its SQLAlchemy URL (database ``tuner``)."""

    def __init__(self) -> None:
        where = _bin()
        if where is None:
            raise FileNotFoundError("no PostgreSQL under /usr/lib/postgresql")
        self.bin = where
        self.root = Path(tempfile.mkdtemp(prefix="tuner-faults-pg-"))
        self.root.chmod(0o755)
        if os.getuid() == 0:
            shutil.chown(self.root, "postgres")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"postgresql+psycopg2://tuner@127.0.0.1:{self.port}/tuner"
        self._run("initdb", "-D", str(self.root / "data"), "-U", "tuner", "--auth=trust", "-N")
        self.start()
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "tuner", "tuner")

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin / tool), *args]
        if os.getuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        # A clean environment: the server must not carry the test run's process marker.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        subprocess.run(command, check=True, capture_output=True, cwd="/", env=env, timeout=120)

    def start(self) -> None:
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
        self._run("pg_ctl", "-D", str(self.root / "data"), "-l", str(self.root / "log"), "-w", "-o", opts, "start")

    def stop(self) -> None:
        """A fast shutdown: sessions are terminated, connections refused until ``start()``."""
        self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass  # already stopped
        shutil.rmtree(self.root, ignore_errors=True)

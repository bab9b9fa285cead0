"""Write a set of files all or nothing: an export interrupted by Ctrl-C, SIGTERM or a full disk
leaves no half-written launch file and no partial set.

Each file is written in full into a staging folder beside (or, for an existing folder, inside) the
destination, on the same file system, then moved into place with ``os.replace``, which is atomic;
the moves run with SIGINT and SIGTERM held back, and a new destination folder appears in one
rename. A SIGKILL can leave only the hidden staging folder (``.<name>.tuner-export-*``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

from tuner.errors import ExportError


def write_all(out_dir: Path, files: list[tuple[Path, str]]) -> list[Path]:
    """Write ``files`` (names in ``out_dir``, texts); ``.sh`` and ``.py`` become executable."""
    out_dir = out_dir.absolute()
    fresh = not out_dir.exists()
    staging = (out_dir.parent if fresh else out_dir) / f".{out_dir.name}.tuner-export-{uuid.uuid4().hex[:12]}"
    try:
        staging.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()  # the umask's permissions, as the folder would have had when made directly
        try:
            for path, text in files:
                (staging / path.name).write_text(text)
                (staging / path.name).chmod(0o755 if path.suffix in (".sh", ".py") else 0o644)
            with signals_held():
                if fresh:
                    staging.rename(out_dir)
                else:
                    for path, _ in files:
                        os.replace(staging / path.name, out_dir / path.name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as exc:
        raise ExportError(f"cannot write the export to {out_dir}: {exc.strerror or exc}") from exc
    return [out_dir / path.name for path, _ in files]


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block ends, then act as usual. Only the main thread can
    swap handlers; elsewhere the block runs as it is (Python runs handlers in the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum)) for sig in held}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if caught:
            signal.raise_signal(caught[0])

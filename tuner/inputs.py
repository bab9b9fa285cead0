"""Reading a file the user names (a search space, a trace): a regular file of UTF-8 text, parsed
without a traceback however deeply it nests.

A device file or a FIFO given as ``--space`` or ``--workload`` would be read until the process is
killed, and a document nested thousands of levels deep exhausts the parser's recursion; both are bad
input (exit 2), said in one line before anything is built or started.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tuner.errors import ConfigError

T = TypeVar("T")


def read_text(path: Path, what: str, form: str) -> str:
    """The whole text of ``path``; ConfigError (naming ``what`` the file is and the ``form`` of text
    it holds) if it is not a readable regular UTF-8 file."""
    try:
        if path.exists() and not path.is_file():
            raise ConfigError(f"{path}: not a regular file; {what} is a file of {form}")
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text file (no UTF-8 at byte {exc.start}); {what} is {form}") from exc


def parse_bounded(parse: Callable[[str], T], text: str, where: str) -> T:
    """``parse(text)``, with a nesting too deep for the parser as a ConfigError naming ``where``."""
    try:
        return parse(text)
    except RecursionError as exc:
        raise ConfigError(f"{where}: nested too deeply to read") from exc

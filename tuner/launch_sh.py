"""Shell launch files: ``exec "$ENGINE_PYTHON" -m MODULE ARGS...``, and reading one back.

Every value is quoted with ``shlex.quote``, so a model path with spaces or quotes, or the JSON of
``--speculative-config``, stays one argument. The interpreter, host and port can be overridden
with ``ENGINE_PYTHON``, ``HOST`` and ``PORT``. ``read_sh`` reads a file as bash would, so
``tuner check`` validates exactly the command the file runs.
"""

from __future__ import annotations

import shlex
from typing import Any

from tuner.errors import ExportError
from tuner.provenance import provenance

__all__ = ["engine_args", "read_sh", "render_sh"]
ADDRESS_FLAGS = ("--host", "--port")


def engine_args(argv: list[str]) -> tuple[str, list[str]]:
    """Split ``python -m MODULE args...`` into MODULE and the args without host and port."""
    if len(argv) < 3 or argv[1] != "-m":
        raise ExportError(f"not an engine command: {argv[:3]}")
    args, rest = [], iter(argv[3:])
    for arg in rest:
        if arg in ADDRESS_FLAGS:
            next(rest, None)
        else:
            args.append(arg)
    return argv[2], args


def render_sh(m: dict[str, Any]) -> str:
    header = [
        "#!/usr/bin/env bash",
        *provenance(m),
        "# Override the interpreter with ENGINE_PYTHON, the address with HOST and PORT.",
        "set -euo pipefail",
        f"ENGINE_PYTHON=${{ENGINE_PYTHON:-{shlex.quote(m['python'])}}}",
        "HOST=${HOST:-127.0.0.1}",
        "PORT=${PORT:-8000}",
    ]
    lines = [f'exec "$ENGINE_PYTHON" -m {shlex.quote(m["module"])}']
    lines += [f"  {shlex.quote(a)}" for a in m["argv"]]
    lines.append('  --host "$HOST" --port "$PORT"')
    return "\n".join(header) + "\n" + " \\\n".join(lines) + "\n"


def read_sh(text: str) -> tuple[str, list[str]]:
    """The module and engine args of an exported ``*.sh`` (the inverse of ``render_sh``), read as bash
    reads it: a quoted value may hold a newline, and a line ends in ``\\`` only outside quotes."""
    try:
        words = shlex.split(_join_lines(text))
    except ValueError as exc:  # an unclosed quote: not what render_sh writes
        raise ExportError(f"not a launch file written by tuner export: {exc}") from exc
    start = next((i for i, w in enumerate(words) if w == "exec"), None)
    if start is None:
        raise ExportError("no 'exec' line: not a launch file written by tuner export")
    command = words[start + 1 :]
    if len(command) < 3 or command[1] != "-m":
        raise ExportError("the exec line does not start an engine module")
    _, args = engine_args(command)
    return command[2], args


def _join_lines(text: str) -> str:
    """``text`` as bash reads it before splitting words: comments dropped, and every backslash-newline
    outside single quotes removed (``shlex.quote`` writes a quote as ``'"'"'``: double quotes count too)."""
    out, quote, i = [], "", 0
    while i < len(text):
        char = text[i]
        if char == "\\" and quote != "'":
            if text.startswith("\n", i + 1):
                i += 2
                continue
            out.append(text[i : i + 2])  # an escaped character, never a quote
            i += 2
            continue
        if char == "#" and not quote and (i == 0 or text[i - 1].isspace()):
            end = text.find("\n", i)  # a comment: its quotes are no quotes (provenance holds user text)
            i = len(text) if end < 0 else end
            continue
        if char in "'\"" and quote in ("", char):
            quote = char if quote == "" else ""
        out.append(char)
        i += 1
    return "".join(out)

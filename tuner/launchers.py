"""Python launch files: ``sglang.Runtime(**KWARGS)`` as SGLang users write it.

The keyword arguments are the server flags with dashes turned into underscores; a flag with no
value is ``True``, and numbers are written as numbers (``ServerArgs`` is a typed dataclass).
``read_python`` turns the ``KWARGS`` literal back into the argv, so ``tuner check`` validates a
Python launcher with the same parser as a shell one.
"""

from __future__ import annotations

import ast
import pprint
import re
from typing import Any

from tuner.errors import ExportError

_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE]-?\d+)?")


def _value(text: str) -> Any:
    if _NUMBER.fullmatch(text):
        return float(text) if any(c in text for c in ".eE") else int(text)
    return text


def argv_to_kwargs(args: list[str]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        if not flag.startswith("--"):
            raise ExportError(f"cannot turn {flag!r} into a keyword argument")
        has_value = i + 1 < len(args) and not args[i + 1].startswith("--")
        kwargs[flag[2:].replace("-", "_")] = _value(args[i + 1]) if has_value else True
        i += 2 if has_value else 1
    return kwargs


def kwargs_to_argv(kwargs: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for key, value in kwargs.items():
        args.append("--" + key.replace("_", "-"))
        if value is not True:
            args.append(str(value))
    return args


def render_python(m: dict[str, Any], header: list[str]) -> str:
    """The engine's Python launcher: ``sglang.Runtime`` for SGLang, vLLM's server module for vLLM."""
    if m["engine"] == "vllm":
        argv = pprint.pformat(list(m["argv"]), indent=4)
        body = _VLLM_LAUNCHER.replace("@MODULE@", repr(m["module"])).replace("@ARGV@", argv)
        return "\n".join(["#!/usr/bin/env python3", *header, body])
    return _render_sglang(m, header)


def _render_sglang(m: dict[str, Any], header: list[str]) -> str:
    kwargs = argv_to_kwargs(m["argv"])
    body = pprint.pformat(kwargs, indent=4, sort_dicts=False)  # a Python literal: quoting is repr's
    # Plain concatenation, not an f-string: the launcher's own dict braces must stay as they are.
    return "\n".join(["#!/usr/bin/env python3", *header, _LAUNCHER.replace("@KWARGS@", body)])


_LAUNCHER = """# Run with the engine environment's Python; HOST and PORT come from the environment.
import os
import signal

import sglang

KWARGS = @KWARGS@

if __name__ == "__main__":
    address = {"host": os.environ.get("HOST", "127.0.0.1"), "port": int(os.environ.get("PORT", "30000"))}
    runtime = sglang.Runtime(**KWARGS, **address)
    print(runtime.url, flush=True)
    try:
        signal.pause()
    finally:
        runtime.shutdown()
"""


_VLLM_LAUNCHER = """# Run with the engine environment's Python; HOST and PORT come from the environment.
# vLLM's OpenAI server through its Python entry point, exactly as `python -m` would start it.
import os
import runpy
import sys

MODULE = @MODULE@
ARGV = @ARGV@

if __name__ == "__main__":
    address = ["--host", os.environ.get("HOST", "127.0.0.1"), "--port", os.environ.get("PORT", "8000")]
    sys.argv = [MODULE, *ARGV, *address]
    runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
"""


def read_launcher(text: str) -> tuple[str, list[str]]:
    """The module and engine args of either Python launcher."""
    try:
        assigned = {
            t.id: node.value
            for node in ast.parse(text).body
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name)
        }
        if "ARGV" in assigned and "MODULE" in assigned:
            return str(ast.literal_eval(assigned["MODULE"])), [str(a) for a in ast.literal_eval(assigned["ARGV"])]
    except (SyntaxError, ValueError) as exc:
        raise ExportError(f"not a Python launcher written by tuner export: {exc}") from exc
    return "sglang.launch_server", read_python(text)


def read_python(text: str) -> list[str]:
    """The engine args of a Python launcher written by ``render_python``."""
    try:
        tree = ast.parse(text)
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "KWARGS" for t in node.targets):
                kwargs = ast.literal_eval(node.value)
                if isinstance(kwargs, dict):
                    return kwargs_to_argv(kwargs)
    except (SyntaxError, ValueError) as exc:
        raise ExportError(f"not a Python launcher written by tuner export: {exc}") from exc
    raise ExportError("no KWARGS dict: not a Python launcher written by tuner export")

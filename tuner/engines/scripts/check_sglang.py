"""Validate SGLang server argv with SGLang's own parser, without serving. Run in the SGLang environment.

stdin: a JSON list of argv lists (the arguments after ``-m sglang.launch_server``).
stdout: one JSON object per argv: {"ok", "error", "speculative", "method", "num_speculative_tokens",
"num_draft_tokens", "eagle_topk", "chunked_prefill_size", "max_running_requests", "mem_fraction_static"}.

Each argv goes through what the server does before it starts the engine: the argument parser
(``prepare_server_args``, exit 2 on a bad flag), then the resolution of the record (ValueError /
AssertionError on a rejected combination): ``ServerArgs.resolve_once()`` from 0.5.23 on, while
0.5.17 resolves inside ``prepare_server_args`` (the dataclass's ``__post_init__``). Resolution
probes the accelerator, so ``--device cpu`` is appended for this check only (it must never reach a
real launch): without a GPU, resolution of the default device fails. Values SGLang derives from
device memory (``mem_fraction_static``, ``chunked_prefill_size`` when not given) are therefore the
CPU ones; values given in the argv are exact. From 0.5.23 resolved values live in SGLang's
resolution stash, not on the record, so they are read through ``resolution_result``; 0.5.17 writes
them onto the record's fields at the end of its ``__post_init__``.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import sys
import traceback
from pathlib import Path
from typing import Any


def _error(exc: BaseException) -> str:
    message = f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    if not str(exc) and frames:  # a bare assert: quote the failing statement and where it is
        last = frames[-1]
        where, source = last.lineno or 0, last.line
        with contextlib.suppress(Exception):  # a multi-line assert: the frame's line is only part of it
            tree = ast.parse(Path(last.filename).read_text(encoding="utf-8"))
            asserts = (n for n in ast.walk(tree) if isinstance(n, ast.Assert))
            node = next(n for n in asserts if n.lineno <= where <= (n.end_lineno or n.lineno))
            where, source = node.lineno, f"assert {ast.unparse(node.test)}"
        message += f"{source} ({Path(last.filename).name}:{where})"
    return " ".join(message.split())[:500]


def _reader() -> Any:
    """How a resolved field is read in this version: ``(server_args, field) -> value``."""
    try:
        from sglang.srt.arg_groups.overrides import resolution_result
    except ImportError:  # 0.5.17: the fields themselves carry the resolved values
        return getattr
    return resolution_result


def check(argv: list[str]) -> dict[str, Any]:
    from sglang.srt.server_args import prepare_server_args

    resolution_result = _reader()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(sys.stderr):
            server_args = prepare_server_args([*argv, "--device", "cpu"])
            resolve = getattr(server_args, "resolve_once", None)
            if resolve is not None:  # 0.5.23: resolution is its own pass; 0.5.17 ran it above
                resolve()
    except SystemExit:
        lines = [line for line in err.getvalue().splitlines() if "error" in line] or err.getvalue().splitlines()
        return {"ok": False, "error": (lines[-1] if lines else "rejected by the argument parser")}
    except Exception as exc:  # noqa: BLE001 - the engine's own message is the answer
        return {"ok": False, "error": _error(exc)}

    def get(field: str) -> Any:
        return resolution_result(server_args, field)

    method = get("speculative_algorithm")
    spec = method is not None
    return {
        "ok": True,
        "error": None,
        "speculative": spec,
        "method": method,
        "num_speculative_tokens": get("speculative_num_steps") if spec else None,
        "num_draft_tokens": get("speculative_num_draft_tokens") if spec else None,
        "eagle_topk": get("speculative_eagle_topk") if spec else None,
        "chunked_prefill_size": get("chunked_prefill_size"),
        "max_running_requests": get("max_running_requests"),
        "mem_fraction_static": get("mem_fraction_static"),
    }


def main() -> None:
    import logging

    logging.disable(logging.CRITICAL)
    results = [check(argv) for argv in json.load(sys.stdin)]
    sys.stdout.write("\n".join(json.dumps(r) for r in results) + "\n")


if __name__ == "__main__":
    main()

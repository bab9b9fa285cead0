"""Validate vLLM server argv with vLLM's own parser, without serving. Run in the vLLM environment.

stdin: a JSON list of argv lists (the arguments after ``-m vllm.entrypoints.openai.api_server``).
stdout: one JSON object per argv: {"ok", "error", "speculative", "method", "max_num_batched_tokens"}.

Each argv goes through exactly what the server does before it starts the engine: the argument
parser (exit 2 on a bad flag), ``validate_parsed_serve_args``, then ``create_engine_config``.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from typing import Any


def _parser() -> Any:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # 0.32 and later
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:  # 0.26
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    return make_arg_parser(FlexibleArgumentParser()), validate_parsed_serve_args


def check(argv: list[str]) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    parser, validate = _parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
        validate(args)
        config = AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except SystemExit:
        lines = [line for line in err.getvalue().splitlines() if "error" in line] or err.getvalue().splitlines()
        return {"ok": False, "error": (lines[-1] if lines else "rejected by the argument parser")}
    except Exception as exc:  # noqa: BLE001 - the engine's own message is the answer
        return {"ok": False, "error": " ".join(f"{type(exc).__name__}: {exc}".split())[:500]}
    spec = config.speculative_config
    return {
        "ok": True,
        "error": None,
        "speculative": spec is not None,
        "method": None if spec is None else spec.method,
        "num_speculative_tokens": None if spec is None else spec.num_speculative_tokens,
        # K by batch size (vLLM 0.26+), as the engine parsed it: [[first, last, K], ...] or None
        "schedule": None
        if getattr(spec, "num_speculative_tokens_per_batch_size", None) is None
        else [list(r) for r in spec.num_speculative_tokens_per_batch_size],
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "max_num_seqs": config.scheduler_config.max_num_seqs,
    }


def main() -> None:
    import logging

    logging.disable(logging.WARNING)
    results = [check(argv) for argv in json.load(sys.stdin)]
    sys.stdout.write("\n".join(json.dumps(r) for r in results) + "\n")


if __name__ == "__main__":
    main()

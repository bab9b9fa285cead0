"""The command line: parse, validate, call one function per command.

A ``TunerError`` becomes one line on stderr and its exit code (2 for usage and config errors, 1 for
runtime failures); ``--debug`` shows the traceback instead. So does a study storage that stayed
unreachable (``tuner.study.storage.StorageOutage``, exit 1), wherever it surfaces, clean-up included.
SIGTERM is handled like Ctrl-C: the running engine is stopped, the running trial is marked failed,
and the study stays usable (exit 130).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from types import FrameType

from tuner.cli.commands import run_command
from tuner.cli.flags import build_parser
from tuner.errors import TunerError
from tuner.study.storage import StorageOutage, reason, transient

__all__ = ["build_parser", "main"]


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM as Ctrl-C: ``KeyboardInterrupt`` where the signal found the main thread. Where that is
    a running event loop (a drive's requests), it is raised from a callback of its own, between
    tasks: raised inside a request's task, it would end that task and the drive gathering it with
    the exception, and asyncio would print "Task exception was never retrieved" with a traceback
    after the one-line message (seen on the H100, reports/gpu-h100/study-1/block1/NOTES.md). From a
    callback it leaves the loop as Ctrl-C does, and ``asyncio.run`` cancels every task cleanly."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no loop runs in this thread
        raise KeyboardInterrupt(f"signal {signum}") from None
    loop.call_soon_threadsafe(_raise_interrupt, signum)


def _raise_interrupt(signum: int) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args_list
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        args = build_parser().parse_args(args_list)

        return run_command(args)
    except TunerError as exc:
        if debug:
            raise
        print(f"tuner: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(_interrupted(args_list), file=sys.stderr)
        return 130
    except BaseException as exc:  # a storage outage is a BaseException on purpose (tuner.study.storage)
        line = None if debug else _one_line(exc)
        if line is None:
            raise
        print(f"tuner: {line}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupted(args_list: list[str]) -> str:
    command = next((a for a in args_list if not a.startswith("-")), "")
    if command in ("search", "worker"):
        return "tuner: interrupted; the running trial was marked failed, rerun the command to resume"
    return "tuner: interrupted"


def _one_line(exc: BaseException) -> str | None:
    """What to say about an error that is no bug of ours: the study storage lost (``StorageOutage``,
    or a database error met outside the retrying storage), found anywhere in the chain, since
    clean-up code can fail in turn while the outage lasts. None: a bug, shown with its traceback."""

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, StorageOutage | TunerError):
            return str(seen)
        if transient(seen):
            return f"the study storage could not be reached ({reason(seen)}); rerun the command to resume"
        seen = seen.__cause__ or seen.__context__
    return None


if __name__ == "__main__":
    sys.exit(main())

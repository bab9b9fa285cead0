"""The command line: parse, validate, call one function per command.

A ``TunerError`` becomes one line on stderr and its exit code (2 for usage and config errors, 1 for
runtime failures); ``--debug`` shows the traceback instead. So does a study storage that stayed
unreachable (``tuner.storage.StorageOutage``, exit 1), wherever it surfaces, clean-up included.
SIGTERM is handled like Ctrl-C: the running engine is stopped, the running trial is marked failed,
and the study stays usable (exit 130).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import NoReturn

from tuner.errors import ConfigError, TunerError
from tuner.samplers import SAMPLERS


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{self.prog}: {message}")


def _engine_envs(values: list[str]) -> dict[str, str]:
    envs = {}
    for value in values:
        engine, sep, path = value.partition("=")
        if not sep or not engine or not path:
            raise ConfigError(f"--engine-env {value!r}: expected ENGINE=PATH")
        envs[engine] = path
    return envs


def _seed(value: str) -> int:
    """A seed numpy's generators take: 0 to 2**32 - 1."""
    try:
        seed = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if not 0 <= seed < 2**32:
        raise argparse.ArgumentTypeError(f"must be between 0 and {2**32 - 1}, got {seed}")
    return seed


def _engine_list(value: str) -> list[str]:
    engines = [e.strip() for e in value.split(",") if e.strip()]
    if not engines:
        raise argparse.ArgumentTypeError("expected a comma-separated list of engines")
    return engines


def _load_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", type=int, help="closed loop at C in flight (with --rate: its cap)")
    parser.add_argument("--rate", type=float, help="open loop: requests (or sessions) per second")
    parser.add_argument("--burstiness", type=float, help="open-loop gamma shape: 1 Poisson, <1 burstier")


def _search_flags(s: argparse.ArgumentParser, worker: bool) -> None:
    """``search``'s flags; a ``worker`` takes what it is not given from the study it joins."""
    from_study = "(default: the study's)" if worker else ""
    s.add_argument("--workload", required=not worker, help=from_study or "a preset or a trace file")
    s.add_argument("--space", type=Path, help=from_study or None)
    s.add_argument("--study", required=worker)
    s.add_argument(
        "--storage", required=worker, help="Optuna storage URL (default $TUNER_STORAGE or sqlite:///studies/STUDY.db)"
    )
    s.add_argument(
        "--trials", type=int, default=None,
        help="the study's budget of booted trials, the default trial included (default 6; CPU default 4)",
    )  # fmt: skip
    s.add_argument("--finalists", type=int, help="best configs repeated after the search (default 3; CPU default 1)")
    s.add_argument("--repeats", type=int, help="fresh boots per finalist (default 5; CPU default 2; 0: none)")
    s.add_argument("--timeout", type=float, help="stop starting trials after this many seconds")
    s.add_argument("--model")
    s.add_argument("--draft-model", action="append", default=[], dest="drafts")
    s.add_argument("--seed", type=_seed, default=None if worker else 0)
    s.add_argument(
        "--requests", type=int, help="measured requests per trial (default: 10 x a closed loop's concurrency, else 16)"
    )
    _load_flags(s)
    s.add_argument("--engine-env", action="append", default=[], metavar="ENGINE=PATH")
    s.add_argument("--engines", type=_engine_list, help="comma-separated engines (default: the space's)")
    s.add_argument(
        "--objective",
        default=None if worker else "pareto",
        help="pareto (TTFT p95 vs throughput), goodput or throughput",
    )
    s.add_argument("--slo", help="e.g. ttft_p95_ms=500,tpot_p95_ms=50 (default: the workload preset's)")
    s.add_argument("--sampler", default="tpe", choices=SAMPLERS, help="how configs are proposed (default tpe)")
    s.add_argument(
        "--no-screen", dest="screen", action="store_false", help="boot every config, even one the memory screen rejects"
    )
    s.add_argument("--no-prune", dest="prune", action="store_false", help="let every trial's workload run to its end")
    s.add_argument(
        "--no-stress", dest="stress", action="store_false", help="skip the finalists' stress check at peak load"
    )
    s.add_argument("--gpus", help="GPU indices this host may use, e.g. 0,1,2,3 (default: all, one trial at a time)")
    s.add_argument("--gpus-per-trial", type=int, default=1, help="GPUs of each parallel trial (bounds tensor_parallel)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tuner", description="Auto-tune LLM serving settings on real engines.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    _search_flags(sub.add_parser("search", help="run (or resume) a tuning study"), worker=False)
    _search_flags(
        sub.add_parser("worker", help="join a study's fleet: take its trials until its budget is spent"), worker=True
    )

    w = sub.add_parser("workload", help="write the exact requests a trial would send, with their statistics")
    w.add_argument("name", help="a preset (rag, agent, chat, json) or a trace file")
    w.add_argument("--seed", type=_seed, default=0)
    w.add_argument(
        "--requests", type=int, help="measured requests (default: 10 x a closed loop's concurrency, else 16)"
    )
    w.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    w.add_argument("--model", help="default: the generated models")
    w.add_argument("--space", type=Path, help="the search space whose max_model_len applies")
    w.add_argument("--engine-env", action="append", default=[], metavar="ENGINE=PATH")
    _load_flags(w)

    p = sub.add_parser("plan", help="print the commands N sampled trials would start; boots nothing")
    p.add_argument("--workload", required=True)
    p.add_argument("--space", type=Path)
    p.add_argument("--engines", type=_engine_list)
    p.add_argument("--n", type=int, default=10)
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--model")
    p.add_argument("--draft-model", action="append", default=[], dest="drafts")
    p.add_argument("--engine-env", action="append", default=[], metavar="ENGINE=PATH")

    r = sub.add_parser("drive", help="measure a running OpenAI-compatible server with the trials' driver")
    r.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    r.add_argument("--workload", required=True)
    r.add_argument("--requests", type=int)
    r.add_argument("--concurrency", type=int)
    r.add_argument("--rate", type=float)
    r.add_argument("--burstiness", type=float)
    r.add_argument("--seed", type=_seed, default=0)
    r.add_argument("--slo", help="e.g. ttft_p95_ms=500 (default: the workload preset's)")
    r.add_argument("--model", help="a model folder whose tokenizer sizes the requests (default: the generated one)")
    r.add_argument("--space", type=Path)
    r.add_argument("--engine-env", action="append", default=[], metavar="ENGINE=PATH")
    r.add_argument("--json", action="store_true", help="print the metrics as one JSON object")

    t = sub.add_parser("trials", help="print the trials of a study")
    t.add_argument("--study", required=True)
    t.add_argument("--storage")

    e = sub.add_parser("export", help="write launch files for the best (or given) trials")
    e.add_argument("--study", required=True)
    e.add_argument("--storage")
    e.add_argument("--trial", type=int, action="append", dest="trials")
    e.add_argument("--out", type=Path, required=True)
    e.add_argument(
        "--format",
        action="append",
        dest="formats",
        choices=["sh", "compose", "k8s", "python", "json"],
        help="repeatable (default: sh and json, plus python for SGLang)",
    )
    e.add_argument(
        "--engine-env",
        action="append",
        default=[],
        metavar="ENGINE=PATH",
        help="check with this engine environment instead of the trial's",
    )

    h = sub.add_parser("report", help="write reports/<study>/index.html and summary.md")
    h.add_argument("--study", required=True)
    h.add_argument("--storage")
    h.add_argument("--out", type=Path, default=Path("reports"), help="the folder that gets <study>/ (default reports)")

    d = sub.add_parser("dashboard", help="review a study in optuna-dashboard (bound to 127.0.0.1 by default)")
    d.add_argument("--study", help="with the default storage: the study whose SQLite file to open")
    d.add_argument("--storage")
    d.add_argument("--port", type=int, default=8080)
    d.add_argument("--host", default="127.0.0.1", help="listen address; anything but loopback exposes the study")

    c = sub.add_parser("check", help="validate exported launch files with their engine's own parser")
    c.add_argument("files", type=Path, nargs="+", metavar="FILE")
    c.add_argument("--engine-env")
    return parser


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args_list
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        args = build_parser().parse_args(args_list)
        from tuner.commands import run_command

        return run_command(args)
    except TunerError as exc:
        if debug:
            raise
        print(f"tuner: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(_interrupted(args_list), file=sys.stderr)
        return 130
    except BaseException as exc:  # a storage outage is a BaseException on purpose (tuner.storage)
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
    from tuner.storage import StorageOutage, reason, transient

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

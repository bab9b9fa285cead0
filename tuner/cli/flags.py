"""The command line's parser: every command's flags, and the value types that check them.

A bad value is a ``ConfigError`` (exit 2, one line) rather than argparse's own exit, so
``tuner.cli.main`` reports it like every other usage error.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from tuner.errors import ConfigError
from tuner.measure.capacity import ATTAINMENT_TARGET, RESOLUTION
from tuner.search.options import CPU_DEFAULT_PLAN, DEFAULT_PLAN
from tuner.search.resolve import CPU_STEPS, GPU_STEPS
from tuner.search.samplers import SAMPLERS
from tuner.search.scoring import DEFAULT_OBJECTIVE, OBJECTIVES
from tuner.workloads import rag
from tuner.workloads.arrivals import MIN_BURSTINESS
from tuner.workloads.base import DEFAULT_TIER, TIER_NAMES

__all__ = ["build_parser", "engine_envs"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{self.prog}: {message}")


def engine_envs(values: list[str], flag: str = "--engine-env", what: str = "PATH") -> dict[str, str]:
    envs = {}
    for value in values:
        engine, sep, path = value.partition("=")
        if not sep or not engine or not path:
            raise ConfigError(f"{flag} {value!r}: expected ENGINE={what}")
        envs[engine] = path
    return envs


def engine_versions(values: list[str]) -> dict[str, str]:
    return engine_envs(values, "--engine-version", "VERSION")


def _number(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {value!r}")
    return number


def _at_least(low: int, high: int | None = None, says: str | None = None) -> Callable[[str], int]:
    """The value type of a whole number of at least ``low`` (and at most ``high``); ``says`` the range in words."""

    def whole(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
        if number < low or (high is not None and number > high):
            raise argparse.ArgumentTypeError(f"must be {says or f'at least {low}'}, got {number}")
        return number

    return whole


_seed = _at_least(0, 2**32 - 1, f"between 0 and {2**32 - 1}")  # what numpy's generators take
_port = _at_least(1, 65535, "a TCP port, 1 to 65535")


def _number_in(
    low: float, high: float, says: str, *, low_open: bool = False, high_open: bool = False
) -> Callable[[str], float]:
    """The value type of a finite number from ``low`` to ``high``, either end open; ``says`` the range in words."""

    def parse(value: str) -> float:
        number = _number(value)
        if not ((number > low if low_open else number >= low) and (number < high if high_open else number <= high)):
            raise argparse.ArgumentTypeError(f"must be {says}, got {value}")
        return number

    return parse


_attainment = _number_in(0, 1, "in (0, 1]", low_open=True)  # a share of requests
_confidence = _number_in(0, 1, "strictly between 0 and 1", low_open=True, high_open=True)  # a probability
_above_zero = _number_in(0, math.inf, "above 0", low_open=True)  # seconds or a rate
# a gamma shape: below MIN_BURSTINESS the gaps underflow to 0 (tuner.workloads.arrivals)
_burstiness = _number_in(MIN_BURSTINESS, math.inf, f"at least {MIN_BURSTINESS:g} (1 is Poisson)")
_reuse_share = _number_in(0, rag.MAX_REUSE, f"between 0 and {rag.MAX_REUSE:g}")  # a share of each prompt


def _engine_list(value: str) -> list[str]:
    engines = [e.strip() for e in value.split(",") if e.strip()]
    if not engines:
        raise argparse.ArgumentTypeError("expected a comma-separated list of engines")
    return engines


def _reuse_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prefix-reuse", type=_reuse_share, metavar="SHARE",
        help=f"the share of each prompt shared as a prefix with earlier requests (rag; default {rag.DEFAULT_REUSE:g})",
    )  # fmt: skip


def _load_flags(parser: argparse.ArgumentParser) -> None:
    _reuse_flag(parser)
    parser.add_argument("--concurrency", type=_at_least(1), help="closed loop at C in flight (with --rate: its cap)")
    parser.add_argument("--rate", type=_above_zero, help="open loop: requests (or sessions) per second")
    parser.add_argument("--burstiness", type=_burstiness, help="open-loop gamma shape: 1 Poisson, <1 burstier")


PRICE_HELP = "what one GPU costs per hour: capacities are also priced per million output tokens at the SLO"
PRICE_OVERRIDE = PRICE_HELP + " (default: the price the study was searched with)"


def _search_flags(s: argparse.ArgumentParser, worker: bool) -> None:
    """``search``'s flags; a ``worker`` takes what it is not given from the study it joins."""
    from_study = "(default: the study's)" if worker else ""
    s.add_argument("--workload", required=not worker, help=from_study or "a preset or a trace file")
    if not worker:
        s.add_argument(
            "--verify", action="store_true",
            help="at the end, boot each tier's winner again and check its capacity with the engine's own client",
        )  # fmt: skip
    s.add_argument("--space", type=Path, help=from_study or None)
    s.add_argument("--study", required=worker)
    s.add_argument(
        "--storage", required=worker, help="Optuna storage URL (default $TUNER_STORAGE or sqlite:///studies/STUDY.db)"
    )
    s.add_argument(
        "--trials", type=_at_least(0), default=None,
        help=f"the study's budget of booted trials, the default trial included (default {DEFAULT_PLAN.trials}; "
        f"CPU default {CPU_DEFAULT_PLAN.trials})",
    )  # fmt: skip
    s.add_argument(
        "--finalists",
        type=_at_least(0),
        help="best configs repeated after the search, per tier in a two-tier study "
        f"(default {DEFAULT_PLAN.finalists}; CPU default {CPU_DEFAULT_PLAN.finalists})",
    )
    s.add_argument(
        "--repeats", type=_at_least(0),
        help=f"fresh boots per finalist (default {DEFAULT_PLAN.repeats}; CPU default {CPU_DEFAULT_PLAN.repeats}; "
        "0: none)",
    )  # fmt: skip
    s.add_argument("--timeout", type=_above_zero, help="stop starting trials after this many seconds")
    if not worker:
        s.add_argument("--gpu-price", type=_above_zero, metavar="USD_PER_GPU_HOUR", help=PRICE_HELP)
    s.add_argument("--model")
    s.add_argument(
        "--draft-model", action="append", default=[], dest="drafts", metavar="[KIND:]PATH",
        help="a draft model, or a head (KIND eagle or eagle3: read from its config.json when not given)",
    )  # fmt: skip
    s.add_argument("--seed", type=_seed, default=None if worker else 0)
    s.add_argument(
        "--requests",
        type=_at_least(1),
        help="measured requests per trial (default: 10 x a closed loop's concurrency, else 16)",
    )
    _load_flags(s)
    s.add_argument("--engine-env", action="append", default=[], metavar="ENGINE=PATH")
    s.add_argument("--engines", type=_engine_list, help="comma-separated engines (default: the space's)")
    s.add_argument(
        "--objective", choices=tuple(OBJECTIVES),
        default=None if worker else DEFAULT_OBJECTIVE,
        help=f"{DEFAULT_OBJECTIVE} (the default: the highest rate that meets an SLO tier), capacity-pareto (both "
        "tiers), pareto (TTFT p95 vs throughput at one load), goodput or throughput",
    )  # fmt: skip
    _capacity_flags(s, worker)
    _strategy_flags(s)


def _capacity_flags(s: argparse.ArgumentParser, worker: bool = False) -> None:
    """The SLO and how a capacity search judges it; a worker takes what it is not given from the study."""
    s.add_argument(
        "--slo", action="append", default=None,
        help="[TIER:]KEY=MS,... e.g. interactive:ttft_p95_ms=300,tpot_p95_ms=100 (repeatable; default: the "
        "workload preset's tiers). Without a tier: the scored tier's SLO (the older objectives' SLO)",
    )  # fmt: skip
    s.add_argument(
        "--tier", choices=TIER_NAMES, default=None if worker else DEFAULT_TIER,
        help=f"the SLO tier --objective capacity scores (default {DEFAULT_TIER})",
    )  # fmt: skip
    s.add_argument(
        "--attainment", type=_attainment, default=None if worker else ATTAINMENT_TARGET,
        help=f"share of requests that must meet the SLO at a capacity (default {ATTAINMENT_TARGET:g})",
    )  # fmt: skip
    s.add_argument(
        "--resolution", type=_above_zero, default=None if worker else RESOLUTION,
        help=f"relative precision of the capacity search (default {RESOLUTION:g}: within {RESOLUTION:.0%}%)",
    )  # fmt: skip
    s.add_argument(
        "--confidence", type=_confidence, default=None,
        help="how sure a capacity step's pass or fail must be before the step stops (default: the device's, "
        f"{GPU_STEPS['confidence']:g} on a GPU, {CPU_STEPS['confidence']:g} on the CPU build; lower is faster "
        "and noisier)",
    )  # fmt: skip


def _strategy_flags(s: argparse.ArgumentParser) -> None:
    """How a search proposes, screens, prunes, checks and places its trials."""
    s.add_argument(
        "--sampler", default=None, choices=SAMPLERS,
        help="how configs are proposed (default: model for the capacity objectives, tpe for the others)",
    )  # fmt: skip
    s.add_argument(
        "--no-screen",
        dest="screen",
        action="store_false",
        help="boot every config: no memory screen, learned rejection or idle-draft screen",
    )
    s.add_argument("--no-prune", dest="prune", action="store_false", help="let every trial's workload run to its end")
    s.add_argument(
        "--no-stress", dest="stress", action="store_false", help="skip the finalists' stress check at peak load"
    )
    s.add_argument("--gpus", help="GPU indices this host may use, e.g. 0,1,2,3 (default: all, one trial at a time)")
    s.add_argument(
        "--gpus-per-trial", type=_at_least(1), default=1, help="GPUs of each parallel trial (bounds tensor_parallel)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tuner", description="Auto-tune LLM serving settings on real engines.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _search_flags(sub.add_parser("search", help="run (or resume) a tuning study"), worker=False)
    _search_flags(
        sub.add_parser("worker", help="join a study's fleet: take its trials until its budget is spent"), worker=True
    )
    workload_help = "write the exact requests a trial would send, with their statistics"
    _workload_flags(sub.add_parser("workload", help=workload_help))
    _plan_flags(sub.add_parser("plan", help="print the commands N sampled trials would start; boots nothing"))
    _drive_flags(sub.add_parser("drive", help="measure a running OpenAI-compatible server with the trials' driver"))
    _verify_flags(sub.add_parser("verify", help="check a claimed capacity with the engine's own benchmark client"))
    _study_commands(sub)
    return parser


def _workload_flags(w: argparse.ArgumentParser) -> None:
    w.add_argument("name", help="a preset (rag, agent, chat, json) or a trace file")
    w.add_argument("--seed", type=_seed, default=0)
    w.add_argument(
        "--requests", type=_at_least(1), help="measured requests (default: 10 x a closed loop's concurrency, else 16)"
    )
    w.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    w.add_argument("--model", help="default: the generated models")
    w.add_argument("--space", type=Path, help="the search space whose max_model_len applies")
    w.add_argument("--engine-env", action="append", default=[], metavar="ENGINE=PATH")
    _load_flags(w)


def _plan_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", required=True)
    p.add_argument("--space", type=Path)
    p.add_argument("--engines", type=_engine_list)
    p.add_argument("--n", type=_at_least(1), default=10)
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--model")
    p.add_argument("--draft-model", action="append", default=[], dest="drafts", metavar="[KIND:]PATH")
    p.add_argument("--engine-env", action="append", default=[], metavar="ENGINE=PATH")
    p.add_argument("--study", help="a capacity study whose trials rank the planned configs by predicted capacity")
    p.add_argument("--storage", help="the study's storage URL (default $TUNER_STORAGE or sqlite:///studies/STUDY.db)")
    p.add_argument(
        "--engine-version", action="append", default=[], metavar="ENGINE=VERSION",
        help="plan for this supported version of the engine (default: the one installed, else the newest)",
    )  # fmt: skip
    p.add_argument(
        "--gpu-memory", type=_number_in(0, 1e6, "a GPU's memory in GiB, above 0", low_open=True), metavar="GIB",
        help="plan for a GPU of this much memory, not the one visible here (its memory sets engine defaults)",
    )  # fmt: skip
    p.add_argument("--gpu-name", help="the planned GPU's name as the driver reports it (with --gpu-memory)")


def _drive_flags(r: argparse.ArgumentParser) -> None:
    r.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    r.add_argument("--workload", required=True)
    r.add_argument("--requests", type=_at_least(1))
    _load_flags(r)
    r.add_argument("--seed", type=_seed, default=0)
    r.add_argument("--model", help="a model folder whose tokenizer sizes the requests (default: the served folder)")
    r.add_argument(
        "--capacity", action="store_true",
        help="search the highest rate that meets each SLO tier (both, or --tier), as a trial does",
    )  # fmt: skip
    r.add_argument(
        "--tiers-for", choices=("gpu", "cpu"), default="gpu",
        help="with --capacity: the preset's tiers for a server on a GPU (default) or the vLLM CPU build",
    )  # fmt: skip
    _capacity_flags(r, worker=True)  # no --tier default: --capacity searches both tiers unless told
    r.add_argument("--json", action="store_true", help="print the metrics as one JSON object (null: undefined)")


def _verify_flags(v: argparse.ArgumentParser) -> None:
    v.add_argument("file", nargs="?", type=Path, metavar="FILE", help="an exported launch file to boot and verify")
    v.add_argument("--url", help="a running server's base URL, e.g. http://127.0.0.1:8000 (with --workload, --rate)")
    v.add_argument("--workload", help="the workload the capacity was claimed for (with --url)")
    v.add_argument("--rate", type=_above_zero, dest="claimed_rate", help="the claimed capacity, req/s (with --url)")
    v.add_argument("--study", help="verify a trial of this study: its recorded capacity, its exported .sh")
    v.add_argument("--storage", help="the study's storage URL (default $TUNER_STORAGE or sqlite:///studies/STUDY.db)")
    v.add_argument("--trial", type=_at_least(0), help="the trial's number (with --study)")
    v.add_argument("--model", help="a model folder whose tokenizer sizes the requests (default: the served folder)")
    v.add_argument("--requests", type=_at_least(1), help="the request pool's size, as given to the search")
    v.add_argument("--seed", type=_seed, default=0)
    _reuse_flag(v)
    v.add_argument("--duration-s", type=_above_zero, help="seconds of load per rate (default: a trial's step)")
    v.add_argument(
        "--tiers-for", choices=("gpu", "cpu"), default="gpu",
        help="the preset's tiers for a server on a GPU (default) or the vLLM CPU build",
    )  # fmt: skip
    _capacity_flags(v, worker=True)  # no --tier default: both tiers unless told
    v.add_argument("--engine-env", action="append", default=[], metavar="ENGINE=PATH")
    v.add_argument("--out", type=Path, help="keep the client's datasets, logs and results in this folder")
    v.add_argument("--json", action="store_true", help="print the verdicts as one JSON object (null: undefined)")
    v.set_defaults(concurrency=None, rate=None, burstiness=None)  # the workload's own arrivals are not used


def _study_commands(sub: argparse._SubParsersAction[_Parser]) -> None:
    """The commands that read a study (or its exports): trials, export, report, dashboard, check."""
    t = sub.add_parser("trials", help="print the trials of a study")
    t.add_argument("--study", required=True)
    t.add_argument("--storage")
    t.add_argument(
        "--gpu-price", type=_above_zero, metavar="USD_PER_GPU_HOUR", help=PRICE_HELP + " (default: the study's)"
    )

    _export_flags(sub.add_parser("export", help="write launch files for the best (or given) trials"))
    h = sub.add_parser("report", help="write reports/<study>/index.html and summary.md")
    h.add_argument("--study", required=True)
    h.add_argument("--storage")
    h.add_argument("--out", type=Path, default=Path("reports"), help="the folder that gets <study>/ (default reports)")
    h.add_argument(
        "--gpu-price", type=_above_zero, metavar="USD_PER_GPU_HOUR", help=PRICE_HELP + " (default: the study's)"
    )

    d = sub.add_parser("dashboard", help="review a study in optuna-dashboard (bound to 127.0.0.1 by default)")
    d.add_argument("--study", help="with the default storage: the study whose SQLite file to open")
    d.add_argument("--storage")
    d.add_argument("--port", type=_port, default=8080)
    d.add_argument("--host", default="127.0.0.1", help="listen address; anything but loopback exposes the study")

    c = sub.add_parser("check", help="validate exported launch files with their engine's own parser")
    c.add_argument("files", type=Path, nargs="+", metavar="FILE")
    c.add_argument("--engine-env")


def _export_flags(e: argparse.ArgumentParser) -> None:
    e.add_argument("--study", required=True)
    e.add_argument("--storage")
    e.add_argument("--trial", type=_at_least(0), action="append", dest="trials")
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

"""One function per CLI command; each takes the parsed arguments and returns the exit code."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from tuner.cli.flags import engine_envs, engine_versions  # cli imported it already: nothing to import late
from tuner.deploy.export import export_study
from tuner.deploy.verify import check_files
from tuner.errors import ConfigError
from tuner.fleet.placement import parse_gpus
from tuner.measure.capacity import ATTAINMENT_TARGET, RESOLUTION
from tuner.progress import Progress
from tuner.report.dashboard import serve
from tuner.report.html import write_report
from tuner.report.trials_table import trials_table
from tuner.search.drive_server import drive_capacity, drive_url, failed_beyond_limit
from tuner.search.plan import plan as make_plan
from tuner.search.plan import planned_gpu
from tuner.search.preview import preview
from tuner.search.resolve import parse_slo_flags
from tuner.search.run import SearchOptions, run_search
from tuner.search.verify_server import describe_report, verify_launch_file, verify_trial, verify_url
from tuner.search.worker import fill_from_study
from tuner.study.attrs import capacity_uncertainty
from tuner.study.storage import given_url, load_existing, open_storage, redacted, storage_url
from tuner.workloads import source
from tuner.workloads.arrivals import check_flags
from tuner.workloads.base import DEFAULT_TIER

if TYPE_CHECKING:
    from tuner.search.run import SearchOptions


def _options(args: argparse.Namespace, workload: str, **only_search: Any) -> SearchOptions:
    """The workload, model and load flags that search, workload and drive share, validated."""

    slo, tiers = parse_slo_flags(_slo_texts(getattr(args, "slo", None)))
    opts = SearchOptions(
        workload=workload,
        space=getattr(args, "space", None),  # drive takes no search space
        model=args.model,
        seed=args.seed,
        engine_envs=engine_envs(getattr(args, "engine_env", [])),
        requests=args.requests,
        concurrency=args.concurrency,
        rate=args.rate,
        burstiness=args.burstiness,
        prefix_reuse=getattr(args, "prefix_reuse", None),
        slo=slo,
        slo_tiers=tiers,
        **only_search,
    )
    _check_load_flags(opts)
    return opts


def _slo_texts(given: str | list[str] | None) -> list[str]:
    return [] if given is None else [given] if isinstance(given, str) else list(given)


def _search_options(args: argparse.Namespace, **extra: Any) -> SearchOptions:
    given_url(args.storage)  # a URL of no database's kind is a usage error before any engine is probed
    return _options(
        args, args.workload, study=args.study, storage=args.storage, trials=args.trials,
        finalists=args.finalists, repeats=args.repeats, timeout_s=args.timeout, drafts=args.drafts,
        engines=args.engines, objective=args.objective, sampler=args.sampler, screen=args.screen,
        tier=args.tier, attainment=args.attainment, resolution=args.resolution, confidence=args.confidence,
        prune=args.prune, stress=args.stress, gpus=parse_gpus(args.gpus) if args.gpus else None,
        gpu_price=getattr(args, "gpu_price", None), verify=getattr(args, "verify", False),
        gpus_per_trial=args.gpus_per_trial, **extra,
    )  # fmt: skip


def worker(args: argparse.Namespace) -> int:
    """Join a study's fleet: what the flags leave out comes from the study (``tuner.search.worker``)."""

    fill_from_study(args)
    run_search(_search_options(args, worker=True, space_dump=args.space_dump), Progress())
    return 0


def search(args: argparse.Namespace) -> int:
    """`tuner search`: run (or resume) a study to its verdict; exit 0 once it ends."""
    opts = _search_options(args)
    run_search(opts, Progress())
    return 0


def _check_load_flags(opts: SearchOptions) -> None:

    if opts.requests is not None and opts.requests < 1:
        raise ConfigError(f"--requests must be at least 1, got {opts.requests}")
    check_flags(opts.concurrency, opts.rate, opts.burstiness)


def workload(args: argparse.Namespace) -> int:
    """`tuner workload NAME --out FILE`: the requests a trial would send, written and summarised."""
    opts = _options(args, args.name)
    print("\n".join(preview(opts, args.out)))
    return 0


def drive(args: argparse.Namespace) -> int:
    """`tuner drive --url URL`: drive a running server as a trial does (`--capacity`: search its capacity)."""
    if args.capacity:
        return _drive_capacity(args)
    opts = _options(args, args.workload)
    report = drive_url(opts, args.url)
    if args.json:
        print(json.dumps(report, allow_nan=False))  # an undefined figure is null, never NaN
    else:
        m = report["metrics"]
        print(f"{report['url']} ({report['model']}), workload {report['workload']}: {int(m['n_requests'])} requests")
        for key in ("ttft_p50_ms", "ttft_p95_ms", "tpot_p95_ms", "output_throughput_tok_s", "error_rate"):
            print(f"  {key:<24} {'n/a' if m[key] is None else format(m[key], '.3f')}")
    failed = failed_beyond_limit(report)
    if failed is not None:
        print(f"tuner: {failed}", file=sys.stderr)
        return 1
    return 0


def _capacity_options(args: argparse.Namespace, workload: str, **extra: Any) -> SearchOptions:
    """`drive --capacity` and `verify`: one tier if named, else both, at the capacity defaults."""
    objective = "capacity" if args.tier else "capacity-pareto"
    return _options(args, workload, objective=objective, tier=args.tier or DEFAULT_TIER,
                    attainment=args.attainment or ATTAINMENT_TARGET, resolution=args.resolution or RESOLUTION,
                    **extra)  # fmt: skip


def _drive_capacity(args: argparse.Namespace) -> int:
    opts = _capacity_options(args, args.workload, confidence=args.confidence)
    report = drive_capacity(opts, args.url, args.tiers_for, Progress())
    if args.json:
        print(json.dumps(report, allow_nan=False))
    else:
        for tier, found in report["capacity"]["tiers"].items():
            slo = ", ".join(f"{k} <= {v:g}" for k, v in found["slo"].items())
            known = capacity_uncertainty(found)
            print(f"{tier}: {found['capacity_req_s']:.3g} req/s with {found['target']:.0%} of requests within {slo} "
                  f"({found['stop_reason']}, {len(found['steps'])} steps{', ' + known if known else ''})")  # fmt: skip
    if report["capacity"]["interrupted"]:
        print("tuner: interrupted; the report holds the steps judged before it", file=sys.stderr)
        return 130
    return 0


def verify(args: argparse.Namespace) -> int:
    """The engine's own client at the claimed capacity and 1.2x it; exit 1 when the goal is not met."""
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    if args.study is not None:
        report = _verify_trial(args)
    else:
        if (args.url is None) == (args.file is None) or args.workload is None or args.claimed_rate is None:
            raise ConfigError("verify: give --url URL (or FILE) --workload NAME --rate R, or --study NAME --trial N")
        opts = _capacity_options(args, args.workload)
        if args.file is not None:
            report = verify_launch_file(args.file, opts, args.claimed_rate, args.tiers_for, args.duration_s,
                                        Progress(), args.out)  # fmt: skip
        else:
            report = verify_url(opts, args.url, args.claimed_rate, args.tiers_for, args.duration_s, Progress(),
                                args.out)  # fmt: skip
    if args.json:
        print(json.dumps(report, allow_nan=False))
    else:
        print("\n".join(describe_report(report)))
    return 0 if all(all(r["goal_met"].values()) for r in report["runs"]) else 1


def _verify_trial(args: argparse.Namespace) -> dict[str, Any]:
    """A trial's claim and launch; the workload, seed, pool and model are the study's own."""
    if args.trial is None or args.url is not None or args.file is not None or args.claimed_rate is not None:
        raise ConfigError("verify --study NAME: give --trial N, and neither --url nor --rate (the trial has both)")
    study = load_existing(args.study, storage_url(args.study, args.storage, reading=True))
    given = study.user_attrs.get("options") or {}
    for key in ("seed", "requests", "model", "prefix_reuse"):
        if getattr(args, key) in (None, 0) and given.get(key) is not None:
            setattr(args, key, given[key])
    workload = args.workload or given.get("workload") or study.user_attrs.get("workload")
    if not workload:
        raise ConfigError(f"--study {args.study}: it records no workload; give --workload")
    tiers = None if args.tier is None else [args.tier]
    return verify_trial(study, args.trial, _capacity_options(args, workload), tiers, args.duration_s, Progress(),
                        args.out)  # fmt: skip


def plan(args: argparse.Namespace) -> int:
    """`tuner plan`: the exact commands sampled trials would start, one JSON line each; boots nothing."""
    source(args.workload)  # a preset name or a readable trace file
    study = None
    if args.study is not None:  # its trials rank the plan by predicted capacity
        study = load_existing(args.study, storage_url(args.study, args.storage, reading=True))
    if args.gpu_name is not None and args.gpu_memory is None:
        raise ConfigError("--gpu-name: give the planned GPU's memory too (--gpu-memory GIB)")
    gpu = None if args.gpu_memory is None else planned_gpu(args.gpu_memory, args.gpu_name)
    rows = make_plan(
        args.space, args.engines, args.n, args.seed, args.model, args.drafts, engine_envs(args.engine_env),
        study, engine_versions(args.engine_version), say=lambda line: print(line, file=sys.stderr), gpu=gpu,
    )  # fmt: skip
    for row in rows:
        print(json.dumps(row))
    return 0


def trials(args: argparse.Namespace) -> int:
    """`tuner trials --study NAME`: every trial, the front, the repeats and the verdict."""
    study = load_existing(args.study, storage_url(args.study, args.storage, reading=True))
    print(trials_table(study, args.gpu_price))
    return 0


def export(args: argparse.Namespace) -> int:
    """`tuner export --study NAME --out DIR`: the best configs as launch files, checked by the engines' parsers."""
    study = load_existing(args.study, storage_url(args.study, args.storage, reading=True))
    for path in export_study(study, args.trials, args.out, engine_envs(args.engine_env), args.formats):
        print(path)
    return 0


def check(args: argparse.Namespace) -> int:
    """Every file's command through its engine's parser: one parser run per engine environment."""

    rejected = 0
    for path, engine, version, verdict in check_files(args.files, args.engine_env):
        if not verdict["ok"]:
            rejected += 1
            print(f"{path}: rejected by {engine} {version}: {verdict['error']}", file=sys.stderr)
        else:
            speculative = "on" if verdict["speculative"] else "off"
            print(f"{path}: accepted by {engine} {version} (speculative decoding: {speculative})")
    return 1 if rejected else 0


def report(args: argparse.Namespace) -> int:
    """`tuner report --study NAME`: the HTML report and summary.md."""
    study = load_existing(args.study, storage_url(args.study, args.storage, reading=True))
    print(write_report(study, args.out, args.gpu_price))
    return 0


def dashboard(args: argparse.Namespace) -> int:
    """`tuner dashboard --study NAME`: optuna-dashboard on the study, until Ctrl-C."""
    if not (args.storage or os.environ.get("TUNER_STORAGE") or args.study):
        raise ConfigError("dashboard needs --storage URL, $TUNER_STORAGE, or --study NAME for its SQLite file")
    url = storage_url(args.study or "", args.storage, reading=True)
    storage = open_storage(url)  # opened here, so a bad URL is one line, not the dashboard's traceback

    print(f"study storage: {redacted(url)}", file=sys.stderr, flush=True)
    try:
        serve(storage, args.host, args.port)
    except OSError as exc:
        raise ConfigError(f"dashboard: cannot listen on {args.host}:{args.port}: {exc.strerror}") from exc
    return 0


COMMANDS = {
    "search": search,
    "worker": worker,
    "plan": plan,
    "drive": drive,
    "report": report,
    "trials": trials,
    "export": export,
    "check": check,
    "dashboard": dashboard,
    "workload": workload,
    "verify": verify,
}


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command; its exit status."""
    return COMMANDS[args.command](args)

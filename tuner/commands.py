"""One function per CLI command; each takes the parsed arguments and returns the exit code."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tuner.errors import ConfigError, ExportError


def search(args: argparse.Namespace) -> int:
    from tuner.cli import _engine_envs
    from tuner.progress import Progress
    from tuner.search import DEFAULT_TRIALS, SearchOptions, run_search

    opts = SearchOptions(
        workload=args.workload,
        space=args.space,
        study=args.study,
        storage=args.storage,
        trials=DEFAULT_TRIALS if args.trials is None else args.trials,
        timeout_s=args.timeout,
        model=args.model,
        drafts=args.drafts,
        seed=args.seed,
        engine_envs=_engine_envs(args.engine_env),
        requests=args.requests,
        concurrency=args.concurrency,
        engines=args.engines,
    )
    if opts.requests < 1 or (opts.concurrency is not None and opts.concurrency < 1):
        raise ConfigError("--requests and --concurrency must be at least 1")
    run_search(opts, Progress())
    return 0


def plan(args: argparse.Namespace) -> int:
    from tuner.cli import _engine_envs
    from tuner.plan import plan as make_plan
    from tuner.workloads import WORKLOADS

    if args.workload not in WORKLOADS:
        raise ConfigError(f"unknown workload {args.workload!r}; known: {', '.join(WORKLOADS)}")
    rows = make_plan(
        args.space, args.engines, args.n, args.seed, args.model, args.drafts, _engine_envs(args.engine_env)
    )
    for row in rows:
        print(json.dumps(row))
    return 0


def trials(args: argparse.Namespace) -> int:
    from tuner.study import load_existing, storage_url
    from tuner.summary import trials_table

    study = load_existing(args.study, storage_url(args.study, args.storage))
    print(trials_table(study))
    return 0


def export(args: argparse.Namespace) -> int:
    from tuner.export import export_study
    from tuner.study import load_existing, storage_url

    study = load_existing(args.study, storage_url(args.study, args.storage))
    from tuner.cli import _engine_envs

    for path in export_study(study, args.trials, args.out, _engine_envs(args.engine_env)):
        print(path)
    return 0


def check(args: argparse.Namespace) -> int:
    from tuner.check import check_argvs
    from tuner.engines import ADAPTERS
    from tuner.engines.env import probe
    from tuner.export import read_sh
    from tuner.launchers import read_python

    path: Path = args.file
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    if path.suffix == ".json":
        try:
            m = json.loads(text)
            module, argv, python = m["module"], list(m["argv"]), m["python"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ExportError(f"{path}: not a manifest written by tuner export ({type(exc).__name__}: {exc})") from exc
    elif path.suffix == ".py":  # a Python launcher: sglang.Runtime(**KWARGS)
        module, argv, python = "sglang.launch_server", read_python(text), None
    else:
        module, argv = read_sh(text)
        python = None
    engine = next((name for name, a in ADAPTERS.items() if a.module == module), None)
    if engine is None:
        raise ExportError(f"{path}: unknown engine module {module}")
    where = args.engine_env or python
    env = probe(ADAPTERS[engine](), Path(where) if where else None)
    verdict = check_argvs(env, [argv])[0]
    if not verdict["ok"]:
        print(f"{path}: rejected by {engine} {env.version}: {verdict['error']}", file=sys.stderr)
        return 1
    speculative = "on" if verdict["speculative"] else "off"
    print(f"{path}: accepted by {engine} {env.version} (speculative decoding: {speculative})")
    return 0


def dashboard(args: argparse.Namespace) -> int:
    import os

    from optuna_dashboard import run_server

    from tuner.study import open_storage, storage_url

    if not (args.storage or os.environ.get("TUNER_STORAGE") or args.study):
        raise ConfigError("dashboard needs --storage URL, $TUNER_STORAGE, or --study NAME for its SQLite file")
    url = storage_url(args.study or "", args.storage)
    storage = open_storage(url)  # opened here, so a bad URL is one line, not the dashboard's traceback
    print(f"optuna-dashboard on http://{args.host}:{args.port}/dashboard for {url}", file=sys.stderr, flush=True)
    try:
        run_server(storage, host=args.host, port=args.port)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a user stops the dashboard
    return 0


COMMANDS = {"search": search, "plan": plan, "trials": trials, "export": export, "check": check, "dashboard": dashboard}


def run_command(args: argparse.Namespace) -> int:
    return COMMANDS[args.command](args)

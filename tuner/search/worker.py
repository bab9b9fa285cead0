"""``tuner worker``: join a study that a fleet shares, on a database many processes can reach.

A worker is ``tuner search`` with three differences: its storage must be a server database
(PostgreSQL), it runs no finalists (``tuner search`` on the same study does, once the budget is
spent), and what its flags leave out comes from the study: the workload and how it was built
(preset or trace, seed, requests, arrivals), the models, the search space, the objective and the
SLOs. So every worker drives byte-identical requests (the study refuses any other workload
digest), and a worker on another GPU model or engine version is refused: the hardware and the
engine versions belong to the study.

    tuner search --workload rag --study fleet --storage postgresql://tuner@db/tuner --trials 0
    tuner worker --study fleet --storage postgresql://tuner@db/tuner --trials 40   # on every host
    tuner search --study fleet --storage postgresql://tuner@db/tuner --workload rag --trials 40
"""

from __future__ import annotations

import argparse

from tuner.errors import ConfigError, StorageError
from tuner.measure.capacity import ATTAINMENT_TARGET, RESOLUTION
from tuner.study.objectives import objective_named
from tuner.study.storage import load_existing
from tuner.workloads.base import DEFAULT_TIER


def fill_from_study(args: argparse.Namespace) -> None:
    """Fill the flags a worker was not given from the study's ``options``; set ``args.space_dump``."""
    if args.storage.startswith("sqlite"):
        raise ConfigError("tuner worker needs a database many processes can share: --storage postgresql://user@host/db")

    args.space_dump = None
    try:
        attrs = load_existing(args.study, args.storage).user_attrs
    except StorageError:
        if args.workload is None:
            raise ConfigError(f"study {args.study!r} does not exist yet: give --workload to create it") from None
        return  # the first worker creates the study from its own flags
    known = attrs.get("options") or {}
    shaping = ("workload", "seed", "requests", "concurrency", "rate", "burstiness", "prefix_reuse")
    for flag in (*shaping, "model", "engines"):
        if getattr(args, flag) is None:
            setattr(args, flag, known.get(flag))
    if not args.drafts:
        args.drafts = list(known.get("drafts") or [])
    if args.objective is None:
        args.objective = objective_named(attrs.get("objective")).name  # as the study reads everywhere
    plan = attrs.get("capacity_plan") or {}
    if args.tier is None:
        args.tier = (plan.get("scored") or [DEFAULT_TIER])[0]
    if args.attainment is None:
        args.attainment = plan.get("target", ATTAINMENT_TARGET)
    if args.resolution is None:
        args.resolution = plan.get("resolution", RESOLUTION)
    if args.confidence is None:
        args.confidence = plan.get("confidence")
    if args.slo is None and plan.get("tiers"):
        args.slo = [f"{tier}:" + ",".join(f"{k}={v:g}" for k, v in slo.items()) for tier, slo in plan["tiers"].items()]
    elif args.slo is None and attrs.get("slo"):
        args.slo = [",".join(f"{k}={v:g}" for k, v in attrs["slo"].items())]
    if args.space is None and attrs.get("space"):
        args.space_dump = attrs["space"]
    if args.workload is None:
        raise ConfigError(f"study {args.study!r} does not say its workload: give --workload")
    if args.seed is None:
        args.seed = 0

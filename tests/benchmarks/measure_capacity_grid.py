"""Serve every config of ``search_spaces/grid-cpu-capacity.yaml`` on a ladder of rates on the vLLM CPU build.

Run: ``.venv/bin/python -m tests.benchmarks measure_capacity_grid [--out FILE] [--limit N]`` (one to
two hours on 2 cores for the 36 configs and the engine default). Not part of the default test run.
Resumable: configs already in the output file are skipped, so an interrupted run continues where it
stopped (across sessions: the file keeps the stamp of the run that started it, and every config the
time it was served and the load before it).

``--heavy`` serves the second table instead (``_table.CAPACITY_GRIDS``): the heavy space under the
rag preset as it is now (GuideLLM's RAG shape, scaled to the CPU context), where the first table's
light preset left the engine default tied for the best. Its ladder starts higher (``HEAVY_RUNGS``),
since its configs carry several times the first table's rates. ``--repeat N`` then serves the
first N served configs again on fresh boots (kept under ``repeats``): the truth's own noise.
``--extend`` climbs on, on a fresh boot, from where a ladder stopped before ``FAILS_TO_STOP`` rungs
in a row failed as the search judges them (``_extend``).

Each config boots as a capacity trial does (``tuner.measure.trial``: fresh boot, warmup, the prefix
cache reset before every step), then serves a fixed geometric ladder of open-loop steps with the
CPU step sizes (``tuner.search.resolve.CPU_STEPS``), rungs one ``--resolution`` (10 %) apart, from
``FIRST_RUNG`` up until ``FAILS_TO_STOP`` rungs in a row fail the relaxed tier; when the first rung
already fails the interactive tier, the ladder also walks down until a rung passes it. Every rung
keeps its raw step (request rows, ITL gaps, duration, server deltas, whether the monitor cut it),
so ``bench_search`` can replay any capacity search, under either tier and from any incumbent,
against it (``_table.CapacityTableRunner``). The order is shuffled with a fixed seed so drift in
the machine's load spreads over the grid rather than over one parameter.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import httpx
import optuna

from tests.benchmarks import _report
from tests.benchmarks._table import CAPACITY_GRIDS, grid_offers, read_table, rungs_of, write_table
from tests.benchmarks.measure_grid import _memory_lines
from tuner.engines.base import Config
from tuner.errors import EngineLaunchError
from tuner.measure.process import ServerProcess, free_port, tail
from tuner.measure.rate_steps import CapacityPlan, Measured, judge_served, measure_step
from tuner.measure.supply import RequestSupply
from tuner.measure.trial import TrialContext, TrialResult, healthy, reset_prefix_cache, warm_up
from tuner.progress import Progress
from tuner.search.grid import grid_points, shuffled
from tuner.search.options import SearchOptions
from tuner.search.resolve import capacity_plan, detect_device, resolve_engines, resolve_models, resolve_workload
from tuner.search.space import Space, load_space, suggest
from tuner.search.speculation import Offer

LOG_DIR = _report.ROOT / "studies" / "logs" / "capacity-grid"
# start_rate * 1.1**5: the low rungs cost the most (their requests trickle in), and a config that
# fails here walks down to them anyway.
FIRST_RUNG = 5
FAILS_TO_STOP = 2  # one failing rung can be noise at 10 requests a step; two in a row end the climb
TOP_RUNG = 25  # about 5 req/s, twice the best capacity seen on this machine
# The heavy table's (first, top) rungs over its plan's start rate of 1 req/s: about 4.2 to 45 req/s,
# around the engine default's capacity under today's rag on this machine (reports/model-sampler.md).
HEAVY_RUNGS = (15, 40)
LOG_CHARS = 20_000  # of the log since the server was ready: what the replay's failure classification reads


def ladder_rate(plan: CapacityPlan, rung: int) -> float:
    return plan.start_rate * (1 + plan.resolution) ** rung


def _passes(m: Measured, plan: CapacityPlan, tier: str) -> bool:
    return judge_served(m, plan.tiers[tier], plan).passed


def serve_ladder(
    number: int, config: Config, ctx: TrialContext, plan: CapacityPlan, rungs_from_to: tuple[int, int],
    fails_before: int = 0, walk_down: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """Boot ``config``, warm up, and serve the ladder from the first of ``rungs_from_to`` up (at most
    to the second, until ``FAILS_TO_STOP`` rungs in a row fail the relaxed tier, ``fails_before`` of
    them already), then down where the first rung failed the interactive tier (``walk_down``); the
    row the table keeps for it."""
    first_rung, top_rung = rungs_from_to
    adapter, env = ctx.engines[config.engine]
    spec = adapter.launch(config, ctx.model, ctx.device, free_port(), env.python, env.version)
    log_path = ctx.log_dir / f"config-{number:03d}.log"
    result = TrialResult(config=config, launch=spec, engine_version=env.version, log_path=str(log_path))
    rungs: dict[int, Measured] = {}
    with ServerProcess(spec, log_path) as server:
        try:
            result.boot_s = server.wait_ready(ctx.boot_deadline_s)
        except EngineLaunchError as exc:
            return {"failure": exc.failure, "argv": list(spec.argv), "log_tail": exc.log_tail[-1500:],
                    "memory_lines": _memory_lines(str(log_path)), "phases_s": {}, "rungs": {}}  # fmt: skip
        result.phases_s["boot"] = round(result.boot_s, 2)
        ready_at = server.log_size()
        with httpx.Client(timeout=10.0) as client:
            warm_up(number, server, client, ctx, result)
            started = time.monotonic()
            supply = RequestSupply.of(ctx.workload)

            def serve(rung: int) -> Measured:
                reset_prefix_cache(client, server.base_url, adapter)
                m = measure_step(server.base_url, server.spec.served_model, supply,
                                 ladder_rate(plan, rung), plan, adapter)  # fmt: skip
                rungs[rung] = m
                verdict = "/".join("pass" if _passes(m, plan, t) else "fail" for t in plan.tiers)
                ctx.progress.line(f"  rung {rung}: {m.rate_req_s:.3g} req/s, {len(m.rows)} requests in "
                                  f"{m.duration_s:.0f} s: {verdict} ({'/'.join(plan.tiers)})")  # fmt: skip
                return m

            fails, rung = fails_before, first_rung
            while rung <= top_rung and fails < FAILS_TO_STOP:
                fails = 0 if _passes(serve(rung), plan, "relaxed") else fails + 1
                rung += 1
            floor = plan.start_rate / 8  # where a search without an incumbent reports no capacity
            rung = first_rung - 1
            low_fails = walk_down and not _passes(rungs[min(rungs)], plan, "interactive")
            while low_fails and ladder_rate(plan, rung) >= floor:
                low_fails = not _passes(serve(rung), plan, "interactive")
                rung -= 1
            ladder_s = time.monotonic() - started
            alive = server.alive() and healthy(client, server)
        since_ready = tail(server.log_path, max_lines=400, start=ready_at)
    return {
        "failure": None,
        "argv": list(result.launch.argv),
        "served_by": result.served_by,
        "phases_s": {**result.phases_s, "ladder": round(ladder_s, 2)},
        "alive": alive,
        "since_ready": since_ready[-LOG_CHARS:],
        "memory_lines": _memory_lines(str(log_path)),
        "rungs": {str(r): asdict(m) for r, m in sorted(rungs.items())},
    }


def measure(out: Path, limit: int | None, heavy: bool = False, repeat: int = 0, extend: bool = False) -> None:
    space_path = CAPACITY_GRIDS["heavy" if heavy else "light"][1]
    rungs_from_to = HEAVY_RUNGS if heavy else (FIRST_RUNG, TOP_RUNG)
    space = load_space(space_path)
    opts = SearchOptions(workload="rag", space=space_path, objective="capacity-pareto")
    progress = Progress()
    engines = resolve_engines(space, {}, None, progress)
    env = engines["vllm"][1]
    device = detect_device(env, space)
    model = resolve_models(opts, space, env)
    workload = resolve_workload(opts, model)
    plan = capacity_plan(opts, workload, device)
    assert plan is not None
    log_dir = LOG_DIR.with_name(LOG_DIR.name + "-heavy") if heavy else LOG_DIR
    log_dir.mkdir(parents=True, exist_ok=True)
    ctx = TrialContext(engines, model, device, workload, log_dir, progress, 300.0, {}, capacity=plan)
    data: dict[str, Any] = read_table(out) if out.exists() else {
        "what": f"every config of search_spaces/{space_path.name}, served on a fixed ladder of rates",
        "stamp": _report.stamp(),
        "space": space.model_dump(),
        "plan": {**asdict(plan), "tiers": {k: dict(v) for k, v in plan.tiers.items()}},
        "workload": {"name": workload.name, "digest": workload.digest(), "requests": len(workload.requests),
                     "seed": workload.seed},
        "engine": {"distribution": env.distribution, "version": env.version},
        "device": {"kind": device.kind, "name": device.name, "memory_bytes": device.memory_bytes},
        "model": {"path": model.path, "drafts": dict(model.drafts), "max_model_len": model.max_model_len},
        "machine": _report.machine(),
        "rungs": {"first": rungs_from_to[0], "top": rungs_from_to[1], "fails_to_stop": FAILS_TO_STOP},
        "points": {},
    }  # fmt: skip
    # the engine default first: a table cut short by the end of a session still has what it is judged by
    points = [{"engine": "vllm"}] + shuffled(grid_points(space, grid_offers(space, model)), seed=0)
    todo = [p for p in points if json.dumps(p, sort_keys=True) not in data["points"]][:limit]
    progress.line(f"capacity grid: {len(points)} configs, {len(data['points'])} done, {len(todo)} to measure now")
    offers = grid_offers(space, model)
    for i, point in enumerate(todo):
        row = _served(point, len(data["points"]), space, offers, ctx, plan, rungs_from_to, f"{i + 1}/{len(todo)}")
        data["points"][json.dumps(point, sort_keys=True)] = row
        write_table(out, data)
    if extend:
        _extend(out, data, space, offers, ctx, plan, rungs_from_to)
    # The same config served again, on a fresh boot: the truth's own noise, which bounds what any
    # prediction of one ladder can reach (bench_model). The first served configs in order, once each.
    served = sorted((kv for kv in data["points"].items() if not kv[1]["failure"]), key=lambda kv: kv[1]["order"])
    again = data.setdefault("repeats", {})
    for i, (point, row) in enumerate(served[:repeat]):
        if again.get(point):
            continue
        again[point] = [_served(json.loads(point), row["order"], space, offers, ctx, plan, rungs_from_to,
                                f"repeat {i + 1}/{repeat}")]  # fmt: skip
        write_table(out, data)


def _extend(out: Path, data: dict[str, Any], space: Space, offers: dict[str, Offer], ctx: TrialContext,
            plan: CapacityPlan, rungs_from_to: tuple[int, int]) -> None:  # fmt: skip
    """Climb again, on a fresh boot, every ladder (repeats included) that stopped before
    ``FAILS_TO_STOP`` rungs in a row failed the relaxed tier as the search judges a step
    (``judge_served``): a climb judged without a look's own window stopped on requests a look had
    left in flight. The new rungs join the row, which records the extension."""
    rows = list(data["points"].items()) + [(p, r) for p, rs in data.get("repeats", {}).items() for r in rs]
    for point, row in rows:
        if row["failure"] or not row["rungs"]:
            continue
        rungs = rungs_of(row)
        top = max(rungs)
        trailing = 0
        for r in sorted(rungs, reverse=True):
            if _passes(rungs[r], plan, "relaxed"):
                break
            trailing += 1
        if trailing >= FAILS_TO_STOP or top >= rungs_from_to[1]:
            continue
        more = _served(json.loads(point), row["order"], space, offers, ctx, plan, (top + 1, rungs_from_to[1]),
                       f"extending from rung {top + 1}", fails_before=trailing, walk_down=False)  # fmt: skip
        if more["failure"]:
            row.setdefault("extensions", []).append({"failure": more["failure"], "at": more["measured_at"]})
        else:
            row["rungs"].update(more["rungs"])
            row.setdefault("extensions", []).append({"from_rung": top + 1, "at": more["measured_at"],
                                                     "phases_s": more["phases_s"], "load_avg_1m_before":
                                                     more["load_avg_1m_before"]})  # fmt: skip
        write_table(out, data)


def _served(point: dict[str, Any], number: int, space: Space, offers: dict[str, Offer], ctx: TrialContext,
            plan: CapacityPlan, rungs_from_to: tuple[int, int], said: str, fails_before: int = 0,
            walk_down: bool = True) -> dict[str, Any]:  # fmt: skip
    """One config booted and served on the ladder: the row the table keeps for it. The grid point
    becomes a config as a trial's params do (``suggest`` on a fixed trial: a draft under its method)."""
    config = suggest(cast(optuna.Trial, optuna.trial.FixedTrial(point)), space, offers, point == {"engine": "vllm"})
    params = dict(config.params)
    started, load = time.time(), os.getloadavg()[0]
    ctx.progress.line(f"capacity grid: {said} {params or 'engine defaults'}")
    row = serve_ladder(number, config, ctx, plan, rungs_from_to, fails_before, walk_down)
    outcome = row["failure"] or f"{len(row['rungs'])} rungs"
    ctx.progress.line(f"capacity grid: {said} -> {outcome} in {time.time() - started:.0f} s")
    return {
        "order": number, "params": params, **row, "wall_s": round(time.time() - started, 2),
        "load_avg_1m_before": load, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heavy", action="store_true", help="the heavy table: its space, today's rag, its ladder")
    parser.add_argument("--out", type=Path, help="default: the grid's table (tests/benchmarks/_table.CAPACITY_GRIDS)")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--repeat", type=int, default=0, help="then serve the first N served configs again")
    parser.add_argument("--extend", action="store_true", help="climb on where a ladder stopped before its top")
    args = parser.parse_args()
    out = args.out or CAPACITY_GRIDS["heavy" if args.heavy else "light"][0]
    measure(out, args.limit, args.heavy, args.repeat, args.extend)


if __name__ == "__main__":
    main()

"""Capacity under an SLO on the vLLM CPU build: curves, what the search costs, and its repeatability.

Run: ``.venv/bin/python -m tests.benchmarks.bench_capacity [--boots 5]`` (about 25 minutes on 2
cores). Writes ``reports/capacity.md`` and ``reports/capacity.json``. Not part of the default test run.

Everything is resolved as ``tuner search --workload rag --objective capacity-pareto`` resolves it
(default space, generated models, the rag preset's CPU tiers, the CPU step sizes), and every step is
``tuner.measure.rate_steps.measure_step`` on a server started as a trial starts it. Three parts:

1. Curves: for each config (the engine defaults and three tuned ones), one boot. A fixed ladder
   walks up from the search's start rate in steps of the search's resolution until a step fails
   both tiers (or a rate cap); then, on the same server, the capacity search runs both tiers. The
   ladder's steps give the whole curve (attainment, TTFT p95, TPOT p95 against rate) and its cost:
   a ladder must measure every rung below the knee to reach the search's precision.
2. Cost: per config and tier, the search's steps and seconds against the ladder's, and whether the
   two capacities agree within the resolution.
3. Repeatability: ``--boots`` fresh boots of the defaults, one interactive-tier search each with no
   incumbent; the coefficient of variation of the capacity over them.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from tests.benchmarks import _engine
from tests.benchmarks._report import ROOT, sections, table, with_section
from tests.benchmarks.stamp import stamp, stamp_line
from tuner.engines.base import Config
from tuner.measure.process import ServerProcess, free_port
from tuner.measure.rate_steps import CapacityPlan, Measured, judge_served, measure_step, search_capacity
from tuner.measure.supply import RequestSupply
from tuner.measure.trial import reset_prefix_cache
from tuner.progress import Progress
from tuner.search.options import SearchOptions
from tuner.search.resolve import capacity_plan, detect_device, resolve_engines, resolve_models, resolve_workload
from tuner.search.space import load_space

NAME = "capacity"
MD_PATH, JSON_PATH = ROOT / "reports" / "capacity.md", ROOT / "reports" / "capacity.json"
CONFIGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "max_num_seqs=2": {"max_num_seqs": 2},
    "chunk_size=512": {"chunk_size": 512, "max_num_seqs": 8},
    "draft-2l K=2": {"num_speculative_tokens": 2, "draft_model": "draft-2l"},
}
LADDER_CAP_REQ_S = 5.0  # the ladder stops here even if a tier still passes (the CPU build carries less)


class Setup:
    """What a capacity-pareto search on the default CPU study would run with."""

    def __init__(self) -> None:
        self.progress = Progress()
        opts = SearchOptions(workload="rag", objective="capacity-pareto")
        self.space = load_space(None)
        self.engines = resolve_engines(self.space, {}, ["vllm"], self.progress)
        self.adapter, self.env = self.engines["vllm"]
        self.device = detect_device(self.env, self.space)
        self.model = resolve_models(opts, self.space, self.env)
        self.workload = resolve_workload(opts, self.model)
        plan = capacity_plan(opts, self.workload, self.device)
        assert plan is not None
        self.plan: CapacityPlan = plan
        self.logs = _engine.run_dir(NAME)

    def serve(self, params: dict[str, Any], label: str) -> ServerProcess:
        config = Config("vllm", params, enforce_eager=self.space.static.enforce_eager, is_default=not params)
        spec = self.adapter.launch(config, self.model, self.device, free_port(), self.env.python, self.env.version)
        return ServerProcess(spec, self.logs / f"{label.replace(' ', '_').replace('=', '-')}.log")


def _measure(setup: Setup, server: ServerProcess, client: httpx.Client, log: list[Measured]) -> Any:
    supply = RequestSupply.of(setup.workload)  # one search's requests, each sent once

    def measure(rate: float, hold: bool = False) -> Measured:
        reset_prefix_cache(client, server.base_url, setup.adapter)
        m = measure_step(server.base_url, server.spec.served_model, supply, rate, setup.plan, setup.adapter, hold)
        log.append(m)
        return m

    return measure


def _judged(plan: CapacityPlan, m: Measured) -> dict[str, Any]:
    out: dict[str, Any] = {"rate_req_s": m.rate_req_s, "seconds": round(m.duration_s, 2), "requests": len(m.rows)}
    for tier, slo in plan.tiers.items():
        step = judge_served(m, slo, plan)
        out[tier] = {k: step.as_dict()[k] for k in ("attainment", "passed", "saturated", "ttft_p95_ms", "tpot_p95_ms")}
    return out


def curve(setup: Setup, label: str, params: dict[str, Any]) -> dict[str, Any]:
    plan = setup.plan
    with setup.serve(params, label) as server, httpx.Client(timeout=10.0) as client:
        boot_s = server.wait_ready(600)
        setup.progress.line(f"{label}: ready in {boot_s:.0f} s")
        ladder: list[Measured] = []
        measure = _measure(setup, server, client, ladder)
        rate, rungs = plan.start_rate, []
        started = time.monotonic()
        while rate <= LADDER_CAP_REQ_S * (1 + 1e-9):
            judged = _judged(plan, measure(rate))
            rungs.append(judged)
            setup.progress.line(
                f"{label}: ladder {rate:.3g} req/s "
                + " ".join(f"{t}={judged[t]['attainment']:.0%}" for t in plan.tiers)
            )
            if not any(judged[t]["passed"] for t in plan.tiers):
                break
            rate *= 1 + plan.resolution
        ladder_s = time.monotonic() - started
        searched: list[Measured] = []
        outcome = search_capacity(_measure(setup, server, client, searched), plan)
    per_tier = {}
    for tier in plan.tiers:
        passing = [r["rate_req_s"] for r in rungs if r[tier]["passed"]]
        first_fail = next((r["rate_req_s"] for r in rungs if not r[tier]["passed"]), None)
        ladder_capacity = max((p for p in passing if first_fail is None or p < first_fail), default=0.0)
        rungs_needed = [r for r in rungs if first_fail is None or r["rate_req_s"] <= first_fail]
        result = outcome.results[tier]
        per_tier[tier] = {
            "search_capacity_req_s": result.capacity_req_s,
            "search_stop": result.stop_reason,
            "search_steps": len(result.steps),
            "ladder_capacity_req_s": ladder_capacity,
            "ladder_steps": len(rungs_needed),
            "ladder_s": round(sum(r["seconds"] for r in rungs_needed), 1),
            "agree": _agree(result.capacity_req_s, ladder_capacity, plan.resolution),
        }
    return {
        "label": label,
        "params": params,
        "boot_s": round(boot_s, 1),
        "ladder": rungs,
        "ladder_s": round(ladder_s, 1),
        "search_s": round(outcome.search_s, 1),
        "search_steps_measured": len(outcome.measured),
        "tiers": per_tier,
    }


def _agree(a: float, b: float, resolution: float) -> bool:
    """Within one resolution step of each other (two rates of one bracket), or both zero."""
    return a == b or (min(a, b) > 0 and max(a, b) / min(a, b) <= (1 + resolution) ** 2 + 1e-9)


def repeatability(setup: Setup, boots: int) -> dict[str, Any]:
    plan = setup.plan
    one_tier = CapacityPlan(**{**plan.__dict__, "scored": ("interactive",)})
    setup.plan = one_tier
    runs: list[dict[str, Any]] = []
    for i in range(boots):
        with setup.serve({}, f"repeat-{i + 1}") as server, httpx.Client(timeout=10.0) as client:
            boot_s = server.wait_ready(600)
            outcome = search_capacity(_measure(setup, server, client, []), one_tier)
        r = outcome.results["interactive"]
        runs.append(
            {
                "boot": i + 1,
                "boot_s": round(boot_s, 1),
                "capacity_req_s": r.capacity_req_s,
                "steps": len(r.steps),
                "search_s": round(outcome.search_s, 1),
                "stop": r.stop_reason,
            }
        )
        setup.progress.line(f"repeat {i + 1}: {r.capacity_req_s:.3g} req/s in {outcome.search_s:.0f} s")
    setup.plan = plan
    values = [float(r["capacity_req_s"]) for r in runs]
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else math.nan
    return {
        "runs": runs,
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "mean": mean,
        "cv_pct": sd / mean * 100 if mean else math.nan,
    }


def _write_md(page: str) -> None:
    """The page, keeping the sections other benchmarks own in it (``bench_capacity_trust``'s)."""
    old = MD_PATH.read_text() if MD_PATH.exists() else ""
    for name, block in sections(old):
        page = with_section(page, name, block)
    MD_PATH.write_text(page.rstrip() + "\n")


def render(data: dict[str, Any]) -> str:
    plan = data["plan"]
    tiers = "; ".join(f"{t}: " + ", ".join(f"{k} <= {v:g}" for k, v in slo.items()) for t, slo in plan["tiers"].items())
    lines = [
        "# Capacity under an SLO on the vLLM CPU build",
        "",
        f"_{stamp_line(data['stamp'])}_",
        "",
        "Regenerate: `python -m tests.benchmarks bench_capacity` (`--render-only` re-renders this page from the JSON).",
        f"Workload `rag` (CPU tiers: {tiers}); target attainment {plan['target']:.0%}, resolution "
        f"{plan['resolution']:.0%}, steps of at least {plan['min_step_s']:g} s and {plan['min_requests']} requests, "
        f"search from {plan['start_rate']:g} req/s. One boot per config; each ladder rung and search step is "
        "one measurement, so figures carry the noise the repeatability section shows.",
        "",
        *_goals(data),
        "## Curves",
        "",
    ]
    for c in data["curves"]:
        lines += [f"### {c['label']} (boot {c['boot_s']:g} s)", ""]
        rows = [
            [
                f"{r['rate_req_s']:.3g}",
                r["requests"],
                r["seconds"],
                *[f"{r[t]['attainment']:.0%}{'' if r[t]['passed'] else ' (fail)'}" for t in plan["tiers"]],
                _ms(r["interactive"]["ttft_p95_ms"]),
                _ms(r["interactive"]["tpot_p95_ms"]),
            ]
            for r in c["ladder"]
        ]
        lines += [
            table(
                [
                    "rate req/s",
                    "requests",
                    "s",
                    *[f"{t} attainment" for t in plan["tiers"]],
                    "TTFT p95 ms",
                    "TPOT p95 ms",
                ],
                rows,
            ),
            "",
        ]
    lines += [
        "## What the search cost",
        "",
        "Per tier: the search's capacity, steps and the seconds of its steps (warm-up excluded), against a "
        "fixed ladder at the same resolution walked up to its first failing rung.",
        "",
    ]
    rows = []
    for c in data["curves"]:
        for tier, t in c["tiers"].items():
            rows.append(
                [
                    c["label"],
                    tier,
                    f"{t['search_capacity_req_s']:.3g}",
                    t["search_stop"],
                    t["search_steps"],
                    f"{t['ladder_capacity_req_s']:.3g}",
                    t["ladder_steps"],
                    t["ladder_s"],
                    "yes" if t["agree"] else "no",
                ]
            )
    lines += [
        table(
            [
                "config",
                "tier",
                "search req/s",
                "stop",
                "search steps",
                "ladder req/s",
                "ladder steps",
                "ladder s",
                "agree",
            ],
            rows,
        ),
        "",
    ]
    lines += ["Both tiers' searches share steps; per config, all steps of both searches took:", ""]
    lines += [
        table(
            ["config", "steps measured", "search s", "boot s"],
            [[c["label"], c["search_steps_measured"], c["search_s"], c["boot_s"]] for c in data["curves"]],
        ),
        "",
    ]
    rep = data.get("repeatability")
    if rep:
        lines += [
            "## Repeatability",
            "",
            f"{len(rep['runs'])} fresh boots of the defaults, one interactive-tier search each: median "
            f"{rep['median']:.3g} req/s (range {rep['min']:.3g}-{rep['max']:.3g}), CV {rep['cv_pct']:.1f} %.",
            "",
        ]
        lines += [
            table(
                ["boot", "boot s", "capacity req/s", "steps", "search s", "stop"],
                [
                    [r["boot"], r["boot_s"], f"{r['capacity_req_s']:.3g}", r["steps"], r["search_s"], r["stop"]]
                    for r in rep["runs"]
                ],
            ),
            "",
        ]
    return "\n".join(lines)


GOAL_S = 90.0  # issue 15: on the CPU build, a trial's capacity search takes no more than this


def _goals(data: dict[str, Any]) -> list[str]:
    """The goal, judged from this run's own figures."""
    both = [c["search_s"] for c in data["curves"]]
    one = [r["search_s"] for r in (data.get("repeatability") or {}).get("runs", [])]
    lines = [
        "## Against the goal",
        "",
        f"Goal: a trial's capacity search takes no more than {GOAL_S:g} s on the CPU build.",
    ]
    if one:
        met = sum(s <= GOAL_S for s in one)
        lines.append(
            f"- One tier (`--objective capacity`, the default): {met} of {len(one)} searches within the "
            f"goal (longest {max(one):g} s)."
        )
    met = sum(s <= GOAL_S for s in both)
    lines.append(
        f"- Both tiers (`capacity-pareto`, no incumbent): {met} of {len(both)} configs within the goal "
        f"(longest {max(both):g} s)."
    )
    return [*lines, ""]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boots", type=int, default=5, help="fresh boots of the defaults for the CV")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated labels of CONFIGS")
    parser.add_argument("--render-only", action="store_true", help="re-render reports/capacity.md from the JSON")
    args = parser.parse_args()
    if args.render_only:
        _write_md(render(json.loads(JSON_PATH.read_text())))
        return
    run_stamp = stamp()
    setup = Setup()
    data: dict[str, Any] = {"stamp": run_stamp, "plan": {**setup.plan.__dict__, "tiers": dict(setup.plan.tiers)}}
    data["curves"] = [curve(setup, label, CONFIGS[label]) for label in args.configs.split(",")]
    if args.boots > 0:
        data["repeatability"] = repeatability(setup, args.boots)
    kept = (
        {k: v for k, v in json.loads(JSON_PATH.read_text()).items() if k == "capacity_trust"}
        if JSON_PATH.exists()
        else {}
    )
    JSON_PATH.write_text(json.dumps({**data, **kept}, indent=2, default=list) + "\n")
    _write_md(render(data))
    print(f"wrote {Path(MD_PATH).relative_to(ROOT)} and {Path(JSON_PATH).relative_to(ROOT)}")


if __name__ == "__main__":
    main()

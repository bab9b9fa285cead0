"""A two-tier capacity search on a known server: each tier searched afresh (the tuner's rule) against
a later tier starting from the steps the earlier ones served (tried, not adopted).

Run: ``.venv/bin/python -m tests.benchmarks.bench_tier_search [--searches N]`` (about ten minutes;
no engine). Not part of the default test run. Writes the section "tier_search" of
``reports/capacity.md``.

On the H100 (reports/gpu-h100/study-1/block1/NOTES.md) SGLang's defaults searched the interactive
tier up to a bracket near its knee; the relaxed tier then started afresh at its incumbent, failed
there and halved down, serving steps around a knee the interactive tier's steps had already
bracketed. Both tiers are scored in a `capacity-pareto` study, so every trial searches both. Would
a later tier do better starting from every step already served, judged under its own SLO? This
replays two-tier searches on ``tests/batching_server.py`` in the shapes of ``bench_known_search``
(``SERVERS``, each step served offline and watched by ``measure_step``'s rules), under an
interactive tier and a relaxed one of twice its bounds (as the rag preset's tiers are), with the
incumbents a study hands a trial: none (the study's first trial), just above the config's knees (a
config a little worse than the best so far, the H100 case; with the pruning a sampled trial has,
and without it, as an engine default and a finalist's repeat run), and well below them (a better
config). Each runs under the tuner's rule and under ``tests/benchmarks/_previous_rules.py``'s
``WarmTierPlan``, on the same seeds. The truth is each tier's knee on the server's long-run
attainment curve (``bench_known_search.truth_curve`` over a wider grid, judged under that tier).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tests.benchmarks import _report
from tests.benchmarks._previous_rules import WarmTierPlan
from tests.benchmarks.bench_known_search import (
    PLAN,
    SERVERS,
    Server,
    knee_of,
    simulate_step,
    truth_curve,
)
from tuner.measure.rate_steps import CapacityPlan, Measured, search_capacity

NAME = "tier_search"
MD_PATH, JSON_PATH = _report.ROOT / "reports" / "capacity.md", _report.ROOT / "reports" / "capacity.json"
INTERACTIVE = dict(PLAN.tiers["interactive"])
RELAXED = {key: 2 * bound for key, bound in INTERACTIVE.items()}  # as the rag preset's relaxed tier is
# 1..10 req/s: the relaxed knees lie past the 7 req/s of the one-tier grid
TRUTH_RATES = tuple(1.0 + 0.25 * i for i in range(37))
TIERS = ("interactive", "relaxed")
TWO_TIERS = CapacityPlan(**{**vars(PLAN), "tiers": {"interactive": INTERACTIVE, "relaxed": RELAXED}, "scored": TIERS})
# the incumbents a trial is handed, as a share of each tier's knee (None: the study's first trial), and
# whether the trial may be pruned (a sampled trial) or not (an engine default, a finalist's repeat)
CASES: dict[str, tuple[float | None, bool]] = {
    "no incumbent": (None, False),
    "incumbents 1.05x the knees, no pruning": (1.05, False),
    "incumbents 1.05x the knees, pruning": (1.05, True),
    "incumbents 0.7x the knees, pruning": (0.7, True),
}
# each rule's plan for one search, given the list that search's measure appends its served steps to
RULES: dict[str, Callable[[list[Measured]], CapacityPlan]] = {
    "current: each tier afresh": lambda served: TWO_TIERS,
    "tried: a later tier from the steps served": lambda served: WarmTierPlan(**vars(TWO_TIERS), served=served),
}


def one_search(
    server: Server, rule: Callable[[list[Measured]], CapacityPlan], seed: int, incumbents: dict[str, float] | None,
    prune: bool,
) -> dict[str, Any]:  # fmt: skip
    """One two-tier search; every step is served on its own seed, the same under every rule."""
    served: list[Measured] = []
    plan = rule(served)

    def measure(rate: float, hold: bool = False) -> Measured:
        served.append(simulate_step(server, rate, plan, seed * 1000 + len(served), hold))
        return served[-1]

    outcome = search_capacity(measure, plan, incumbents, prune)
    return {
        "seed": seed,
        "served": len(served),
        "served_s": round(sum(m.duration_s for m in served), 1),
        **{
            tier: {
                "capacity_req_s": result.capacity_req_s,
                "stop_reason": result.stop_reason,
                # one line a tier: each judged step as the search's log tells it, "(cut: why)" where the monitor cut it
                "steps": "; ".join(
                    f"{s.rate_req_s:.3f} {s.verdict}" + (f" (cut: {s.cut_reason})" if s.cut_reason else "")
                    for s in result.steps
                ),
            }
            for tier, result in outcome.results.items()
        },
    }


def summary(
    case: str, rule: str, searches: list[dict[str, Any]], at: Mapping[str, Callable[[float], float]],
    knees: Mapping[str, float],
) -> list[str]:  # fmt: skip
    served = [s["served"] for s in searches]
    cells = [
        case, rule, str(len(searches)), f"{statistics.median(served):g} [{min(served)}, {max(served)}]",
        f"{statistics.median(s['served_s'] for s in searches):.0f}",
    ]  # fmt: skip
    for tier in TIERS:
        claims = [s[tier]["capacity_req_s"] for s in searches]
        near = sum(at[tier](c) >= TWO_TIERS.target - 0.05 for c in claims)
        shares = [c / knees[tier] for c in claims]
        low, high = np.percentile(shares, [10, 90])
        cells += [f"{statistics.median(shares):.2f} [{low:.2f}, {high:.2f}]", f"{near}/{len(claims)}"]
    pruned = sum(any(s[t]["stop_reason"] == "pruned" for t in TIERS) for s in searches)
    return [*cells, f"{pruned}/{len(searches)}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--searches", type=int, default=20, help="searches per case and rule")
    args = parser.parse_args()
    run_stamp, before = _report.stamp(), _report.machine()
    header = [
        "incumbents", "rule", "searches", "steps served (median [min, max])", "served s (median)",
        "interactive: claim / knee, median [p10, p90]", "interactive: at the claim >= 0.85",
        "relaxed: claim / knee, median [p10, p90]", "relaxed: at the claim >= 0.85", "searches with a tier pruned",
    ]  # fmt: skip
    parts, data = [], {}
    for server in SERVERS:
        curves = {tier: truth_curve(server, TWO_TIERS.tiers[tier], TRUTH_RATES) for tier in TIERS}
        knees = {tier: knee_of(curves[tier], TWO_TIERS.target, TRUTH_RATES) for tier in TIERS}
        at = {tier: (lambda rate, curve=curves[tier]: float(np.interp(rate, TRUTH_RATES, curve))) for tier in TIERS}
        rows, runs = [], {}
        for case, (share, prune) in CASES.items():
            incumbents = None if share is None else {tier: share * knees[tier] for tier in TIERS}
            for rule, make in RULES.items():
                searches = [one_search(server, make, seed, incumbents, prune) for seed in range(args.searches)]
                runs[f"{case} / {rule}"] = searches
                rows.append(summary(case, rule, searches, at, knees))
        parts += [
            f"### {server.name.capitalize()}",
            f"The knees on the long-run curves: interactive **{knees['interactive']:.2f} req/s**, relaxed "
            f"**{knees['relaxed']:.2f} req/s**.",
            _report.table(header, rows),
        ]
        data[server.name] = {"server": vars(server), "knees_req_s": knees, "runs": runs}
    after = _report.machine()
    markdown = "\n\n".join([
        "## Two tiers: each searched afresh, or a later one from the steps served (`bench_tier_search`)",
        f"{args.searches} two-tier capacity searches per case and rule on `tests/batching_server.py`, in the "
        "shapes of the section above, with its GPU step plan; the interactive tier as there (TTFT p95 <= "
        f"{INTERACTIVE['ttft_p95_ms']:g} ms, TPOT p95 <= {INTERACTIVE['tpot_p95_ms']:g} ms), the relaxed tier at "
        f"twice its bounds, both scored, target {TWO_TIERS.target:g}. The rules share seeds. *current: each tier "
        "afresh*: the tuner's rule, the relaxed tier's search starts at its incumbent (or the start rate) and "
        "reuses the steps the interactive tier served at a rate (a look's early pass and its confirmation both) "
        "only where it asks that rate; *tried: a later tier from the steps served*: before proposing, the "
        "relaxed tier's search judges every step served so far under its own SLO (`WarmTierPlan`, "
        "tests/benchmarks/_previous_rules.py). The incumbents are set from the "
        "server's own knees, as a share of them. *claim / knee*: each search's claim over the tier's knee, "
        "median and 10th and 90th percentiles over the searches. *at the claim >= 0.85*: the long-run curve at "
        "the claim no more than 5 points under the target (the goal of the section above). *steps served* "
        "counts both tiers' steps, confirmations included; *served s* their length.",
        *parts,
        "Every search's steps per tier are in `reports/capacity.json` under `tier_search`.",
        _report.contention(before, after),
    ])  # fmt: skip
    _report.write_section(NAME, markdown, {"stamp": run_stamp, **data}, MD_PATH, JSON_PATH)
    print(markdown)


if __name__ == "__main__":
    main()

"""Each tier's winner as its engine's own benchmark client measured it (``tuner search --verify``).

``--verify`` boots each tier's winner from its exported launch file and runs the engine's own client
at the claimed capacity and at a higher share of it (``tuner.search.verify_server``); the reports
are stored in the study's ``verify`` attribute, one per tier. Here they are read back, a line per
tier: at each rate the attainment the client's per-request results give, what was counted of what was sent,
and whether the goal held (at the claim, at most the report's ``goal_slack`` below the target;
above it, below the target). A tier whose check could not run shows why. The report module reads
what the search stored and never boots anything.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna

from tuner.report.capacity import is_capacity_study
from tuner.study.attrs import study_attrs_of
from tuner.study.figures import number

NOT_RUN = "No tier's winner was checked by its engine's own client (tuner search --verify)."


@dataclass(frozen=True)
class RateCheck:
    share: float
    rate_req_s: float
    attainment: float
    counted: int
    sent: int
    goal_met: bool


@dataclass(frozen=True)
class TierCheck:
    tier: str
    trial: int | None
    engine: str
    target: float | None
    claimed_req_s: float | None
    runs: tuple[RateCheck, ...]
    launch_file: str | None
    error: str | None

    @property
    def goal_met(self) -> bool:
        return self.error is None and bool(self.runs) and all(r.goal_met for r in self.runs)


def _run(run: Mapping[str, Any], tier: str) -> RateCheck | None:
    judged = (run.get("tiers") or {}).get(tier)
    if not isinstance(judged, Mapping):
        return None
    return RateCheck(
        share=float(run.get("share", 0.0)),
        rate_req_s=float(run.get("rate_req_s", 0.0)),
        attainment=float(judged.get("attainment", 0.0)),
        counted=int(judged.get("n_counted", 0)),
        sent=int(judged.get("n_requests", 0)),
        goal_met=bool((run.get("goal_met") or {}).get(tier)),
    )


def tier_check(tier: str, report: Mapping[str, Any]) -> TierCheck:
    """One tier's stored verify report as figures."""
    trial = report.get("trial")
    claim = (report.get("claims") or {}).get(tier) or {}
    runs = tuple(c for run in report.get("runs") or [] if (c := _run(run, tier)) is not None)
    return TierCheck(
        tier=tier,
        trial=int(trial) if isinstance(trial, int) else None,
        engine=" ".join(str(report[k]) for k in ("engine", "engine_version") if report.get(k)),
        target=float(claim["target"]) if isinstance(claim.get("target"), int | float) else None,
        claimed_req_s=float(claim["rate_req_s"]) if isinstance(claim.get("rate_req_s"), int | float) else None,
        runs=runs,
        launch_file=str(report["launch_file"]) if report.get("launch_file") else None,
        error=str(report["error"]) if report.get("error") else None,
    )


def tier_checks(study: optuna.Study) -> list[TierCheck]:
    stored = study_attrs_of(study).get("verify") or {}
    return [tier_check(tier, report) for tier, report in stored.items() if isinstance(report, Mapping)]


def _at(run: RateCheck) -> str:
    goal = "goal met" if run.goal_met else "goal missed"
    return f"{run.attainment:.1%} of {run.counted} counted ({run.sent} sent), {goal}"


def _line(check: TierCheck) -> str:
    who = f"trial {check.trial}" if check.trial is not None else "no trial"
    if check.error is not None:
        return f"{check.tier}: {who}: not checked: {check.error}"
    claimed = f" claimed {number(check.claimed_req_s)} req/s" if check.claimed_req_s is not None else ""
    target = f", target {check.target:.0%}" if check.target is not None else ""
    runs = "; ".join(f"at {r.share:g}x ({number(r.rate_req_s)} req/s) {_at(r)}" for r in check.runs)
    verdict = "the claim holds" if check.goal_met else "the claim does not hold"
    return f"{check.tier}: {who} ({check.engine}){claimed}{target}: {runs}: {verdict}."


def verified_section(study: optuna.Study) -> str:
    if not is_capacity_study(study):
        return ""
    checks = tier_checks(study)
    items = "".join(f"<li>{html.escape(_line(c))}</li>" for c in checks)
    body = f"<ul>{items}</ul>" if checks else f"<p>{html.escape(NOT_RUN)}</p>"
    files = "".join(f"<li><code>{html.escape(c.launch_file)}</code></li>" for c in checks if c.launch_file)
    booted = f"<p>booted from the exported launch files</p><ul>{files}</ul>" if files else ""
    return f'<section id="verified"><h2>Checked by the engine\'s own client</h2>{body}{booted}</section>'


def verified_md(study: optuna.Study) -> list[str]:
    """The same lines as Markdown, for ``summary.md``."""
    if not is_capacity_study(study):
        return []
    checks = tier_checks(study)
    return ["", "## Checked by the engine's own client", "", *([f"- {_line(c)}" for c in checks] or [NOT_RUN])]

"""The report's "Checked by the engine's own client": each tier's stored ``--verify`` report as figures."""

from __future__ import annotations

from pathlib import Path

import optuna

from tuner.report.html import summary_md, write_report
from tuner.report.verified import NOT_RUN, tier_checks, verified_md


def _run(share: float, rate: float, attainment: float, goal: bool) -> dict[str, object]:
    """One client run as `tier_report` stores it (tuner.search.verify_server)."""
    judged = {"attainment": attainment, "n_counted": 180, "n_requests": 200, "target": 0.9, "passed": attainment >= 0.9}
    return {"share": share, "claimed_rate_req_s": 6.34, "rate_req_s": rate, "tiers": {"interactive": judged},
            "goal_met": {"interactive": goal}, "notes": []}  # fmt: skip


def _stored(study: optuna.Study, over_attainment: float) -> None:
    study.set_user_attr("objective", "capacity-pareto")
    over_goal = over_attainment < 0.9
    study.set_user_attr("verify", {
        "interactive": {
            "study": study.study_name, "trial": 6, "launch_file": "/w/trial-6/s-trial6.sh", "engine": "sglang",
            "engine_version": "0.5.17", "url": "http://127.0.0.1:1", "workload": "rag", "goal_slack": 0.05,
            "claims": {"interactive": {"rate_req_s": 6.34, "slo": {"ttft_p95_ms": 300.0}, "target": 0.9}},
            "runs": [_run(1.0, 6.34, 0.87, True), _run(1.2, 7.61, over_attainment, over_goal)],
        },
        "relaxed": {"study": study.study_name, "trial": 6, "error": "the engine did not boot: exit 1"},
    })  # fmt: skip


def test_each_tiers_check_reads_its_rates_attainments_and_goal(tmp_path: Path) -> None:
    study = optuna.create_study(study_name="v", storage=f"sqlite:///{tmp_path / 'v.db'}")
    _stored(study, over_attainment=0.62)
    interactive, relaxed = tier_checks(study)
    assert (interactive.trial, interactive.engine, interactive.claimed_req_s) == (6, "sglang 0.5.17", 6.34)
    assert [(r.share, r.attainment, r.goal_met) for r in interactive.runs] == [(1.0, 0.87, True), (1.2, 0.62, True)]
    assert interactive.goal_met and not relaxed.goal_met and relaxed.error == "the engine did not boot: exit 1"
    lines = verified_md(study)
    assert lines[-2] == (
        "- interactive: trial 6 (sglang 0.5.17) claimed 6.34 req/s, target 90%: at 1x (6.34 req/s) 87.0% of 180 "
        "counted (200 sent), goal met; at 1.2x (7.61 req/s) 62.0% of 180 counted (200 sent), goal met: the claim holds."
    )
    assert lines[-1] == "- relaxed: trial 6: not checked: the engine did not boot: exit 1"
    # still within the target at 1.2x: the claim was too low, and the goal says so
    _stored(study, over_attainment=0.95)
    assert tier_checks(study)[0].goal_met is False
    assert verified_md(study)[-2].endswith("goal missed: the claim does not hold.")
    page = write_report(study, tmp_path / "reports").read_text()
    assert '<section id="verified">' in page and "<code>/w/trial-6/s-trial6.sh</code>" in page


def test_a_capacity_study_never_verified_says_so(tmp_path: Path) -> None:
    study = optuna.create_study(study_name="n", storage=f"sqlite:///{tmp_path / 'n.db'}")
    study.set_user_attr("objective", "capacity")
    assert tier_checks(study) == [] and NOT_RUN in summary_md(study)

"""``tuner search --verify`` picks each tier's best feasible trial; a tier with none says so. What it boots,
each winner's exported .sh, reads back as the command the trial measured, on the GPU studies' own files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from tests.unit.study_files import H100_STUDY, H200_STUDY
from tuner.errors import ConfigError, ExportError
from tuner.progress import Progress
from tuner.search import verify_server
from tuner.search.finalists import pick_finalists
from tuner.search.options import SearchOptions
from tuner.search.resolve import check_capacity_flags
from tuner.search.verify_server import exported_launch, tier_winners, verify_winners


def _trial(study: optuna.Study, interactive: float, relaxed: float, violation: float = 0.0) -> None:
    metrics = {"capacity_interactive_req_s": interactive, "capacity_relaxed_req_s": relaxed}
    attrs = {"config_kind": "sampled", "metrics": metrics, "constraint_violation": violation}
    study.add_trial(optuna.trial.create_trial(values=[interactive, relaxed], user_attrs=attrs))


def _study() -> optuna.Study:
    study = optuna.create_study(directions=["maximize", "maximize"])
    _trial(study, 2.0, 3.0)  # 0
    _trial(study, 9.0, 9.5, violation=1.0)  # 1: the highest, but infeasible
    _trial(study, 2.5, 2.9)  # 2: interactive's best
    _trial(study, 1.0, 3.0)  # 3: ties trial 0 on relaxed, later
    return study


def test_each_tier_gets_its_best_feasible_trial_earliest_on_a_tie() -> None:
    assert tier_winners(_study(), ["interactive", "relaxed"]) == {"interactive": 2, "relaxed": 0}


def test_a_tier_nobody_served_is_said_and_the_others_still_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    study = optuna.create_study(directions=["maximize", "maximize"])
    _trial(study, 1.5, 0.0)
    seen: list[tuple[int, list[str] | None]] = []

    def fake_verify(study: optuna.Study, number: int, opts: SearchOptions, tiers: list[str] | None, *rest: Any) -> dict:
        seen.append((number, tiers))
        raise ConfigError("the client exited 1")  # an error path: the real boot is tested end to end

    monkeypatch.setattr(verify_server, "verify_trial", fake_verify)
    reports = verify_winners(study, SearchOptions(workload="rag"), ["interactive", "relaxed"], Progress(), tmp_path)
    assert seen == [(0, ["interactive"])]
    assert reports == {
        "interactive": {"study": study.study_name, "trial": 0, "error": "the client exited 1"},
        "relaxed": {"error": "no feasible trial found a relaxed capacity above 0 req/s"},
    }
    assert study.user_attrs["verify"] == reports


def test_verify_needs_a_capacity_objective() -> None:
    with pytest.raises(ConfigError, match="--verify checks capacities"):
        check_capacity_flags(SearchOptions(workload="rag", objective="goodput", verify=True))


def _run(rate: float, tiers: list[str]) -> dict[str, Any]:
    return {"share": 1.0, "rate_req_s": rate, "tiers": {t: {"attainment": 0.95} for t in tiers},
            "goal_met": {t: True for t in tiers}}  # fmt: skip


def test_a_trial_that_won_both_tiers_boots_once_and_each_tier_gets_its_own_report(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    study = optuna.create_study(directions=["maximize", "maximize"])
    _trial(study, 2.0, 3.0)  # wins both tiers
    boots: list[tuple[int, list[str] | None]] = []

    def one_boot(study: optuna.Study, number: int, opts: SearchOptions, tiers: list[str] | None, *rest: Any) -> dict:
        boots.append((number, tiers))
        claims = {"interactive": {"rate_req_s": 2.0}, "relaxed": {"rate_req_s": 3.0}}
        runs = [_run(2.0, ["interactive"]), _run(2.4, ["interactive"]), _run(3.0, ["relaxed"]), _run(3.6, ["relaxed"])]
        return {"trial": number, "url": "http://x", "claims": claims, "runs": runs}

    monkeypatch.setattr(verify_server, "verify_trial", one_boot)
    monkeypatch.setattr(verify_server, "describe_report", lambda report: [])
    reports = verify_winners(study, SearchOptions(workload="rag"), ["interactive", "relaxed"], Progress(), tmp_path)
    assert boots == [(0, ["interactive", "relaxed"])]
    assert [r["rate_req_s"] for r in reports["interactive"]["runs"]] == [2.0, 2.4]
    assert [r["rate_req_s"] for r in reports["relaxed"]["runs"]] == [3.0, 3.6]
    for tier, report in reports.items():
        assert set(report["claims"]) == {tier}
        assert all(set(r["tiers"]) == set(r["goal_met"]) == {tier} for r in report["runs"])


def test_the_finalists_verdict_names_the_winner_where_there_is_one() -> None:
    """After the finalists, a tier's winner is the verdict's (its repeats' mean), not the best single
    trial; a verdict naming a trial no longer feasible falls back to the recorded capacities."""
    study = _study()
    by_metric = {"capacity_interactive_req_s": {"kind": "winner", "trials": [0]},  # trial 2 recorded more
                 "capacity_relaxed_req_s": {"kind": "tie", "trials": [1, 2]}}  # trial 1 is infeasible  # fmt: skip
    study.set_user_attr("verdict", {"kind": "winner", "metric": "capacity_interactive_req_s", "trials": [0],
                                    "by_metric": by_metric})  # fmt: skip
    assert tier_winners(study, ["interactive", "relaxed"]) == {"interactive": 0, "relaxed": 0}
    one_tier = _study()
    one_tier.set_user_attr("verdict", {"kind": "tie", "metric": "capacity_req_s", "trials": [3, 2]})
    assert tier_winners(one_tier, ["relaxed"]) == {"relaxed": 3}


def test_a_verify_cut_by_the_lease_resumes_with_the_tier_left(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each winner's reports are stored as its boot ends; a search resumed after its machine went away
    boots only the winners whose report is missing or an error."""
    study = _study()  # interactive: trial 2; relaxed: trial 0
    boots: list[int] = []

    def boot(limit: int | None) -> Any:
        def verify(study: optuna.Study, number: int, opts: SearchOptions, tiers: list[str] | None, *rest: Any) -> dict:
            if limit is not None and len(boots) == limit:
                raise KeyboardInterrupt  # the lease ended during this boot
            boots.append(number)
            assert tiers is not None
            claims = {t: {"rate_req_s": 1.0} for t in tiers}
            return {"trial": number, "url": "http://x", "claims": claims, "runs": [_run(1.0, tiers)]}

        return verify

    monkeypatch.setattr(verify_server, "describe_report", lambda report: [])
    monkeypatch.setattr(verify_server, "verify_trial", boot(1))
    with pytest.raises(KeyboardInterrupt):
        verify_winners(study, SearchOptions(workload="rag"), ["interactive", "relaxed"], Progress(), tmp_path)
    assert boots == [2] and set(study.user_attrs["verify"]) == {"interactive"}
    monkeypatch.setattr(verify_server, "verify_trial", boot(None))
    reports = verify_winners(study, SearchOptions(workload="rag"), ["interactive", "relaxed"], Progress(), tmp_path)
    assert boots == [2, 0], "only the relaxed tier's winner booted again"
    assert {t: r["trial"] for t, r in reports.items()} == {"interactive": 2, "relaxed": 0}
    study.set_user_attr("verify", {**reports, "relaxed": {"study": "s", "trial": 0, "error": "the client exited 1"}})
    verify_winners(study, SearchOptions(workload="rag"), ["interactive", "relaxed"], Progress(), tmp_path)
    assert boots == [2, 0, 0], "a stored error is tried again"


@pytest.mark.parametrize(("study_name", "path"), [("rag-h100-study-1", H100_STUDY), ("rag-h200-study-1", H200_STUDY)])
def test_each_gpu_finalist_exports_a_launch_file_that_reads_back_as_the_command_it_measured(
    study_name: str, path: Path, tmp_path: Path
) -> None:
    """What `tuner verify --study` boots for a GPU study's winner, checked on the real study files
    before a lease pays for it: SGLang's and vLLM's exported .sh for each finalist reads back as the
    launch its trial recorded (the H100 study's finalists are SGLang's trials 8 and 6, vLLM's 0)."""
    study = optuna.load_study(study_name=study_name, storage=f"sqlite:///{path}")
    finalists = pick_finalists(study, 1)
    engines = set()
    for trial in finalists:
        launch_file, module, args = exported_launch(study, trial, tmp_path)
        assert launch_file.parent == tmp_path and module == trial.user_attrs["launch"]["module"]
        assert args == [str(a) for a in trial.user_attrs["launch"]["args"]]
        engines.add(trial.user_attrs["engine"])
    assert engines == {"vllm", "sglang"}


def test_a_launch_file_that_reads_back_as_another_command_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    study = optuna.load_study(study_name="rag-h100-study-1", storage=f"sqlite:///{H100_STUDY}")
    monkeypatch.setattr(
        verify_server, "read_launch_file", lambda path: ("sglang.launch_server", ["--model-path", "x"], None)
    )
    with pytest.raises(ExportError, match="trial 8: its exported .sh reads back as sglang.launch_server"):
        exported_launch(study, study.trials[8], tmp_path)

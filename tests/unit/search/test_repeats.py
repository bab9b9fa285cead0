"""Finalist repeats: log-scale Student-t intervals, the winner-or-tie verdict, and who gets repeated."""

from __future__ import annotations

import html
import math
import statistics

import optuna
import pytest

from tests.storage.test_storage import _result
from tuner.deploy.provenance import _repeat_lines
from tuner.report.describe import mean_interval
from tuner.report.trials_table import trials_table
from tuner.search.finalists import pick_finalists
from tuner.search.objective import record
from tuner.search.scoring import DIRECTIONS
from tuner.study.attrs import enqueue_defaults
from tuner.study.verdict import TOO_FEW_RUNS, describe_verdict, interval, judge, repeat_interval, reread


def test_interval_is_the_student_t_interval_on_the_log_scale() -> None:
    samples = [10.0, 12.0, 11.0]
    out = interval(samples)
    logs = [math.log(x) for x in samples]
    half = 4.303 * statistics.stdev(logs) / 3**0.5
    assert out["mean"] == pytest.approx(11.0) and out["n"] == 3 and out["method"] == "t on the log scale"
    assert out["low"] == pytest.approx(math.exp(statistics.fmean(logs) - half))
    assert out["high"] == pytest.approx(math.exp(statistics.fmean(logs) + half))
    assert out["cv"] == pytest.approx(statistics.stdev(samples) / 11.0)


def test_skewed_positive_runs_never_give_a_negative_bound() -> None:
    runs = [3.0, 4.0, 90.0]  # one slow run: the plain t-interval would reach -88
    out = interval(runs)
    assert 0 < out["low"] < min(runs) and out["high"] > max(runs)
    assert out["high"] - out["mean"] > out["mean"] - out["low"], "longer above than below, as skewed data are"
    zero = interval([0.0, 2.0, 4.0])  # a run with no goodput has no log: the t-interval, clipped at 0
    assert zero["low"] == 0.0 and zero["high"] > 4.0 and zero["method"] == "t, clipped at 0"
    assert interval([0.0, 0.0, 0.0]) | {"cv": 0.0} == {"n": 3, "mean": 0.0, "low": 0.0, "high": 0.0, "cv": 0.0,
                                                       "method": "t, clipped at 0"}  # fmt: skip


@pytest.mark.parametrize("runs", [[5.0], [5.0, 7.0]])
def test_fewer_than_three_runs_give_no_interval_but_say_so(runs: list[float]) -> None:
    out = interval(runs)
    assert out["low"] is None and out["high"] is None and out["method"] == TOO_FEW_RUNS
    assert out["n"] == len(runs) and out["mean"] == pytest.approx(statistics.fmean(runs))
    assert mean_interval(out) == f"{out['mean']:.3g} (too few runs for an interval)"


def _finalist(trial: int, mean: float, half: float, failures: list[str] | None = None, n: int = 3) -> dict[str, object]:
    low, high = (mean - half, mean + half) if n >= 3 else (None, None)
    stats = {"output_throughput_tok_s": {"n": n, "mean": mean, "low": low, "high": high, "cv": 0.1}}
    return {"trial": trial, "config_kind": "sampled", "failures": failures or [], "stats": stats}


def _repeat(claims: dict[str, float], tops: dict[str, float | None], objective_tier: str = "interactive") -> dict:
    """A stored capacity repeat (``tuner.search.finalists._stored``) with each tier's bracket."""
    tiers = {t: {"capacity_req_s": c, "bracket_req_s": [c, tops[t]]} for t, c in claims.items()}
    metrics = {f"capacity_{t}_req_s": c for t, c in claims.items()} | {"capacity_req_s": claims[objective_tier]}
    return {"failure": None, "metrics": metrics, "capacity": {"objective_tier": objective_tier, "tiers": tiers}}


def test_repeats_on_one_rung_give_the_rung_not_a_point() -> None:
    """SGLang's defaults on the H100 read 6.65 [6.65, 6.98) three times under the relaxed tier
    (reports/gpu-h100/study-1/block16/NOTES.md): the claims have no spread, but the capacity of each
    run lies anywhere in its bracket, so the interval reaches the bracket's top."""
    same = [_repeat({"relaxed": 6.65}, {"relaxed": 6.98}, "relaxed")] * 3
    assert interval([6.65] * 3)["high"] == pytest.approx(6.65), "the claims alone: a point"
    out = repeat_interval(same, "capacity_relaxed_req_s")
    assert out is not None and (out["mean"], out["low"], out["high"]) == pytest.approx((6.65, 6.65, 6.98))
    assert repeat_interval(same, "capacity_req_s") == out, "capacity_req_s is the objective tier's"
    assert mean_interval(out) == "6.65 [6.65, 6.98]", "three figures, as the runs are shown"


def test_a_capacity_interval_keeps_its_low_and_rises_by_the_brackets_mean_width() -> None:
    claims, tops = (6.65, 6.34, 6.98), (6.98, 6.65, 7.61)
    runs = [_repeat({"interactive": c}, {"interactive": t}) for c, t in zip(claims, tops, strict=True)]
    plain = interval(list(claims))
    out = repeat_interval(runs, "capacity_interactive_req_s")
    reach = math.exp(statistics.fmean(math.log(t / c) for c, t in zip(claims, tops, strict=True)))
    assert out is not None and out["mean"] == plain["mean"] and out["low"] == plain["low"]
    assert out["high"] == pytest.approx(plain["high"] * reach) and "brackets" in out["method"]
    zero = [_repeat({"interactive": c}, {"interactive": t}) for c, t in ((0.0, 4.76), (5.0, 5.5), (5.0, 5.5))]
    clipped = repeat_interval(zero, "capacity_interactive_req_s")  # a pruned repeat: no log, widths add
    assert clipped is not None and clipped["high"] == pytest.approx(interval([0.0, 5.0, 5.0])["high"] + 1.92)
    untold = [{**r, "capacity": None} for r in runs[:2]] + [_repeat({"interactive": 6.98}, {"interactive": None})]
    assert repeat_interval(untold, "capacity_interactive_req_s") == plain, "no bracket kept or no top: no rise"
    other = [{**r, "metrics": {**r["metrics"], "ttft_p95_ms": 250.0 + i}} for i, r in enumerate(runs)]
    assert repeat_interval(other, "ttft_p95_ms") == interval([250.0, 251.0, 252.0]), "only capacities rise"
    assert repeat_interval([{**r, "failure": "oom"} for r in runs], "capacity_interactive_req_s") is None


def test_a_winner_needs_its_interval_above_the_runner_ups_brackets() -> None:
    """Two finalists each on one rung, a rung apart: the claims alone give two points and a winner.
    A bracket's top is the lowest rate above the claim that did not pass, undecided ones included, so
    the runner-up's capacity may reach the winner's rung: a tie."""
    from tuner.search.finalists import _summary

    def summary(number: int, claim: float, top: float) -> dict:
        trial = optuna.trial.create_trial(value=claim, user_attrs={"config_kind": "sampled"})
        trial.number = number
        run = _repeat({"interactive": claim}, {"interactive": top})
        return _summary(trial, [{**run, "ttft_samples_ms": [100.0]}] * 3)

    finalists = [summary(1, 6.98, 7.32), summary(2, 6.65, 6.98)]
    assert judge(finalists, "capacity_interactive_req_s") == {
        "kind": "tie", "metric": "capacity_interactive_req_s", "trials": [1, 2]}  # fmt: skip
    apart = [summary(1, 7.61, 7.99), summary(2, 6.65, 6.98)]
    assert judge(apart, "capacity_interactive_req_s")["kind"] == "winner", "two rungs apart: a winner"


def test_a_verdict_stored_on_the_claims_alone_is_read_again_beside_it() -> None:
    """A GPU study's finalists run at its tag, whose intervals were the claims' alone: the report keeps
    the stored verdict and reads the stored repeats again with this version's intervals, where they
    differ; a study whose finalists ran on this version has nothing to read again."""
    from tuner.report.html import best_vs_default_section, finalists_md
    from tuner.report.trials_table import reread_lines
    from tuner.search.finalists import _summary
    from tuner.study.verdict import verdict_of

    key = "capacity_interactive_req_s"
    runs = {"1": [_repeat({"interactive": 6.98}, {"interactive": 7.32})] * 3,
            "2": [_repeat({"interactive": 6.65}, {"interactive": 6.98})] * 3}  # fmt: skip
    for stored in runs.values():
        for r in stored:
            r.update(ttft_samples_ms=[100.0])
            r["metrics"]["ttft_p95_ms"] = 250.0  # kept, and not what the verdict reads: not read again
    claims_only = [{"trial": int(n), "config_kind": "sampled", "failures": [],
                    "stats": {m: interval([r["metrics"][m] for r in rs]) for m in (key, "ttft_p95_ms")}}
                   for n, rs in runs.items()]  # fmt: skip
    old = verdict_of(claims_only, [key], [])
    assert old["kind"] == "winner" and old["trials"] == [1], "two points a rung apart: a winner on the claims"
    study = optuna.create_study()
    for name, value in (("finalist_runs", runs), ("finalists", claims_only), ("verdict", old)):
        study.set_user_attr(name, value)
    again = reread(study.user_attrs)
    assert again is not None and again["verdict"] | {"stress_failed": []} == {
        "kind": "tie", "metric": key, "trials": [1, 2], "stress_failed": []}  # fmt: skip
    assert [f["stats"][key]["high"] for f in again["finalists"]] == pytest.approx([7.32, 6.98])
    lines = reread_lines(study)
    tie = f"{key}: verdict: tie on {key} between trials 1, 2 (their 95 % intervals overlap)"
    assert lines[1:] == [f"trial 1: {key} 6.98 [6.98, 7.32]", f"trial 2: {key} 6.65 [6.65, 6.98]", tie]
    assert f"- {key}: verdict: trial 1 wins on {key}" in "\n".join(finalists_md(study)), "the stored verdict stays"
    assert lines[0] in finalists_md(study) and f"- {lines[-1]}" in finalists_md(study)
    assert f"{lines[0]}\n{lines[1]}" in trials_table(study), "tuner trials reads them again too"
    section = best_vs_default_section(study)
    assert "trial 1 wins" in section and section.endswith(f"<li>{html.escape(tie)}</li></ul></section>")
    trials = {}
    for n, rs in runs.items():
        trial = optuna.trial.create_trial(value=0.0, user_attrs={"config_kind": "sampled"})
        trial.number = int(n)
        trials[n] = _summary(trial, rs)
    study.set_user_attr("finalists", list(trials.values()))
    study.set_user_attr("verdict", verdict_of(list(trials.values()), [key], []))
    assert reread(study.user_attrs) is None and reread_lines(study) == [], "judged on this version: the same"


def test_a_winner_only_when_the_intervals_separate() -> None:
    key = "output_throughput_tok_s"
    assert judge([_finalist(1, 50, 2), _finalist(2, 40, 2)], key) == {"kind": "winner", "metric": key, "trials": [1]}
    assert judge([_finalist(1, 50, 6), _finalist(2, 42, 6)], key)["kind"] == "tie"
    assert judge([_finalist(1, 50, 6), _finalist(2, 42, 6)], key)["trials"] == [1, 2]
    # a finalist that failed a repeat cannot win, however fast its other runs were
    assert judge([_finalist(1, 90, 1, ["oom_load"]), _finalist(2, 40, 2)], key)["trials"] == [2]
    assert judge([], key)["kind"] == "none"


def test_too_few_runs_give_a_tie_that_says_so_however_far_apart() -> None:
    key = "output_throughput_tok_s"
    verdict = judge([_finalist(1, 90, 1, n=2), _finalist(2, 40, 1, n=2)], key)
    assert verdict == {"kind": "tie", "metric": key, "trials": [1, 2], "reason": TOO_FEW_RUNS}
    assert describe_verdict(verdict) == f"verdict: tie on {key} between trials 1, 2 (too few runs for an interval)"
    assert judge([_finalist(1, 90, 1), _finalist(2, 40, 1, n=1)], key)["kind"] == "tie"  # one side short is enough
    overlap = judge([_finalist(1, 50, 6), _finalist(2, 42, 6)], key)
    assert "reason" not in overlap and describe_verdict(overlap).endswith("(their 95 % intervals overlap)")


def test_too_few_runs_read_as_such_in_the_trials_table_and_the_launch_files() -> None:
    short = interval([50.0, 52.0])
    study = optuna.create_study(directions=DIRECTIONS)
    study.add_trial(optuna.trial.create_trial(values=[100.0, 51.0], user_attrs={"config_kind": "sampled"}))
    study.set_user_attr("finalists", [{"trial": 0, "config_kind": "sampled", "failures": [],
                                       "stats": {"output_throughput_tok_s": short}}])  # fmt: skip
    assert "51 (too few runs for an interval) n=2" in trials_table(study)
    lines = _repeat_lines({"repeats": {"stats": {"output_throughput_tok_s": short}}})
    assert lines == ["# repeats output_throughput_tok_s: mean 51, too few runs for an interval, n=2"]


def test_a_launch_file_says_the_verdict_of_every_tier_with_figures_as_the_report_writes_them() -> None:
    """A capacity-pareto study's verdict is one per tier (``by_metric``); the launch file said the
    first tier's alone, so a relaxed tier's winner read as if only the interactive verdict existed,
    and its repeats' capacities to one decimal (6.65 and 6.98 req/s, a rung apart, as 6.7 and 7.0)."""
    stats = {"capacity_relaxed_req_s": {"n": 3, "mean": 6.65, "low": 6.65, "high": 6.98}}
    verdict = {"kind": "winner", "metric": "capacity_interactive_req_s", "trials": [8],
               "by_metric": {"capacity_interactive_req_s": {"kind": "winner", "metric": "capacity_interactive_req_s",
                                                             "trials": [8]},
                             "capacity_relaxed_req_s": {"kind": "tie", "metric": "capacity_relaxed_req_s",
                                                        "trials": [0, 6]}},
               "stress_failed": []}  # fmt: skip
    lines = _repeat_lines({"repeats": {"stats": stats}, "verdict": verdict})
    assert lines[0] == "# repeats capacity_relaxed_req_s: mean 6.65, 95% CI [6.65, 6.98], n=3"
    assert lines[1] == (
        "# verdict: trial 8 wins on capacity_interactive_req_s (its 95 % interval clears the runner-up's); "
        "tie on capacity_relaxed_req_s between trials 0, 6 (their 95 % intervals overlap)"
    )


def test_finalists_are_the_best_feasible_plus_the_engine_default() -> None:
    study = optuna.create_study(directions=DIRECTIONS)
    enqueue_defaults(study, ["vllm"])
    for ttft, throughput, failure in [
        (100.0, 10.0, None),
        (90.0, 30.0, None),
        (120.0, 60.0, None),
        (1.0, 99.0, "oom_boot"),
    ]:
        trial = study.ask()
        trial.suggest_categorical("engine", ["vllm"])
        if trial.user_attrs.get("config_kind") is None:
            trial.set_user_attr("config_kind", "sampled")
        study.tell(trial, record(trial, _result(ttft, throughput, failure), "pareto"))
    chosen = [t.number for t in pick_finalists(study, 1)]
    assert chosen == [2, 0], "the best throughput on the front, then the default as the reference"
    assert [t.number for t in pick_finalists(study, 5)] == [2, 1, 0]

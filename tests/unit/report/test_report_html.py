"""``tuner report``: one self-contained HTML file with Plotly plots, capacity curves for capacity studies."""

from __future__ import annotations

import html
import re
from pathlib import Path

import optuna
import pytest
from plotly.offline import get_plotlyjs

from tuner.report.capacity import curve, curve_trials, tiers
from tuner.report.html import write_report


def _page(study: optuna.Study, tmp_path: Path) -> tuple[str, str]:
    """The page, and the page without the plotly.js bundle (whose own text is not ours to check) with the
    figures' JSON escapes (``\\u003c`` for ``<``) undone."""
    page = write_report(study, tmp_path / "reports").read_text()
    bundle = get_plotlyjs()
    assert page.count(bundle) == 1, "plotly.js inlined exactly once"
    ours = re.sub(r"\\u([0-9a-f]{4})", lambda m: chr(int(m.group(1), 16)), page.replace(bundle, ""))
    return page, ours


def _section(page: str, section: str) -> str:
    found = re.search(rf'<section id="{section}">(.*?)</section>', page, re.S)
    assert found, section
    return found.group(1)


def test_a_capacity_report_is_one_file_with_each_tiers_curves(capacity_study: optuna.Study, tmp_path: Path) -> None:
    page, ours = _page(capacity_study, tmp_path)
    assert not re.search(r"<script[^>]*\bsrc=", page), "no script loaded from anywhere: the page needs no network"
    assert not re.search(r"<link[^>]*\bhref=", page)
    for div in ("capacity-plot-0", "capacity-plot-1"):  # one figure per tier, the objective's first
        assert f'id="{div}"' in ours and re.search(rf'Plotly.newPlot\(\s*"{div}"', ours), div
    assert ours.index("Tier interactive") < ours.index("Tier relaxed")
    for name in ("trial 2 (vllm)", "trial 0 (vllm default)", "trial 3 (sglang)", "trial 1 (sglang default)"):
        assert f'"name":"{name}"' in ours, name
    for line in ("target 90%", "TTFT p95 bound 200 ms", "TPOT p95 bound 6 ms", "TTFT p95 bound 1000 ms"):
        assert f'"name":"{line}"' in ours, line
    assert '"name":"capacity of trial 2 (vllm)"' in ours
    assert "request rate (req/s)" in ours and "TTFT p95 (ms)" in ours and "TPOT p95 (ms)" in ours
    assert "vllm.memory_fraction=0.3<br>" in ours, "hover shows the trial's parameters"


def test_the_report_has_no_dict_repr_no_float_noise_and_no_trial_port(
    capacity_study: optuna.Study, tmp_path: Path
) -> None:
    page, ours = _page(capacity_study, tmp_path)
    assert "engines vllm 0.32.0, sglang 0.5.23" in ours
    assert "{'" not in ours and "&#x27;version&#x27;" not in ours
    assert "0.30000000000000004" not in page and "0.7000000000000001" not in page
    launch = _section(ours, "launch")
    assert "no winner: the verdict is a tie between trials 2 and 3" in launch
    assert (
        "/opt/engine/bin/python -m vllm.entrypoints.openai.api_server --model /models/m --gpu-memory-utilization 0.3"
        in launch
    )
    assert "sglang.launch_server --model-path /models/m --mem-fraction-static 0.7" in launch  # an older trial's argv
    assert "--port" not in launch and "--host" not in launch and "4100" not in launch, "no trial's random port"
    summary = (tmp_path / "reports" / "cap" / "summary.md").read_text()
    assert "tie between trials 2 and 3" in summary and "4100" not in summary


def test_the_capacity_table_lists_each_tiers_capacity(capacity_study: optuna.Study, tmp_path: Path) -> None:
    _, ours = _page(capacity_study, tmp_path)
    table = _section(ours, "capacity-table")
    assert "<th>interactive (req/s)</th><th>relaxed (req/s)</th>" in table
    assert "<td>2</td><td>vllm</td><td>complete</td><td>4</td><td>6</td>" in table
    assert "<td>4</td><td>vllm</td><td>oom_boot</td><td>-</td><td>-</td>" in table  # failed: no capacity, no crash
    assert "vllm.memory_fraction=0.3 " in table


def test_curves_are_sorted_by_rate_and_pair_each_finalist_with_its_default(capacity_study: optuna.Study) -> None:
    assert [t.name for t in tiers(capacity_study)] == ["interactive", "relaxed"]
    chosen = curve_trials(capacity_study)
    assert [t.number for t in chosen] == [2, 0, 3, 1]
    drawn = curve(chosen[0], "interactive")
    assert drawn is not None and drawn.capacity_req_s == 4.0
    rates = [s.rate_req_s for s in drawn.steps]
    assert rates == sorted(rates) == [2.0, 4.0, 6.0, 8.0]
    assert [s.passed for s in drawn.steps] == [True, True, False, False]


def test_a_capacity_study_with_no_finalists_or_partial_attributes_still_reports(
    capacity_study: optuna.Study, tmp_path: Path
) -> None:
    capacity_study.set_user_attr("finalists", "garbage")
    capacity_study.set_user_attr("verdict", None)
    assert [t.number for t in curve_trials(capacity_study)] == [2, 0]  # the highest capacity, beside its default
    _, ours = _page(capacity_study, tmp_path)
    assert "no finalist repeats ran: trial 2 is the best feasible trial" in _section(ours, "launch")
    assert "no finalist repeats ran" in _section(ours, "best-vs-default")
    bare = optuna.create_study(study_name="bare", storage=capacity_study._storage, direction="maximize")
    bare.set_user_attr("objective", "capacity")
    bare.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs={"capacity": 3}))
    _, ours = _page(bare, tmp_path)
    assert "no trial recorded a capacity" in _section(ours, "capacity")


def test_a_pareto_report_keeps_its_plots_drawn_with_plotly(pareto_study: optuna.Study, tmp_path: Path) -> None:
    page, ours = _page(pareto_study, tmp_path)
    for section in ("pareto", "ttft-cdf", "importance", "best-vs-default", "failure-map", "acceptance", "launch"):
        _section(ours, section)
    assert 'id="pareto-plot"' in ours and 'id="ttft-cdf-plot"' in ours and 'id="capacity"' not in ours
    assert "TTFT p95 (ms)" in ours and "output throughput (tok/s)" in ours
    assert "0.30000000000000004" not in page and "vllm.memory_fraction=0.3<br>" in ours
    launch = _section(ours, "launch")
    assert "no winner: the verdict is a tie between trials 1 and 0" in launch and "4200" not in launch
    pareto_study.set_user_attr("verdict", {"kind": "winner", "metric": "output_throughput_tok_s", "trials": [1]})
    _, ours = _page(pareto_study, tmp_path)
    launch = _section(ours, "launch")
    assert "trial 1 wins the verdict" in launch and launch.count("<pre>") == 1 and "4200" not in launch


def test_the_engines_side_by_side_per_tier_from_the_numbers(capacity_study: optuna.Study) -> None:
    """Each engine's best feasible capacity per tier beside its defaults, and who carried more."""
    from tuner.report.engines import engines_md, engines_section, per_engine

    rows = {r.engine: r for r in per_engine(capacity_study, "interactive")}
    assert rows["vllm"].best is not None and rows["vllm"].best.number == 2  # 4.0 req/s; the OOM one is out
    assert rows["sglang"].best is not None and rows["sglang"].best.number == 3  # 3.5 beats its defaults' 1.5
    assert rows["vllm"].default is not None and rows["vllm"].default.number == 0
    section = engines_section(capacity_study, price=2.0)
    assert "vllm carried 4 req/s, sglang 3.5: vllm 1.14x on this workload." in section
    assert section.count("<h3>Tier ") == 2 and "per million output tokens" in section
    relaxed = engines_md(capacity_study)
    assert "vllm carried 6 req/s, sglang 5: vllm 1.20x on this workload." in relaxed
    priced = [line for line in engines_md(capacity_study, price=2.0) if line.startswith("| vllm |")]
    assert len(priced) == 2 and all("per million output tokens at $2/GPU-hour" in line for line in priced)
    assert not any("per million" in line for line in relaxed), "no price, no dollars: tokens/s per GPU only"


def test_one_engine_has_nothing_to_compare(capacity_study: optuna.Study, tmp_path: Path) -> None:
    from tuner.report.engines import comparison, per_engine

    only = optuna.create_study(study_name="one", storage=f"sqlite:///{tmp_path / 'one.db'}", direction="maximize")
    for t in capacity_study.get_trials():
        if t.user_attrs.get("engine") == "vllm":
            only.add_trial(t)
    assert comparison(per_engine(only, "interactive"), "interactive") == (
        "Only one engine was booted in this study: nothing to compare."
    )


def _two_engines(source: optuna.Study, path: Path, sglang_top: float) -> optuna.Study:
    """vLLM's defaults (2.0 req/s interactive, up to 2.4) and SGLang's (1.5, up to ``sglang_top``),
    and one config enqueued, waiting for its boot."""
    study = optuna.create_study(study_name="two", storage=f"sqlite:///{path}", direction="maximize")
    for t, top in zip(source.get_trials()[:2], (2.4, sglang_top), strict=True):
        attrs = dict(t.user_attrs)
        tiers_ = attrs["capacity"]["tiers"]
        tier = {**tiers_["interactive"], "bracket_req_s": [tiers_["interactive"]["capacity_req_s"], top]}
        attrs["capacity"] = {**attrs["capacity"], "tiers": {**tiers_, "interactive": tier}}
        study.add_trial(optuna.trial.create_trial(params=t.params, distributions=t.distributions, values=t.values,
                                                  user_attrs=attrs))  # fmt: skip
    study.enqueue_trial({"engine": "sglang"})
    return study


def test_engines_within_one_bracket_are_not_ranked_and_a_waiting_trial_names_no_engine(
    capacity_study: optuna.Study, tmp_path: Path
) -> None:
    """Study 1's block 1 on the H200: both engines claimed 7.54 req/s under the relaxed tier, one
    bracket each, and the report called one of them 1.00x the other; its enqueued configs still
    waiting showed as an engine named "?" that carried 0."""
    from tuner.report.engines import comparison, engines_md, per_engine

    apart = _two_engines(capacity_study, tmp_path / "apart.db", sglang_top=1.8)
    rows = per_engine(apart, "interactive")
    assert [r.engine for r in rows] == ["sglang", "vllm"], "the waiting trial names no engine"
    assert comparison(rows, "interactive") == "vllm carried 2 req/s, sglang 1.5: vllm 1.33x on this workload."
    assert not any(line.startswith("| ?") for line in engines_md(apart))
    close = _two_engines(capacity_study, tmp_path / "close.db", sglang_top=2.2)
    assert comparison(per_engine(close, "interactive"), "interactive") == (
        "vllm carried 2 req/s and sglang 1.5 (its bracket runs to 2.2): one drive each cannot tell them apart; "
        "repeats decide."
    )


def test_with_repeats_of_both_engines_the_comparison_reads_their_means_and_intervals(
    capacity_study: optuna.Study,
) -> None:
    """Once the finalists ran, each engine's best has fresh-boot repeats: the sentence compares their
    means, and says the repeats cannot tell the engines apart where the 95 % intervals overlap."""
    from tuner.report.engines import comparison, engines_md, per_engine

    def stats(mean: float, low: float, high: float) -> dict[str, object]:
        return {"stats": {"capacity_interactive_req_s": {"mean": mean, "low": low, "high": high, "n": 3}}}

    capacity_study.set_user_attr("finalists", [{"trial": 2, **stats(4.1, 3.9, 4.3)},
                                               {"trial": 3, **stats(3.4, 3.2, 3.6)}])  # fmt: skip
    rows = per_engine(capacity_study, "interactive")
    assert comparison(rows, "interactive") == (
        "vllm carried 4.1 [3.9, 4.3] req/s and sglang 3.4 [3.2, 3.6] over fresh-boot repeats: vllm 1.21x on this "
        "workload."
    )
    vllm = [line for line in engines_md(capacity_study) if line.startswith("| vllm | 2 | 4; repeats 4.1 [3.9, 4.3] | ")]
    assert len(vllm) == 1 and vllm[0].endswith(" tok/s per GPU | 2 |")  # the cost at it, then its defaults
    capacity_study.set_user_attr("finalists", [{"trial": 2, **stats(4.1, 3.5, 4.7)},
                                               {"trial": 3, **stats(3.6, 3.2, 4.0)}])  # fmt: skip
    assert comparison(per_engine(capacity_study, "interactive"), "interactive") == (
        "vllm carried 4.1 [3.5, 4.7] req/s and sglang 3.6 [3.2, 4] over fresh-boot repeats: their 95 % intervals "
        "overlap, so the repeats cannot tell them apart."
    )
    capacity_study.set_user_attr("finalists", [{"trial": 2, **stats(4.1, 3.5, 4.7)}])  # sglang's best not repeated
    assert "1.14x" in comparison(per_engine(capacity_study, "interactive"), "interactive")  # one trial each, as before


def test_an_engine_whose_only_trial_failed_is_not_measured_and_not_said_to_carry_nothing(
    capacity_study: optuna.Study, tmp_path: Path
) -> None:
    """The H100 study after its block 3: SGLang's defaults were cut by a lease's end (FAIL, no
    capacity) and queued again, and the report read "sglang | - | 0" and "Only vllm carried load under
    this tier's SLO", as if SGLang had been measured and carried nothing."""
    from tuner.report.engines import comparison, engines_md, per_engine

    study = optuna.create_study(study_name="cut", storage=f"sqlite:///{tmp_path / 'cut.db'}", direction="maximize")
    vllm_default = capacity_study.get_trials()[0]
    study.add_trial(vllm_default)
    cut = optuna.trial.create_trial(
        params={"engine": "sglang"}, distributions=vllm_default.distributions, state=optuna.trial.TrialState.FAIL,
        user_attrs={"engine": "sglang", "config_kind": "engine_default", "booted": True},
    )  # fmt: skip
    study.add_trial(cut)
    study.enqueue_trial({"engine": "sglang"})
    rows = {r.engine: r for r in per_engine(study, "interactive")}
    assert not rows["sglang"].measured and rows["sglang"].failed == 1 and rows["vllm"].measured
    assert comparison(list(rows.values()), "interactive") == (
        "vllm carried 2 req/s. No trial of sglang (1 failed) recorded a capacity here, so it is not compared."
    )
    assert "| sglang | - | not measured | - | failed |" in engines_md(study)
    # measured at last, then re-run and cut again: the comparison is the two engines' again, and
    # the latest default that recorded a capacity stands for SGLang's defaults
    sglang_attrs = dict(capacity_study.get_trials()[1].user_attrs)
    again = optuna.trial.create_trial(
        params={"engine": "sglang"}, distributions=vllm_default.distributions, values=[1.5], user_attrs=sglang_attrs
    )
    study.add_trial(again)
    study.add_trial(cut)
    measured = [t.number for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE]
    rows = {r.engine: r for r in per_engine(study, "interactive")}
    assert rows["sglang"].default is not None and rows["sglang"].default.number == measured[-1]
    assert rows["sglang"].measured and rows["sglang"].failed == 2
    assert comparison(list(rows.values()), "interactive") == (
        "vllm carried 2 req/s, sglang 1.5: vllm 1.33x on this workload."
    )
    assert f"| sglang | {measured[-1]} | 1.5 | 180 tok/s per GPU | 1.5 |" in engines_md(study)


def test_an_engine_whose_only_trial_ran_out_of_memory_is_counted_failed_not_measured(
    capacity_study: optuna.Study, tmp_path: Path
) -> None:
    """A trial that booted and ran out of memory ends COMPLETE, infeasible, with no capacity: its
    engine was not measured either, and the sentence counts that trial as failed."""
    from tuner.report.engines import comparison, per_engine

    study = optuna.create_study(study_name="oom", storage=f"sqlite:///{tmp_path / 'oom.db'}", direction="maximize")
    vllm_default, oom = capacity_study.get_trials()[0], capacity_study.get_trials()[4]
    assert oom.user_attrs["failure"] == "oom_boot"
    study.add_trial(vllm_default)
    attrs = {**oom.user_attrs, "engine": "sglang"}
    study.add_trial(optuna.trial.create_trial(params={"engine": "sglang"}, distributions=vllm_default.distributions,
                                              values=[0.0], user_attrs=attrs))  # fmt: skip
    rows = per_engine(study, "interactive")
    assert comparison(rows, "interactive") == (
        "vllm carried 2 req/s. No trial of sglang (1 failed) recorded a capacity here, so it is not compared."
    )


def test_each_engines_best_is_read_against_its_own_defaults(capacity_study: optuna.Study) -> None:
    """The user's first question, per engine and tier: did tuning carry more than the defaults? From
    one drive each until the finalists' repeats, then from the repeats' means and intervals."""
    from tuner.report.engines import beside_defaults, engines_md, engines_section, per_engine

    one_drive = "req/s: {}x in one drive each; the finalists' repeats decide."
    repeated = "req/s over fresh-boot repeats{}"
    cases = [  # the finalists' repeats (trial: mean, low, high), then what vLLM's and SGLang's sentences say
        ({}, ("4 and 2 " + one_drive.format("2.00"), "3.5 and 1.5 " + one_drive.format("2.33"))),
        # a tuned best whose repeats fell wholly below its defaults': apart, the other way round
        ({2: (1.9, 1.7, 2.1), 0: (2.6, 2.4, 2.8), 3: (3.4, 3.0, 3.8), 1: (3.0, 2.6, 3.4)},
         ("1.9 [1.7, 2.1] and 2.6 [2.4, 2.8] " + repeated.format(": 0.73x, their 95 % intervals apart: its "
                                                                 "defaults carried more."),
          "3.4 [3, 3.8] and 3 [2.6, 3.4] " + repeated.format(", 1.13x: their 95 % intervals overlap, so the repeats "
                                                             "cannot tell them apart."))),
        ({2: (4.1, 3.9, 4.3), 0: (2.2, 2.0, 2.4), 3: (3.4, 3.0, 3.8), 1: (3.0, 2.6, 3.4)},
         ("4.1 [3.9, 4.3] and 2.2 [2, 2.4] " + repeated.format(": 1.86x, their 95 % intervals apart."),
          "3.4 [3, 3.8] and 3 [2.6, 3.4] " + repeated.format(", 1.13x: their 95 % intervals overlap, so the repeats "
                                                             "cannot tell them apart."))),
    ]  # fmt: skip
    for repeats, (vllm, sglang) in cases:
        capacity_study.set_user_attr("finalists", [
            {"trial": n, "stats": {"capacity_interactive_req_s": {"mean": m, "low": lo, "high": hi, "n": 3}}}
            for n, (m, lo, hi) in repeats.items()
        ])  # fmt: skip
        said = {r.engine: beside_defaults(r, "interactive") for r in per_engine(capacity_study, "interactive")}
        assert said == {"vllm": f"vllm: trial 2 against its defaults (trial 0) carried {vllm}",
                        "sglang": f"sglang: trial 3 against its defaults (trial 1) carried {sglang}"}  # fmt: skip
        assert html.escape(said["sglang"] or "") in engines_section(capacity_study)
    vllm = [line for line in engines_md(capacity_study) if line.startswith("| vllm | 2 | 4; repeats 4.1 [3.9, 4.3] | ")]
    assert len(vllm) == 1 and vllm[0].endswith(" | 2; repeats 2.2 [2, 2.4] |")


def test_an_engine_whose_defaults_carried_the_most_says_so(capacity_study: optuna.Study, tmp_path: Path) -> None:
    from tuner.report.engines import beside_defaults, per_engine

    defaults_only = _two_engines(capacity_study, tmp_path / "d.db", sglang_top=1.8)
    rows = {r.engine: r for r in per_engine(defaults_only, "interactive")}
    assert beside_defaults(rows["vllm"], "interactive") == (
        "vllm: no tuned config carried more than its defaults (trial 0)."
    )


def test_a_tuned_config_inside_its_defaults_bracket_is_not_ranked_above_them(
    capacity_study: optuna.Study, tmp_path: Path
) -> None:
    from tuner.report.engines import beside_defaults, per_engine

    study = _two_engines(capacity_study, tmp_path / "inside.db", sglang_top=1.8)  # vLLM's defaults: 2 up to 2.4
    tuned = capacity_study.get_trials()[2]
    attrs = dict(tuned.user_attrs)
    tiers_ = attrs["capacity"]["tiers"]
    inside = {**tiers_["interactive"], "capacity_req_s": 2.2}
    attrs["capacity"] = {**attrs["capacity"], "tiers": {**tiers_, "interactive": inside}}
    study.add_trial(optuna.trial.create_trial(params=tuned.params, distributions=tuned.distributions, values=[2.2],
                                              user_attrs=attrs))  # fmt: skip
    rows = {r.engine: r for r in per_engine(study, "interactive")}
    assert rows["vllm"].best is not None and rows["vllm"].best.number == 3
    assert beside_defaults(rows["vllm"], "interactive") == (
        "vllm: trial 3 against its defaults (trial 0) carried 2.2 and 2 req/s (its defaults' bracket runs to 2.4): "
        "one drive each cannot tell them apart."
    )


def test_on_the_h100_study_vllms_defaults_are_its_best_under_both_tiers() -> None:
    from tests.unit.study_files import H100_STUDY
    from tuner.report.engines import beside_defaults, per_engine

    study = optuna.load_study(study_name="rag-h100-study-1", storage=f"sqlite:///{H100_STUDY}")
    for tier in ("interactive", "relaxed"):
        vllm = next(r for r in per_engine(study, tier) if r.engine == "vllm")
        assert beside_defaults(vllm, tier) == "vllm: no tuned config carried more than its defaults (trial 0)."

    # SGLang's draft at chunk 2048 (trial 7) and at 8192 (trial 8) both claim 6.92 under the relaxed tier;
    # trial 8 is Pareto-optimal (6.65 against 5.49 interactive), the finalist whose repeats are read
    sglang = next(r for r in per_engine(study, "relaxed") if r.engine == "sglang")
    assert sglang.best is not None and sglang.best.number == 8


def test_the_importance_ranking_says_what_it_rests_on() -> None:
    """PED-ANOVA reads the best tenth of the finished trials: one or two in a GPU study, under the five
    Optuna advises, and the page says so; a study of fifty finished trials has five, and reads plainly."""
    from tuner.report.html import ADVISED_TOP, importance_basis, importance_section

    assert importance_basis(15) == (
        "PED-ANOVA over the 15 finished trials: how the parameters of the best 10% of them (2) differ from the "
        f"rest's; Optuna advises at least {ADVISED_TOP} trials in that top, so read the ranking as a hint."
    )
    assert importance_basis(50).endswith("best 10% of them (5) differ from the rest's.")
    section = importance_section({"vllm.chunk_size": 1.0}, True, 15)
    assert "over the 15 finished trials" in section and "a hint" in section
    assert "PED-ANOVA" not in importance_section({}, True, 1), "no ranking, nothing said of its basis"


def test_the_pages_finalists_section_shows_the_repeats_under_way_not_that_none_ran(tmp_path: Path) -> None:
    """The H100 study's file after block 16 and session 52's withdrawals: three repeats of vLLM's
    defaults stored, one withdrawn, one of SGLang's, two withdrawn, and one of trial 8; no verdict.
    The page's section said "no finalist repeats were run" until session 48."""
    from tests.unit.study_files import H100_STUDY

    study = optuna.load_study(study_name="rag-h100-study-1", storage=f"sqlite:///file:{H100_STUDY}?mode=ro&uri=true")
    _, ours = _page(study, tmp_path)
    section = _section(ours, "best-vs-default")
    assert "no verdict yet: the finalists&#x27; repeats are under way (5 stored, 3 withdrawn)" in section
    row = "<td>trial 0 (vllm defaults)</td><td>so far 6.65, 6.34, 6.98: 6.66 [5.91, 7.83] (3 runs, 1 withdrawn)</td>"
    assert row in section
    sglang = "<td>trial 6 (sglang defaults)</td><td>so far 6.65 (1 run, 2 withdrawn)</td>"
    assert sglang in section
    assert "<td>so far 6.05 (1 run)</td><td>so far 7.25 (1 run)</td>" in section, "trial 8's first repeat"
    assert "no finalist repeats" not in section


def test_summary_holds_the_finalists_repeats_so_far_and_then_their_intervals_and_verdict(
    capacity_study: optuna.Study, tmp_path: Path
) -> None:
    """summary.md, which the GPU reports are written from: while the stage runs (it spans leases), the
    repeats stored and withdrawn; once it ended, each finalist's mean [95 % interval] and the verdict."""
    from tests.unit.study_files import H100_STUDY
    from tuner.report.html import finalists_md, summary_md

    h100 = optuna.load_study(study_name="rag-h100-study-1", storage=f"sqlite:///{H100_STUDY}")
    assert finalists_md(h100)[3:] == [
        "| trial | config | capacity_interactive_req_s | capacity_relaxed_req_s |", "|---|---|---|---|",
        "| 0 | vllm defaults | so far 6.65, 6.34, 6.98: 6.66 [5.91, 7.83] (3 runs, 1 withdrawn) "
        "| so far 6.92, 7.25, 6.92: 7.03 [6.56, 7.77] (3 runs, 1 withdrawn) |",
        "| 6 | sglang defaults | so far 6.65 (1 run, 2 withdrawn) | so far 6.65 (1 run, 2 withdrawn) |",
        "| 8 | sglang tuned | so far 6.05 (1 run) | so far 7.25 (1 run) |",
    ]  # fmt: skip
    empty = optuna.create_study(study_name="none", storage=f"sqlite:///{tmp_path / 'none.db'}")
    assert finalists_md(empty) == [], "no finalist ran: no section"
    stats = {"capacity_req_s": {"mean": 4.1, "low": 3.9, "high": 4.3, "n": 3}}
    failed = {"trial": 0, "stats": {}, "failures": ["oom", "oom", "oom"]}
    capacity_study.set_user_attr("finalists", [{"trial": 2, "stats": stats, "failures": []}, failed])
    capacity_study.set_user_attr("verdict", {"kind": "sole", "metric": "capacity_req_s", "trials": [2]})
    summary = summary_md(capacity_study)
    assert "| 2 | vllm tuned | 4.1 [3.9, 4.3] n=3 |" in summary
    assert "| 0 | vllm defaults | all failed (3 failed) |" in summary
    assert "- capacity_req_s: verdict: trial 2 is the only finalist that served all its repeats" in summary


def test_a_verdict_per_tier_is_said_for_every_tier_and_each_tier_is_priced(
    capacity_study: optuna.Study, tmp_path: Path
) -> None:
    """A capacity-pareto study's finalists are judged per tier (``by_metric``; the top level repeats
    the first tier's). The report said the first tier's verdict alone at its top, in the page's
    section and on the launch commands, and priced the first tier alone: a rehearsal of the H100
    study's end (its tiers tie, on different trials first) read as if the relaxed tier had no verdict."""
    from tuner.report.html import summary_md

    stats = {f"capacity_{t}_req_s": {"mean": m, "low": m - 0.2, "high": m + 0.2, "n": 3}
             for t, m in (("interactive", 4.0), ("relaxed", 6.0))}  # fmt: skip
    capacity_study.set_user_attr("finalists", [{"trial": 2, "stats": stats, "failures": []},
                                               {"trial": 0, "stats": stats, "failures": []}])  # fmt: skip
    interactive = {"kind": "winner", "metric": "capacity_interactive_req_s", "trials": [2]}
    relaxed = {"kind": "tie", "metric": "capacity_relaxed_req_s", "trials": [0, 2]}
    verdict = {**interactive, "by_metric": {"capacity_interactive_req_s": interactive,
                                            "capacity_relaxed_req_s": relaxed}, "stress_failed": []}  # fmt: skip
    capacity_study.set_user_attr("verdict", verdict)
    summary = summary_md(capacity_study)
    said = ("verdict: trial 2 wins on capacity_interactive_req_s (its 95 % interval clears the runner-up's); "
            "tie on capacity_relaxed_req_s between trials 0, 2 (their 95 % intervals overlap)")  # fmt: skip
    assert f"- {said}\n" in summary
    assert ("capacity_interactive_req_s: trial 2 wins the verdict; capacity_relaxed_req_s: no winner: the verdict "
            "is a tie between trials 0 and 2") in summary  # fmt: skip
    launch = summary[summary.index("## Launch command of the winner") :]
    assert launch.index("trial 2") < launch.index("trial 0 (engine default)"), "every trial a tier names, once"
    page, _ = _page(capacity_study, tmp_path)
    section = _section(page, "best-vs-default")
    assert html.escape(said) in section
    for tier in ("interactive", "relaxed"):
        assert f"<th>cost at the {tier} SLO (at the repeats' mean capacity)</th>" in section, tier
    one = {"kind": "sole", "metric": "capacity_req_s", "trials": [2]}
    capacity_study.set_user_attr("verdict", {**one, "by_metric": {"a": one, "b": {**one, "metric": "b"}}})
    assert "- verdict: trial 2 is the only finalist that served all its repeats; nothing to compare\n" in (
        summary_md(capacity_study)
    ), "what reads alike on every tier is said once"


def test_the_engines_cost_cell_prices_the_repeats_mean_beside_the_trials_own(capacity_study: optuna.Study) -> None:
    from tuner.report.engines import engines_section

    stats = {"capacity_interactive_req_s": {"mean": 2.0, "low": 1.9, "high": 2.1, "n": 3}}
    capacity_study.set_user_attr("finalists", [{"trial": 2, "stats": stats, "failures": []}])
    section = engines_section(capacity_study, price=2.0)
    cells = re.findall(r"<td>([^<]*tok/s per GPU[^<]*)</td>", section)
    repeated = [c for c in cells if "; at the repeats&#x27; mean: " in c]
    assert len(repeated) == 1 and len(cells) == 4, section  # vLLM's best in the interactive tier alone
    first, second = (float(x) for x in re.findall(r"([\d.]+) tok/s per GPU", repeated[0]))
    assert second == pytest.approx(first / 2), "trial 2 carried 4 req/s, its repeats 2 on average: half the tokens"

"""``tuner trials``: capacity per tier and each tier's SLO in a capacity study, the old columns otherwise."""

from __future__ import annotations

import optuna

from tests.unit.study_files import H100_STUDY
from tuner.report.trials_table import repeats_cell, trials_table
from tuner.report.winner import launch_choice


def _row(table: str, number: int) -> list[str]:
    return next(line.split() for line in table.splitlines() if line.split()[:1] in ([str(number)], [f"{number}*"]))


def test_a_capacity_study_lists_each_trials_capacity_per_tier_and_the_slo(capacity_study: optuna.Study) -> None:
    table = trials_table(capacity_study)
    head = table.splitlines()[0]
    assert "interactive req/s" in head and "relaxed req/s" in head and "repeats: req/s" in head
    assert "ttft_p95_ms" not in head
    assert _row(table, 2)[:5] == ["2*", "COMPLETE", "-", "4", "6"]  # the best capacity: the feasible front
    assert _row(table, 2)[5] == "480", "output tokens/s per GPU at the interactive capacity"
    assert _row(table, 2)[6:8] == ["4.1", "[3.89,"], "the finalist's repeats on capacity"
    assert "tok/s/GPU" in head and "$/M tok" not in head and "(--gpu-price to price them)" in table
    priced = trials_table(capacity_study, gpu_price=2.0)  # $2/GPU-hour at 480 tok/s: $1.16 per million tokens
    assert "$/M tok" in priced.splitlines()[0] and _row(priced, 2)[5:7] == ["480", "1.16"]
    assert "at $2/GPU-hour" in priced
    assert _row(table, 0)[3:5] == ["2", "3"] and "vllm (engine defaults)" in table
    assert _row(table, 4)[2:5] == ["oom_boot", "-", "-"]  # failed: no capacity attribute, no crash
    assert _row(table, 5)[2:5] == ["-", "-", "-"]  # a malformed capacity attribute
    assert "vllm.memory_fraction=0.3 " in table and "0.30000000000000004" not in table
    assert "SLO interactive: TTFT p95 <= 200 ms, TPOT p95 <= 6 ms for at least 90% of requests" in table
    assert "SLO relaxed: TTFT p95 <= 1000 ms, TPOT p95 <= 20 ms for at least 90% of requests" in table
    assert "tie on capacity_req_s between trials 2, 3" in table


def test_a_pareto_study_keeps_its_columns(pareto_study: optuna.Study) -> None:
    table = trials_table(pareto_study)
    head = table.splitlines()[0]
    assert "ttft_p95_ms" in head and "tok/s" in head and "req/s" not in head and "SLO" not in table
    assert _row(table, 1)[3:5] == ["120", "1400.0"]


def test_the_effort_line_tells_a_capacity_prune_from_a_mid_workload_one() -> None:
    study = optuna.create_study(directions=["maximize"])
    pruned = {
        1: {"at_requests": 12, "of": 40, "values": {}, "saved_s": 30.4, "beaten_by": 0},
        2: {"at_requests": 20, "steps": 2, "values": {}, "saved_s": None, "capacity": {"interactive": 0.0}},
        3: {"at_requests": 18, "steps": 2, "values": {}, "saved_s": None, "capacity": {"interactive": 0.0}},
    }
    for number in range(4):
        trial = study.ask()
        trial.set_user_attr("booted", True)
        if number in pruned:
            trial.set_user_attr("pruned", pruned[number])
        study.tell(trial, 1.0)
    effort = trials_table(study).splitlines()[-1]
    assert "4 booted an engine" in effort and "3 pruned: " in effort, effort
    assert "1 mid-workload (about 30 s of workload not driven)" in effort, effort
    assert "2 failing the SLO below the incumbent's capacity" in effort, effort


def test_a_model_study_shows_each_prediction_beside_the_measured_capacity(capacity_study: optuna.Study) -> None:
    from tests.unit.report.conftest import add, capacity_attrs, launch
    from tuner.report.html import prediction_section

    def said(central: float | None, low: float | None, high: float | None) -> dict[str, object]:
        tier = {"tier": "interactive", "capacity_req_s": central, "low_req_s": low, "high_req_s": high, "basis": "b"}
        return {"predicted": {"tiers": {"interactive": tier}}}

    add(capacity_study, {"engine": "vllm", "vllm.max_num_seqs": 8},
        {"launch": launch("vllm.entrypoints.openai.api_server", 41009), **capacity_attrs(2.0, 3.0),
         **said(2.5, 2.5, 2.5)}, 2.0)  # fmt: skip
    add(capacity_study, {"engine": "vllm", "vllm.max_num_seqs": 16},
        {"launch": launch("vllm.entrypoints.openai.api_server", 41010), **capacity_attrs(1.0, 3.0),
         **said(1.4, 0.8, 2.4)}, 1.0)  # fmt: skip
    add(capacity_study, {"engine": "vllm", "vllm.max_num_seqs": 32},
        {"launch": launch("vllm.entrypoints.openai.api_server", 41011), **capacity_attrs(2.0, 3.0),
         **said(0.5, None, None)}, 2.0)  # fmt: skip  # a value kept only to rank: no claim
    table = trials_table(capacity_study)
    assert "predicted interactive" in table.splitlines()[0]
    last = len(capacity_study.trials) - 1
    assert _row(table, last - 1)[5] == "0.8..2.4" and _row(table, last - 2)[5] == "2.5"
    assert _row(table, last)[5] == "~0.5"
    assert _row(table, 0)[5] == "-"  # the engine default was not predicted in this study
    section = prediction_section(capacity_study)
    assert "+25%" in section and "0.8..2.4" in section and "+40%" in section
    assert "~0.5" in section and "-75%" not in section  # no claim, so no error


def test_a_pruned_tier_shows_the_bracket_below_which_nothing_passed() -> None:
    """The H100 study's trial 3: its interactive search failed 6.34, 5.49 and 5.11 req/s, left 4.76
    undecided and pruned the tier. The table read "0 pruned", as if nothing at all had been carried;
    its bracket [0, 4.76) is what the search found."""
    from tuner.report.capacity import capacity_cell

    tiers = {"interactive": {"capacity_req_s": 0.0, "bracket_req_s": [0.0, 4.756828460010884], "pruned": True},
             "relaxed": {"capacity_req_s": 5.989845327788118, "bracket_req_s": [5.989845327788118, 6.44]},
             "no_bracket": {"capacity_req_s": 0.0}}  # fmt: skip
    trial = optuna.trial.create_trial(value=0.0, user_attrs={"capacity": {"tiers": tiers}})
    assert capacity_cell(trial, "interactive") == "0<4.76 pruned"
    assert capacity_cell(trial, "relaxed") == "5.99<6.44"
    assert capacity_cell(trial, "no_bracket") == "0"
    assert capacity_cell(trial, "absent") == "-"


def test_the_finalists_repeats_so_far_and_a_withdrawn_one_show_while_the_stage_spans_leases() -> None:
    """The H100 study's file after block 16 and session 52's withdrawals: vLLM's defaults (trial 0) have
    three repeats stored and one withdrawn, SGLang's (trial 6) one and two withdrawn, trial 8 one, and
    no verdict yet (reports/gpu-h100/study-1/block16/NOTES.md)."""
    study = optuna.load_study(study_name="rag-h100-study-1", storage=f"sqlite:///file:{H100_STUDY}?mode=ro&uri=true")
    table = trials_table(study)
    cell = "so far 6.65, 6.34, 6.98: 6.66 [5.91, 7.83] (3 runs, 1 withdrawn)"
    assert cell in " ".join(_row(table, 0)), "the interactive capacities, and their interval: trial 0 is done"
    two = [{"repeat": n, "failure": None, "metrics": {"m": v}} for n, v in ((1, 6.65), (2, 6.34))]
    assert repeats_cell(None, "m", two, 0) == "so far 6.65, 6.34 (2 runs)", "two runs give no interval"
    failed = [*two, {"repeat": 3, "failure": "oom", "metrics": {}}]
    assert repeats_cell(None, "m", failed, 0) == "so far 6.65, 6.34 (3 runs, 1 failed)", "nor two served of three"
    assert "so far 6.65 (1 run, 2 withdrawn)" in " ".join(_row(table, 6)), "SGLang's defaults: two to run again"
    assert "so far 6.05 (1 run)" in " ".join(_row(table, 8)), "trial 8: one repeat, no interval"
    withdrawn = [line for line in table.splitlines() if line.startswith("trial 0: repeat 2 withdrawn (")]
    assert len(withdrawn) == 1 and "max_steps at 5.33" in withdrawn[0]
    again = [line for line in table.splitlines() if line.startswith("trial 6: repeat ")]
    assert [line[: len("trial 6: repeat 3 withdrawn")] for line in again] == [
        "trial 6: repeat 3 withdrawn",
        "trial 6: repeat 2 withdrawn",
    ] and all("claims 6.98 from the same servings" in line for line in again)


def test_the_reports_launch_sentence_says_the_repeats_are_under_way() -> None:
    """With repeats stored and no verdict yet, the report does not say no repeat ran."""
    study = optuna.load_study(study_name="rag-h100-study-1", storage=f"sqlite:///file:{H100_STUDY}?mode=ro&uri=true")
    sentence, shown = launch_choice(study)
    assert sentence == (
        "no verdict yet: the finalists' repeats are under way (5 stored, 3 withdrawn): "
        "trial 8 is the best feasible trial"
    )
    assert [t.number for t in shown] == [8]

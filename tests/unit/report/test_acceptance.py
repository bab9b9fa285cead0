"""Acceptance per method, head and K: what a trial records (its ``speculation`` attribute, with every
capacity step's figures), the ``accept`` column of ``tuner trials`` and the report's table."""

from __future__ import annotations

import re
from typing import Any

import optuna

from tuner.engines.base import Config, Device, ModelSpec
from tuner.engines.vllm import VllmAdapter
from tuner.measure.trial import TrialResult
from tuner.report.html import acceptance_section
from tuner.report.trials_table import header, trial_rows, trials_table
from tuner.search.objective import record
from tuner.search.scoring import DIRECTIONS

MODEL = ModelSpec("/m/target", {"eagle3-head": "/m/eagle3-head"}, draft_kinds={"eagle3-head": "eagle3"})


def _step(rate: float, acceptance: float | None, length: float | None) -> dict[str, Any]:
    return {"rate_req_s": rate, "passed": True,
            "server": {"spec_acceptance_rate": acceptance, "spec_mean_accept_len": length}}  # fmt: skip


def _add(
    study: optuna.Study, params: dict[str, Any], server: dict[str, float | None], steps: list[dict[str, Any]]
) -> None:
    config = Config("vllm", params)
    launch = VllmAdapter().launch(config, MODEL, Device("cuda", "gpu", 0), 8000, "python3", "0.32.0")
    # both tiers judge every served step; ``measured`` holds each once, in the order served
    tiers = {tier: {"capacity_req_s": 2.0, "steps": steps, "slo": {"ttft_p95_ms": 200.0}, "target": 0.9}
             for tier in ("interactive", "relaxed")}  # fmt: skip
    capacity = {"objective_tier": "interactive", "tiers": tiers, "measured": steps}
    result = TrialResult(config, launch, "0.32.0", server=server, capacity=capacity,
                         metrics={"ttft_p95_ms": 50.0, "output_throughput_tok_s": 10.0, "error_rate": 0.0})  # fmt: skip
    trial = study.ask()
    trial.set_user_attr("config_kind", "sampled")
    study.tell(trial, record(trial, result, "pareto"))


def _study() -> optuna.Study:
    study = optuna.create_study(directions=DIRECTIONS)
    eagle3 = {"spec_method": "eagle3", "num_speculative_tokens": 3, "draft_model": "eagle3-head"}
    _add(study, eagle3, {"spec_acceptance_rate": 0.25, "spec_mean_accept_len": 1.75},
         [_step(4.0, 0.1, 1.3), _step(2.0, 0.25, 1.75)])  # fmt: skip
    _add(study, {**eagle3}, {"spec_acceptance_rate": 0.35, "spec_mean_accept_len": 2.05}, [])
    _add(study, {"spec_method": "ngram", "num_speculative_tokens": 2}, {"spec_acceptance_rate": 0.5}, [])
    _add(study, {"spec_method": "off"}, {"spec_acceptance_rate": None}, [])
    return study


def test_a_trial_records_its_method_head_k_and_acceptance_at_every_step() -> None:
    first, _, ngram, off = (t.user_attrs["speculation"] for t in _study().trials)
    assert first == {
        "method": "eagle3", "label": "EAGLE-3 eagle3-head K=3", "draft": "eagle3-head", "num_speculative_tokens": 3,
        "acceptance_rate": 0.25, "mean_accept_len": 1.75,
        "steps": [{"rate_req_s": 4.0, "acceptance_rate": 0.1, "mean_accept_len": 1.3},
                  {"rate_req_s": 2.0, "acceptance_rate": 0.25, "mean_accept_len": 1.75}],
    }  # fmt: skip
    assert ngram["method"] == "ngram" and ngram["draft"] is None and ngram["mean_accept_len"] is None
    assert off is None, "a trial that did not speculate records no speculation"


def test_a_rate_served_twice_keeps_both_steps_counters() -> None:
    """A look passed 2 req/s early, then the claim's confirmation served it whole: two steps, each
    with its own acceptance, and the trial's (the confirmed claim's) is among them."""
    study = optuna.create_study(directions=DIRECTIONS)
    eagle3 = {"spec_method": "eagle3", "num_speculative_tokens": 3, "draft_model": "eagle3-head"}
    served = [_step(2.0, 0.3, 1.9), _step(4.0, 0.1, 1.3), _step(2.0, 0.25, 1.75)]
    _add(study, eagle3, {"spec_acceptance_rate": 0.25, "spec_mean_accept_len": 1.75}, served)
    spec = study.trials[0].user_attrs["speculation"]
    assert [(s["rate_req_s"], s["acceptance_rate"]) for s in spec["steps"]] == [(2.0, 0.3), (4.0, 0.1), (2.0, 0.25)]
    assert spec["acceptance_rate"] in [s["acceptance_rate"] for s in spec["steps"]]


def test_trials_shows_each_speculating_trials_acceptance() -> None:
    study = _study()
    column = header(study).index("accept")
    assert [row[column] for row in trial_rows(study)] == ["25% x1.75", "35% x2.05", "50%", "-"]
    assert "accept" in trials_table(study).splitlines()[0]


def test_the_report_groups_acceptance_by_method_head_and_k() -> None:
    section = acceptance_section(_study())
    assert "<td>vllm</td><td>eagle3</td><td>eagle3-head</td><td>3</td><td>30.0%</td><td>1.90</td><td>2</td>" in section
    assert "<td>vllm</td><td>ngram</td><td>-</td><td>2</td><td>50.0%</td><td>-</td><td>1</td>" in section
    assert "off" not in section.split("<table>")[1]


def test_the_report_keeps_the_engines_apart_and_counts_the_pruned_trials() -> None:
    """The H100 study: `draft-2l` at K=3 on vLLM (trial 2) and on SGLang (trials 7 and 8) are two rows;
    SGLang's pruned draws (the 1-layer draft, the heads, n-gram lookup) served steps and measured
    their acceptance, which is why they were pruned, so they are rows too."""
    from tests.unit.study_files import H100_STUDY

    study = optuna.load_study(study_name="rag-h100-study-1", storage=f"sqlite:///file:{H100_STUDY}?mode=ro&uri=true")
    rows = re.findall(r"<tr><td>(\w+)</td><td>(\w+)</td><td>([\w-]+)</td><td>(\d+)</td>.*?<td>(\d+)</td></tr>",
                      acceptance_section(study))  # fmt: skip
    assert ("vllm", "draft_model", "draft-2l", "3", "1") in rows and (
        "sglang",
        "draft_model",
        "draft-2l",
        "3",
        "2",
    ) in rows
    assert ("sglang", "draft_model", "draft-1l", "2", "1") in rows, "trial 12, pruned"
    assert {(e, m) for e, m, *_ in rows} >= {("sglang", "eagle3"), ("sglang", "ngram"), ("sglang", "eagle")}


def test_a_study_without_speculation_has_no_accept_column() -> None:
    study = optuna.create_study(directions=DIRECTIONS)
    _add(study, {}, {}, [])
    assert "accept" not in trials_table(study).splitlines()[0]

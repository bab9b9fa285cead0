"""The report's list of what the engines changed of the configs (``tuner.report.overrides``)."""

from __future__ import annotations

from pathlib import Path

import optuna

from tests.unit.report.conftest import VLLM, add, capacity_attrs, launch
from tuner.report.html import summary_md, write_report
from tuner.report.trials_table import trials_table

CAP = "at most 48 running requests (SGLang's cap with speculation; --max-running-requests not given)"
ASYNC = "async scheduling off (vLLM does not run it with draft_model)"


def test_each_change_is_listed_once_with_its_engine_and_every_trial_that_logged_it(
    capacity_study: optuna.Study, tmp_path: Path
) -> None:
    drafted = {"launch": launch(VLLM, 41010), **capacity_attrs(3.0, 4.0)}
    add(
        capacity_study,
        {"engine": "vllm", "vllm.max_num_seqs": 64},
        {**drafted, "engine_overrides": [ASYNC]},
        3.0,
    )
    capped = {"launch": launch("sglang.launch_server", 41011), **capacity_attrs(2.0, 3.0), "engine_overrides": [CAP]}
    add(capacity_study, {"engine": "sglang", "sglang.mem_fraction_static": 0.8}, capped, 2.0)
    add(capacity_study, {"engine": "sglang", "sglang.mem_fraction_static": 0.7}, {**capped}, 2.0)
    n = len(capacity_study.trials)
    table = trials_table(capacity_study)
    assert f"vllm changed the config: {ASYNC} (trials {n - 3})" in table
    assert f"sglang changed the config: {CAP} (trials {n - 2}, {n - 1})" in table
    summary = summary_md(capacity_study)
    assert "## What the engines changed of the configs" in summary
    assert f"| sglang | {CAP} | {n - 2}, {n - 1} |" in summary
    page = write_report(capacity_study, tmp_path).read_text()
    assert '<section id="overrides">' in page and "async scheduling off" in page


def test_a_study_whose_trials_logged_no_change_says_none(capacity_study: optuna.Study, tmp_path: Path) -> None:
    assert "changed the config" not in trials_table(capacity_study)
    assert "What the engines changed" not in summary_md(capacity_study)
    page = write_report(capacity_study, tmp_path).read_text()
    assert (
        '<section id="overrides"><h2>What the engines changed of the configs</h2><p>none logged</p></section>' in page
    )

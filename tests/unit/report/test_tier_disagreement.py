"""A trial whose looser tier carries less than a stricter one it contains is said, in the trials table
and the HTML report; tiers that are not nested, equal capacities and a pruned looser tier are not."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest

from tests.unit.report.conftest import VLLM, add, capacity_attrs, launch
from tests.unit.study_files import H100_STUDY
from tuner.report.capacity import Tier, capacity_table_section, contains, tier_disagreements
from tuner.report.trials_table import trials_table

STRICT = Tier("interactive", {"ttft_p95_ms": 300.0, "tpot_p95_ms": 100.0}, 0.9)


@pytest.mark.parametrize(
    ("loose", "expected"),
    [
        (Tier("relaxed", {"ttft_p95_ms": 600.0, "tpot_p95_ms": 200.0}, 0.9), True),
        (Tier("relaxed", {"ttft_p95_ms": 300.0, "tpot_p95_ms": 100.0}, 0.9), True),  # the same bounds
        (Tier("ttft-only", {"ttft_p95_ms": 600.0}, 0.9), True),  # no TPOT bound at all: looser still
        (Tier("mixed", {"ttft_p95_ms": 600.0, "tpot_p95_ms": 50.0}, 0.9), False),  # tighter on TPOT
        (Tier("stricter-share", {"ttft_p95_ms": 600.0, "tpot_p95_ms": 200.0}, 0.95), False),
        (Tier("e2e", {"e2e_p95_ms": 9000.0}, 0.9), False),  # a bound the strict tier does not set
        (Tier("unrecorded", {}, None), False),
        (STRICT, False),  # a tier is not its own looser tier
    ],
)
def test_contains(loose: Tier, expected: bool) -> None:
    assert contains(loose, STRICT) is expected


def test_a_looser_tier_below_a_stricter_one_is_said(capacity_study: optuna.Study) -> None:
    assert tier_disagreements(capacity_study) == []  # every fixture trial carries more under relaxed
    add(capacity_study, {"engine": "vllm", "vllm.max_num_seqs": 128},
        {"launch": launch(VLLM, 41020), **capacity_attrs(4.0, 3.0)}, 4.0)  # fmt: skip
    number = len(capacity_study.trials) - 1
    said = tier_disagreements(capacity_study)
    assert len(said) == 1 and said[0].startswith(f"trial {number}: relaxed 3 req/s is below interactive 4 req/s")
    assert f"tiers disagree, {said[0]}" in trials_table(capacity_study).splitlines()
    section = capacity_table_section(capacity_study)
    assert "Tiers that disagree" in section and f"trial {number}: relaxed 3 req/s" in section


def test_equal_capacities_and_a_pruned_looser_tier_are_not_said(capacity_study: optuna.Study) -> None:
    add(capacity_study, {"engine": "vllm", "vllm.max_num_seqs": 128},
        {"launch": launch(VLLM, 41021), **capacity_attrs(4.0, 4.0)}, 4.0)  # fmt: skip
    pruned = capacity_attrs(4.0, 2.0)
    # pruned: its 0 claims only a bracket below the incumbent
    pruned["capacity"]["tiers"]["relaxed"].update(capacity_req_s=0.0, pruned=True, stop_reason="pruned")
    pruned["capacity_relaxed_req_s"] = 0.0
    add(capacity_study, {"engine": "vllm", "vllm.max_num_seqs": 256}, {"launch": launch(VLLM, 41022), **pruned}, 4.0)
    assert tier_disagreements(capacity_study) == []
    assert "Tiers that disagree" not in capacity_table_section(capacity_study)


def test_the_h100_study_says_trial_14_alone_of_its_first_fifteen(tmp_path: Path) -> None:
    """The study file's own trials: trial 14 (vLLM, n-gram lookup) claimed 5.76 req/s under the
    interactive tier and 5.19 under the relaxed one; trial 6 ties (6.34 each) and trials 12 and 13
    were pruned under both, so none of them is said. Later blocks add trials; these stay as recorded."""
    copy = tmp_path / "study.db"
    shutil.copy(H100_STUDY, copy)  # a copy: no test writes a committed study file
    study = optuna.load_study(study_name="rag-h100-study-1", storage=f"sqlite:///{copy}")
    said = [line for line in tier_disagreements(study) if int(line.split(":")[0].removeprefix("trial ")) <= 14]
    assert len(said) == 1 and said[0].startswith("trial 14: relaxed 5.19 req/s is below interactive 5.76 req/s")

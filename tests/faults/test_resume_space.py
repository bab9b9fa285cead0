"""A study resumed with an edited search space: a change Optuna refuses is one line before any trial;
a narrowed range goes on."""

from __future__ import annotations

from pathlib import Path

from tests.faults.harness import FaultEngine, Study, lost


def test_a_changed_space_is_refused_up_front_and_a_narrowed_one_goes_on(
    study: Study, engine: FaultEngine, tmp_path: Path
) -> None:
    code, err = study.search(2)
    assert code == 0, err
    before = study.trials()
    space = tmp_path / "space.yaml"
    space.write_text("engines: [vllm]\nparameters:\n  chunk_size: {choices: [512, 4096]}\n")
    boots = engine.boots()
    code, err = study.search(4)
    # the one line of the refusal (beside rag's notice that it scaled to the context, said once)
    said = [line for line in err.splitlines() if "is shorter than the preset needs" not in line]
    assert code == 2 and len(said) == 1 and said[0].startswith("tuner: "), err
    assert "vllm.chunk_size" in err and "another --study" in err, err
    assert engine.boots() == boots and len(study.trials()) == len(before), "no engine, no trial written"
    # the study's own choices, another parameter's range added: Optuna takes it, so the search goes on
    space.write_text(
        "engines: [vllm]\nparameters:\n  chunk_size: {choices: [256, 512, 1024, 2048]}\n"
        "  max_num_seqs: {choices: [1, 2, 4, 8]}\n  memory_fraction: {low: 0.2, high: 0.4, step: 0.1}\n"
    )
    code, err = study.search(3)
    assert code == 0, err
    after = study.trials()
    assert lost(before, after) == 0 and len(after) > len(before)
    assert "vllm.memory_fraction" in after[-1].params

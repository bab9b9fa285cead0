"""``--sampler grid`` walks every distinct config once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.search.offers import model_of, offers
from tuner.errors import ConfigError
from tuner.search.grid import grid_points, shuffled
from tuner.search.space import load_space

ROOT = Path(__file__).resolve().parents[3]


def test_the_benchmark_grid_has_168_distinct_configs() -> None:
    space = load_space(ROOT / "search_spaces" / "grid-cpu.yaml")  # written before methods were a parameter
    points = grid_points(space, offers(space))
    assert len(points) == 3 * 2 * 4 * (1 + 2 * 3)
    assert len({json.dumps(p, sort_keys=True) for p in points}) == len(points)
    off = [p for p in points if p["vllm.spec_method"] == "off"]
    assert off and all(set(p) - {"vllm.spec_method"} <= {"engine", "vllm.chunk_size", "vllm.max_num_seqs",
                                                             "vllm.memory_fraction"} for p in off)  # fmt: skip
    assert {p["vllm.spec_method"] for p in points} == {"off", "draft_model", "ngram"}
    assert {p.get("vllm.draft_model.draft") for p in points} == {None, "draft-2l", "draft-1l"}
    assert all(p["vllm.num_speculative_tokens"] in (2, 4) for p in points if p["vllm.spec_method"] != "off")


def test_each_method_is_paired_only_with_what_it_takes(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "engines: [vllm, sglang]\nparameters:\n"
        "  spec_method: {choices: [off, eagle3, ngram, draft_model]}\n"
        "  num_speculative_tokens: {choices: [1, 3]}\n"
        "  ngram_lookup: {choices: [[1, 2], [2, 4]]}\n"
        "  spec_tree: {choices: [[1, 2], [4, 8]]}\n"
    )
    model = model_of(["draft-2l", "eagle3-head"], {"eagle3-head": "eagle3"})
    points = grid_points(load_space(path), offers(load_space(path), model=model))
    vllm = [p for p in points if p["engine"] == "vllm"]
    sglang = [p for p in points if p["engine"] == "sglang"]
    # off once; eagle3 and draft_model: 2 K x 1 draft; ngram: 2 K x 2 windows (vLLM) or 2 K (SGLang)
    assert len(vllm) == 1 + 2 + 2 + 2 * 2
    assert len(sglang) == 1 + 2 * 2 + 2 * 2 + 2  # its EAGLE family takes the tree, its n-gram nothing more
    for p in points:
        e, method = p["engine"], p[f"{p['engine']}.spec_method"]
        assert (f"{e}.ngram_lookup" in p) == (e == "vllm" and method == "ngram"), p
        assert (f"{e}.spec_tree" in p) == (e == "sglang" and method in ("eagle3", "draft_model")), p
        assert (f"{e}.eagle3.draft" in p) == (method == "eagle3"), p
        assert p.get(f"{e}.eagle3.draft", "eagle3-head") == "eagle3-head"
        assert p.get(f"{e}.draft_model.draft", "draft-2l") == "draft-2l", "a head is never a draft model's choice"


def test_ranges_with_a_step_expand_and_the_order_is_seeded(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("engines: [vllm]\nparameters:\n  memory_fraction: {low: 0.5, high: 0.9, step: 0.1}\n"
                    "  num_speculative_tokens: {low: 0, high: 2}\n")  # fmt: skip
    points = grid_points(load_space(path), offers(load_space(path), model=model_of(["d"])))
    assert sorted({p["vllm.memory_fraction"] for p in points}) == [0.5, 0.6, 0.7, 0.8, 0.9]
    assert len(points) == 5 * 3  # off, and K 1 and 2 with the draft d
    assert shuffled(points, 1) == shuffled(points, 1) != shuffled(points, 2)


def test_a_float_range_without_a_step_is_no_grid(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("engines: [vllm]\nparameters:\n  memory_fraction: {low: 0.5, high: 0.9}\n")
    with pytest.raises(ConfigError, match="memory_fraction needs a step"):
        grid_points(load_space(path), offers(load_space(path)))

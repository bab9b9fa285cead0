"""``--sampler grid`` walks every distinct config once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.errors import ConfigError
from tuner.search.grid import grid_points, shuffled
from tuner.search.space import load_space

ROOT = Path(__file__).resolve().parents[3]


def test_the_benchmark_grid_has_168_distinct_configs() -> None:
    space = load_space(ROOT / "search_spaces" / "grid-cpu.yaml")
    points = grid_points(space, ["vllm"], ["draft-2l", "draft-1l"])
    assert len(points) == 3 * 2 * 4 * (1 + 2 * 3)
    assert len({json.dumps(p, sort_keys=True) for p in points}) == len(points)
    off = [p for p in points if p["vllm.num_speculative_tokens"] == 0]
    assert off and all("vllm.draft_model" not in p for p in off), "no draft without speculation"
    assert {p.get("vllm.draft_model") for p in points} == {None, "draft-2l", "draft-1l", "ngram"}


def test_ranges_with_a_step_expand_and_the_order_is_seeded(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("engines: [vllm]\nparameters:\n  memory_fraction: {low: 0.5, high: 0.9, step: 0.1}\n"
                    "  num_speculative_tokens: {low: 0, high: 2}\n")  # fmt: skip
    points = grid_points(load_space(path), ["vllm"], ["d"])
    assert sorted({p["vllm.memory_fraction"] for p in points}) == [0.5, 0.6, 0.7, 0.8, 0.9]
    assert len(points) == 5 * 3
    assert shuffled(points, 1) == shuffled(points, 1) != shuffled(points, 2)


def test_a_float_range_without_a_step_is_no_grid(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("engines: [vllm]\nparameters:\n  memory_fraction: {low: 0.5, high: 0.9}\n")
    with pytest.raises(ConfigError, match="memory_fraction needs a step"):
        grid_points(load_space(path), ["vllm"], [])

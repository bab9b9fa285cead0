"""The rag preset: determinism, exact token lengths, popularity skew, and fitting to the context."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from tuner.errors import ConfigError, WorkloadError
from tuner.workloads import build_workload, load_tokenizer
from tuner.workloads import rag as rag_module
from tuner.workloads.base import Workload, count_tokens, load_corpus
from tuner.workloads.rag import TOLERANCE_TOKENS, build_rag


def _bodies_bytes(workload: Workload) -> bytes:
    requests = workload.warmup + workload.requests
    return json.dumps([r.body for r in requests], sort_keys=True).encode()


def test_corpus_is_real_ascii_passages() -> None:
    passages = load_corpus()
    assert 200 <= len(passages) <= 300
    assert all(80 <= len(p.split()) <= 160 for p in passages)
    assert all(p.isascii() for p in passages)


def test_same_seed_gives_identical_bytes(tokenizer: Tokenizer) -> None:
    first = build_rag(tokenizer, seed=7, n_requests=12, max_model_len=4096)
    second = build_rag(tokenizer, seed=7, n_requests=12, max_model_len=4096)
    assert first.digest() == second.digest()
    assert _bodies_bytes(first) == _bodies_bytes(second)


def test_different_seed_gives_different_requests(tokenizer: Tokenizer) -> None:
    first = build_rag(tokenizer, seed=1, n_requests=12, max_model_len=4096)
    second = build_rag(tokenizer, seed=2, n_requests=12, max_model_len=4096)
    assert first.digest() != second.digest()
    assert first.requests[0].body["prompt"] != second.requests[0].body["prompt"]


def test_request_shape(tokenizer: Tokenizer) -> None:
    workload = build_rag(tokenizer, seed=3, n_requests=5, max_model_len=4096, concurrency=8, n_warmup=3)
    assert [r.request_id for r in workload.requests] == [f"r{i:04d}" for i in range(5)]
    assert [r.request_id for r in workload.warmup] == ["w000", "w001", "w002"]
    assert workload.name == "rag" and workload.concurrency == 8 and workload.seed == 3
    for request in workload.requests:
        assert request.endpoint == "/v1/completions"
        assert set(request.body) == {"prompt", "max_tokens", "temperature", "ignore_eos"}
        assert request.body["max_tokens"] == request.max_tokens == 48
        assert request.body["temperature"] == 0.0 and request.body["ignore_eos"] is True
        prompt = request.body["prompt"]
        assert prompt.startswith(rag_module.SYSTEM_PROMPT) and prompt.endswith("\nAnswer:")
        assert prompt.count("\nPassage ") == 3 and "\nQuestion: " in prompt
        assert request.prompt_tokens == count_tokens(tokenizer, prompt)
        assert 800 - TOLERANCE_TOKENS <= request.prompt_tokens <= 1000 + TOLERANCE_TOKENS


def test_warmup_does_not_change_measured_requests(tokenizer: Tokenizer) -> None:
    few = build_rag(tokenizer, seed=5, n_requests=4, max_model_len=4096, n_warmup=0)
    many = build_rag(tokenizer, seed=5, n_requests=4, max_model_len=4096, n_warmup=4)
    assert [r.body for r in few.requests] == [r.body for r in many.requests]
    assert few.digest() != many.digest()


@pytest.mark.parametrize("target", [300, 650, 900])
def test_prompt_lands_within_tolerance_of_its_target(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch, target: int
) -> None:
    # pin the per-request target so each request's error against it can be read off exactly
    monkeypatch.setattr(rag_module, "TARGET_LOW", target)
    monkeypatch.setattr(rag_module, "TARGET_HIGH", target)
    workload = build_rag(tokenizer, seed=11, n_requests=15, max_model_len=4096)
    for request in workload.requests:
        assert abs(request.prompt_tokens - target) <= TOLERANCE_TOKENS
        assert request.prompt_tokens == count_tokens(tokenizer, request.body["prompt"])


def test_input_lengths_spread_around_the_target(tokenizer: Tokenizer) -> None:
    lengths = [r.prompt_tokens for r in build_rag(tokenizer, seed=4, n_requests=30, max_model_len=4096).requests]
    assert len(set(lengths)) > 10
    assert 850 <= sum(lengths) / len(lengths) <= 950


def test_popular_passages_repeat_across_requests(tokenizer: Tokenizer) -> None:
    workload = build_rag(tokenizer, seed=9, n_requests=40, max_model_len=4096)
    openings: Counter[str] = Counter()
    for request in workload.requests:
        for match in re.finditer(r"\nPassage \d: ((?:\S+ ){12})", request.body["prompt"]):
            openings[match.group(1)] += 1
    assert sum(openings.values()) == 120
    assert openings.most_common(1)[0][1] >= 8  # the top document shows up in a good share of prompts
    assert len(openings) < 90  # far fewer distinct documents than a uniform draw would give


def test_short_context_scales_inputs_and_says_so_once(tokenizer: Tokenizer, capsys: pytest.CaptureFixture[str]) -> None:
    workload = build_rag(tokenizer, seed=2, n_requests=10, max_model_len=512)
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert err_lines == ["rag: model context 512 is shorter than the preset needs (1064); input lengths scaled by 0.45"]
    for request in workload.requests:
        assert request.prompt_tokens + request.max_tokens <= 512
        assert request.prompt_tokens <= 448 + TOLERANCE_TOKENS


def test_roomy_context_prints_nothing(tokenizer: Tokenizer, capsys: pytest.CaptureFixture[str]) -> None:
    build_rag(tokenizer, seed=2, n_requests=2, max_model_len=1064)
    assert capsys.readouterr().err == ""


def test_context_too_small_for_fixed_text_is_a_workload_error(tokenizer: Tokenizer) -> None:
    with pytest.raises(WorkloadError, match="rag"):
        build_rag(tokenizer, seed=2, n_requests=2, max_model_len=200)


def test_build_workload_registry(tokenizer: Tokenizer) -> None:
    workload = build_workload("rag", tokenizer, seed=1, n_requests=2, max_model_len=4096, concurrency=6)
    assert workload.concurrency == 6
    assert build_workload("rag", tokenizer, seed=1, n_requests=2, max_model_len=4096).concurrency == 4
    with pytest.raises(ConfigError, match="known workloads: rag"):
        build_workload("chat", tokenizer, seed=1, n_requests=2, max_model_len=4096)


def test_load_tokenizer_errors_name_the_path(tmp_path: Path, tokenizer: Tokenizer) -> None:
    with pytest.raises(WorkloadError, match=str(tmp_path / "tokenizer.json")):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(WorkloadError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    assert count_tokens(load_tokenizer(tmp_path), "hello world") == count_tokens(tokenizer, "hello world")

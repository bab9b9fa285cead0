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
from tuner.workloads.arrivals import Arrival
from tuner.workloads.base import Workload, count_tokens, load_corpus


def _rag(tokenizer: Tokenizer, seed: int, n: int, max_model_len: int = 4096, **kwargs: int) -> Workload:
    return build_workload("rag", tokenizer, seed=seed, n_requests=n, max_model_len=max_model_len, **kwargs)


def _bodies_bytes(workload: Workload) -> bytes:
    requests = workload.warmup + workload.requests
    return json.dumps([r.body for r in requests], sort_keys=True).encode()


def test_corpus_is_real_ascii_passages() -> None:
    passages = load_corpus()
    assert 200 <= len(passages) <= 300
    assert all(80 <= len(p.split()) <= 160 for p in passages)
    assert all(p.isascii() for p in passages)


def test_same_seed_gives_identical_bytes(tokenizer: Tokenizer) -> None:
    first, second = _rag(tokenizer, 7, 12), _rag(tokenizer, 7, 12)
    assert first.digest() == second.digest()
    assert _bodies_bytes(first) == _bodies_bytes(second)


def test_different_seed_gives_different_requests(tokenizer: Tokenizer) -> None:
    first, second = _rag(tokenizer, 1, 12), _rag(tokenizer, 2, 12)
    assert first.digest() != second.digest()
    assert first.requests[0].body["prompt"] != second.requests[0].body["prompt"]


def test_request_shape(tokenizer: Tokenizer) -> None:
    workload = _rag(tokenizer, 3, 5, concurrency=8, n_warmup=3)
    assert [r.request_id for r in workload.requests] == [f"r{i:04d}" for i in range(5)]
    assert [r.request_id for r in workload.warmup] == ["w000", "w001", "w002"]
    assert workload.name == "rag" and workload.concurrency == 8 and workload.seed == 3
    assert workload.arrival == Arrival(concurrency=8)
    for request in workload.requests:
        assert request.endpoint == "/v1/completions" and request.session_id is None and request.arrival_s is None
        assert set(request.body) == {"prompt", "max_tokens", "temperature", "ignore_eos"}
        assert request.body["max_tokens"] == request.max_tokens == 48
        assert request.body["temperature"] == 0.0 and request.body["ignore_eos"] is True
        prompt = request.body["prompt"]
        assert prompt.startswith(rag_module.SYSTEM_PROMPT) and prompt.endswith("\nAnswer:")
        assert prompt.count("\nPassage ") >= 2 and "\nQuestion: " in prompt
        assert request.prompt_tokens == count_tokens(tokenizer, prompt)
        assert 800 - 1 <= request.prompt_tokens <= 1000 + 1


def test_preset_defaults(tokenizer: Tokenizer) -> None:
    workload = _rag(tokenizer, 1, 2)
    assert workload.concurrency == 4 and workload.arrival == Arrival(concurrency=4)
    assert workload.slo.ttft_p95_ms == 2000 and workload.slo.e2e_p95_ms == 3000


def test_warmup_does_not_change_measured_requests(tokenizer: Tokenizer) -> None:
    few, many = _rag(tokenizer, 5, 4, n_warmup=0), _rag(tokenizer, 5, 4, n_warmup=4)
    assert [r.body for r in few.requests] == [r.body for r in many.requests]
    assert few.digest() != many.digest()


@pytest.mark.parametrize("target", [520, 650, 777, 900, 1000])
def test_prompt_lands_within_one_token_of_its_target(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch, target: int
) -> None:
    # pin the per-request target so each request's error against it can be read off exactly
    monkeypatch.setattr(rag_module, "TARGET_LOW", target)
    monkeypatch.setattr(rag_module, "TARGET_HIGH", target)
    for request in _rag(tokenizer, 11, 25).requests + _rag(tokenizer, 12, 25).requests:
        assert abs(request.prompt_tokens - target) <= 1
        assert request.prompt_tokens == count_tokens(tokenizer, request.body["prompt"])


def test_input_lengths_spread_around_the_target(tokenizer: Tokenizer) -> None:
    lengths = [r.prompt_tokens for r in _rag(tokenizer, 4, 30).requests]
    assert len(set(lengths)) > 10
    assert 850 <= sum(lengths) / len(lengths) <= 950


def test_popular_passages_repeat_right_after_the_preamble(tokenizer: Tokenizer) -> None:
    workload = _rag(tokenizer, 9, 40)
    first_passages: Counter[str] = Counter()
    all_passages: Counter[str] = Counter()
    for request in workload.requests:
        retrieved = request.body["prompt"][len(rag_module.SYSTEM_PROMPT) :]
        openings = re.findall(r"\nPassage (\d): ((?:\S+ ){12})", retrieved)
        first_passages[openings[0][1]] += 1
        all_passages.update(text for _, text in openings)
    assert first_passages.most_common(1)[0][1] >= 10  # the top passage leads a good share of prompts
    assert len(all_passages) < 80  # far fewer distinct passages than a uniform draw would give


def test_passages_are_fixed_chunks_of_the_corpus(tokenizer: Tokenizer) -> None:
    corpus = {" ".join(p.split()) for p in load_corpus()}  # words as the prompt joins them
    for request in _rag(tokenizer, 2, 10).requests:
        retrieved = request.body["prompt"][len(rag_module.SYSTEM_PROMPT) :]  # after the worked example
        passages = re.findall(r"\nPassage \d: (.*)\n", retrieved)
        assert all(p in corpus for p in passages[:-1])  # only the last one packed may be cut short
        assert any(c.startswith(passages[-1]) for c in corpus)


def test_short_context_scales_inputs_and_says_so_once(tokenizer: Tokenizer, capsys: pytest.CaptureFixture[str]) -> None:
    workload = _rag(tokenizer, 2, 10, max_model_len=768)
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert err_lines == ["rag: model context 768 is shorter than the preset needs (1064); input lengths scaled by 0.70"]
    for request in workload.requests:
        assert request.prompt_tokens + request.max_tokens <= 768
        assert 560 - 1 <= request.prompt_tokens <= 704 + 1


def test_roomy_context_prints_nothing(tokenizer: Tokenizer, capsys: pytest.CaptureFixture[str]) -> None:
    _rag(tokenizer, 2, 2, max_model_len=1064)
    assert capsys.readouterr().err == ""


def test_context_too_small_for_the_output_is_a_workload_error(tokenizer: Tokenizer) -> None:
    with pytest.raises(WorkloadError, match="rag"):
        _rag(tokenizer, 2, 2, max_model_len=60)


def test_build_workload_registry(tokenizer: Tokenizer) -> None:
    assert _rag(tokenizer, 1, 2, concurrency=6).concurrency == 6
    with pytest.raises(ConfigError, match="known workloads: rag, agent, chat, json"):
        build_workload("poetry", tokenizer, seed=1, n_requests=2, max_model_len=4096)


def test_load_tokenizer_errors_name_the_path(tmp_path: Path, tokenizer: Tokenizer) -> None:
    with pytest.raises(WorkloadError, match=str(tmp_path / "tokenizer.json")):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(WorkloadError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    assert count_tokens(load_tokenizer(tmp_path), "hello world") == count_tokens(tokenizer, "hello world")


def test_any_range_of_rag_requests_is_what_a_whole_build_holds(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Request i depends only on the seed and i: a capacity search grows the pool by building the
    requests it lacks, in worker processes, and gets exactly what one build of them all would hold."""
    from tuner.workloads import build_workload, preset

    whole = build_workload("rag", tokenizer, seed=3, n_requests=14, max_model_len=2048).requests
    small = build_workload("rag", tokenizer, seed=3, n_requests=4, max_model_len=2048)
    monkeypatch.setattr(preset, "PARALLEL_FROM", 4)
    monkeypatch.setattr(preset, "CHUNK", 3)
    assert small.grow is not None
    grown = small.grow(14)  # ten more, in four chunks over worker processes
    assert [r.body for r in grown] == [r.body for r in whole] and [r.request_id for r in grown][-1] == "r0013"
    assert len({r.body["prompt"] for r in grown}) == 14
    other = build_workload("rag", tokenizer, seed=4, n_requests=4, max_model_len=2048).requests
    assert [r.body for r in other] != [r.body for r in whole[:4]], "another seed, other requests"

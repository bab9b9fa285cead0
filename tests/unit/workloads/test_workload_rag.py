"""The rag preset: determinism, exact token lengths, its stated shape and reuse share, and fitting to the context."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from tuner.errors import ConfigError, WorkloadError
from tuner.workloads import build_workload, load_tokenizer
from tuner.workloads import rag as rag_module
from tuner.workloads.arrivals import Arrival
from tuner.workloads.base import Workload, count_tokens, load_corpus


def _rag(tokenizer: Tokenizer, seed: int, n: int, max_model_len: int = 1024, **kwargs: int) -> Workload:
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


FULL = 8192  # a context that holds the preset unscaled


def _lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_request_shape(tokenizer: Tokenizer) -> None:
    workload = _rag(tokenizer, 3, 5, max_model_len=FULL, concurrency=8, n_warmup=3)
    assert [r.request_id for r in workload.requests] == [f"r{i:04d}" for i in range(5)]
    assert [r.request_id for r in workload.warmup] == ["w000", "w001", "w002"]
    assert workload.name == "rag" and workload.concurrency == 8 and workload.seed == 3
    assert workload.arrival == Arrival(concurrency=8)
    for request in workload.requests:
        assert request.endpoint == "/v1/completions" and request.session_id is None and request.arrival_s is None
        assert set(request.body) == {"prompt", "max_tokens", "temperature", "ignore_eos"}
        assert request.body["max_tokens"] == request.max_tokens and 256 <= request.max_tokens <= 768
        assert request.body["temperature"] == 0.0 and request.body["ignore_eos"] is True
        prompt = request.body["prompt"]
        assert prompt.startswith(rag_module.SYSTEM_PROMPT) and prompt.endswith("\nAnswer:")
        assert "\n\nDocument:\n" in prompt and "\n\nRetrieved passages:\n" in prompt and "\nQuestion: " in prompt
        assert request.prompt_tokens == count_tokens(tokenizer, prompt)
        assert 2048 - 1 <= request.prompt_tokens <= 6144 + 1


def test_preset_defaults(tokenizer: Tokenizer) -> None:
    workload = _rag(tokenizer, 1, 2)
    assert workload.concurrency == 4 and workload.arrival == Arrival(concurrency=4)
    assert workload.slo == rag_module.TIERS.cpu["interactive"]
    interactive = rag_module.TIERS.gpu["interactive"]  # GuideLLM's RAG guide, as the docstring says
    assert (interactive.ttft_p95_ms, interactive.tpot_p95_ms) == (300, 100)


def test_warmup_does_not_change_measured_requests(tokenizer: Tokenizer) -> None:
    few, many = _rag(tokenizer, 5, 4, n_warmup=0), _rag(tokenizer, 5, 4, n_warmup=4)
    assert [r.body for r in few.requests] == [r.body for r in many.requests]
    assert few.digest() != many.digest()


@pytest.mark.parametrize("target", [2048, 3001, 4096, 6144])
def test_prompt_lands_within_one_token_of_its_target(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch, target: int
) -> None:
    # pin the per-request target so each request's error against it can be read off exactly
    monkeypatch.setattr(rag_module, "PROMPT_TOKENS", rag_module.Normal(target, 0, target, target))
    rag_module._index.cache_clear()
    built = _rag(tokenizer, 11, 6, max_model_len=FULL).requests + _rag(tokenizer, 12, 6, max_model_len=FULL).requests
    for request in built:
        assert abs(request.prompt_tokens - target) <= 1
        assert request.prompt_tokens == count_tokens(tokenizer, request.body["prompt"])
    rag_module._index.cache_clear()


def test_lengths_follow_the_docstring(tokenizer: Tokenizer) -> None:
    """GuideLLM's RAG shape: prompts 4096 +- 512 in 2048..6144, answers 512 +- 128 cut to 256..768."""
    requests = _rag(tokenizer, 4, 120, max_model_len=FULL).requests
    prompts = [r.prompt_tokens for r in requests]
    outputs = [r.max_tokens for r in requests]
    assert 4096 - 150 <= statistics.mean(prompts) <= 4096 + 150  # three standard errors of 120 draws
    assert 400 <= statistics.stdev(prompts) <= 640
    assert min(prompts) >= 2048 - 1 and max(prompts) <= 6144 + 1
    assert 512 - 40 <= statistics.mean(outputs) <= 512 + 40
    assert min(outputs) >= 256 and max(outputs) <= 768 and len(set(outputs)) > 50


def _same_document_pairs(tokenizer: Tokenizer, workload: Workload) -> list[tuple[int, int, int, int]]:
    """(prompt tokens a, prompt tokens b, their common token prefix, the shorter share) for each pair
    of requests that draw the same document (their text after the preamble opens alike)."""
    ids = [tokenizer.encode(r.body["prompt"]).ids for r in workload.requests]
    share = rag_module.DEFAULT_REUSE if f"{rag_module.DEFAULT_REUSE:.0%}" in workload.description else None
    assert share is not None
    opening = [r.body["prompt"].split("Document:\n", 1)[-1][:200] for r in workload.requests]
    pairs = []
    for i in range(len(ids)):
        for j in range(i):
            if opening[i] == opening[j]:
                shorter = min(round(share * len(ids[i])), round(share * len(ids[j])))
                pairs.append((len(ids[i]), len(ids[j]), _lcp(ids[i], ids[j]), shorter))
    return pairs


def test_a_request_shares_its_reuse_share_with_its_document_and_nothing_more(tokenizer: Tokenizer) -> None:
    workload = _rag(tokenizer, 9, 40, max_model_len=FULL)
    pairs = _same_document_pairs(tokenizer, workload)
    assert len(pairs) >= 20  # Zipf-popular documents: the top ones come back often
    for _, _, common, shorter in pairs:
        assert shorter - 3 <= common <= shorter + 3  # up to the shorter one's share, to a token or so


@pytest.mark.parametrize("share", [0.0, 0.2, 0.8])
def test_prefix_reuse_sets_the_share(tokenizer: Tokenizer, share: float) -> None:
    workload = build_workload("rag", tokenizer, seed=2, n_requests=30, max_model_len=FULL, prefix_reuse=share)
    assert f"({share:.0%} of each prompt shared)" in workload.description
    ids = [tokenizer.encode(r.body["prompt"]).ids for r in workload.requests]
    for i, mine in enumerate(ids):
        most = max(_lcp(mine, other) for j, other in enumerate(ids) if j != i)
        # never more than its share, but for the passages' header and a chance word: under one 16-token block
        assert most < round(share * len(mine)) + 16
    shared = sum(max(_lcp(m, o) for o in ids[:i]) for i, m in enumerate(ids) if i) / sum(map(len, ids))
    assert shared >= share * 0.5  # most requests find their document already read
    if share == 0.0:
        assert not workload.requests[0].body["prompt"].startswith(rag_module.SYSTEM_PROMPT[:40])


def test_prefix_reuse_is_refused_where_it_means_nothing(tokenizer: Tokenizer) -> None:
    with pytest.raises(ConfigError, match="between 0 and 0.9"):
        build_workload("rag", tokenizer, seed=0, n_requests=2, max_model_len=FULL, prefix_reuse=0.95)
    with pytest.raises(ConfigError, match="the chat preset's sharing is fixed by its structure"):
        build_workload("chat", tokenizer, seed=0, n_requests=2, max_model_len=FULL, prefix_reuse=0.4)


def test_documents_follow_a_zipf_popularity(tokenizer: Tokenizer) -> None:
    workload = _rag(tokenizer, 9, 40, max_model_len=FULL)
    openings = Counter(r.body["prompt"].split("Document:\n", 1)[1][:200] for r in workload.requests)
    assert openings.most_common(1)[0][1] >= 8  # the top document leads a good share of prompts
    assert len(openings) < 30  # far fewer distinct documents than a uniform draw over 64 would give


def test_retrieved_passages_are_corpus_text(tokenizer: Tokenizer) -> None:
    words = " ".join(" ".join(p.split()) for p in load_corpus())
    for request in _rag(tokenizer, 2, 6).requests:
        retrieved = request.body["prompt"].split("Retrieved passages:\n", 1)[1].split("\n\nQuestion: ")[0]
        whole_words = retrieved.rsplit(" ", 1)[0]  # the last word may be cut short
        assert whole_words[:300] in words + " " + words  # an excerpt, which may wrap around the end


def test_short_context_scales_inputs_and_outputs_and_says_so_once(
    tokenizer: Tokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = _rag(tokenizer, 2, 10, max_model_len=1024)
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert err_lines == [
        "rag: model context 1024 is shorter than the preset needs (6928); input and output lengths scaled by 0.15"
    ]
    scale = (1024 - 16) / (6144 + 768)
    for request in workload.requests:
        assert request.prompt_tokens + request.max_tokens <= 1024
        assert round(2048 * scale) - 1 <= request.prompt_tokens <= round(6144 * scale) + 1
        assert round(256 * scale) <= request.max_tokens <= round(768 * scale)


def test_roomy_context_prints_nothing(tokenizer: Tokenizer, capsys: pytest.CaptureFixture[str]) -> None:
    _rag(tokenizer, 2, 2, max_model_len=6928)
    assert capsys.readouterr().err == ""


def test_context_too_small_for_the_prompt_is_a_workload_error(tokenizer: Tokenizer) -> None:
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


# the workload a forked pool worker grows: inherited through the fork, since its ``grow`` is a
# closure no pickle carries (as the performance model's workers inherit theirs)
_DAEMON_WORKLOAD: list[Any] = []


def _grown_in_a_daemon(n: int) -> list[str]:
    workload = _DAEMON_WORKLOAD[0]
    assert workload.grow is not None
    return [r.request_id for r in workload.grow(n)]


def test_a_pool_s_worker_grows_the_requests_itself(tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The performance model predicts in a pool's (daemonic) workers, and a prediction may grow the
    study's requests there: a daemon may not start the processes a large growth uses, so it builds
    them itself, the same requests."""
    import multiprocessing

    from tuner.workloads import build_workload, preset

    monkeypatch.setattr(preset, "PARALLEL_FROM", 4)
    monkeypatch.setattr(preset, "CHUNK", 3)
    _DAEMON_WORKLOAD[:] = [build_workload("rag", tokenizer, seed=3, n_requests=4, max_model_len=2048)]
    try:
        with multiprocessing.get_context("fork").Pool(1) as pool:  # its workers are daemons
            ids = pool.apply(_grown_in_a_daemon, (14,))
    finally:
        _DAEMON_WORKLOAD.clear()
    assert ids == [f"r{i:04d}" for i in range(14)]


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

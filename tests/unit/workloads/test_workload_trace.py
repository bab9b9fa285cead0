"""Replay of the user's own traffic: JSONL bodies and wrappers, ShareGPT, and bad lines named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from tuner.errors import ConfigError
from tuner.workloads import build_workload, source
from tuner.workloads.base import CHAT_ENDPOINT, COMPLETIONS_ENDPOINT, count_tokens
from tuner.workloads.chat_format import render_chat
from tuner.workloads.inspection import jsonl_lines, write_jsonl
from tuner.workloads.trace import read_trace

CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "What is a tuple?"}], "max_tokens": 16}


def _write(tmp_path: Path, lines: list[Any], name: str = "trace.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def _build(path: Path, tokenizer: Tokenizer, **kwargs: Any) -> Any:
    return build_workload(read_trace(path), tokenizer, seed=0, n_requests=None, max_model_len=2048, **kwargs)


def test_bare_bodies_wrappers_and_batch_lines(tmp_path: Path, tokenizer: Tokenizer) -> None:
    lines = [
        {**CHAT, "model": "gpt-x", "stream": True},
        {"body": {"prompt": "Once upon", "max_tokens": 8}, "url": "/v1/completions", "custom_id": "req-2"},
        "",
        {"body": {**CHAT, "max_tokens": 4}, "endpoint": "/v1/chat/completions"},
    ]
    workload = _build(_write(tmp_path, lines), tokenizer)
    first, second, third = workload.requests
    assert first.endpoint == CHAT_ENDPOINT and "model" not in first.body and "stream" not in first.body
    assert first.prompt_tokens == count_tokens(tokenizer, render_chat(CHAT["messages"]))
    assert second.endpoint == COMPLETIONS_ENDPOINT and second.request_id == "req-2" and second.max_tokens == 8
    assert third.max_tokens == 4
    assert workload.name == "trace-trace" and workload.concurrency == 4 and len(workload.warmup) == 1


def test_timestamps_and_sessions(tmp_path: Path, tokenizer: Tokenizer) -> None:
    lines = [
        {**CHAT, "timestamp": 100.0, "session_id": "u1"},
        {**CHAT, "timestamp": 100.5},
        {**CHAT, "timestamp": 103.25, "session_id": "u1"},
    ]
    workload = _build(_write(tmp_path, lines), tokenizer)
    assert [r.arrival_s for r in workload.requests] == [0.0, 0.5, 3.25]
    assert [(r.session_id, r.turn) for r in workload.requests] == [("u1", 0), (None, 0), ("u1", 1)]
    assert workload.arrival.recorded and "trace's timestamps" in workload.description
    retimed = _build(_write(tmp_path, lines), tokenizer, rate=10.0)
    assert retimed.requests[2].arrival_s is None and retimed.requests[1].arrival_s != 0.5
    closed = _build(_write(tmp_path, lines), tokenizer, concurrency=2)
    assert all(r.arrival_s is None for r in closed.requests) and closed.concurrency == 2


def test_missing_max_tokens_gets_a_default_and_one_line(
    tmp_path: Path, tokenizer: Tokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = _build(_write(tmp_path, [{"prompt": "a"}, {"prompt": "b"}, CHAT]), tokenizer)
    assert [r.max_tokens for r in workload.requests] == [256, 256, 16]
    assert capsys.readouterr().err.strip().splitlines() == ["trace.jsonl: 2 requests had no max_tokens: 256 used"]


@pytest.mark.parametrize(
    "bad,message",
    [
        ("{not json", "not JSON"),
        ("[1, 2]", None),  # starts with "[": read as ShareGPT, whose entries must be objects
        ('"just a string"', "expected a JSON object"),
        ({"messages": [], "max_tokens": 4}, "non-empty list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
        ({"messages": [{"role": "user", "content": 5}]}, "string content"),
        ({"prompt": "x", "messages": []}, "exactly one of"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens must be a positive integer"),
        ({"prompt": "x", "timestamp": "noon"}, "timestamp"),
        ({"body": {"prompt": "x"}, "url": "/v1/chat/completions"}, "does not match"),
        ({"body": {"prompt": "x"}, "extends_session": True, "session_id": "s"}, "extends_session"),
    ],
)
def test_a_malformed_line_is_named(tmp_path: Path, bad: Any, message: str | None) -> None:
    path = _write(tmp_path, [CHAT, CHAT, bad, CHAT])
    with pytest.raises(ConfigError) as caught:
        source(str(path))
    if message is not None:
        assert f"{path} line 3: " in str(caught.value) and message in str(caught.value)


def test_timestamps_on_some_lines_only(tmp_path: Path) -> None:
    path = _write(tmp_path, [{**CHAT, "timestamp": 1}, CHAT])
    with pytest.raises(ConfigError, match="line 2: no timestamp"):
        read_trace(path)


def test_a_request_longer_than_the_context_is_named(tmp_path: Path, tokenizer: Tokenizer) -> None:
    path = _write(tmp_path, [CHAT, {"prompt": "word " * 3000, "max_tokens": 8}])
    with pytest.raises(ConfigError, match="line 2: .* exceed the model context of 2048"):
        _build(path, tokenizer)


def test_sharegpt_conversations_become_sessions(tmp_path: Path, tokenizer: Tokenizer) -> None:
    conversations = [
        {
            "id": "c1",
            "conversations": [
                {"from": "human", "value": "Hi there"},
                {"from": "gpt", "value": "Hello! How can I help you today?"},
                {"from": "human", "value": "Explain lists."},
                {"from": "gpt", "value": "A list is a mutable sequence."},
                {"from": "human", "value": "unanswered"},
            ],
        },
        {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Why?"}]},
    ]
    path = tmp_path / "share.json"
    path.write_text(json.dumps(conversations))
    workload = _build(path, tokenizer)
    first, second = workload.requests
    assert (first.session_id, second.session_id, second.turn) == ("c1", "c1", 1)
    assert first.max_tokens == count_tokens(tokenizer, "Hello! How can I help you today?")
    assert [m["role"] for m in second.body["messages"]] == ["user", "assistant", "user"]
    assert second.body["ignore_eos"] is True


def test_bad_sharegpt_entry_is_named(tmp_path: Path) -> None:
    path = tmp_path / "share.json"
    path.write_text(json.dumps([{"conversations": []}, {"conversations": [{"from": "alien", "value": "x"}]}]))
    with pytest.raises(ConfigError, match="entry 2: each turn needs"):
        read_trace(path)


@pytest.mark.parametrize("name", ["rag", "agent", "chat", "json"])
def test_what_tuner_workload_writes_replays_as_the_same_requests(
    tmp_path: Path, tokenizer: Tokenizer, name: str
) -> None:
    preset = build_workload(name, tokenizer, seed=5, n_requests=12, max_model_len=2048)
    path = tmp_path / f"{name}.jsonl"
    write_jsonl(preset, path)
    replayed = _build(path, tokenizer)
    assert [r.wire() for r in replayed.requests] == [r.wire() for r in preset.requests]
    assert [r.wire() for r in replayed.warmup] == [r.wire() for r in preset.warmup]
    assert replayed.concurrency == preset.concurrency and jsonl_lines(replayed) == jsonl_lines(preset)

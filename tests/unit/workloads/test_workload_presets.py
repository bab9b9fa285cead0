"""The agent, chat and json presets, and what every preset shares: determinism, exact lengths,
well-formed structured-output requests, sessions, arrivals and fitting to a short context."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jsonschema
import pytest
from tokenizers import Tokenizer

from tuner.workloads import build_workload
from tuner.workloads.base import CHAT_ENDPOINT, Request, Workload, count_tokens, load_corpus
from tuner.workloads.chat_format import render_chat, render_follow_up
from tuner.workloads.inspection import jsonl_lines
from tuner.workloads.lengths import Fit, Fitter, Render
from tuner.workloads.schemas import AGENT_SCHEMAS, EXTRACTION_SCHEMAS

PRESETS = ("rag", "agent", "chat", "json")


def _build(tokenizer: Tokenizer, name: str, seed: int = 0, n: int = 24, max_model_len: int = 2048) -> Workload:
    return build_workload(name, tokenizer, seed=seed, n_requests=n, max_model_len=max_model_len)


def _prompt_text(request: Request) -> str:
    if request.endpoint != CHAT_ENDPOINT:
        return str(request.body["prompt"])
    render = render_follow_up if request.extends_session else render_chat
    return render(request.body["messages"])


@pytest.mark.parametrize("name", PRESETS)
def test_same_seed_same_bytes_other_seed_other_bytes(tokenizer: Tokenizer, name: str) -> None:
    first, again, other = _build(tokenizer, name, 3), _build(tokenizer, name, 3), _build(tokenizer, name, 4)
    assert jsonl_lines(first) == jsonl_lines(again) and first.digest() == again.digest()
    assert jsonl_lines(first) != jsonl_lines(other) and first.digest() != other.digest()
    assert len(first.requests) == 24


@pytest.mark.parametrize("name", PRESETS)
def test_prompt_tokens_are_the_count_of_what_is_sent(tokenizer: Tokenizer, name: str) -> None:
    workload = _build(tokenizer, name)
    for request in workload.warmup + workload.requests:
        assert request.prompt_tokens == count_tokens(tokenizer, _prompt_text(request)), request.request_id


@pytest.mark.parametrize("name", ["agent", "chat", "json"])  # rag pins its targets in its own tests
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_prompt_lands_within_one_token_of_its_requested_length(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch, name: str, seed: int
) -> None:
    requested: list[tuple[int, int]] = []
    real_fit = Fitter.fit

    def recording_fit(self: Fitter, render: Render, words: Sequence[str], target: int, what: str) -> Fit:
        fit = real_fit(self, render, words, target, what)
        requested.append((target, fit.tokens))
        return fit

    monkeypatch.setattr(Fitter, "fit", recording_fit)
    workload = _build(tokenizer, name, seed=seed, n=30)
    assert len(requested) == len(workload.requests) + len(workload.warmup)
    assert [(t, n) for t, n in requested if abs(n - t) > 1] == []
    assert len({t for t, _ in requested}) > 10  # the lengths really vary


def test_content_lengths_come_on_top_of_the_fixed_text(tokenizer: Tokenizer) -> None:
    words = [w for p in load_corpus()[:5] for w in p.split()]
    fitter = Fitter(tokenizer)

    def render(n: int, partial: str) -> str:
        return "<|user|>\nTool result:\n" + " ".join(words[:n] + ([partial] if partial else [])) + "\n<|assistant|>\n"

    fixed = count_tokens(tokenizer, render(0, ""))
    for content in (1, 7, 50, 123, 300):
        fit = fitter.fit_content(render, words, content, "test")
        assert abs(fit.tokens - fixed - content) <= 1 and fit.tokens == count_tokens(tokenizer, fit.text)


def _structured_requests(tokenizer: Tokenizer) -> list[Request]:
    found = []
    for name in ("agent", "json"):
        workload = _build(tokenizer, name, n=40)
        found += [r for r in workload.warmup + workload.requests if "response_format" in r.body]
    return found


def test_every_structured_request_is_well_formed(tokenizer: Tokenizer) -> None:
    requests = _structured_requests(tokenizer)
    assert len(requests) > 45  # all 40 json requests and a share of the agent's turns
    for request in requests:
        fmt = request.body["response_format"]
        assert set(fmt) == {"type", "json_schema"} and fmt["type"] == "json_schema"
        assert set(fmt["json_schema"]) == {"name", "schema"}
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", fmt["json_schema"]["name"])  # OpenAI's rule for names
        schema = fmt["json_schema"]["schema"]
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema == {**AGENT_SCHEMAS, **EXTRACTION_SCHEMAS}[fmt["json_schema"]["name"]]
        assert fmt["json_schema"]["name"] in str(request.body["messages"])  # the prompt asks for that schema
        assert request.endpoint == CHAT_ENDPOINT and "ignore_eos" not in request.body  # the grammar ends it


@pytest.mark.parametrize(
    "name,good,bad",
    [
        ("next_action", {"thought": "t", "tool": "finish", "arguments": {"query": "q"}}, {"tool": "finish"}),
        ("final_answer", {"answer": "a", "sources": [1, 2]}, {"answer": "a", "sources": [1, 2, 3, 4]}),
        ("ticket", {"title": "t", "priority": "low", "components": []}, {"title": "t", "priority": "soon"}),
        ("glossary", {"terms": [{"term": "a", "definition": "b"}]}, {"terms": [{"term": "a"}]}),
        ("classification", {"topic": "other", "confidence": 0.5, "is_normative": True}, {"topic": "other"}),
        ("summary", {"summary": "s", "keywords": ["k"]}, {"summary": "s" * 101, "keywords": []}),
    ],
)
def test_schemas_accept_and_reject(name: str, good: dict[str, Any], bad: dict[str, Any]) -> None:
    schema = {**AGENT_SCHEMAS, **EXTRACTION_SCHEMAS}[name]
    jsonschema.validate(good, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_agent_sessions_grow_turn_by_turn(tokenizer: Tokenizer) -> None:
    workload = _build(tokenizer, "agent", n=40)
    sessions: dict[str, list[Request]] = {}
    for request in workload.requests:
        assert request.session_id is not None
        sessions.setdefault(request.session_id, []).append(request)
    assert all(len(turns) <= 5 for turns in sessions.values()) and len(sessions) >= 8
    system = workload.requests[0].body["messages"][0]
    for turns in sessions.values():
        assert [t.turn for t in turns] == list(range(len(turns)))
        first, *rest = turns
        assert not first.extends_session and first.body["messages"][0] == system  # the shared preamble
        for turn in rest:
            assert turn.extends_session and [m["role"] for m in turn.body["messages"]] == ["user"]
            assert turn.body["messages"][0]["content"].startswith("Tool result from ")
    json_share = sum("response_format" in r.body for r in workload.requests) / len(workload.requests)
    assert 0.15 <= json_share <= 0.55


def test_open_loop_presets_carry_seeded_release_times(tokenizer: Tokenizer) -> None:
    for name in ("chat", "json"):
        workload = _build(tokenizer, name)
        firsts = [r for r in workload.requests if not r.extends_session]
        times = [r.arrival_s for r in firsts]
        assert times[0] == 0.0 and all(t is not None for t in times)
        assert times == sorted(times)  # type: ignore[type-var]
        assert all(r.arrival_s is None for r in workload.requests if r.extends_session)
        assert workload.arrival.rate == 0.5 and workload.concurrency == len(firsts)


def test_arrival_flags_override_the_preset(tokenizer: Tokenizer) -> None:
    closed = build_workload("chat", tokenizer, seed=0, n_requests=10, max_model_len=2048, concurrency=3)
    assert closed.concurrency == 3 and all(r.arrival_s is None for r in closed.requests)
    opened = build_workload("rag", tokenizer, seed=0, n_requests=10, max_model_len=2048, rate=4.0, burstiness=2.0)
    assert opened.arrival.rate == 4.0 and opened.arrival.burstiness == 2.0
    assert [r.body for r in opened.requests] == [r.body for r in _build(tokenizer, "rag", n=10).requests]


@pytest.mark.parametrize("name,what", [("agent", "input lengths"), ("chat", "input and output lengths")])
def test_short_context_scales_down_and_says_so(
    tokenizer: Tokenizer, capsys: pytest.CaptureFixture[str], name: str, what: str
) -> None:
    workload = _build(tokenizer, name, n=20, max_model_len=1024)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"{name}: model context 1024 is shorter than the preset needs") and what in line
    for request in workload.requests:
        assert request.prompt_tokens + request.max_tokens <= 1024


# What each docstring states of its lengths, in tokens of the target's tokenizer, unscaled: the
# elastic text's range and mean (the part on top of each prompt's fixed text), and the outputs'.
STATED = {
    # chat: user text lognormal median 48, sigma 0.9, in 4..800 (mean about 72); replies median 160,
    # sigma 0.7, in 8..512 (mean about 200), after LMSYS-Chat-1M's per-turn averages
    "chat": {"text": (4, 800, 72), "output": (8, 512, 200)},
    # agent: tasks 60..150 and tool results 80..140 tokens, uniform; 48-token text or <= 96-token JSON turns
    "agent": {"text": (60, 150, (105 + 110) / 2), "output": (48, 96, None)},
    # json: passages 150..300 tokens, uniform; replies capped at 128
    "json": {"text": (150, 300, 225), "output": (128, 128, None)},
}


@pytest.mark.parametrize("name", sorted(STATED))
def test_lengths_follow_the_docstring(tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    contents: list[int] = []
    real = Fitter.fit_content

    def recording(self: Fitter, render: Render, words: Sequence[str], content_tokens: int, what: str) -> Fit:
        contents.append(content_tokens)
        return real(self, render, words, content_tokens, what)

    monkeypatch.setattr(Fitter, "fit_content", recording)
    workload = build_workload(name, tokenizer, seed=5, n_requests=240, max_model_len=16384)  # unscaled
    (low, high, mean), (out_low, out_high, out_mean) = STATED[name]["text"], STATED[name]["output"]
    assert low <= min(contents) and max(contents) <= high
    assert abs(sum(contents) / len(contents) - mean) <= 0.15 * mean  # 240 draws of a wide distribution
    outputs = [r.max_tokens for r in workload.requests]
    assert out_low <= min(outputs) and max(outputs) <= out_high
    if out_mean is not None:
        assert abs(sum(outputs) / len(outputs) - out_mean) <= 0.15 * out_mean

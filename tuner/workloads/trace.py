"""Replay of the user's own traffic: a JSONL file of OpenAI request bodies, or ShareGPT JSON.

JSONL, one request per line (blank lines skipped), in either form:

* a bare request body: ``{"messages": [...], "max_tokens": 128, ...}`` (chat) or
  ``{"prompt": "...", ...}`` (completions), optionally with ``"timestamp"`` (seconds, any origin)
  and ``"session_id"`` beside the OpenAI fields;
* a wrapper: ``{"body": {...}, "url" or "endpoint": "/v1/chat/completions", "timestamp": 12.5,
  "session_id": "abc", "request_id": "...", "extends_session": false, "warmup": false}``, which
  also reads OpenAI batch files and what ``tuner workload --out`` writes.

Lines with a ``session_id`` are sent one after another in file order, each after the previous
response. A line that ``extends_session`` holds only its new messages and is sent after the
session's previous messages and the actual previous response (as the ``agent`` preset does);
otherwise a line is sent as written. With timestamps (on every line that starts a request or a
session; a session's later turns may go without), requests start at the recorded times, a
session's later turns never before the previous response; ``--rate`` or ``--concurrency`` replace
them. ``model`` and ``stream*`` are dropped (the driver sets them); a body without ``max_tokens``
gets 256, said in one line.

A file that starts with ``[`` is ShareGPT (see ``tuner.workloads.trace``). Any malformed line
is a ConfigError that names the file and the line, raised before anything runs.

ShareGPT-format conversations as trace entries.

The file is a JSON array of conversations: ``{"id": ..., "conversations": [{"from": "human",
"value": "..."}, {"from": "gpt", "value": "..."}, ...]}`` (``system``, ``user`` and ``assistant``
are read too). Each human turn that has an answer becomes one chat request holding the
conversation so far, the recorded answers included; the conversation is one session, so its turns
go one after another. ``max_tokens`` is the recorded answer's length in the target's tokens, with
``ignore_eos``, so outputs are as long as they were. A trailing question with no answer is left
out, as serving benchmarks do.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError
from tuner.inputs import parse_bounded, read_text
from tuner.naming import safe_name
from tuner.workloads.arrivals import Arrival
from tuner.workloads.base import CHAT_ENDPOINT, COMPLETIONS_ENDPOINT

DEFAULT_MAX_TOKENS = 256
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_DRIVER_FIELDS = ("model", "stream", "stream_options")


@dataclass(frozen=True)
class TraceEntry:
    where: str  # "line 7" or "entry 3", for messages
    endpoint: str
    body: dict[str, Any]
    session_id: str | None = None
    timestamp: float | None = None
    extends_session: bool = False
    warmup: bool = False
    request_id: str | None = None
    reply: str | None = None  # ShareGPT: the recorded answer, whose length sets max_tokens


@dataclass(frozen=True)
class Trace:
    path: Path
    entries: tuple[TraceEntry, ...]
    defaulted_max_tokens: int = 0
    arrival: Arrival = field(default_factory=Arrival)

    @property
    def name(self) -> str:
        return safe_name(f"trace-{self.path.stem}")


def read_trace(path: Path) -> Trace:
    """Parse and check the whole file; nothing is built or sent from a file with a bad line."""
    text = read_text(path, "a trace", "JSON lines (or a ShareGPT JSON array)")
    if text.lstrip().startswith("["):
        entries = read_sharegpt(path, text)
    else:
        entries = [_entry(path, n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not [e for e in entries if not e.warmup]:
        raise ConfigError(f"{path}: the trace holds no request")
    _check_sessions(path, entries)
    starts = _unit_starts(entries)  # a session's later turns may go without: they follow its replies
    stamped = [e.timestamp is not None for e in starts]
    if any(stamped) and not all(stamped):
        missing = starts[stamped.index(False)]
        raise ConfigError(f"{path} {missing.where}: no timestamp, but other lines have one: give all or none")
    defaulted = sum(1 for e in entries if e.reply is None and not {"max_tokens", "max_completion_tokens"} & set(e.body))
    entries = [_with_max_tokens(e) for e in entries]
    arrival = Arrival(concurrency=None, recorded=True) if all(stamped) else Arrival(concurrency=4)
    return Trace(path, tuple(entries), defaulted, arrival)


def _entry(path: Path, number: int, line: str) -> TraceEntry:
    where = f"line {number}"
    try:
        item = parse_bounded(json.loads, line, f"{path} {where}")
    except ValueError as exc:
        raise ConfigError(f"{path} {where}: not JSON: {exc}") from exc
    if not isinstance(item, dict):
        raise ConfigError(f"{path} {where}: expected a JSON object, got {type(item).__name__}")
    wrapped = "body" in item
    body = item["body"] if wrapped else dict(item)
    if not isinstance(body, dict):
        raise ConfigError(f"{path} {where}: body must be a JSON object")
    meta = item if wrapped else {k: body.pop(k) for k in ("timestamp", "session_id") if k in body}
    try:
        return TraceEntry(
            where=where,
            endpoint=_endpoint(body, meta.get("endpoint") or meta.get("url")),
            body=_clean_body(body),
            session_id=_optional_str(meta.get("session_id"), "session_id"),
            timestamp=_timestamp(meta.get("timestamp")),
            extends_session=_flag(meta.get("extends_session"), "extends_session"),
            warmup=_flag(meta.get("warmup"), "warmup"),
            request_id=_optional_str(meta.get("request_id") or meta.get("custom_id"), "request_id"),
        )
    except ValueError as exc:
        raise ConfigError(f"{path} {where}: {exc}") from exc


def _endpoint(body: dict[str, Any], given: Any) -> str:
    if ("messages" in body) == ("prompt" in body):
        raise ValueError('a body needs exactly one of "messages" (chat) or "prompt" (completions)')
    endpoint = CHAT_ENDPOINT if "messages" in body else COMPLETIONS_ENDPOINT
    if given is not None and given != endpoint:
        raise ValueError(f"endpoint {given!r} does not match the body, which is for {endpoint}")
    if endpoint == CHAT_ENDPOINT:
        body["messages"] = [_message(m) for m in _nonempty_list(body["messages"], "messages")]
    elif not isinstance(body["prompt"], str) or not body["prompt"]:
        raise ValueError("prompt must be a non-empty string")
    return endpoint


def _message(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise ValueError(f"each message needs a role among {', '.join(sorted(ROLES))}")
    content = message.get("content")
    if isinstance(content, list):  # content parts: text only, joined as servers join them
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise ValueError("only text content parts can be replayed")
        content = "\n".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise ValueError("each message needs a string content")
    return {**message, "content": content}


def _clean_body(body: dict[str, Any]) -> dict[str, Any]:
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if key in body and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{key} must be a positive integer")
    return {k: v for k, v in body.items() if k not in _DRIVER_FIELDS}


def _with_max_tokens(entry: TraceEntry) -> TraceEntry:
    body = entry.body
    if entry.reply is not None or "max_tokens" in body or "max_completion_tokens" in body:
        return entry
    return TraceEntry(**{**entry.__dict__, "body": {**body, "max_tokens": DEFAULT_MAX_TOKENS}})


def _nonempty_list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{what} must be a non-empty list")
    return value


def _optional_str(value: Any, what: str) -> str | None:
    if value is None or isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"{what} must be a non-empty string")


def _timestamp(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError("timestamp must be a number of seconds")
    return float(value)


def _flag(value: Any, what: str) -> bool:
    if value is None or isinstance(value, bool):
        return bool(value)
    raise ValueError(f"{what} must be true or false")


def _unit_starts(entries: list[TraceEntry]) -> list[TraceEntry]:
    """The measured entries that start a unit: a lone request, or a session's first turn."""
    seen: set[str] = set()
    starts = []
    for entry in entries:
        if not entry.warmup and (entry.session_id is None or entry.session_id not in seen):
            starts.append(entry)
        if entry.session_id is not None:
            seen.add(entry.session_id)
    return starts


def _check_sessions(path: Path, entries: list[TraceEntry]) -> None:
    seen: set[str] = set()
    for entry in entries:
        if entry.extends_session and (entry.session_id is None or entry.session_id not in seen):
            raise ConfigError(f"{path} {entry.where}: extends_session needs an earlier line of the same session_id")
        if entry.session_id is not None:
            seen.add(entry.session_id)


# ShareGPT files: conversations turned into the trace's entries.
SPEAKERS = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def read_sharegpt(path: Path, text: str) -> list[TraceEntry]:
    try:
        items = parse_bounded(json.loads, text, str(path))
    except ValueError as exc:
        raise ConfigError(f"{path}: not JSON: {exc}") from exc
    if not isinstance(items, list):
        raise ConfigError(f"{path}: a ShareGPT file is a JSON array of conversations")
    entries: list[TraceEntry] = []
    for number, item in enumerate(items, start=1):
        try:
            entries += _conversation(item, number)
        except ValueError as exc:
            raise ConfigError(f"{path} entry {number}: {exc}") from exc
    return entries


def _conversation(item: Any, number: int) -> list[TraceEntry]:
    turns = item.get("conversations") if isinstance(item, dict) else None
    if not isinstance(turns, list):
        raise ValueError('expected an object with a "conversations" list')
    messages = [_sharegpt_message(turn) for turn in turns]
    session = str(item.get("id") or f"conversation-{number}")
    entries = []
    for index, message in enumerate(messages[:-1]):
        answer = messages[index + 1]
        if message["role"] != "user" or answer["role"] != "assistant":
            continue
        body = {"messages": messages[: index + 1], "temperature": 0.0, "ignore_eos": True}
        where = f"entry {number}"
        entries.append(TraceEntry(where, CHAT_ENDPOINT, body, session_id=session, reply=answer["content"]))
    return entries


def _sharegpt_message(turn: Any) -> dict[str, str]:
    if not isinstance(turn, dict) or turn.get("from") not in SPEAKERS or not isinstance(turn.get("value"), str):
        raise ValueError(f'each turn needs "from" (one of {", ".join(SPEAKERS)}) and a string "value"')
    return {"role": SPEAKERS[turn["from"]], "content": turn["value"]}

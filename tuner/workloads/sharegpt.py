"""ShareGPT-format conversations as trace entries.

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
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError
from tuner.workloads.base import CHAT_ENDPOINT
from tuner.workloads.trace import TraceEntry

SPEAKERS = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def read_sharegpt(path: Path, text: str) -> list[TraceEntry]:
    try:
        items = json.loads(text)
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
    messages = [_message(turn) for turn in turns]
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


def _message(turn: Any) -> dict[str, str]:
    if not isinstance(turn, dict) or turn.get("from") not in SPEAKERS or not isinstance(turn.get("value"), str):
        raise ValueError(f'each turn needs "from" (one of {", ".join(SPEAKERS)}) and a string "value"')
    return {"role": SPEAKERS[turn["from"]], "content": turn["value"]}

"""A parsed trace made into the workload a trial drives, for one model's tokenizer and context.

Every request's prompt is counted as the server counts it (chat messages rendered with the chat
template); one that cannot fit the model context with its ``max_tokens`` is a ConfigError naming its
line, before anything runs. Warmup: the trace's own ``warmup`` lines, else a copy of its first
request, as vLLM's benchmark warms up with its first prompt.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from tokenizers import Tokenizer

from tuner.errors import ConfigError
from tuner.workloads.arrivals import Arrival
from tuner.workloads.base import CHAT_ENDPOINT, Request, Slo, Workload, count_tokens
from tuner.workloads.chat_format import render_chat, render_follow_up
from tuner.workloads.preset import Drafted, assemble
from tuner.workloads.trace import DEFAULT_MAX_TOKENS, Trace, TraceEntry


def build_trace(
    trace: Trace, tokenizer: Tokenizer, seed: int, n_requests: int | None, max_model_len: int, arrival: Arrival
) -> Workload:
    """The trace's first ``n_requests`` requests (None: all) and its warmup, released as ``arrival``."""
    measured = [e for e in trace.entries if not e.warmup][:n_requests]
    origin = min((e.timestamp for e in measured if e.timestamp is not None), default=0.0)
    requests = [_request(trace, e, f"r{i:04d}", tokenizer, max_model_len, origin) for i, e in enumerate(measured)]
    turns: dict[str, int] = {}
    for index, request in enumerate(requests):
        if request.session_id is not None:
            turns[request.session_id] = turns.get(request.session_id, -1) + 1
            requests[index] = replace(request, turn=turns[request.session_id])
    ids = [r.request_id for r in requests]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{trace.path}: request_id values repeat")
    warmup_entries = [e for e in trace.entries if e.warmup] or [e for e in measured if not e.extends_session][:1]
    warmup = [
        replace(_request(trace, e, f"w{i:03d}", tokenizer, max_model_len, origin), session_id=None, arrival_s=None)
        for i, e in enumerate(warmup_entries)
    ]
    n_sessions = len({r.session_id for r in requests if r.session_id is not None})
    description = f"trace {trace.path.name}: {len(requests)} requests, {n_sessions} sessions"
    if trace.defaulted_max_tokens:
        description += f", {trace.defaulted_max_tokens} without max_tokens"
    workload = assemble(trace.name, seed, Drafted(requests, warmup, description), arrival, Slo())
    if trace.defaulted_max_tokens:  # said only of a trace that loaded: an error after it must be the one line
        print(
            f"{trace.path.name}: {trace.defaulted_max_tokens} requests had no max_tokens: {DEFAULT_MAX_TOKENS} used",
            file=sys.stderr,
        )
    return workload


def _request(
    trace: Trace, entry: TraceEntry, default_id: str, tokenizer: Tokenizer, max_model_len: int, origin: float
) -> Request:
    body = dict(entry.body)
    if entry.reply is not None:
        body["max_tokens"] = max(count_tokens(tokenizer, entry.reply), 1)
    max_tokens = int(body.get("max_tokens") or body["max_completion_tokens"])
    if entry.endpoint == CHAT_ENDPOINT:
        render = render_follow_up if entry.extends_session else render_chat
        prompt_tokens = count_tokens(tokenizer, render(body["messages"]))
    else:
        prompt_tokens = count_tokens(tokenizer, body["prompt"])
    if not entry.extends_session and prompt_tokens + max_tokens > max_model_len:
        raise ConfigError(
            f"{trace.path} {entry.where}: {prompt_tokens} prompt tokens and max_tokens {max_tokens} "
            f"exceed the model context of {max_model_len}"
        )
    arrival_s = None if entry.timestamp is None else round(entry.timestamp - origin, 6)
    return Request(
        request_id=entry.request_id or default_id,
        endpoint=entry.endpoint,
        body=body,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        session_id=entry.session_id,
        turn=0,
        extends_session=entry.extends_session,
        arrival_s=arrival_s,
    )

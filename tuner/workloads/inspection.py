"""What ``tuner workload`` shows: the exact requests as JSONL, their lengths and their sharing.

The JSONL holds one line per request, warmup first (``"warmup": true``), in the wrapper form that
``--workload FILE`` replays: ``request_id``, ``endpoint``, ``session_id``, ``turn``,
``extends_session``, ``timestamp`` (the open-loop release time, or null), ``prompt_tokens``,
``max_tokens``, ``warmup`` and ``body``.

The shared-prefix fraction is the share of prompt tokens that an unbounded prefix cache with
16-token blocks could reuse: full blocks whose whole prefix an earlier prompt (warmup included)
already had. A follow-up turn's prompt is not known before its previous response is: it is taken
to share everything before that response, and its length counts the response at ``max_tokens``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from tuner.errors import ConfigError
from tuner.workloads.base import CHAT_ENDPOINT, Request, Workload
from tuner.workloads.chat_format import render_chat

BLOCK_TOKENS = 16


def jsonl_lines(workload: Workload) -> list[str]:
    lines = []
    for warmup, request in [(True, r) for r in workload.warmup] + [(False, r) for r in workload.requests]:
        wire = request.wire()
        item: dict[str, Any] = {k: wire[k] for k in ("request_id", "endpoint", "session_id", "turn", "extends_session")}
        item.update(timestamp=wire["arrival_s"], prompt_tokens=wire["prompt_tokens"], max_tokens=wire["max_tokens"])
        item.update(warmup=warmup, body=wire["body"])
        lines.append(json.dumps(item, separators=(",", ":"), ensure_ascii=True))
    return lines


def check_writable(path: Path) -> None:
    """Refuse, before anything is built, a path a file cannot be written at (a folder under a file,
    no permission): bad input, said in one line. Makes the missing folders, as writing would."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {path}: cannot write there ({exc.strerror or exc})") from exc
    if path.is_dir() or not os.access(path.parent, os.W_OK):
        raise ConfigError(f"--out {path}: cannot write there ({'a folder' if path.is_dir() else 'no permission'})")


def write_jsonl(workload: Workload, path: Path) -> None:
    """Write atomically: a half-written file is never left behind. A path that cannot be written (a
    folder under a file, no permission, a full disk) is bad input, said in one line."""
    check_writable(path)
    staging = path.with_name(path.name + ".tmp")
    try:
        staging.write_text("".join(line + "\n" for line in jsonl_lines(workload)), encoding="ascii")
        staging.replace(path)
    except OSError as exc:  # a full disk, or a folder that changed under us
        staging.unlink(missing_ok=True)
        raise ConfigError(f"--out {path}: cannot write there ({exc.strerror or exc})") from exc


def prompt_lengths(workload: Workload) -> list[int]:
    """Each request's whole prompt; a follow-up's counts the previous responses at ``max_tokens``."""
    lengths: list[int] = []
    previous: dict[str, tuple[int, int]] = {}  # session -> (its last prompt, that turn's max_tokens)
    for request in workload.requests:
        tokens = request.prompt_tokens
        if request.extends_session and request.session_id in previous:
            prompt, reply = previous[request.session_id]
            tokens += prompt + reply
        if request.session_id is not None:
            previous[request.session_id] = (tokens, request.max_tokens)
        lengths.append(tokens)
    return lengths


def shared_prefix_fraction(workload: Workload, tokenizer: Tokenizer) -> float:
    seen: set[bytes] = set()
    for request in workload.warmup:
        _blocks(_prompt_ids(request, tokenizer), seen)
    shared = total = 0
    history: dict[str, int] = {}  # session -> tokens of its last prompt, which a follow-up reuses
    for request, length in zip(workload.requests, prompt_lengths(workload), strict=True):
        total += length
        if request.extends_session and request.session_id in history:
            shared += history[request.session_id] // BLOCK_TOKENS * BLOCK_TOKENS
        else:
            shared += _blocks(_prompt_ids(request, tokenizer), seen) * BLOCK_TOKENS
        if request.session_id is not None:
            history[request.session_id] = length
    return shared / total if total else 0.0


def _prompt_ids(request: Request, tokenizer: Tokenizer) -> list[int]:
    body = request.body
    text = render_chat(body["messages"]) if request.endpoint == CHAT_ENDPOINT else body["prompt"]
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


def block_keys(ids: list[int]) -> list[bytes]:
    """The prompt's full blocks as chained hashes: two prompts share a block's key exactly when they
    share every token up to its end, which is what a prefix cache can reuse."""
    chain, keys = hashlib.sha256(), []
    for start in range(0, len(ids) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        chain.update(np.asarray(ids[start : start + BLOCK_TOKENS], dtype=np.int64).tobytes())
        keys.append(chain.digest())
    return keys


def prompt_blocks(request: Request, tokenizer: Tokenizer) -> list[bytes]:
    """``block_keys`` of a request's prompt (a follow-up's own part only)."""
    return block_keys(_prompt_ids(request, tokenizer))


def _blocks(ids: list[int], seen: set[bytes]) -> int:
    """Add the prompt's chained block hashes to ``seen``; return how many were there already."""
    hits, matching = 0, True
    for key in block_keys(ids):
        matching = matching and key in seen
        hits += matching
        seen.add(key)
    return hits


def summary_lines(workload: Workload, tokenizer: Tokenizer) -> list[str]:
    requests = workload.requests
    follow_ups = [r.prompt_tokens for r in requests if r.extends_session]
    json_turns = sum(1 for r in requests if "response_format" in r.body)
    lines = [
        f"{workload.name}: {len(requests)} requests ({_sessions(requests)} multi-turn sessions), "
        f"{len(workload.warmup)} warmup; digest {workload.digest()[:16]}",
        f"  {workload.description}",
        "  prompt tokens      "
        + _stats(prompt_lengths(workload))
        + (" (follow-ups at max_tokens replies)" if follow_ups else ""),
    ]
    if follow_ups:
        lines.append("  appended per turn  " + _stats(follow_ups) + " (after the actual previous response)")
    lines += [
        "  max_tokens         " + _stats([r.max_tokens for r in requests]),
        f"  JSON output        {json_turns} of {len(requests)} requests (response_format json_schema)",
        f"  shared prefix      {shared_prefix_fraction(workload, tokenizer):.1%} of prompt tokens "
        f"({BLOCK_TOKENS}-token blocks an earlier prompt had)",
        f"  SLO                {workload.slo.describe()}",
    ]
    return lines


def _sessions(requests: tuple[Request, ...]) -> int:
    return len({r.session_id for r in requests if r.session_id is not None})


def _stats(values: list[int]) -> str:
    p50, p95 = np.percentile(np.asarray(values, dtype=float), [50, 95])
    return f"min {min(values)}  p50 {p50:.0f}  mean {sum(values) / len(values):.0f}  p95 {p95:.0f}  max {max(values)}"

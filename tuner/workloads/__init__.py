"""Workloads: seeded presets that look like production traffic, and replay of the user's own.

``build_workload`` is the one entry point: a preset name from ``WORKLOADS`` (see each module's
docstring for its definition) or the path of a trace file (``tuner.workloads.trace``). The command
line's ``--concurrency``, ``--rate`` and ``--burstiness`` override the preset's arrival pattern.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TypedDict, Unpack

from tokenizers import Tokenizer

from tuner.errors import ConfigError
from tuner.workloads import agent, chat, rag, structured
from tuner.workloads.arrivals import Arrival, override
from tuner.workloads.base import CHAT_ENDPOINT, Request, Workload, count_tokens, load_tokenizer
from tuner.workloads.chat_format import check_template
from tuner.workloads.preset import Preset, assemble, grow
from tuner.workloads.replay import build_trace
from tuner.workloads.trace import Trace, read_trace

__all__ = [
    "WORKLOADS",
    "Arrival",
    "Request",
    "Workload",
    "build_workload",
    "count_tokens",
    "load_tokenizer",
    "source",
    "workload_for_model",
]

WORKLOADS: dict[str, Preset] = {p.name: p for p in (rag.PRESET, agent.PRESET, chat.PRESET, structured.PRESET)}
DEFAULT_REQUESTS = 16  # open loop; a closed loop gets REQUESTS_PER_SLOT x its concurrency if that is more
REQUESTS_PER_SLOT = 10  # "at least 10 x concurrency requests" (vLLM's and AIPerf's practice)


def default_requests(arrival: Arrival) -> int:
    """Measured requests of a preset when ``--requests`` is not given."""
    if arrival.open_loop or arrival.concurrency is None:
        return DEFAULT_REQUESTS
    return max(DEFAULT_REQUESTS, REQUESTS_PER_SLOT * arrival.concurrency)


def source(name: str) -> str | Trace:
    """A preset's name as given, or the parsed trace file ``name`` names (a bad file: ConfigError)."""
    if name in WORKLOADS:
        return name
    path = Path(name)
    if path.exists():  # a folder or a device file too: read_trace says why it is not a trace
        return read_trace(path)
    if path.suffix in (".json", ".jsonl") or "/" in name:
        raise ConfigError(f"--workload {name}: no such trace file")
    raise ConfigError(f"unknown workload {name!r}; known workloads: {', '.join(WORKLOADS)}, or a trace file path")


class WorkloadShape(TypedDict, total=False):
    """How a workload is built beside its name and tokenizer (``build_workload``, ``workload_for_model``)."""

    concurrency: int | None  # the arrival pattern's overrides: closed loop at C, or open loop at a rate
    rate: float | None
    burstiness: float | None
    prefix_reuse: float | None  # the share of each prompt shared as a prefix, for a preset that has one
    n_warmup: int  # warmup requests, 2 when not given


def build_workload(
    name: str | Trace,
    tokenizer: Tokenizer,
    *,
    seed: int,
    n_requests: int | None,
    max_model_len: int,
    **shape: Unpack[WorkloadShape],
) -> Workload:
    """Build a preset (``n_requests`` None: ``default_requests``) or a trace (None: all of it)."""
    concurrency, rate, burstiness = shape.get("concurrency"), shape.get("rate"), shape.get("burstiness")
    prefix_reuse, n_warmup = shape.get("prefix_reuse"), shape.get("n_warmup", 2)
    if n_requests is not None and n_requests < 1:
        raise ConfigError(f"--requests must be at least 1, got {n_requests}")
    if isinstance(name, Trace) and prefix_reuse is not None:
        raise ConfigError("--prefix-reuse shapes a preset; a trace's prompts share what they share")
    if isinstance(name, Trace):
        trace = name
        arrival = override(trace.arrival, concurrency, rate, burstiness)

        def grow_trace(n: int) -> tuple[Request, ...]:  # up to the whole file, then it is replayed
            return build_trace(trace, tokenizer, seed, n, max_model_len, arrival).requests

        return replace(build_trace(trace, tokenizer, seed, n_requests, max_model_len, arrival), grow=grow_trace)
    preset = WORKLOADS.get(name)
    if preset is None:
        raise ConfigError(f"unknown workload {name!r}; known workloads: {', '.join(WORKLOADS)}")
    if prefix_reuse is not None:
        if preset.with_reuse is None:
            with_share = ", ".join(n for n, p in WORKLOADS.items() if p.with_reuse is not None)
            raise ConfigError(
                f"--prefix-reuse: the {name} preset's sharing is fixed by its structure (a share: {with_share})"
            )
        preset = preset.with_reuse(prefix_reuse)
    arrival = override(preset.arrival, concurrency, rate, burstiness)
    drafted = preset.make(tokenizer, seed, n_requests or default_requests(arrival), max_model_len, n_warmup)

    built = list(drafted.requests)

    def grow_preset(n: int) -> tuple[Request, ...]:
        if preset.make_range is not None:  # only the requests not built yet
            built.extend(grow(preset, tokenizer, seed, max_model_len, built, n))
            return tuple(built)
        return assemble(
            preset.name, seed, preset.make(tokenizer, seed, n, max_model_len, n_warmup), arrival, preset.slo
        ).requests

    workload = assemble(preset.name, seed, drafted, arrival, preset.slo, preset.tiers)
    return replace(workload, grow=grow_preset)


def workload_for_model(
    name: str | Trace,
    model_dir: Path,
    *,
    seed: int,
    n_requests: int | None,
    max_model_len: int,
    **shape: Unpack[WorkloadShape],
) -> Workload:
    """``build_workload`` with the model's own tokenizer; says once if chat lengths are approximate."""
    tokenizer = load_tokenizer(model_dir)
    workload = build_workload(name, tokenizer, seed=seed, n_requests=n_requests, max_model_len=max_model_len, **shape)
    if any(r.endpoint == CHAT_ENDPOINT for r in workload.requests):
        check_template(model_dir, workload.name)
    return workload

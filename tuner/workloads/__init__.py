"""Workload presets: each builds a fixed, seeded list of requests for one model's tokenizer.

``build_workload`` is the one entry point; ``WORKLOADS`` maps a preset name to its builder.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenizers import Tokenizer

from tuner.errors import ConfigError
from tuner.workloads.base import Request, Workload, count_tokens, load_tokenizer
from tuner.workloads.rag import build_rag

__all__ = ["WORKLOADS", "Request", "Workload", "build_workload", "count_tokens", "load_tokenizer"]


# A builder takes (tokenizer, *, seed, n_requests, max_model_len, concurrency=..., ...) -> Workload.
WORKLOADS: dict[str, Callable[..., Workload]] = {"rag": build_rag}


def build_workload(
    name: str,
    tokenizer: Tokenizer,
    *,
    seed: int,
    n_requests: int,
    max_model_len: int,
    concurrency: int | None = None,
) -> Workload:
    """Build preset ``name``; ``concurrency=None`` keeps the preset's own default."""
    builder = WORKLOADS.get(name)
    if builder is None:
        raise ConfigError(f"unknown workload {name!r}; known workloads: {', '.join(sorted(WORKLOADS))}")
    extra: dict[str, Any] = {} if concurrency is None else {"concurrency": concurrency}
    return builder(tokenizer, seed=seed, n_requests=n_requests, max_model_len=max_model_len, **extra)

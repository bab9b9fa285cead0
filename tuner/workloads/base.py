"""Workload data types, and the tokenizer and corpus every preset builds its prompts from.

A workload is fixed before the first trial: the same preset, seed and tokenizer give byte-identical
requests, so trials differ only in the engine settings under test. ``Workload.digest`` fingerprints
the exact bodies so a study can refuse to mix results from different workloads.

Token counts use the model's own ``tokenizer.json`` through the ``tokenizers`` library (never
transformers). Counts exclude special tokens: a server may add a BOS token on top.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from tuner.errors import WorkloadError

COMPLETIONS_ENDPOINT = "/v1/completions"
CHAT_ENDPOINT = "/v1/chat/completions"


@dataclass(frozen=True)
class Request:
    """One request of a workload; ``body`` lacks ``model`` and ``stream*``, which the driver adds."""

    request_id: str
    endpoint: str
    body: dict[str, Any]
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class Workload:
    """The requests of one trial: ``warmup`` is sent first and discarded, then ``requests``."""

    name: str
    seed: int
    requests: tuple[Request, ...]
    warmup: tuple[Request, ...]
    concurrency: int
    description: str

    def digest(self) -> str:
        """Sha256 hex of the canonical JSON of what the server sees; equal inputs, equal digest."""
        canonical = {
            "name": self.name,
            "seed": self.seed,
            "concurrency": self.concurrency,
            "warmup": [r.body for r in self.warmup],
            "requests": [r.body for r in self.requests],
        }
        text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(text.encode("ascii")).hexdigest()


def load_tokenizer(model_dir: Path) -> Tokenizer:
    """Load ``tokenizer.json`` from a model folder; a missing or unreadable file is a WorkloadError."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise WorkloadError(f"tokenizer not found: {path} (the model folder needs a tokenizer.json)")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust binding raises a bare Exception on a bad file
        raise WorkloadError(f"cannot read tokenizer {path}: {exc}") from exc


def count_tokens(tok: Tokenizer, text: str) -> int:
    """Tokens of ``text`` without special tokens, as a prompt's content is counted."""
    return len(tok.encode(text, add_special_tokens=False).ids)


@lru_cache(maxsize=1)
def load_corpus() -> tuple[str, ...]:
    """The shipped passages (Python documentation text, PSF license), one per line."""
    try:
        text = resources.files("tuner.workloads").joinpath("corpus.txt").read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"cannot read the packaged corpus tuner/workloads/corpus.txt: {exc}") from exc
    passages = tuple(line for line in text.splitlines() if line.strip())
    if not passages:
        raise WorkloadError("the packaged corpus tuner/workloads/corpus.txt is empty")
    return passages

"""Workload data types, and the tokenizer and corpus every preset builds its prompts from.

A workload is fixed before the first trial: the same preset, seed and tokenizer give byte-identical
requests, so trials differ only in the engine settings under test. ``Workload.digest`` fingerprints
the exact requests and how they are released, so a study can refuse to mix results from different
workloads.

Token counts use the model's own ``tokenizer.json`` through the ``tokenizers`` library (never
transformers). Counts exclude special tokens: a server may add a BOS token on top.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from tuner.errors import WorkloadError
from tuner.workloads.arrivals import Arrival

COMPLETIONS_ENDPOINT = "/v1/completions"
CHAT_ENDPOINT = "/v1/chat/completions"


@dataclass(frozen=True)
class Request:
    """One request of a workload; ``body`` lacks ``model`` and ``stream*``, which the driver adds.

    Requests that share a ``session_id`` are sent one after another, in list order, each once the
    previous response has arrived. A request that ``extends_session`` carries only its new
    messages (or prompt text): the driver sends the previous turn's messages, then the previous
    turn's actual response as an assistant message, then these. ``prompt_tokens`` is then the
    number of tokens the turn appends after that response; otherwise it is the whole prompt.
    ``arrival_s`` is the open-loop release time, in seconds after the run starts (None: closed loop).
    """

    request_id: str
    endpoint: str
    body: dict[str, Any]
    prompt_tokens: int
    max_tokens: int
    session_id: str | None = None
    turn: int = 0
    extends_session: bool = False
    arrival_s: float | None = None

    def wire(self) -> dict[str, Any]:
        """Everything that decides what the server sees and when, as plain JSON."""
        return {
            "request_id": self.request_id,
            "endpoint": self.endpoint,
            "session_id": self.session_id,
            "turn": self.turn,
            "extends_session": self.extends_session,
            "arrival_s": self.arrival_s,
            "prompt_tokens": self.prompt_tokens,
            "max_tokens": self.max_tokens,
            "body": self.body,
        }


@dataclass(frozen=True)
class Slo:
    """A preset's default service-level objectives (None: no objective on that metric)."""

    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None
    e2e_p95_ms: float | None = None

    def describe(self) -> str:
        parts = [f"{label} <= {value:g} ms" for label, value in self._named() if value is not None]
        return ", ".join(parts) or "none"

    def as_dict(self) -> dict[str, float | None]:
        return {f"{label.lower().replace(' ', '_')}_ms": value for label, value in self._named()}

    def _named(self) -> list[tuple[str, float | None]]:
        return [("TTFT p95", self.ttft_p95_ms), ("TPOT p95", self.tpot_p95_ms), ("E2E p95", self.e2e_p95_ms)]


TIER_NAMES = ("interactive", "relaxed")
DEFAULT_TIER = TIER_NAMES[0]  # what --objective capacity scores unless --tier says otherwise


@dataclass(frozen=True)
class Tiers:
    """A preset's two SLO tiers for capacity: ``interactive`` (strict bounds) and ``relaxed`` (looser).

    Each tier holds for one kind of device: ``gpu`` for a real model on a GPU, ``cpu`` for the
    generated model on the CPU build, which is far slower per token, so a GPU tier would refuse every
    request there. Each preset's module says where its values come from.
    """

    gpu: Mapping[str, Slo] = field(default_factory=dict)
    cpu: Mapping[str, Slo] = field(default_factory=dict)

    def for_device(self, kind: str) -> dict[str, Slo]:
        return dict(self.cpu if kind == "cpu" else self.gpu)


@dataclass(frozen=True)
class Workload:
    """The requests of one trial: ``warmup`` is sent first and discarded, then ``requests``.

    ``concurrency`` is the most requests in flight: the closed loop's concurrency, or the open
    loop's cap (the driver reads the open-loop release times from the requests themselves).
    """

    name: str
    seed: int
    requests: tuple[Request, ...]
    warmup: tuple[Request, ...]
    concurrency: int
    description: str
    arrival: Arrival = field(default_factory=Arrival)
    slo: Slo = field(default_factory=Slo)
    tiers: Tiers = field(default_factory=Tiers)  # capacity's SLO tiers; not part of the digest
    # The same workload built with at least N requests, ``requests`` first (None: it cannot grow).
    # A capacity search takes its distinct requests from it; not part of the digest.
    grow: Callable[[int], tuple[Request, ...]] | None = field(default=None, compare=False, repr=False)

    def digest(self) -> str:
        """Sha256 hex of the canonical JSON of what the server sees; equal inputs, equal digest."""
        canonical = {
            "name": self.name,
            "seed": self.seed,
            "concurrency": self.concurrency,
            "arrival": self.arrival.as_dict(),
            "warmup": [r.wire() for r in self.warmup],
            "requests": [r.wire() for r in self.requests],
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


@lru_cache(maxsize=1)
def corpus_words() -> tuple[str, ...]:
    """The corpus as one run of words, passages in file order: excerpts are slices of it."""
    return tuple(word for passage in load_corpus() for word in passage.split())

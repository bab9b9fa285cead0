"""The engine adapter contract: the one plug point every engine implements.

An ``EngineAdapter`` is pure logic: it performs no I/O, so it can be unit-tested and used by
``tuner plan`` on any machine. Its contract, checked for every adapter by
``tests/contract/test_engine_contract.py``:

* ``launch(config, model, device, port, python, version)`` returns a ``LaunchSpec`` whose argv
  is a list (never a shell string) starting with the engine environment's Python. A parameter
  absent from ``config.params`` emits no flag, so the engine's own default applies. Only flags
  that the given engine ``version`` accepts are emitted; ``check_version`` refuses the others.
* Speculative decoding is on in the argv exactly when ``num_speculative_tokens > 0``.
* ``health_path`` answers 200 once the server can serve; ``failure_signatures`` map log text to a
  failure class (see ``tuner.measure.failures``), first match wins.
* ``server_stats(before, after)`` turns two ``/metrics`` scrapes into named deltas:
  ``spec_acceptance_rate``, ``spec_mean_accept_len``, ``preemptions``, ``prefix_cache_hit_rate``,
  ``server_ttft_mean_ms`` (None where the engine did not report it).
* ``default_params(device)`` names the engine's defaults for the enqueued baseline trial.
* ``default_memory_fraction`` is the share of device memory the engine takes when no memory
  fraction is given (None: the engine derives it itself), and ``kv_tokens_required(model)`` the KV
  cache in tokens below which it refuses to start; the memory screen (``tuner.search.memory``) uses both.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.errors import EnvironmentSetupError


@dataclass(frozen=True)
class ModelSpec:
    """The served target, the drafts a trial may choose from, and the context length to serve."""

    path: str
    drafts: Mapping[str, str] = field(default_factory=dict)
    max_model_len: int = 2048
    load_format: str | None = None


@dataclass(frozen=True)
class Device:
    """Where the engine runs. On ``cpu`` the memory fraction applies to ``memory_bytes``, a budget."""

    kind: str  # "cpu" or "cuda"
    name: str
    memory_bytes: int


@dataclass(frozen=True)
class Config:
    """One point of the search space; a parameter absent from ``params`` means the engine default."""

    engine: str
    params: Mapping[str, Any]
    enforce_eager: bool = False
    is_default: bool = False


@dataclass(frozen=True)
class LaunchSpec:
    engine: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    port: int
    health_path: str
    served_model: str
    ready_line: str | None = None  # where set, the log must show it too before the server counts as ready


class EngineAdapter(abc.ABC):
    """Builds commands for one engine and reads what it reports. See the module docstring."""

    name: str
    distributions: tuple[str, ...]  # package names that carry the engine's version
    module: str  # run as ``python -m module``
    supported_versions: tuple[str, ...]  # "major.minor" or full versions
    health_path: str = "/health"
    ready_line: str | None = None
    reset_cache_path: str | None = None  # POST here after warmup empties the prefix cache
    needs_gpu: bool = False  # an engine with no CPU build is left out of studies on a machine without a GPU
    ttft_histogram: str = ""
    failure_signatures: tuple[tuple[str, str], ...] = ()
    default_memory_fraction: float | None = None

    def kv_tokens_required(self, model: ModelSpec) -> int:
        return 1  # any positive KV pool

    def check_version(self, version: str) -> None:
        if not any(version == v or version.startswith(v + ".") for v in self.supported_versions):
            raise EnvironmentSetupError(
                f"{self.name} {version} is not supported; supported: {', '.join(self.supported_versions)}"
            )

    @abc.abstractmethod
    def launch(
        self, config: Config, model: ModelSpec, device: Device, port: int, python: str, version: str
    ) -> LaunchSpec: ...

    @abc.abstractmethod
    def server_stats(self, before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float | None]: ...

    @abc.abstractmethod
    def default_params(self, device: Device) -> dict[str, Any]: ...

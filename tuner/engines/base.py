"""The engine adapter contract: the one plug point every engine implements.

An ``EngineAdapter`` is pure logic: it performs no I/O, so it can be unit-tested and used by
``tuner plan`` on any machine. Its contract, checked for every adapter by
``tests/contract/test_engine_contract.py``:

* ``launch(config, model, device, port, python, version)`` returns the one ``LaunchSpec`` of the
  trial: the engine environment's Python, the module, the engine's own flags (``args``, opening
  with the model flag and its path, never the address), the host and port, and the environment.
  A parameter absent from ``config.params`` emits no flag, so the engine's own default applies.
  Only flags that the given engine ``version`` accepts are emitted; ``check_version`` refuses the
  others.
* Speculative decoding is on in the argv exactly when ``num_speculative_tokens > 0`` and the
  ``spec_method`` is not off (``tuner.engines.speculation``). ``spec_methods`` maps each
  engine-neutral method the engine runs to ``SpecSupport``: its own name for it, the
  engine-specific parameters it takes, what its environment needs and which versions have it; a
  method missing there is one the engine lacks.
* ``health_path`` answers 200 once the server can serve; ``failure_signatures`` map the engine's
  own log text to a failure class (see ``tuner.measure.failures``, which adds the signatures of
  Python, torch and the OS after them), first match wins. ``image`` is the engine's
  official container image and ``default_port`` the port its server listens on by default (the
  exports use both), ``export_formats`` the launch files ``tuner export`` writes by default and
  ``runtime_class`` the engine's own Python launcher (``package.Class(**kwargs)``; None: the
  server module is run), ``check_script`` the script that puts argv through the engine's own
  parser in its environment (``tuner.deploy.verify``), ``ttft_histogram`` its ``/metrics`` TTFT
  histogram, ``waiting_gauge`` its gauge of requests waiting to be scheduled (a capacity step must
  not pass while it keeps growing).
* ``server_stats(before, after)`` turns two ``/metrics`` scrapes into named deltas:
  ``spec_acceptance_rate``, ``spec_mean_accept_len`` (both over the steps that proposed),
  ``spec_draft_share`` (the share of decode steps that proposed: below 1 where a model-free lookup
  found no match), ``preemptions``, ``prefix_cache_hit_rate``, ``server_ttft_mean_ms`` (None where
  the engine did not report it).
* ``default_params(device)`` names the engine's defaults for the enqueued baseline trial.
* ``default_memory_fraction`` is the share of device memory the engine takes when no memory
  fraction is given (None: the engine derives it itself), and ``kv_tokens_required(model)`` the KV
  cache in tokens below which it refuses to start; the memory screen (``tuner.search.memory``) uses both.
* ``config_overrides`` are the engine's log lines that say it changed the config it was asked for
  (a feature turned off, a cap set), each with what it means; ``overrides_in(log)`` reads them off a
  boot's log, so a trial's record says what the engine really ran.
* ``draft_slots_signature`` is the engine's message when speculative drafting leaves no token to
  schedule, and ``draft_slots(params)`` the scheduling slots a request's drafting takes under
  ``params`` (None: the engine does not say); ``tuner.search.rejections`` generalises such a
  rejection by them.
* ``refusal(params, device, version, eager)`` is why the engine at ``version`` refuses ``params`` on
  ``device`` (``eager``: without CUDA graphs) before it serves, by its own validation or by a failure
  at boot the adapter knows, in a few words (None: nothing the adapter knows of), worked out from
  ``draft_slots`` and ``scheduler_limits`` where those say; ``tuner plan`` leaves such a config
  out and ``tuner search`` records it as ``invalid_config`` without a boot.
* The engine's own benchmark client, for ``tuner verify``: ``bench_dataset(prompts, output_lens)``
  is the text of a dataset file holding exactly those prompts, ``bench_argv(...)`` the client's
  command on it (open loop, Poisson, greedy, ``ignore_eos``; each request's own output length where
  ``bench_own_output_lens``, else one for all), and ``bench_rows(result)``
  turns the client's per-request output into request rows (``BenchRows``). An engine without one
  leaves ``bench_module`` None and the three raise ``EnvironmentSetupError``.
"""

from __future__ import annotations

import abc
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tuner.engines.speculation import DRAFT_MODEL, OFF, SpecSupport, method_of
from tuner.engines.versions import matches
from tuner.errors import ConfigError, EnvironmentSetupError


@dataclass(frozen=True)
class ModelSpec:
    """The served target, the drafts and heads a trial may choose from, and the context length to serve.

    ``draft_kinds`` says which method each draft serves (``tuner.engines.drafts``; one not named is a
    draft model), ``mtp_layers`` how many MTP layers the target ships (0: MTP cannot run)."""

    path: str
    drafts: Mapping[str, str] = field(default_factory=dict)
    max_model_len: int = 2048
    load_format: str | None = None
    draft_kinds: Mapping[str, str] = field(default_factory=dict)
    mtp_layers: int = 0

    def kind(self, draft: str) -> str:
        """The method the draft named ``draft`` serves."""
        return self.draft_kinds.get(draft, DRAFT_MODEL)

    def drafts_for(self, method: str) -> list[str]:
        """The drafts and heads that serve ``method``, in the order given."""
        return [name for name in self.drafts if self.kind(name) == method]

    def draft_path(self, draft: str) -> str:
        """The folder of the draft named ``draft``: one of ``drafts``, or a model folder given by path;
        any other name is bad input, never passed to an engine as a path."""
        if draft in self.drafts:
            return self.drafts[draft]
        if (Path(draft) / "config.json").is_file():
            return draft
        known = ", ".join(self.drafts) or "none: give one with --draft-model"
        raise ConfigError(f"draft_model: no draft {draft!r} here; drafts: {known}")


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


SCRIPTS = Path(__file__).parent / "scripts"  # run by each engine's own Python, never imported
MODEL_ARGS = 2  # ``args`` open with the model flag and its path: the address follows them in the argv


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    """One engine server's launch, built once by the adapter and read by everything after it: the
    server process runs ``argv``, a trial stores ``stored()`` and the export reads its fields (so the
    files ``tuner check`` reads back hold them too). ``trial_env`` holds what only a trial needs (a dev
    endpoint, its GPUs): it is neither stored with the command nor exported."""

    engine: str
    python: str
    module: str  # run as ``python -m module``
    args: tuple[str, ...]  # the engine's own flags, without --host and --port
    host: str
    port: int
    env: Mapping[str, str] = field(default_factory=dict)
    trial_env: Mapping[str, str] = field(default_factory=dict)
    health_path: str
    served_model: str
    ready_line: str | None = None  # where set, the log must show it too before the server counts as ready

    @property
    def argv(self) -> tuple[str, ...]:
        """``python -m module`` with the engine's flags and the address right after the model flag,
        where both engines' CLIs list it (the argv trials have always run)."""
        address = ("--host", self.host, "--port", str(self.port))
        return (self.python, "-m", self.module, *self.args[:MODEL_ARGS], *address, *self.args[MODEL_ARGS:])

    @property
    def run_env(self) -> dict[str, str]:
        """What the server process gets on top of the tuner's own environment."""
        return {**self.env, **self.trial_env}

    def with_port(self, port: int) -> LaunchSpec:
        return replace(self, port=port)

    def stored(self) -> dict[str, Any]:
        """The command as a trial stores it (user attribute ``launch``): JSON, no trial-only environment."""
        return {"python": self.python, "module": self.module, "args": list(self.args), "host": self.host,
                "port": self.port, "env": dict(self.env)}  # fmt: skip


@dataclass(frozen=True)
class SchedulerLimits:
    """One iteration's bounds: the tokens it may schedule (the chunked-prefill budget) and the
    sequences it may run (None: unbounded, or not known to the adapter); and whether the engine
    prefills in iterations of their own, its decoding requests waiting meanwhile (``prefill_first``),
    rather than mixing prefill chunks into the decode batch."""

    token_budget: int | None
    max_seqs: int | None
    prefill_first: bool = False


@dataclass(frozen=True)
class BenchRows:
    """Request rows read from a benchmark client's per-request output, in the trial's row form
    (``sent_s``, ``first_s``, ``done_s``: seconds since the run's first request; ``output_tokens``;
    ``error``). ``timed`` is False when the client records no start times: every row is then sent
    at 0, and no steady window can be cut from the run."""

    rows: list[dict[str, Any]]
    duration_s: float
    timed: bool


def sharegpt_dataset(prompts: Sequence[str], output_lens: Sequence[int]) -> str:
    """A ShareGPT file of one human turn per prompt (the empty reply is never sent), each entry with
    its ``output_tokens``: the one dataset form both engines' clients read without pandas."""
    turns = [
        {"conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": ""}], "output_tokens": n}
        for p, n in zip(prompts, output_lens, strict=True)
    ]
    return json.dumps(turns)


def rows_from_lists(
    ttfts: Sequence[float], itls: Sequence[Sequence[float]], output_lens: Sequence[int], errors: Sequence[str | None],
    start_times: Sequence[float] | None,
) -> BenchRows:  # fmt: skip
    """Rows from a client's parallel per-request lists (seconds). A request ends at its first token
    plus the sum of its inter-token gaps, so its TPOT is sum(itl) / (tokens - 1), as the client's
    own TPOT is; one with an error or no first token failed."""
    if not len(ttfts) == len(itls) == len(output_lens) == len(errors):
        raise EnvironmentSetupError("the benchmark client's per-request lists differ in length")
    origin = min(start_times) if start_times else 0.0
    rows: list[dict[str, Any]] = []
    for i, (ttft, gaps, tokens, error) in enumerate(zip(ttfts, itls, output_lens, errors, strict=True)):
        sent = float(start_times[i]) - origin if start_times else 0.0
        failed = bool(error) or not ttft
        first = None if failed else sent + float(ttft)
        done = None if first is None else first + float(sum(gaps))
        rows.append({"sent_s": sent, "first_s": first, "done_s": done, "output_tokens": int(tokens or 0),
                     "error": str(error) if failed else None})  # fmt: skip
    ends = [r["done_s"] if r["done_s"] is not None else r["sent_s"] for r in rows]
    return BenchRows(rows, max(ends, default=0.0), start_times is not None)


class CacheReset(Enum):
    """What a server's answer to the prefix-cache reset says."""

    DONE = "done"
    BUSY = "busy"  # requests still hold the cache: ask again once they have ended
    REFUSED = "refused"  # no such route, or an error that asking again will not change


class EngineAdapter(abc.ABC):
    """Builds commands for one engine and reads what it reports. See the module docstring."""

    name: str
    distributions: tuple[str, ...]  # package names that carry the engine's version
    module: str  # run as ``python -m module``
    supported_versions: tuple[str, ...]  # "major.minor" or full versions
    image: str  # the official container image, without its tag
    default_port: int  # where the server listens when given no --port
    health_path: str = "/health"
    ready_line: str | None = None
    reset_cache_path: str | None = None  # POST here after warmup empties the prefix cache
    # what a server the tuner measures needs beside its launch (a dev endpoint), never exported
    measuring_env: Mapping[str, str] = MappingProxyType({})
    reset_busy_status: int | None = None  # what that answers while requests still run (``cache_reset``)
    needs_gpu: bool = False  # an engine with no CPU build is left out of studies on a machine without a GPU
    ttft_histogram: str = ""
    waiting_gauge: str | None = None
    failure_signatures: tuple[tuple[str, str], ...] = ()
    # (a log line's pattern, what it means: a str.format of the pattern's named groups)
    config_overrides: tuple[tuple[str, str], ...] = ()
    default_memory_fraction: float | None = None
    draft_slots_signature: str | None = None
    spec_methods: Mapping[str, SpecSupport] = MappingProxyType({})
    export_formats: tuple[str, ...] = ("sh", "json")
    runtime_class: str | None = None
    check_script: str | None = None  # validates argv with the engine's own parser (tuner.deploy.verify)

    bench_module: str | None = None  # the engine's own benchmark client, for ``tuner verify``
    bench_own_output_lens = False  # the client gives each request its dataset entry's output length

    def kv_tokens_required(self, model: ModelSpec) -> int:
        return 1  # any positive KV pool

    def overrides_in(self, log: str) -> list[str]:
        """What the engine says in ``log`` it changed of the config it was given (``config_overrides``,
        in their order; each said once, at its first line: an engine's processes may log it twice)."""
        found = []
        for pattern, means in self.config_overrides:
            match = re.search(pattern, log)
            if match is not None:
                found.append(means.format(**match.groupdict()))
        return list(dict.fromkeys(found))

    def cache_reset(self, status: int, body: bytes) -> CacheReset:
        """What the server's answer to a POST on ``reset_cache_path`` says: done on 200, busy on
        ``reset_busy_status``, refused otherwise."""
        if status == 200:
            return CacheReset.DONE
        return CacheReset.BUSY if status == self.reset_busy_status else CacheReset.REFUSED

    def bench_dataset(self, prompts: Sequence[str], output_lens: Sequence[int]) -> str:
        """A ShareGPT file of these prompts (``sharegpt_dataset``): the form both engines' clients read."""
        if self.bench_module is None:
            self._no_bench()
        return sharegpt_dataset(prompts, output_lens)

    def bench_argv(
        self, python: str, base_url: str, model: str, tokenizer: str, dataset: str, result: str, rate: float,
        n: int, output_len: int | None, seed: int,
    ) -> list[str]:  # fmt: skip
        """The client's command: ``n`` prompts of ``dataset`` in order where the client allows it, Poisson
        at ``rate``, ``output_len`` tokens each (None: each entry's own, where ``bench_own_output_lens``;
        ``ignore_eos``, temperature 0), per-request output to ``result``."""
        self._no_bench()
        return []

    def bench_rows(self, result: Mapping[str, Any]) -> BenchRows:
        self._no_bench()
        return BenchRows([], 0.0, False)

    def _no_bench(self) -> None:
        raise EnvironmentSetupError(f"{self.name}: no benchmark client of the engine's own is known to the tuner")

    def draft_slots(self, params: Mapping[str, Any]) -> int | None:
        """The scheduling slots a request's drafting takes under ``params`` (None: unknown, so a
        rejection for draft slots is generalised only to the same method and draft)."""
        method = method_of(params)
        if method == OFF:
            return 0
        support = self.spec_methods.get(method)
        return None if support is None else support.draft_slots

    def scheduler_limits(self, params: Mapping[str, Any], device: Device) -> SchedulerLimits:
        """What one scheduler iteration may hold under ``params``, the engine's own default where a
        parameter is not given (the performance model simulates it); None where the adapter does not know."""
        chunk, seqs = params.get("chunk_size"), params.get("max_num_seqs")
        return SchedulerLimits(None if chunk is None else int(chunk), None if seqs is None else int(seqs))

    def refusal(self, params: Mapping[str, Any], device: Device, version: str, eager: bool = False) -> str | None:
        """Why the engine at ``version`` refuses ``params`` on ``device`` (``eager``: without CUDA
        graphs) before it serves (None: nothing the adapter knows of; what it does not know is learned
        from a failed boot, ``tuner.search.rejections``)."""
        return None

    def check_version(self, version: str) -> None:
        if not matches(version, self.supported_versions):
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

"""``tuner drive``: measure a server that is already running, with the same driver trials use.

Any OpenAI-compatible server (one the user started, any engine): the workload is built exactly as
``tuner search`` builds it (same preset, seed and tokenizer give the same requests), a warmup pass
is discarded, and the metrics are computed with the same definitions, so users can measure their
production server the way the tuner measured the candidates. Where the server exposes
``/metrics`` with vLLM or SGLang names, its own mean TTFT is reported beside the client's.

No search space is involved: the model comes from the server's ``/v1/models`` (its id, or its
``root``, when that is a model folder on this machine) or from ``--model``, and the context length
from the server's ``max_model_len``, else from the model's ``config.json``. A server that fails
most of the first requests stops the drive at once, quoting its own error text.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tuner.client.driver import RequestRecord, drive_sync
from tuner.engines import ADAPTERS
from tuner.engines.base import Device, EngineAdapter, ModelSpec
from tuner.engines.prometheus import histogram_mean_delta
from tuner.errors import ConfigError, EngineError
from tuner.measure.goodput import goodput, steady_throughput
from tuner.measure.metrics import scrape_metrics, summarize
from tuner.measure.rate_steps import Measured, measure_step, search_capacity
from tuner.measure.supply import RequestSupply
from tuner.measure.trial import MAX_ERROR_RATE, identify_server, reset_prefix_cache
from tuner.progress import Progress
from tuner.search.options import SearchOptions
from tuner.search.resolve import capacity_plan, preset_slo, resolve_workload
from tuner.search.space import Static
from tuner.workloads import source

__all__ = ["EarlyFailures", "Served", "drive_url", "failed_beyond_limit", "served_model"]

TTFT_HISTOGRAMS = tuple(adapter().ttft_histogram for adapter in ADAPTERS.values())  # any engine's names
EARLY_REQUESTS = 10  # the first requests sent (warmup included) that may stop a drive at once
EARLY_FAILED_SHARE = 0.8  # ... when at least this share of them fails
DEFAULT_CONTEXT = Static().max_model_len  # neither the server nor the model's config.json says


@dataclass(frozen=True)
class Served:
    """What the server's ``/v1/models`` says of its first model."""

    name: str  # the id requests name
    folder: Path | None  # its id or root when that is a model folder here (one with a tokenizer.json)
    max_model_len: int | None


def served_model(client: httpx.Client, url: str) -> Served:
    try:
        card = client.get(url + "/v1/models").json()["data"][0]
        name = str(card["id"])
    except httpx.InvalidURL as exc:  # not an httpx.HTTPError
        raise ConfigError(f"--url {url}: not a valid URL ({exc})") from exc
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise ConfigError(f"--url {url}: no OpenAI-compatible /v1/models there ({type(exc).__name__})") from exc
    folders = [Path(str(p)) for p in (name, card.get("root")) if p]
    folder = next((f for f in folders if (f / "tokenizer.json").is_file()), None)
    length = card.get("max_model_len")
    return Served(name, folder, length if isinstance(length, int) and length > 0 else None)


def drive_model(opts: SearchOptions, served: Served, url: str) -> ModelSpec:
    """The model whose tokenizer sizes the requests: ``--model``, else the served folder."""
    if opts.model is not None:
        folder = Path(opts.model)
        if not (folder / "tokenizer.json").is_file():
            raise ConfigError(f"--model {opts.model}: no tokenizer.json there")
    elif served.folder is not None:
        folder = served.folder
    else:
        raise ConfigError(
            f"--url {url} serves {served.name!r}, not a model folder on this machine, so its tokenizer cannot "
            "size the prompts exactly: give --model FOLDER (the served model's folder, with its tokenizer.json)"
        )
    return ModelSpec(str(folder), {}, served.max_model_len or _config_context(folder))


def _config_context(folder: Path) -> int:
    try:
        context = json.loads((folder / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return DEFAULT_CONTEXT
    return context if isinstance(context, int) and context > 0 else DEFAULT_CONTEXT


def quoted(record: RequestRecord) -> str:
    """A failed request's error in the server's own words where it gave any."""
    return f"{record.error}: {record.detail}" if record.detail else str(record.error)


class EarlyFailures:
    """The drivers' ``on_record``: stops the drive once most of the first requests have failed."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen: list[RequestRecord] = []

    def __call__(self, record: RequestRecord) -> None:
        if len(self.seen) >= EARLY_REQUESTS:
            return
        self.seen.append(record)
        failed = [r for r in self.seen if r.error is not None]
        if len(failed) >= EARLY_FAILED_SHARE * EARLY_REQUESTS:
            raise EngineError(
                f"{self.url}: {len(failed)} of the first {len(self.seen)} requests failed, stopped; "
                f"the server said: {quoted(failed[0])}",
                "request_errors",
            )


def failed_beyond_limit(report: dict[str, Any]) -> str | None:
    """The line saying the requests failed beyond the trials' error-rate limit, or None."""
    m = report["metrics"]
    if m["error_rate"] <= MAX_ERROR_RATE:
        return None
    return (
        f"{int(m['n_errors'])} of {int(m['n_requests'])} requests failed ({m['error_rate']:.1%}, above the "
        f"{MAX_ERROR_RATE:.1%} a trial may fail); the server said: {report['first_error']}"
    )


def drive_url(opts: SearchOptions, url: str) -> dict[str, Any]:
    """Drive the server at ``url``; the report's undefined figures are None (JSON's null), never NaN."""
    url = url.rstrip("/")
    given = source(opts.workload)  # a bad preset name or trace file fails before the server is asked
    watch = EarlyFailures(url)
    with httpx.Client(timeout=10.0) as client:
        served = served_model(client, url)
        model = drive_model(opts, served, url)
        workload = resolve_workload(opts, model, given)
        drive_sync(None, url, served.name, workload.warmup, concurrency=workload.concurrency, on_record=watch)
        before = scrape_metrics(client, url)
        result = drive_sync(None, url, served.name, workload.requests, concurrency=workload.concurrency,
                            on_record=watch)  # fmt: skip
        after = scrape_metrics(client, url)
    slo = opts.slo if opts.slo is not None else preset_slo(workload)
    metrics = summarize(result) | goodput(result, slo)
    metrics["steady_output_throughput_tok_s"] = steady_throughput(result)
    server_ttft = next((m for h in TTFT_HISTOGRAMS if (m := histogram_mean_delta(before, after, h)) is not None), None)
    first_error = next((quoted(r) for r in result.records if r.error is not None), None)
    return {
        "url": url,
        "model": served.name,
        "workload": workload.name,
        "workload_digest": workload.digest(),
        "tokenizer": model.path,
        "max_model_len": model.max_model_len,
        "slo": slo,
        "metrics": {key: _defined(value) for key, value in metrics.items()},
        "server_ttft_mean_ms": None if server_ttft is None else _defined(server_ttft * 1e3),
        "first_error": first_error,
    }


def drive_capacity(opts: SearchOptions, url: str, tiers_for: str, progress: Progress) -> dict[str, Any]:
    """The capacity search of a trial, on the server at ``url``: the preset's tiers for a server on a
    GPU (or the CPU build, ``tiers_for``), ``--slo`` over them. The prefix cache is reset before each
    step where the server allows it (vLLM in dev mode, SGLang); the report says whether it was.
    Interrupted (Ctrl-C, SIGTERM) during the search, it reports the steps judged so far
    (``capacity.interrupted``)."""
    url = url.rstrip("/")
    given = source(opts.workload)
    watch = EarlyFailures(url)
    device = Device("cpu" if tiers_for == "cpu" else "cuda", url, 0)
    with httpx.Client(timeout=10.0) as client:
        served = served_model(client, url)
        model = drive_model(opts, served, url)
        workload = resolve_workload(opts, model, given)
        plan = capacity_plan(opts, workload, device)
        assert plan is not None
        owner = next(iter(identify_server(client, url).get("owned_by") or []), "")
        adapter = ADAPTERS[owner]() if owner in ADAPTERS else None
        drive_sync(None, url, served.name, workload.warmup, concurrency=workload.concurrency, on_record=watch)
        resets: list[bool] = []
        supply = RequestSupply.of(workload)  # every step's requests distinct, whatever --requests says

        def measure(rate: float, hold: bool = False) -> Measured:
            resets.append(_reset(client, url, adapter))
            return measure_step(url, served.name, supply, rate, plan, adapter, hold)

        def said(tier: str, step: Measured, verdict: str) -> None:
            progress.line(f"{tier}: {step.rate_req_s:.3g} req/s, {len(step.rows)} requests in "
                          f"{step.duration_s:.0f} s: attainment {verdict}")  # fmt: skip

        outcome = search_capacity(measure, plan, prune=False, said=said, keep_on_interrupt=True)
    return {
        "url": url, "model": served.name, "engine": owner or None, "workload": workload.name,
        "workload_digest": workload.digest(), "tokenizer": model.path,
        "prefix_cache_reset": bool(resets) and all(resets),
        "capacity": outcome.as_dict(plan),
    }  # fmt: skip


def _reset(client: httpx.Client, url: str, adapter: EngineAdapter | None) -> bool:
    return adapter is not None and reset_prefix_cache(client, url, adapter)


def _defined(value: float) -> float | None:
    return value if math.isfinite(value) else None

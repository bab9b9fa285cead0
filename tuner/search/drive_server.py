"""``tuner drive``: measure a server that is already running, with the same driver trials use.

Any OpenAI-compatible server (one the user started, any engine): the workload is built exactly as
``tuner search`` builds it (same preset, seed and tokenizer give the same requests), a warmup pass
is discarded, and the metrics are computed with the same definitions, so users can measure their
production server the way the tuner measured the candidates. Where the server exposes
``/metrics`` with vLLM or SGLang names, its own mean TTFT is reported beside the client's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tuner.client.driver import drive_sync
from tuner.engines.prometheus import histogram_mean_delta
from tuner.errors import ConfigError
from tuner.measure.goodput import goodput, steady_throughput
from tuner.measure.metrics import summarize
from tuner.measure.trial import scrape_metrics
from tuner.search.preview import _model
from tuner.search.run import SearchOptions, preset_slo, resolve_workload
from tuner.search.space import load_space
from tuner.workloads import source

TTFT_HISTOGRAMS = ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds")


def served_model(client: httpx.Client, url: str) -> str:
    try:
        models = client.get(url + "/v1/models").json()["data"]
        return str(models[0]["id"])
    except httpx.InvalidURL as exc:  # not an httpx.HTTPError
        raise ConfigError(f"--url {url}: not a valid URL ({exc})") from exc
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise ConfigError(f"--url {url}: no OpenAI-compatible /v1/models there ({type(exc).__name__})") from exc


def drive_url(opts: SearchOptions, url: str) -> dict[str, Any]:
    url = url.rstrip("/")
    given = source(opts.workload)
    model = _model(opts, load_space(opts.space))
    workload = resolve_workload(opts, model, given)
    slo = opts.slo if opts.slo is not None else preset_slo(workload)
    with httpx.Client(timeout=10.0) as client:
        name = served_model(client, url)
        drive_sync(None, url, name, workload.warmup, concurrency=workload.concurrency)
        before = scrape_metrics(client, url)
        result = drive_sync(None, url, name, workload.requests, concurrency=workload.concurrency)
        after = scrape_metrics(client, url)
    metrics = summarize(result) | goodput(result, slo)
    metrics["steady_output_throughput_tok_s"] = steady_throughput(result)
    server_ttft = next((m for h in TTFT_HISTOGRAMS if (m := histogram_mean_delta(before, after, h)) is not None), None)
    return {
        "url": url,
        "model": name,
        "workload": workload.name,
        "workload_digest": workload.digest(),
        "tokenizer": str(Path(model.path)),
        "slo": slo,
        "metrics": metrics,
        "server_ttft_mean_ms": None if server_ttft is None else server_ttft * 1e3,
    }

"""``tuner verify``: a claimed capacity checked with the serving engine's own benchmark client.

The server at ``--url`` is asked what serves it (``/v1/models``' ``owned_by``), and that engine's
adapter gives its client's command (``tuner.engines``: nothing here names an engine). The client
sends a trial's capacity step's requests (the same workload, seed and tokenizer, the pool cycled in
the same order, ``tuner.measure.rate_steps.step_requests``) open loop at the claimed rate and at
``OVER_SHARE`` times it, and each tier's attainment is computed from its per-request output by the
trial's own ``summarize_step`` (``tuner.measure.verify``). The goal: at the claim at most
``GOAL_SLACK`` below the target, and below the target at ``OVER_SHARE`` times it.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from tuner.engines import ADAPTERS
from tuner.engines.base import Device, EngineAdapter
from tuner.engines.env import probe
from tuner.errors import ConfigError
from tuner.measure.rate_steps import step_requests
from tuner.measure.supply import RequestSupply
from tuner.measure.trial import identify_server, reset_prefix_cache
from tuner.measure.verify import MAX_EXTRA_S, client_requests, judge, read_result, run_client
from tuner.progress import Progress
from tuner.search.drive_server import drive_model, served_model
from tuner.search.options import SearchOptions
from tuner.search.resolve import capacity_plan, resolve_workload
from tuner.workloads import source
from tuner.workloads.base import Request

Tiers = Mapping[str, Mapping[str, float]]

__all__ = ["GOAL_SLACK", "OVER_SHARE", "verify_url"]

OVER_SHARE = 1.2  # the second rate, as a share of the claim: attainment must fall below the target there
GOAL_SLACK = 0.05  # at the claim, attainment may be this far below the target


def verify_url(
    opts: SearchOptions, url: str, rate: float, tiers_for: str, duration_s: float | None, progress: Progress,
    work_dir: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Run the engine's client at ``rate`` and ``OVER_SHARE * rate`` on the server at ``url``."""
    if not rate > 0:
        raise ConfigError(f"--rate {rate}: a claimed capacity must be above 0 req/s")
    url = url.rstrip("/")
    given = source(opts.workload)
    device = Device("cpu" if tiers_for == "cpu" else "cuda", url, 0)
    with httpx.Client(timeout=10.0) as client:
        served = served_model(client, url)
        model = drive_model(opts, served, url)
        owner = next(iter(identify_server(client, url).get("owned_by") or []), "")
        if owner not in ADAPTERS:
            raise ConfigError(f"--url {url}: served by {owner or 'an unknown engine'!r}; verify knows "
                              f"the clients of {', '.join(ADAPTERS)}")  # fmt: skip
        adapter = ADAPTERS[owner]()
        env = probe(adapter, Path(opts.engine_envs[owner]) if owner in opts.engine_envs else None)
        workload = resolve_workload(opts, model, given)
        plan = capacity_plan(opts, workload, device)
        assert plan is not None  # opts.objective is a capacity objective
        # one run per rate, as long as a trial's step may serve (or --duration-s), no looks: the client
        # runs to its end; its requests come from one supply, so the two runs send distinct requests
        plan = dataclasses.replace(
            plan, min_step_s=duration_s if duration_s is not None else plan.min_step_s * plan.step_limit, step_limit=1
        )
        supply = RequestSupply.of(workload)
        tiers = {name: plan.tiers[name] for name in plan.scored}
        with tempfile.TemporaryDirectory(prefix="tuner-verify-") as scratch:
            run = _Run(adapter, env.python, url, served.name, model.path, work_dir or Path(scratch), opts.seed)
            runs = []
            for share in (1.0, OVER_SHARE):
                reset = reset_prefix_cache(client, url, adapter)  # each rate starts as cold as a trial's step
                pool, _ = step_requests(supply, rate * share, plan)
                progress.line(f"{share:g}x the claim: {rate * share:.4g} req/s, {adapter.name}'s own client")
                runs.append(run.at(share, rate * share, pool, tiers, plan.target) | {"prefix_cache_reset": reset})
    return {"url": url, "model": served.name, "engine": owner, "engine_version": env.version,
            "workload": workload.name, "workload_digest": workload.digest(), "tokenizer": model.path,
            "claimed_rate_req_s": rate, "target": plan.target, "goal_slack": GOAL_SLACK, "runs": runs}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class _Run:
    """One client run's fixed parts: the engine, its Python, the server and where the files go."""

    adapter: EngineAdapter
    python: str
    url: str
    served: str
    tokenizer: str  # the model folder: the name the server serves may be no path here
    where: Path
    seed: int

    def at(self, share: float, rate: float, pool: list[Request], tiers: Tiers, target: float) -> dict[str, Any]:
        chosen = client_requests(pool, self.adapter)
        dataset, result = self.where / f"dataset-{share:g}x.json", self.where / f"result-{share:g}x.json"
        dataset.write_text(self.adapter.bench_dataset(chosen.prompts))
        n = len(chosen.prompts)
        argv = self.adapter.bench_argv(self.python, self.url, self.served, self.tokenizer, str(dataset), str(result),
                                       rate, n, chosen.output_len, self.seed)  # fmt: skip
        run_client(argv, self.where / f"client-{share:g}x.log", timeout_s=n / rate + MAX_EXTRA_S)
        verdicts = judge(rate, read_result(result, self.adapter), tiers, target)
        goal = {tier: _goal(share, v["attainment"], target) for tier, v in verdicts.items()}
        return {"share": share, "rate_req_s": rate, "argv": argv, "notes": chosen.notes, "tiers": verdicts,
                "goal_met": goal}  # fmt: skip


def _goal(share: float, attainment: float, target: float) -> bool:
    return attainment >= target - GOAL_SLACK if share == 1.0 else attainment < target

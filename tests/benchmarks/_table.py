"""The measured grid as a stand-in engine: ``TableRunner`` answers a trial from the table.

``tests/benchmarks/data/grid_vllm_cpu_rag.json`` (written by ``measure_grid``) holds, for every
config of the grid, what its real trial on the vLLM CPU build gave: failure class, one row per
request, the engine's memory lines and the wall time of every phase. A replayed trial goes through
the tuner's own search objective (screen, pruner, record) exactly as a live one; only the engine is
replaced by the table. The pruner sees the requests complete in their recorded order, so a pruned
replay saves exactly the recorded time after its checkpoint.
"""

from __future__ import annotations

import gzip
import json
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tests.benchmarks._report import ROOT
from tuner.client.driver import RequestRecord
from tuner.engines.base import Config, Device, ModelSpec
from tuner.engines.env import EngineEnv, probe
from tuner.engines.models import default_models
from tuner.engines.speculation import OFF, draft_of, method_of
from tuner.engines.vllm import VllmAdapter
from tuner.measure.rate_steps import CapacityPlan, Measured, judge_served, search_capacity
from tuner.measure.trial import Pruned, TrialContext, TrialResult, WatchFactory, score_capacity
from tuner.progress import Quiet
from tuner.search.memory import estimate, parse_facts
from tuner.search.pruning import running_values
from tuner.search.space import Space
from tuner.search.speculation import Offer, study_offers
from tuner.workloads.base import Workload

TABLE = ROOT / "tests" / "benchmarks" / "data" / "grid_vllm_cpu_rag.json"
# How far a recorded KV cache size may be from what the models' shapes give: the engine loses a few
# blocks to rounding, more of a small cache, while a changed recipe is off by whole layers.
SHAPE_TOLERANCE = 0.10


def load(path: Path = TABLE) -> dict[str, Any]:
    """The table, with its points keyed by their (unprefixed) params; the engine default is ``{}``."""
    table = dict(json.loads(path.read_text()))
    table["points"] = {key(row["params"]): row for row in table["points"].values()}
    return table


def key(params: dict[str, Any]) -> str:
    """A config's params as the tables were recorded, before the method was a parameter: K (0: off)
    with its draft, or with the model-free method named as the draft."""
    kept = {k: v for k, v in params.items() if k not in ("spec_method", "num_speculative_tokens", "draft_model")}
    method = method_of(params)
    if method != OFF:
        kept.update(
            num_speculative_tokens=int(params["num_speculative_tokens"]), draft_model=draft_of(params) or method
        )
    elif {"spec_method", "num_speculative_tokens"} & set(params):
        kept["num_speculative_tokens"] = 0
    return json.dumps(kept, sort_keys=True)


def grid_offers(space: Space, model: ModelSpec, version: str = "0.32.0") -> dict[str, Offer]:
    """The vLLM CPU build's offer for a benchmark space (every package assumed there)."""
    p = space.parameters
    return study_offers(p.methods(), p.named_drafts(), {"vllm": (VllmAdapter(), version, None)}, model)[0]


def trial_metrics(rows: list[dict[str, Any]], slo: dict[str, float]) -> dict[str, float]:
    """The objectives of a table row's requests, under the benchmark's SLOs (``tuner.search.pruning``'s
    definitions, over every request: the same numbers the pruner's checkpoints use)."""
    done = sorted((r for r in rows if r["done_s"] is not None), key=lambda r: r["done_s"])
    values = running_values(done, slo)
    errors = sum(1 for r in rows if r["error"] is not None)
    return {**values, "error_rate": errors / len(rows) if rows else 1.0}


@dataclass
class TableRunner:
    """A ``runner`` for ``tuner.search.objective.SearchObjective`` that answers from the table."""

    points: dict[str, dict[str, Any]]
    slo: dict[str, float]
    booted: list[str] = field(default_factory=list)
    saved_s: float = 0.0  # recorded drive time the pruner cut off

    def __call__(
        self, number: int, config: Config, ctx: TrialContext, watch: WatchFactory | None = None
    ) -> TrialResult:
        row = self.points[key(dict(config.params))]
        self.booted.append(key(dict(config.params)))
        launch = VllmAdapter().launch(config, ctx.model, ctx.device, 8000, "python3", "0.32.0")
        result = TrialResult(config=config, launch=launch, engine_version="0.32.0", failure=row["failure"])
        result.memory_facts = parse_facts("\n".join(row["memory_lines"]))
        result.phases_s = dict(row["phases_s"])
        if row["failure"] is not None:
            return result
        rows = row["request_log"]
        if watch is not None and self._pruned(rows, watch, result):
            return result
        result.request_log = rows
        result.metrics = trial_metrics(rows, self.slo)
        return result

    def _pruned(self, rows: list[dict[str, Any]], watch: WatchFactory, result: TrialResult) -> bool:
        on_record = watch(len(rows), float(result.phases_s.get("boot") or 0.0))
        t0 = time.perf_counter()
        for r in sorted(rows, key=lambda r: r["done_s"] if r["done_s"] is not None else r["sent_s"]):
            record = RequestRecord("x", t0 + r["sent_s"], None if r["first_s"] is None else t0 + r["first_s"],
                                   None if r["done_s"] is None else t0 + r["done_s"], (), (), r["output_tokens"],
                                   r["prompt_tokens"], r["error"])  # fmt: skip
            try:
                on_record(record)
            except Pruned as stop:
                result.pruned = stop.info
                ended = max(x["done_s"] for x in rows if x["done_s"] is not None)
                self.saved_s += ended - (r["done_s"] or r["sent_s"])
                return True
        return False


def models(table: dict[str, Any]) -> ModelSpec:
    """The models the table was measured with, for the memory screen, which reads their shapes.

    The generated models live in a cache keyed by their recipe, so the folder a table names can be
    gone (a new recipe key) while this machine's models have the same shapes. Then those are used,
    once every KV cache size the table recorded is what their shapes predict; otherwise this stops,
    since a screen without shapes screens nothing and the table's screen figures would be wrong.
    """
    m = table["model"]
    if Path(m["path"]).exists():
        return ModelSpec(m["path"], m["drafts"], m["max_model_len"])
    here = default_models(probe(VllmAdapter(), ROOT / ".engines" / "vllm").python, m["max_model_len"])
    d = table["device"]
    device = Device(d["kind"], d["name"], d["memory_bytes"])
    for row in table["points"].values():
        facts = parse_facts("\n".join(row["memory_lines"]))
        if row["failure"] is not None or not facts.get("kv_tokens"):
            continue
        config = Config("vllm", row["params"], is_default=not row["params"])
        # the screen's own first-principles estimate (no history): what these models' shapes give
        est = estimate(config, here, device, [], VllmAdapter.default_memory_fraction, 1)
        if est is None:
            raise SystemExit(f"benchmark: cannot read the shapes of this machine's models in {here.path}")
        if abs(est.predicted_tokens - facts["kv_tokens"]) > SHAPE_TOLERANCE * facts["kv_tokens"]:
            raise SystemExit(
                f"benchmark: the table's models ({m['path']}) are not on this machine, and this machine's "
                f"({here.path}) differ: {row['params']} had {facts['kv_tokens']:.0f} KV tokens, their shapes "
                f"give {est.predicted_tokens}. Measure the table again (measure_grid)."
            )
    return here


def context(table: dict[str, Any], slo: dict[str, float]) -> TrialContext:
    """The trial context the table was measured in."""
    d = table["device"]
    model = models(table)
    device = Device(d["kind"], d["name"], d["memory_bytes"])
    workload = Workload("rag", 0, (), (), table["workload"]["concurrency"], "replayed from the table")
    env = EngineEnv("vllm", "python3", table["engine"]["distribution"], table["engine"]["version"])
    return replace(TrialContext({"vllm": (VllmAdapter(), env)}, model, device, workload, ROOT, Quiet()), slo=slo)


# ---- the capacity tables (measure_capacity_grid) ----
# Each capacity table and the space whose every config it served: "light" under the rag preset of
# d85b603 (before the workloads issue), where the engine default tied for the best; "heavy" under the
# rag preset as it is now, on a space chosen so that the configs differ.
CAPACITY_GRIDS = {
    "light": (ROOT / "tests/benchmarks/data/capacity_grid_vllm_cpu_rag.json.gz",
              ROOT / "search_spaces/grid-cpu-capacity.yaml"),
    "heavy": (ROOT / "tests/benchmarks/data/capacity_grid_vllm_cpu_rag_heavy.json.gz",
              ROOT / "search_spaces/grid-cpu-capacity-heavy.yaml"),
}  # fmt: skip
CAPACITY_TABLE = CAPACITY_GRIDS["light"][0]


def read_table(path: Path) -> dict[str, Any]:
    """A table file as measured: JSON, gzip-compressed where its name ends in ``.gz`` (every token's
    gap of every rung makes a table of tens of MB)."""
    return dict(json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text()))


def write_table(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as ``read_table`` reads it, atomically: an interrupted run never leaves a torn table."""
    text = json.dumps(data, indent=1, default=str) + "\n"
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".gz":
        tmp.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        tmp.write_text(text)
    tmp.replace(path)


def load_capacity(path: Path = CAPACITY_TABLE) -> dict[str, Any]:
    """The capacity table, its points keyed by their (unprefixed) params and each rung's step rebuilt."""
    table = read_table(path)
    points = {}
    for row in table["points"].values():
        points[key(row["params"])] = {**row, "rungs": rungs_of(row)}
    table["points"] = points
    # a config served again (measure_capacity_grid --repeat), keyed as its point
    table["repeats"] = {key(rows[0]["params"]): [{**row, "rungs": rungs_of(row)} for row in rows]
                        for rows in table.get("repeats", {}).values() if rows}  # fmt: skip
    return table


def rungs_of(row: dict[str, Any]) -> dict[int, Measured]:
    """A stored row's rungs as steps, in rung order."""
    return dict(sorted((int(r), Measured(**m)) for r, m in row.get("rungs", {}).items()))


def served_when(table: dict[str, Any]) -> dict[str, Any]:
    """When and from which commit a capacity table's configs were served (repeats and extended
    ladders included), and the machine's 1-minute load before each boot."""
    rows = list(table["points"].values()) + [r for rs in table.get("repeats", {}).values() for r in rs]
    booted = rows + [e for r in rows for e in r.get("extensions", []) if "load_avg_1m_before" in e]
    stamps = sorted([r["measured_at"] for r in rows] + [e["at"] for r in rows for e in r.get("extensions", [])])
    loads = [r["load_avg_1m_before"] for r in booted]
    return {"first": stamps[0], "last": stamps[-1], "commit": (table["stamp"].get("commit") or "?")[:7],
            "load_low": min(loads), "load_high": max(loads), "repeats": len(table.get("repeats", {})),
            "extended": sum(bool(r.get("extensions")) for r in rows)}  # fmt: skip


def capacity_space(table: dict[str, Any]) -> Space:
    """The space the capacity table served, as it recorded it: the space file may have changed since
    (the first table served a 2048-token context, which grid-cpu-capacity.yaml later cut to 768), and
    a replay's memory screen must judge the configs the table booted."""
    return Space.model_validate(table["space"])


# A table served before steps were decided by an interval (0168053) kept no step limit in its plan:
# its rungs served one look each and passed on the share alone. Judged as served: one look, and a
# confidence of one half, whose quantile is 0, so the interval is the share itself.
AS_SERVED = {"step_limit": 1, "confidence": 0.5}


def plan_of(table: dict[str, Any], scored: tuple[str, ...]) -> CapacityPlan:
    """The plan the table was served with, scoring ``scored`` (an older table's: ``AS_SERVED``)."""
    p = dict(table["plan"])
    if "step_limit" not in p:
        p.update(AS_SERVED)
    return CapacityPlan(**{**p, "tiers": {k: dict(v) for k, v in p["tiers"].items()}, "scored": scored})


def schedule_s(rate: float, plan: CapacityPlan) -> float:
    """How long a step at ``rate`` releases requests for (``tuner.measure.rate_steps.step_requests``)."""
    return max(plan.min_requests, math.ceil(rate * plan.min_step_s)) / rate


def rung_for(rungs: dict[int, Measured], rate: float, plan: CapacityPlan) -> tuple[Measured, float]:
    """The recorded step nearest ``rate`` on the log scale, and what serving it at ``rate`` would have
    cost: the rung's duration scaled by the two rates' schedules. Outside the ladder the end rung
    stands in: the lowest for a rate below it (a config passes at lower load), the highest above."""
    nearest = min(rungs.values(), key=lambda m: abs(math.log(m.rate_req_s / rate)))
    return nearest, nearest.duration_s * schedule_s(rate, plan) / schedule_s(nearest.rate_req_s, plan)


def ladder_capacity(rungs: dict[int, Measured], plan: CapacityPlan, tier: str) -> float:
    """The ladder's own answer: the highest passing rung below the lowest failing one (0 if none)."""
    return ladder_bracket(rungs, plan, tier)[0]


def ladder_bracket(rungs: dict[int, Measured], plan: CapacityPlan, tier: str) -> tuple[float, float]:
    """What the ladder resolved: its answer (``ladder_capacity``) and the lowest failing rung above it
    (inf where none failed); the config's capacity lies between them."""
    # judged as the search judges a step (a rung a look stopped counts only the requests the look did)
    steps = [judge_served(m, plan.tiers[tier], plan) for m in rungs.values()]
    fails = [s.rate_req_s for s in steps if not s.passed]
    ceiling = min(fails, default=math.inf)
    return max((s.rate_req_s for s in steps if s.passed and s.rate_req_s < ceiling), default=0.0), ceiling


@dataclass
class CapacityTableRunner:
    """A ``runner`` for ``SearchObjective`` under a capacity objective: each trial's search runs the
    tuner's own ``search_capacity`` and ``score_capacity``, its steps answered from the config's ladder."""

    points: dict[str, dict[str, Any]]
    plan: CapacityPlan
    booted: list[str] = field(default_factory=list)
    search_s: float = 0.0  # what the replayed searches would have spent serving steps
    boot_s: float = 0.0  # and booting and warming up

    def __call__(
        self, number: int, config: Config, ctx: TrialContext, watch: WatchFactory | None = None,
        incumbents: dict[str, float] | None = None, prune: bool = True,
    ) -> TrialResult:  # fmt: skip
        row = self.points[key(dict(config.params))]
        self.booted.append(key(dict(config.params)))
        launch = VllmAdapter().launch(config, ctx.model, ctx.device, 8000, "python3", "0.32.0")
        result = TrialResult(config=config, launch=launch, engine_version="0.32.0", failure=row["failure"])
        result.memory_facts = parse_facts("\n".join(row["memory_lines"]))
        result.phases_s = {k: v for k, v in row["phases_s"].items() if k in ("boot", "warmup")}
        self.boot_s += sum(result.phases_s.values()) or float(row["wall_s"])
        if row["failure"] is not None:
            return result
        costs: list[float] = []

        def measure(rate: float, hold: bool = False) -> Measured:
            m, cost = rung_for(row["rungs"], rate, self.plan)
            costs.append(cost)
            # served as asked: the search and the scoring key steps by rate. A claim a look passed early
            # is confirmed by serving it whole (``hold``); the table holds one serving of each rung, judged
            # over its looks' window, and that serving stands in for the confirmation.
            return replace(m, rate_req_s=rate, held=m.held or hold)

        outcome = search_capacity(measure, self.plan, incumbents, prune)
        outcome.search_s = sum(costs)
        self.search_s += outcome.search_s
        score_capacity(result, outcome, self.plan, prune, row["since_ready"], row["alive"], VllmAdapter())
        return result


def capacity_context(table: dict[str, Any], plan: CapacityPlan) -> TrialContext:
    """The trial context the capacity table was served in, scoring ``plan``'s tiers."""
    d = table["device"]
    model = models(table)
    device = Device(d["kind"], d["name"], d["memory_bytes"])
    workload = Workload("rag", 0, (), (), 1, "replayed from the capacity table")
    env = EngineEnv("vllm", "python3", table["engine"]["distribution"], table["engine"]["version"])
    return TrialContext({"vllm": (VllmAdapter(), env)}, model, device, workload, ROOT, Quiet(), capacity=plan)

"""What one ``--sampler model`` proposal costs: the fit and the candidates scored, at several draw counts.

Run: ``.venv/bin/python -m tests.benchmarks.bench_proposal [--repeats 3]`` (about ten minutes on 2
cores; boots nothing, but needs ``scripts/setup.sh``'s vLLM environment and the generated models, as
``tuner search`` does). Not part of the default test run. Writes the ``proposal`` section of
``reports/model-sampler.md`` and ``reports/model_proposal.json``.

The study is ``tests/benchmarks/data/proposal_study_cpu.db``: ``tuner search --workload rag`` on the
no-GPU default after its first trial (the engine default served), as the Quickstart's second trial
finds it. Every variant is a fresh sampler bound to the context ``tuner search`` builds for that
study (the default space, the generated models, the rag preset's capacity plan), proposing the next
trial on a copy of the study. Per variant, over repeats: seconds to fit the model, seconds to score
the candidates, how many candidates and how many of them the model simulated, and the pick: its
expected gain and its rank among the largest draw's candidates (the draws are seeded, so a smaller
draw is the first part of a larger one, and what a smaller draw misses is read off the larger).

Variants: 256 draws (the count before ``DRAWN``), with every candidate simulated on its own (as
before the model reused a simulation across KV pools no step filled, ``EngineModel``'s
``_simulated``) and with the reuse; ``DRAWN``; fewer; and ``DRAWN`` predicted over a worker process
per core (``tuner.search.model.parallel``), as the sampler does by default. Then what one
prediction costs on a GPU study's steps (the H200 study of ``bench_model_study``), where a simulated
step holds far more iterations.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna

from tests.benchmarks import _report, bench_model_study
from tuner.engines import ADAPTERS
from tuner.measure.trial import TrialContext
from tuner.progress import Progress
from tuner.search.model.parallel import default_workers
from tuner.search.model.predict import EngineModel, Job, Prediction
from tuner.search.model.ranking import device_of_study, plan_of_study, shapes_of
from tuner.search.model.sampler import DRAWN, ModelContext, ModelSampler, Scored, context_of, served_trials
from tuner.search.options import SearchOptions
from tuner.search.resolve import (
    capacity_plan,
    detect_device,
    resolve_engines,
    resolve_models,
    resolve_offers,
    resolve_workload,
)
from tuner.search.space import load_space, suggest
from tuner.workloads import source

STUDY_DB = _report.ROOT / "tests" / "benchmarks" / "data" / "proposal_study_cpu.db"
STUDY = "qs"
MD_PATH = _report.REPORTS / "model-sampler.md"
JSON_PATH = _report.REPORTS / "model_proposal.json"
CHUNKS = (1024, 2048, 4096, 8192)  # the H200 space's chunk sizes (search_spaces/gpu-h200.yaml)
# (draws, reuse, worker processes): as before, then each change alone, then all of them
VARIANTS = ((256, False, 1), (256, True, 1), (DRAWN, True, 1), (32, True, 1), (DRAWN, True, default_workers()))


class Timed(ModelSampler):
    """The model sampler, timing its fit and its scoring, and keeping what it scored; in one process,
    also how many capacity searches its model simulated (workers keep their own count)."""

    def __init__(self, seed: int, drawn: int, reuse: bool, workers: int) -> None:
        super().__init__(seed, drawn, workers)
        self.reuse, self.fit_s, self.simulated = reuse, 0.0, 0
        self.scored: list[Scored] = []

    def model(self, study: optuna.Study) -> EngineModel:
        began = time.monotonic()
        model = super().model(study)
        self.fit_s += time.monotonic() - began
        if "predict" not in vars(model):  # once per fitted model
            model.predict = self._counted(model)  # type: ignore[method-assign]
        return model

    def _counted(self, model: EngineModel) -> Callable[..., dict[str, Prediction]]:
        def predict(engine: str, params: Any, kv: int | None) -> dict[str, Prediction]:
            if not self.reuse:
                model._simulated.clear()  # noqa: SLF001  # each candidate on its own, as before the reuse
            before = sum(len(v) for v in model._simulated.values())  # noqa: SLF001
            out = EngineModel.predict(model, engine, params, kv)
            self.simulated += sum(len(v) for v in model._simulated.values()) - before  # noqa: SLF001
            return out

        return predict

    def _scored(self, *args: Any, **kwargs: Any) -> Scored:
        scored = super()._scored(*args, **kwargs)
        self.scored.append(scored)
        return scored


def context() -> ModelContext:
    """What ``tuner search --workload rag`` binds the sampler to on this machine (``run_search``)."""
    progress = Progress()
    opts = SearchOptions(workload="rag")
    space = load_space(None)
    engines = resolve_engines(space, {}, None, progress)
    env = next(iter(engines.values()))[1]
    device = detect_device(env, space)
    model = resolve_models(opts, space, env)
    offers = resolve_offers(space, engines, model, progress)
    workload = resolve_workload(opts, model, source(opts.workload))
    capacity = capacity_plan(opts, workload, device)
    ctx = TrialContext(engines, model, device, workload, Path(tempfile.gettempdir()), progress, capacity=capacity)
    return context_of(space, ctx, offers)


def propose(drawn: int, reuse: bool, workers: int, seed: int) -> dict[str, Any]:
    """One proposal by a fresh sampler on a fresh context: the study's requests are grown and cut into
    blocks within it, as a study's first proposal does."""
    bound = context()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "study.db"
        shutil.copy(STUDY_DB, db)
        sampler = Timed(seed, drawn, reuse, workers)
        sampler.bind(bound)
        study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{db}", sampler=sampler)
        began = time.monotonic()
        trial = study.ask()
        suggest(trial, bound.space, bound.offers, False)  # Optuna proposes at the trial's first suggestion
        total = time.monotonic() - began
        picked = trial.params
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    pick = next((s for s in sampler.scored if _same(s.point, picked)), None)
    return {
        "drawn": drawn, "reuse": reuse, "workers": workers, "total_s": total, "fit_s": sampler.fit_s,
        "score_s": total - sampler.fit_s, "candidates": len(sampler.scored),
        "simulated": sampler.simulated if workers == 1 else None, "pick": picked,
        "gain": None if pick is None else pick.gain,
        "scored": [(s.point, s.gain) for s in sampler.scored],
    }  # fmt: skip


def _same(point: dict[str, Any], params: dict[str, Any]) -> bool:
    return {k: v for k, v in point.items() if k in params} == params


def rank_in(full: list[tuple[dict[str, Any], float]], params: dict[str, Any]) -> int | None:
    """The pick's place among the largest draw's candidates by expected gain: 1 + those with more."""
    gain = next((g for p, g in full if _same(p, params)), None)
    return None if gain is None else 1 + sum(1 for _, g in full if g > gain)


def run(repeats: int, seed: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for drawn, reuse, workers in VARIANTS:
        runs = [propose(drawn, reuse, workers, seed) for _ in range(repeats)]
        print(f"drawn {drawn} reuse {reuse} workers {workers}: " + ", ".join(f"{r['total_s']:.1f}s" for r in runs),
              flush=True)  # fmt: skip
        rows.append({"drawn": drawn, "reuse": reuse, "workers": workers, "runs": runs})
    full: list[tuple[dict[str, Any], float]] = next(
        r for r in rows if r["drawn"] == max(d for d, _, _ in VARIANTS) and r["reuse"]
    )["runs"][0]["scored"]
    for row in rows:
        row["rank"] = rank_in(full, row["runs"][0]["pick"])
        row["best_gain"], row["largest"] = max(g for _, g in full), len(full)
        for r in row["runs"]:
            r.pop("scored")
    return {"study": str(STUDY_DB.relative_to(_report.ROOT)), "repeats": repeats, "seed": seed, "rows": rows}


def gpu_predictions() -> dict[str, Any]:
    """What predictions cost on a GPU study's steps: the H200 study's model, fitted on every served
    trial as ``tuner plan --study`` fits it, predicting each served trial's own config one by one (a
    known draft: one simulated capacity search; an unmeasured one costs two); then a batch, every
    served config at each chunk size of the H200 space, in one process and over a worker per core
    (``predict_many``), checked to give the same predictions; the fit itself both ways, checked the
    same."""
    study = optuna.load_study(study_name=bench_model_study.STUDY, storage=bench_model_study.STORAGE)
    plan, device = plan_of_study(study), device_of_study(study)
    assert plan is not None
    adapters = {name: cls() for name, cls in ADAPTERS.items()}
    served = served_trials(study, {})
    fit_s: dict[str, float] = {}
    fitted = {}
    for workers in (1, default_workers()):
        began = time.monotonic()
        fitted[workers] = EngineModel.fit(served, adapters, device, plan, shapes_of(served), workers=workers)
        fit_s[str(workers)] = time.monotonic() - began
    model = fitted[1]
    assert model.fits == fitted[default_workers()].fits, "the workers' fit differs from one process's"
    seconds = []
    for s in served:
        began = time.monotonic()
        model.predict(s.engine, s.params, s.kv_tokens)
        seconds.append(time.monotonic() - began)
    jobs: list[Job] = [(s.engine, {**s.params, "chunk_size": chunk}, s.kv_tokens) for s in served for chunk in CHUNKS]
    batch: dict[int, float] = {}
    said: dict[int, list[dict[str, Prediction]]] = {}
    for workers in (1, default_workers()):
        fresh = replace(model)  # no simulation carried over from the run before
        began = time.monotonic()
        said[workers] = fresh.predict_many(jobs, workers)
        batch[workers] = time.monotonic() - began
    assert said[1] == said[default_workers()], "the workers' predictions differ from one process's"
    return {"study": bench_model_study.STUDY, "device": device.name, "fit_s": fit_s, "predict_s": seconds,
            "batch": len(jobs), "batch_s": {str(w): s for w, s in batch.items()}}  # fmt: skip


def render(data: dict[str, Any]) -> str:
    header = ["draws", "reuse", "worker processes", "total s (median, range)", "fit s", "scoring s", "candidates",
              "simulated", "pick's gain", "pick's rank among the largest draw"]  # fmt: skip
    body = []
    for row in data["rows"]:
        runs = row["runs"]
        totals = [r["total_s"] for r in runs]
        body.append([
            row["drawn"], "yes" if row["reuse"] else "no", row.get("workers", 1),
            f"{statistics.median(totals):.1f} ({min(totals):.1f}-{max(totals):.1f})",
            f"{statistics.median(r['fit_s'] for r in runs):.1f}",
            f"{statistics.median(r['score_s'] for r in runs):.1f}",
            runs[0]["candidates"], "-" if runs[0]["simulated"] is None else runs[0]["simulated"],
            "-" if runs[0]["gain"] is None else f"{runs[0]['gain']:.3g} (best {row['best_gain']:.3g})",
            "-" if row["rank"] is None else f"{row['rank']} of {row['largest']}",
        ])  # fmt: skip
    return "\n".join([
        "## What a proposal costs (`tests/benchmarks/bench_proposal.py`)", "",
        f"The study `{data['study']}`: `tuner search --workload rag` on the no-GPU default after its first trial "
        "(the engine default served), as the Quickstart's second trial finds it. Each row is a fresh "
        f"`--sampler model` (seed {data['seed']}) proposing that trial on a copy of the study, {data['repeats']} "
        "times: the fit (a study's first also grows its requests to those the served steps sent and cuts each "
        "prompt into blocks), then every candidate predicted (each a simulated capacity search, two where a draft "
        "is unmeasured), in one process or over worker processes. \"Simulated\" counts the candidates' "
        "capacity searches the model ran in one process (the rest it "
        "reused: a KV pool none of the steps filled is the same simulation). The pick's rank is its place, by "
        "expected gain, among the largest draw's candidates (1 + those with a larger gain).", "",
        _report.table(header, body), "",
    ])  # fmt: skip


def _gpu_lines(gpu: dict[str, Any] | None) -> list[str]:
    if not gpu:
        return []
    each = gpu["predict_s"]
    lines = [
        f"On a GPU study's steps (`{gpu['study']}`, {gpu['device']}; the model fitted on every served trial in "
        f"{_by_workers(gpu['fit_s'])}), one prediction of a served trial's own config took a median "
        f"{statistics.median(each):.1f} s (range {min(each):.1f}-{max(each):.1f} s, {len(each)} configs) on this "
        "machine, in one process.",
    ]  # fmt: skip
    if gpu.get("batch_s"):
        lines[0] += (f" A batch of {gpu['batch']} (each served config at every chunk size of the H200 space), the "
                     f"same predictions either way: {_by_workers(gpu['batch_s'])}.")  # fmt: skip
    return [*lines, ""]


def _by_workers(seconds: dict[str, float] | float) -> str:
    """Seconds by worker processes ("1": one process), or one figure as an older run stored it."""
    if not isinstance(seconds, dict):
        return f"{seconds:.0f} s"
    return ", ".join(f"{s:.0f} s in {'one process' if w == '1' else f'{w} worker processes'}"
                     for w, s in seconds.items())  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--render-only", action="store_true", help="re-render from the JSON")
    parser.add_argument(
        "--gpu-only",
        action="store_true",
        help="the GPU study's predictions alone (its own section: run it on a GPU host's cores)",
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if args.render_only:
        stored = json.loads(JSON_PATH.read_text())
        _report.write_section("proposal", render(stored["proposal"]), stored["proposal"], MD_PATH, JSON_PATH)
        if "proposal-gpu" in stored:
            gpu = stored["proposal-gpu"]
            _report.write_section("proposal-gpu", render_gpu(gpu), gpu, MD_PATH, JSON_PATH)
        return
    started = _report.stamp()
    if not args.gpu_only:
        data = {"stamp": started, **run(args.repeats, args.seed)}
        _report.write_section("proposal", render(data), data, MD_PATH, JSON_PATH)
        print(render(data))
    gpu = {"stamp": _report.stamp(), **gpu_predictions()}
    _report.write_section("proposal-gpu", render_gpu(gpu), gpu, MD_PATH, JSON_PATH)
    print(render_gpu(gpu))


def render_gpu(gpu: dict[str, Any]) -> str:
    return "\n".join(["## What a prediction costs on a GPU study's steps (`bench_proposal.py`)", "", *_gpu_lines(gpu)])


if __name__ == "__main__":
    main()

"""One replayed study of ``--sampler model`` against the capacity table, trial by trial.

Run: ``.venv/bin/python -m tests.benchmarks.model_replay SEED [SEED ...] [--grid heavy] [--with-default]``
(boots nothing; seconds to minutes a seed). Writes ``reports/model-sampler/replay-seed-SEED[-heavy][-default].txt``
for each. Not part of the default test run.

The study is ``bench_model``'s search, by default on the light table with the engine default left
out (``bench_search``'s replay:
the tuner's own objective, memory screen, capacity search and pruning), stopped when its best
feasible capacity is within 10 % of the grid's best. For every trial the file says what the model
predicted before it booted (central, and the range what is unmeasured allows), what the replay
measured, and the config's own ladder; for every sampled trial also the best prediction the model
then made for a config without speculation, the best candidate of all and the pick's expected gain.
It is how the search benchmark's slow seeds are read: which beliefs made the model boot what it did.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

import optuna

from tests.benchmarks import _report, _table, bench_model, bench_search
from tests.benchmarks.stamp import stamp_line
from tuner.engines.vllm import VllmAdapter
from tuner.report.capacity import predicted
from tuner.search.model.history import speculation
from tuner.search.model.predict import model_sigma
from tuner.search.model.sampler import ModelContext, ModelSampler, Scored, _record
from tuner.study.attrs import trial_attrs

OUT_DIR = _report.REPORTS / "model-sampler"
TIER = "interactive"


class TracingSampler(ModelSampler):
    """The model sampler, noting for each sampled trial the candidates it scored."""

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(seed)
        self.notes: dict[int, dict[str, Any]] = {}

    def sample_relative(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial, search_space: dict[str, Any]
    ) -> dict[str, Any]:
        c = self._context
        if c is not None and search_space and not trial.system_attrs.get("fixed_params"):
            model = self.model(study)
            best = self._best(study)
            sigma = model_sigma(_record(study, c.plan.scored[0]))
            scored = [
                self._scored(p, cfg, model.predict(cfg.engine, cfg.params, kv), best, sigma)
                for p, cfg, kv in self._candidates(study, trial.number)
            ]
            plain = [s for s in scored if speculation(s.config.params, 0.0) is None]
            self.notes[trial.number] = {
                "best": best.get(TIER), "sigma": sigma,
                "top": _line(max(scored, key=_central)) if scored else None,
                "plain": _line(max(plain, key=_central)) if plain else None,
            }  # fmt: skip
        return super().sample_relative(study, trial, search_space)


def _central(s: Scored) -> float:
    return s.predictions[TIER].capacity_req_s or 0.0


def _line(s: Scored) -> str:
    p = s.predictions[TIER]
    return f"{_params(s.config.params)}: {_range(p.capacity_req_s, p.low_req_s, p.high_req_s)} (gain {s.gain:.3g})"


def _params(params: Mapping[str, Any]) -> str:
    return json.dumps({k: v for k, v in sorted(params.items())}, separators=(",", ":"))


def _range(c: float | None, low: float | None, high: float | None) -> str:
    if c is None:
        return "none"
    if low is None or high is None or abs(high - low) < 1e-9:
        return f"{c:.2f}"
    return f"{c:.2f} [{low:.2f}, {high:.2f}]"


def replay(seed: int, grid: str = "light", with_default: bool = False) -> str:
    table = _table.load_capacity(_table.CAPACITY_GRIDS[grid][0])
    if grid == "light":
        requests = bench_model.light_requests()
        table = bench_model.with_ids(table, len(requests))
    else:
        requests = bench_model.heavy_requests(table)
    plan = _table.plan_of(table, (TIER,))
    truth = bench_search.capacity_truth(table, plan)
    space = _table.capacity_space(table)
    models = _table.models(table)
    context = ModelContext(space, {"vllm": VllmAdapter()}, _table.grid_offers(space, models), models,
                           bench_model.device_of(table), plan, requests)  # fmt: skip
    made: list[TracingSampler] = []

    def bound(s: int) -> optuna.samplers.BaseSampler:
        sampler = TracingSampler(s)
        sampler.bind(context)
        made.append(sampler)
        return sampler

    studies: list[optuna.Study] = []
    create = optuna.create_study

    def recording(*args: Any, **kwargs: Any) -> optuna.Study:
        study = create(*args, **kwargs)
        studies.append(study)
        return study

    bench_search.SAMPLERS["model"] = bound
    optuna.create_study = recording  # the replay makes its study inside
    try:
        outcome = bench_search.run_capacity_once("model", seed, table, truth, plan, with_default=with_default)
    finally:
        optuna.create_study = create
    study, notes = studies[-1], made[-1].notes
    lines = [
        f"seed {seed}: {outcome['trials']} trials, {outcome['boots']} boots to within 10 % of the grid's best "
        f"({truth['best_capacity']:.2f} req/s, {truth['best_config']}); {grid} table, default left "
        f"{'in' if with_default else 'out'}",
        "trial state: config | predicted interactive (req/s) central [range] | replay measured | ladder",
    ]
    for t in study.trials:
        a = trial_attrs(t)
        config = a.get("config") or {}
        said = predicted(t, TIER)
        measured = (a.get("metrics") or {}).get(f"capacity_{TIER}_req_s")
        ladder = truth["capacities"].get(_table.key(config)) if config else None
        cell = _range(said.get("capacity_req_s"), said.get("low_req_s"), said.get("high_req_s"))
        failure = a.get("failure")
        state = t.state.name.lower() + (f" {failure}" if failure else "")
        lines.append(f"{t.number:3d} {state}: "
                     f"{_params(config)} | {cell} | {_fmt(measured)} | {_fmt(ladder)}")  # fmt: skip
        note = notes.get(t.number)
        if note:
            lines.append(f"      best so far {_fmt(note['best'])}, sigma {note['sigma']:.3f}; "
                         f"best predicted {note['top']}; best without speculation {note['plain']}")  # fmt: skip
    return "\n".join(lines) + "\n"


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{float(value):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("seeds", type=int, nargs="+")
    parser.add_argument("--grid", choices=sorted(_table.CAPACITY_GRIDS), default="light")
    parser.add_argument("--with-default", action="store_true", help="the engine default as trial 0, as tuner search")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    run_stamp = _report.stamp()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        text = f"_{stamp_line(run_stamp)}._\n\n" + replay(seed, args.grid, args.with_default)
        suffix = ("" if args.grid == "light" else f"-{args.grid}") + ("-default" if args.with_default else "")
        path = OUT_DIR / f"replay-seed-{seed}{suffix}.txt"
        path.write_text(text)
        print(text)


if __name__ == "__main__":
    main()

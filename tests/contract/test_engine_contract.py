"""The adapter contract, checked against every engine's real parser in its own environment.

For every point of a discrete test space, and for a few hundred points sampled from the default
space, each adapter's argv must be accepted by the engine's own parser (vLLM: ``make_arg_parser`` +
``create_engine_config``; SGLang 0.5.23: ``prepare_server_args`` + ``resolve_once`` with
``--device cpu`` added for the check only), speculative decoding must be on in the resolved config
exactly when the trial asked for it, and a launch file must read back to the same argv.
"""

from __future__ import annotations

import itertools
from typing import Any

import optuna
import pytest

from tuner.deploy.formats import engine_args, read_python, read_sh, render_python, render_sh
from tuner.deploy.verify import check_argvs
from tuner.engines import ADAPTERS
from tuner.engines.base import Config, Device, EngineAdapter, ModelSpec
from tuner.engines.env import EngineEnv, probe
from tuner.engines.models import default_models
from tuner.search.space import load_space, suggest

SAMPLED_POINTS = 200
DEVICES = {
    "vllm": [Device("cpu", "cpu", 32 * 2**20), Device("cuda", "planned GPU", 0)],
    "sglang": [Device("cuda", "planned GPU", 0)],
}


@pytest.fixture(scope="module", params=sorted(ADAPTERS))
def engine(request: pytest.FixtureRequest) -> tuple[EngineAdapter, EngineEnv]:
    adapter = ADAPTERS[request.param]()
    return adapter, probe(adapter)


@pytest.fixture(scope="module")
def model() -> ModelSpec:
    return default_models(probe(ADAPTERS["vllm"]()).python, 2048)


def discrete_points() -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = []
    for chunk, seqs, fraction in itertools.product((512, 1024, 2048), (4, 16), (0.5, 0.9)):
        base = {"chunk_size": chunk, "max_num_seqs": seqs, "memory_fraction": fraction}
        points.append({**base, "num_speculative_tokens": 0})
        for k, draft in itertools.product((1, 3, 5), ("draft-2l", "draft-1l", "ngram")):
            points.append({**base, "num_speculative_tokens": k, "draft_model": draft})
    return points


def sampled_points(engine: str, drafts: list[str]) -> list[dict[str, Any]]:
    space = load_space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
    points = []
    for _ in range(SAMPLED_POINTS):
        trial = study.ask()
        points.append(dict(suggest(trial, space, [engine], [*drafts, "ngram"], is_default=False).params))
        study.tell(trial, 0.0)
    return points


def test_every_argv_is_accepted_and_does_what_the_trial_claims(
    engine: tuple[EngineAdapter, EngineEnv], model: ModelSpec
) -> None:
    adapter, env = engine
    points = discrete_points() + sampled_points(adapter.name, list(model.drafts)) + [{}]
    launches = []
    for device, params in itertools.product(DEVICES[adapter.name], points):
        config = Config(adapter.name, params, enforce_eager=device.kind == "cpu")
        launches.append((params, adapter.launch(config, model, device, 8000, env.python, env.version)))
    verdicts = check_argvs(env, [engine_args(list(launch.argv))[1] for _, launch in launches])
    rejected = [(p, v["error"]) for (p, _), v in zip(launches, verdicts, strict=True) if not v["ok"]]
    assert not rejected, f"{len(rejected)} of {len(launches)} rejected by {adapter.name} {env.version}: {rejected[:3]}"
    for (params, _), verdict in zip(launches, verdicts, strict=True):
        asked = int(params.get("num_speculative_tokens", 0)) > 0
        assert verdict["speculative"] is asked, (params, verdict)
        if asked:
            assert verdict["num_speculative_tokens"] == params["num_speculative_tokens"], (params, verdict)


def test_a_launch_file_reads_back_to_the_same_argv(engine: tuple[EngineAdapter, EngineEnv], model: ModelSpec) -> None:
    adapter, env = engine
    for params in discrete_points():
        device = DEVICES[adapter.name][0]
        launch = adapter.launch(Config(adapter.name, params), model, device, 8000, env.python, env.version)
        module, args = engine_args(list(launch.argv))
        manifest = {
            "tuner_version": "t",
            "exported_at": "now",
            "study": "s",
            "trial": 1,
            "config_kind": "sampled",
            "engine": adapter.name,
            "engine_version": env.version,
            "distribution": env.distribution,
            "hardware": {"name": "h"},
            "model": model.path,
            "workload": "rag",
            "workload_digest": "d",
            "objectives": {},
            "module": module,
            "python": env.python,
            "argv": args,
        }
        assert read_sh(render_sh(manifest)) == (module, args)
        if adapter.name == "sglang":  # the sglang.Runtime(**KWARGS) launcher reads back the same
            assert read_python(render_python(manifest, [])) == args


def test_a_rejected_flag_fails_the_check(engine: tuple[EngineAdapter, EngineEnv], model: ModelSpec) -> None:
    """The suite must fail when an engine stops accepting a flag: show the check can say no."""
    adapter, env = engine
    dead = {"vllm": ["--speculative-model", model.drafts["draft-2l"]], "sglang": ["--cuda-graph-max-bs", "8"]}
    launch = adapter.launch(Config(adapter.name, {}), model, DEVICES[adapter.name][0], 8000, env.python, env.version)
    verdict = check_argvs(env, [engine_args(list(launch.argv))[1] + dead[adapter.name]])[0]
    assert verdict["ok"] is False and verdict["error"]

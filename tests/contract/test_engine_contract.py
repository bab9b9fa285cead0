"""The adapter contract, checked against every engine's real parser in its own environment.

For every point of a discrete test space, and for a few hundred points sampled from the default
space, each adapter's argv must be accepted by the engine's own parser (vLLM: ``make_arg_parser`` +
``create_engine_config``; SGLang 0.5.23: ``prepare_server_args`` + ``resolve_once`` with
``--device cpu`` added for the check only), speculative decoding must be on in the resolved config
exactly when the trial asked for it, and a launch file must read back to the same argv. Without an
engine: every adapter's ``LaunchSpec`` is one value whose argv is derived from its fields, whose
port changes alone, and which a trial stores and reads back without its trial-only environment.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any

import optuna
import pytest

from tuner.deploy.formats import read_python, read_sh, render_python, render_sh
from tuner.deploy.verify import check_argvs
from tuner.engines import ADAPTERS
from tuner.engines.base import Config, Device, EngineAdapter, LaunchSpec, ModelSpec
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
    for schedule in ([[1, 8, 3], [9, 4096, 0]], [[1, 4, 3], [5, 16, 1], [17, 4096, 0]]):  # vLLM only
        points.append({"num_speculative_tokens": 3, "draft_model": "draft-2l", "spec_schedule": schedule})
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
    verdicts = check_argvs(env, [list(launch.args) for _, launch in launches])
    rejected = [(p, v["error"]) for (p, _), v in zip(launches, verdicts, strict=True) if not v["ok"]]
    assert not rejected, f"{len(rejected)} of {len(launches)} rejected by {adapter.name} {env.version}: {rejected[:3]}"
    for (params, _), verdict in zip(launches, verdicts, strict=True):
        asked = int(params.get("num_speculative_tokens", 0)) > 0
        assert verdict["speculative"] is asked, (params, verdict)
        if asked:
            assert verdict["num_speculative_tokens"] == params["num_speculative_tokens"], (params, verdict)
        if adapter.name == "vllm":  # the schedule reaches vLLM's own config exactly, or not at all
            assert verdict["schedule"] == params.get("spec_schedule"), (params, verdict)


def test_a_launch_file_reads_back_to_the_same_argv(engine: tuple[EngineAdapter, EngineEnv], model: ModelSpec) -> None:
    adapter, env = engine
    for params in discrete_points():
        device = DEVICES[adapter.name][0]
        launch = adapter.launch(Config(adapter.name, params), model, device, 8000, env.python, env.version)
        module, args = launch.module, list(launch.args)
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
    verdict = check_argvs(env, [[*launch.args, *dead[adapter.name]]])[0]
    assert verdict["ok"] is False and verdict["error"]


# --- the LaunchSpec, for every adapter, without an engine -------------------------------------------

PLAIN_MODEL = ModelSpec("/models/target", {"draft-2l": "/models/draft"}, 2048, load_format="dummy")
SPEC_POINT = {"chunk_size": 512, "max_num_seqs": 4, "memory_fraction": 0.5, "num_speculative_tokens": 2,
              "draft_model": "draft-2l"}  # fmt: skip


def _spec(adapter: EngineAdapter, params: dict[str, Any], port: int = 41234) -> LaunchSpec:
    device = DEVICES[adapter.name][-1]
    return adapter.launch(Config(adapter.name, params), PLAIN_MODEL, device, port, "/env/bin/python",
                          adapter.supported_versions[-1])  # fmt: skip


@pytest.mark.parametrize("name", sorted(ADAPTERS))
@pytest.mark.parametrize("params", [{}, SPEC_POINT])
def test_the_argv_is_derived_from_the_fields(name: str, params: dict[str, Any]) -> None:
    adapter = ADAPTERS[name]()
    spec = _spec(adapter, params)
    argv = spec.argv
    assert argv[:3] == ("/env/bin/python", "-m", adapter.module) == (spec.python, "-m", spec.module)
    assert spec.engine == name and spec.host == "127.0.0.1" and spec.port == 41234
    assert "--host" not in spec.args and "--port" not in spec.args, "args are the engine's own flags"
    assert spec.args[1] == PLAIN_MODEL.path == spec.served_model, "args open with the model flag and its path"
    i = argv.index("--host")
    assert argv[i : i + 4] == ("--host", spec.host, "--port", str(spec.port))
    assert argv[3:i] + argv[i + 4 :] == spec.args, "the argv is the args with the address, nothing else"
    assert spec.health_path == adapter.health_path and spec.ready_line == adapter.ready_line


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_a_new_port_changes_the_port_and_nothing_else(name: str) -> None:
    spec = _spec(ADAPTERS[name](), SPEC_POINT)
    moved = spec.with_port(50123)
    assert moved == dataclasses.replace(spec, port=50123)
    assert [(k, v) for k, v in vars(moved).items() if v != vars(spec)[k]] == [("port", 50123)]
    changed = [(a, b) for a, b in zip(spec.argv, moved.argv, strict=True) if a != b]
    assert changed == [("41234", "50123")]
    assert moved.argv[moved.argv.index("--port") + 1] == "50123"


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_a_trial_stores_the_launch_without_its_trial_only_environment(name: str) -> None:
    spec = _spec(ADAPTERS[name](), SPEC_POINT)
    spec = dataclasses.replace(spec, trial_env={**spec.trial_env, "CUDA_VISIBLE_DEVICES": "3"})
    stored = json.loads(json.dumps(spec.stored()))  # as the RDB storage gives it back
    assert set(stored) == {"python", "module", "args", "host", "port", "env"}
    assert stored == {"python": spec.python, "module": spec.module, "args": list(spec.args), "host": spec.host,
                      "port": spec.port, "env": dict(spec.env)}  # fmt: skip
    assert not set(spec.trial_env) & set(stored["env"]), "trial-only environment is never stored"
    assert spec.run_env == {**spec.env, **spec.trial_env}, "the server process gets both"


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_each_adapter_names_its_image_port_health_and_ttft_histogram(name: str) -> None:
    adapter = ADAPTERS[name]()
    assert adapter.image and ":" not in adapter.image, "the image without a tag: exports add the version"
    assert 0 < adapter.default_port < 65536
    assert adapter.health_path.startswith("/")
    assert adapter.ttft_histogram.startswith(f"{name}:")

"""The adapter contract, checked against every engine's real parser in its own environment.

For every point of a discrete test space that lists every speculative method, and for a few hundred
points sampled from the default space, each adapter's argv must be accepted by the engine's own
parser (vLLM: ``make_arg_parser`` + ``create_engine_config``; SGLang 0.5.23: ``prepare_server_args``
+ ``resolve_once`` with ``--device cpu`` added for the check only), speculative decoding must be on
in the resolved config exactly when the trial asked for it, with the engine's own method and K (and
SGLang's draft tree), and a launch file must read back to the same argv. The points come from the
real sampler, over each engine's real offer: the generated target with its drafts and heads, and a
config-only DeepSeek-V3-shaped target with one MTP layer (``--load-format dummy``) for MTP. A method
an engine's environment lacks (suffix decoding without arctic-inference) is left out of the offer,
and the engine's own parser refuses it there too. Without an
engine: every adapter's ``LaunchSpec`` is one value whose argv is derived from its fields, whose
port changes alone, and which a trial stores and reads back without its trial-only environment.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

import optuna
import pytest

from tuner.deploy.formats import read_python, read_sh, render_python, render_sh
from tuner.deploy.verify import check_argvs
from tuner.engines import ADAPTERS, models
from tuner.engines.base import Config, Device, EngineAdapter, LaunchSpec, ModelSpec
from tuner.engines.env import EngineEnv, probe
from tuner.engines.models import default_models
from tuner.engines.sglang import tree
from tuner.engines.speculation import OFF, method_of
from tuner.search.grid import grid_points
from tuner.search.space import Space, load_space, suggest
from tuner.search.speculation import Offer, study_offers

SAMPLED_POINTS = 60  # the grid of CONTRACT_SPACE covers every method; these add the default space
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


# A DeepSeek-V3-shaped target with one MTP layer, config and tokenizer only: the parsers read no weights.
MTP_TARGET = """
import shutil, sys
from pathlib import Path
from transformers import DeepseekV3Config
out, tokenizer = Path(sys.argv[1]), Path(sys.argv[2])
DeepseekV3Config(
    vocab_size=int(sys.argv[3]), hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1,
    num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=64, kv_lora_rank=64, qk_rope_head_dim=32,
    qk_nope_head_dim=32, v_head_dim=64, n_group=1, topk_group=1, num_nextn_predict_layers=1,
    max_position_embeddings=4096, architectures=["DeepseekV3ForCausalLM"],
).save_pretrained(out)
for f in tokenizer.iterdir():
    if f.name.startswith("tokenizer") or f.suffix == ".jinja":
        shutil.copy(f, out)
"""


@pytest.fixture(scope="module")
def mtp_model(model: ModelSpec, tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    out = tmp_path_factory.mktemp("mtp-target")
    vocab = json.loads((Path(model.path) / "config.json").read_text())["vocab_size"]
    python = probe(ADAPTERS["vllm"]()).python
    subprocess.run([python, "-c", MTP_TARGET, str(out), model.path, str(vocab)], check=True, timeout=300)
    return models.user_models(str(out), [], 2048, "dummy")


# Every method, each with every value of what it takes (the grid of this space over an offer).
CONTRACT_SPACE = {
    "engines": sorted(ADAPTERS),
    "parameters": {
        "chunk_size": {"choices": [512, 2048]},
        "max_num_seqs": {"choices": [4, 16]},
        "memory_fraction": {"choices": [0.9]},
        "spec_method": {"choices": ["off", "draft_model", "eagle", "eagle3", "mtp", "ngram", "suffix"]},
        "num_speculative_tokens": {"choices": [1, 3]},
        "ngram_lookup": {"choices": [[1, 3], [2, 5]]},
        "spec_tree": {"choices": [[1, 2], [4, 8]]},
        "spec_schedule": {"choices": {"static": None, "taper": [[1, 8, 3], [9, 4096, 0]]}},
    },
}


def offer_of(space: Space, adapter: EngineAdapter, env: EngineEnv, model: ModelSpec) -> tuple[Offer, list[str]]:
    p = space.parameters
    offers, notes = study_offers(
        p.methods(), p.named_drafts(), {adapter.name: (adapter, env.version, env.modules)}, model
    )
    return offers[adapter.name], notes


def discrete_points(
    adapter: EngineAdapter, env: EngineEnv, model: ModelSpec, space: Space | None = None
) -> list[dict[str, Any]]:
    """Every point of the contract space this engine can run on ``model``, as the sampler turns it into params."""
    space = space or Space.model_validate(CONTRACT_SPACE)
    offer, _ = offer_of(space, adapter, env, model)
    study = optuna.create_study()
    points = []
    for point in grid_points(space, {adapter.name: offer}):
        study.enqueue_trial(point)
        trial = study.ask()
        points.append(dict(suggest(trial, space, {adapter.name: offer}, is_default=False).params))
        study.tell(trial, 0.0)
    return points


def sampled_points(adapter: EngineAdapter, env: EngineEnv, model: ModelSpec) -> list[dict[str, Any]]:
    space = load_space()
    offer, _ = offer_of(space, adapter, env, model)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
    points = []
    for _ in range(SAMPLED_POINTS):
        trial = study.ask()
        points.append(dict(suggest(trial, space, {adapter.name: offer}, is_default=False).params))
        study.tell(trial, 0.0)
    return points


Launched = tuple[dict[str, Any], LaunchSpec]


def _launches(adapter: EngineAdapter, env: EngineEnv, model: ModelSpec, points: list[dict[str, Any]]) -> list[Launched]:
    out = []
    for device, params in itertools.product(DEVICES[adapter.name], points):
        config = Config(adapter.name, params, enforce_eager=device.kind == "cpu")
        out.append((params, adapter.launch(config, model, device, 8000, env.python, env.version)))
    return out


@dataclasses.dataclass(frozen=True)
class Checked:
    """Every argv of this module through the engine's parser in one run (importing an engine's parser
    costs tens of seconds): the generated target's points, the MTP target's, and what must be refused."""

    main: list[tuple[dict[str, Any], dict[str, Any]]]
    mtp: list[tuple[dict[str, Any], dict[str, Any]]]
    suffix: dict[str, Any] | None  # the verdict on a suffix argv, where the engine has suffix decoding
    dead: dict[str, Any]  # the verdict on an argv with a flag the engine removed


MTP_SPACE = {**CONTRACT_SPACE, "parameters": {
    **CONTRACT_SPACE["parameters"], "spec_method": {"choices": ["off", "mtp"]},
    "chunk_size": {"choices": [2048]}, "max_num_seqs": {"choices": [16]},
}}  # fmt: skip


@pytest.fixture(scope="module")
def checked(engine: tuple[EngineAdapter, EngineEnv], model: ModelSpec, mtp_model: ModelSpec) -> Checked:
    adapter, env = engine
    main = _launches(
        adapter, env, model, discrete_points(adapter, env, model) + sampled_points(adapter, env, model) + [{}]
    )
    mtp = _launches(adapter, env, mtp_model, discrete_points(adapter, env, mtp_model, Space.model_validate(MTP_SPACE)))
    device = DEVICES[adapter.name][0]
    # flags each engine once took and every supported version refuses (SGLang 0.5.17 still takes
    # --cuda-graph-max-bs, which 0.5.23 dropped; --enable-flashinfer-mla went before both)
    dead_flag = {"vllm": ["--speculative-model", model.drafts["draft-2l"]], "sglang": ["--enable-flashinfer-mla"]}
    dead = adapter.launch(Config(adapter.name, {}), model, device, 8000, env.python, env.version)
    extra = [[*dead.args, *dead_flag[adapter.name]]]
    if "suffix" in adapter.spec_methods:
        config = Config(adapter.name, {"spec_method": "suffix", "num_speculative_tokens": 3})
        extra.append(list(adapter.launch(config, model, device, 8000, env.python, env.version).args))
    verdicts = check_argvs(env, [list(launch.args) for _, launch in main + mtp] + extra)
    paired = [(params, v) for (params, _), v in zip(main + mtp, verdicts, strict=False)]
    tail = verdicts[len(main) + len(mtp) :]
    return Checked(paired[: len(main)], paired[len(main) :], tail[1] if len(tail) > 1 else None, tail[0])


SGLANG_ALIASES = {"NEXTN": "EAGLE"}  # SGLang runs MTP through EAGLE


def _assert_does_what_it_claims(
    adapter: EngineAdapter, env: EngineEnv, judged: list[tuple[dict[str, Any], dict[str, Any]]]
) -> None:
    rejected = [(p, v["error"]) for p, v in judged if not v["ok"]]
    assert not rejected, f"{len(rejected)} of {len(judged)} rejected by {adapter.name} {env.version}: {rejected[:3]}"
    for params, verdict in judged:
        method = method_of(params)
        assert verdict["speculative"] is (method != OFF), (params, verdict)
        if method == OFF:
            continue
        assert verdict["num_speculative_tokens"] == params["num_speculative_tokens"], (params, verdict)
        name = adapter.spec_methods[method].name
        expected = SGLANG_ALIASES.get(name, name) if adapter.name == "sglang" else name
        assert verdict["method"] == expected, (params, verdict)
        if adapter.name == "vllm":  # the schedule reaches vLLM's own config exactly, or not at all
            assert verdict["schedule"] == params.get("spec_schedule"), (params, verdict)
        if adapter.name == "sglang" and "spec_tree" in adapter.spec_methods[method].params:
            topk, tokens = tree(params["num_speculative_tokens"], params.get("spec_tree"))
            assert (verdict["eagle_topk"], verdict["num_draft_tokens"]) == (topk, tokens), (params, verdict)


def test_every_argv_is_accepted_and_does_what_the_trial_claims(
    engine: tuple[EngineAdapter, EngineEnv], checked: Checked
) -> None:
    adapter, env = engine
    methods = {method_of(p) for p, _ in checked.main}
    assert methods >= {OFF, "draft_model", "eagle", "eagle3", "ngram"}, methods
    _assert_does_what_it_claims(adapter, env, checked.main)


def test_mtp_on_a_target_that_ships_mtp_layers(
    engine: tuple[EngineAdapter, EngineEnv], mtp_model: ModelSpec, checked: Checked
) -> None:
    adapter, env = engine
    assert mtp_model.mtp_layers == 1
    assert sum(method_of(p) == "mtp" for p, _ in checked.mtp) >= 2, checked.mtp
    _assert_does_what_it_claims(adapter, env, checked.mtp)


def test_what_an_engine_cannot_run_here_is_left_out_and_its_parser_agrees(
    engine: tuple[EngineAdapter, EngineEnv], model: ModelSpec, checked: Checked
) -> None:
    """The left-out lines tell the truth: each method the offer leaves out for the engine itself or
    its environment (not for the model) is one its own parser refuses here."""
    adapter, env = engine
    offer, notes = offer_of(Space.model_validate(CONTRACT_SPACE), adapter, env, model)
    assert "mtp" not in offer.methods and any(": MTP left out" in n and "ships no MTP layers" in n for n in notes)
    lacking = [m for m in ("suffix",) if m not in offer.methods]
    assert lacking == ["suffix"], "neither engine's environment here has arctic-inference"
    if "suffix" not in adapter.spec_methods:
        assert f"{adapter.name} has no suffix decoding" in " ".join(notes) and checked.suffix is None
        return
    assert "its environment lacks arctic_inference" in " ".join(notes)
    assert checked.suffix is not None
    assert checked.suffix["ok"] is False and "Arctic Inference" in checked.suffix["error"], checked.suffix


def test_a_launch_file_reads_back_to_the_same_argv(engine: tuple[EngineAdapter, EngineEnv], model: ModelSpec) -> None:
    adapter, env = engine
    for params in discrete_points(adapter, env, model):
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


def test_a_rejected_flag_fails_the_check(checked: Checked) -> None:
    """The suite must fail when an engine stops accepting a flag: show the check can say no."""
    assert checked.dead["ok"] is False and checked.dead["error"]


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

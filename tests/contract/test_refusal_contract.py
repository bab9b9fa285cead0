"""``EngineAdapter.refusal`` against the engine's own validation: for vLLM's CPU build (0.32), every
config of a grid around its scheduling rules (batched tokens at and just above a draft model's one
slot, sequence limits at, below and above the token budget, speculation off, with a draft model and
with an EAGLE-3 head) goes through its real parser and ``create_engine_config``; the adapter must
refuse exactly the ones the engine refuses, and where the engine accepts, ``scheduler_limits`` must be
the budget it settled on. ``tuner plan`` over such a grid then prints only argv the parser accepts,
and each config it leaves out is one the parser refuses. vLLM 0.26's rule (slots for every sequence)
is unit-tested in tests/unit/engines/test_vllm_argv.py: no 0.26 build runs here.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from tuner.deploy.verify import check_argvs
from tuner.engines.base import Config, Device, ModelSpec
from tuner.engines.env import EngineEnv, probe
from tuner.engines.models import default_models
from tuner.engines.vllm import VllmAdapter
from tuner.search.plan import plan

CPU = Device("cpu", "cpu", 32 * 2**20)
METHODS: list[dict[str, Any]] = [
    {},
    {"spec_method": "draft_model", "draft_model": "draft-1l", "num_speculative_tokens": 2},
    {"spec_method": "eagle3", "draft_model": "eagle3-head", "num_speculative_tokens": 2},
]
CHUNKS = [1, 2, 64, 128]
SEQS = [None, 1, 2, 128]
# a plan over the same rules: vLLM's CPU build is planned on its memory budget, as a search runs it
PLAN_SPACE = """
engines: [vllm]
parameters:
  chunk_size: {choices: [1, 2, 64]}
  max_num_seqs: {choices: [1, 2, 128]}
  spec_method: {choices: [off, draft_model]}
  num_speculative_tokens: {choices: [2]}
  draft_model: {choices: [draft-1l]}
static:
  enforce_eager: true
"""


def _params(chunk: int, seqs: int | None, method: dict[str, Any]) -> dict[str, Any]:
    return {"chunk_size": chunk, **({} if seqs is None else {"max_num_seqs": seqs}), **method}


@pytest.fixture(scope="module")
def env() -> EngineEnv:
    return probe(VllmAdapter())


@pytest.fixture(scope="module")
def model(env: EngineEnv) -> ModelSpec:
    return default_models(env.python, 2048)


@pytest.fixture(scope="module")
def planned(env: EngineEnv, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], list[str]]:
    space = tmp_path_factory.mktemp("space") / "space.yaml"
    space.write_text(PLAN_SPACE)
    lines: list[str] = []
    rows = plan(space, ["vllm"], 12, 0, engine_envs={"vllm": str(Path(env.python).parents[1])}, say=lines.append)
    return rows, lines


@pytest.fixture(scope="module")
def judged(
    env: EngineEnv, model: ModelSpec, planned: tuple[list[dict[str, Any]], list[str]]
) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Every argv of this module through the parser in one run: the grid's, the plan's rows, and the
    configs the plan left out."""
    adapter = VllmAdapter()
    grid = [_params(c, s, m) for c, s, m in itertools.product(CHUNKS, SEQS, METHODS)]
    left_out = [json.loads(line.split(": left out ", 1)[1].rsplit("}: ", 1)[0] + "}") for line in planned[1]
                if ": left out " in line]  # fmt: skip
    argvs = [
        list(adapter.launch(Config("vllm", p, enforce_eager=True), model, CPU, 8000, env.python, env.version).args)
        for p in grid + left_out
    ]
    argvs += [row["argv"][row["argv"].index("-m") + 2 :] for row in planned[0]]
    verdicts = check_argvs(env, argvs)
    n, m = len(grid), len(grid) + len(left_out)
    return list(zip(grid, verdicts[:n], strict=True)), verdicts[n:m], verdicts[m:]


def test_the_adapter_refuses_exactly_what_the_engines_validation_refuses(env: EngineEnv, judged: Any) -> None:
    adapter = VllmAdapter()
    grid, _, _ = judged
    disagree = [(p, adapter.refusal(p, CPU, env.version), v.get("error")) for p, v in grid
                if (adapter.refusal(p, CPU, env.version) is None) is not v["ok"]]  # fmt: skip
    assert not disagree, f"{len(disagree)} of {len(grid)} disagree with vLLM {env.version}: {disagree[:4]}"
    refused = [p for p, v in grid if not v["ok"]]
    assert any(p.get("spec_method") == "draft_model" and p["chunk_size"] == p.get("max_num_seqs") == 1
               for p in refused), "the draft-slot rule is exercised"  # fmt: skip
    assert any("spec_method" not in p for p in refused), "the token-per-sequence rule is exercised"
    for params, verdict in grid:
        if verdict["ok"]:  # the budget the adapter reasons with is the engine's own
            limits = adapter.scheduler_limits(params, CPU)
            assert (limits.token_budget, limits.max_seqs) == (
                verdict["max_num_batched_tokens"], verdict["max_num_seqs"]), (params, verdict)  # fmt: skip


def test_a_plan_prints_only_argv_the_parser_accepts(planned: Any, judged: Any) -> None:
    rows, lines = planned
    _, left_out, printed = judged
    assert len(rows) == 12 and all(v["ok"] for v in printed), [v["error"] for v in printed if not v["ok"]]
    assert left_out, f"the plan's grid holds refused configs: {lines}"
    assert not any(v["ok"] for v in left_out), "each config left out is one the parser refuses"

"""A third engine, registered beside vLLM and SGLang and known to nothing else: the space, the plan,
the failure classifier and the export work with it through its adapter alone (issue 28, item 6).

The fake engine ``toy`` runs two of the engine-neutral speculative methods under its own names, has
its own log lines, health path, launch file formats and parser check (a script that reads the flags
back). Its "environment" is this test run's own Python, whose installed ``pytest`` stands for the
engine's distribution. Nothing but ``ADAPTERS`` (monkeypatched) is edited.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import optuna
import pytest

from tuner.deploy.export import export_study
from tuner.deploy.verify import check_files
from tuner.engines import ADAPTERS
from tuner.engines.base import Config, Device, EngineAdapter, LaunchSpec, ModelSpec
from tuner.engines.speculation import OFF, SpecSupport, draft_of, method_of
from tuner.measure.failures import classify_boot, classify_serve
from tuner.measure.process import ServerProcess
from tuner.measure.trial import TrialResult
from tuner.search.objective import record
from tuner.search.plan import plan
from tuner.search.scoring import DIRECTIONS
from tuner.search.space import Space, load_space, suggest
from tuner.search.speculation import study_offers
from tuner.study.attrs import bind_study_attrs

VERSION = ".".join(importlib.metadata.version("pytest").split(".")[:2])
# The toy engine's parser: each argv's speculation as the engine would resolve it, or a refusal.
CHECK = """
import json, sys
for argv in json.load(sys.stdin):
    ok = argv[:1] == ["--toy-model"] and all(not a.startswith("--") or a.startswith("--toy-") for a in argv)
    method = argv[argv.index("--toy-spec") + 1] if "--toy-spec" in argv else None
    print(json.dumps({"ok": ok, "error": None if ok else "unknown flag", "speculative": method is not None,
                      "method": method}))
"""


class ToyAdapter(EngineAdapter):
    name = "toy"
    distributions = ("pytest",)
    module = "toy.serve"
    supported_versions = (VERSION,)
    image = "example/toy"
    default_port = 7100
    health_path = "/toy/ready"
    ttft_histogram = "toy:ttft_seconds"
    spec_methods = MappingProxyType(
        {"eagle3": SpecSupport("HEAD3", draft_slots=0), "ngram": SpecSupport("LOOKUP", ("ngram_lookup",))}
    )
    failure_signatures = (("toy ran out of cache", "kv_insufficient"),)
    export_formats = ("sh", "json", "compose")
    check_script: str | None = None  # set per test: a file in its tmp_path

    def launch(
        self, config: Config, model: ModelSpec, device: Device, port: int, python: str, version: str
    ) -> LaunchSpec:
        self.check_version(version)
        args = ["--toy-model", model.path]
        params = config.params
        if "chunk_size" in params:
            args += ["--toy-chunk", str(params["chunk_size"])]
        if method_of(params) != OFF:
            args += ["--toy-spec", self.spec_methods[method_of(params)].name, "--toy-k",
                     str(params["num_speculative_tokens"])]  # fmt: skip
            if draft_of(params):
                args += ["--toy-head", model.draft_path(str(draft_of(params)))]
            if params.get("ngram_lookup"):
                args += ["--toy-window", "-".join(map(str, params["ngram_lookup"]))]
        return LaunchSpec(engine=self.name, python=python, module=self.module, args=tuple(args), host="127.0.0.1",
                          port=port, health_path=self.health_path, served_model=model.path)  # fmt: skip

    def server_stats(self, before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float | None]:
        return {}

    def default_params(self, device: Device) -> dict[str, Any]:
        return {}


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[type[ToyAdapter]]:
    script = tmp_path / "check_toy.py"
    script.write_text(CHECK)
    monkeypatch.setattr(ToyAdapter, "check_script", str(script))
    monkeypatch.setitem(ADAPTERS, "toy", ToyAdapter)
    monkeypatch.setenv("TUNER_ENGINES_DIR", str(tmp_path / "no-engines"))  # plan: no environment installed
    yield ToyAdapter


def _model(tmp_path: Path) -> ModelSpec:
    for name in ("target", "eagle3-head"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    return ModelSpec(str(tmp_path / "target"), {"eagle3-head": str(tmp_path / "eagle3-head")},
                     draft_kinds={"eagle3-head": "eagle3"})  # fmt: skip


SPACE = {
    "engines": ["toy"],
    "parameters": {
        "chunk_size": {"choices": [256, 512]},
        "spec_method": {"choices": ["off", "eagle3", "ngram", "draft_model"]},
        "num_speculative_tokens": {"choices": [2, 4]},
        "ngram_lookup": {"choices": [[1, 3]]},
        "spec_tree": {"choices": [[4, 8]]},
    },
}


def test_the_space_offers_what_the_toy_runs_and_says_what_it_lacks(toy: type[ToyAdapter], tmp_path: Path) -> None:
    space = Space.model_validate(SPACE)
    p = space.parameters
    offers, notes = study_offers(p.methods(), p.named_drafts(), {"toy": (toy(), VERSION, None)}, _model(tmp_path))
    assert offers["toy"].methods == ("off", "eagle3", "ngram")
    assert notes == [f"toy {VERSION}: draft model left out of its space: toy has no draft model"]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen = set()
    for _ in range(30):
        trial = study.ask()
        config = suggest(trial, space, offers, is_default=False)
        params = config.params
        seen.add(params["spec_method"])
        assert ("ngram_lookup" in params) == (params["spec_method"] == "ngram"), params
        assert "spec_tree" not in params, "the toy's methods take no tree"
        assert params.get("draft_model") in (None, "eagle3-head")
        study.tell(trial, 0.0)
    assert seen == {"off", "eagle3", "ngram"}


def test_the_plan_prints_the_toys_own_commands(toy: type[ToyAdapter], tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(json.dumps({**SPACE, "static": {"max_model_len": 512}}))
    model = _model(tmp_path)
    said: list[str] = []
    rows = plan(space, None, 12, 1, model.path, [f"eagle3:{model.drafts['eagle3-head']}"], say=said.append)
    assert said == [f"toy {VERSION}: draft model left out of its space: toy has no draft model"]
    assert {r["engine"] for r in rows} == {"toy"} and {r["engine_version"] for r in rows} == {VERSION}
    for row in rows:
        assert row["argv"][:3] == ["python3", "-m", "toy.serve"]
        assert ("--toy-spec" in row["argv"]) == (row["params"]["spec_method"] != "off")


def test_the_failure_classifier_reads_the_toys_own_log_lines(toy: type[ToyAdapter], tmp_path: Path) -> None:
    log = "INFO loading\nERROR toy ran out of cache at 12 blocks\n"
    assert classify_boot(log, 1, False, toy()) == "kv_insufficient"
    assert classify_serve(log, False, 1.0, 0.005, toy()) == "oom_load"
    launch = toy().launch(Config("toy", {}), _model(tmp_path), Device("cuda", "gpu", 0), 7100, "python3", VERSION)
    assert isinstance(ServerProcess(launch, tmp_path / "toy.log").adapter, ToyAdapter)
    assert classify_boot(log, 1, False, ADAPTERS["vllm"]()) == "engine_died", "vLLM does not know the toy's lines"


def test_the_export_writes_the_toys_formats_checked_by_its_own_parser(toy: type[ToyAdapter], tmp_path: Path) -> None:
    model = _model(tmp_path)
    study = optuna.create_study(study_name="toy", directions=DIRECTIONS)
    bind_study_attrs(study, {"workload": "rag", "workload_digest": "e" * 64, "model": model.path,
                             "hardware": {"kind": "cuda", "name": "gpu", "memory_bytes": 1},
                             "engines": {"toy": {"distribution": "pytest", "version": VERSION}}})  # fmt: skip
    params = {"chunk_size": 256, "spec_method": "eagle3", "num_speculative_tokens": 2, "draft_model": "eagle3-head"}
    launch = toy().launch(Config("toy", params), model, Device("cuda", "gpu", 0), 7100, sys.executable, VERSION)
    trial = study.ask()
    trial.set_user_attr("config_kind", "sampled")
    figures = {"ttft_p95_ms": 90.0, "output_throughput_tok_s": 300.0, "error_rate": 0.0}
    result = TrialResult(Config("toy", params), launch, VERSION, metrics=figures)
    study.tell(trial, list(record(trial, result, "pareto")))
    written = export_study(study, None, tmp_path / "out", {"toy": sys.executable})
    assert sorted(p.name.split(".", 1)[1] for p in written) == ["compose.yaml", "json", "sh"]
    manifest = json.loads(next(p for p in written if p.suffix == ".json").read_text())
    assert manifest["parser_check"]["method"] == "HEAD3" and manifest["parser_check"]["speculative"] is True
    compose = next(p for p in written if p.name.endswith(".compose.yaml")).read_text()
    assert "example/toy:v" in compose and "/toy/ready" in compose
    checked = list(check_files([p for p in written if p.suffix == ".sh"], sys.executable))
    assert [(engine, verdict["ok"]) for _, engine, _, verdict in checked] == [("toy", True)]
    assert study.trials[0].user_attrs["speculation"]["method"] == "eagle3"


def test_the_default_space_still_names_only_the_registered_engines(toy: type[ToyAdapter]) -> None:
    assert set(load_space().engines) <= set(ADAPTERS)
    assert Space.model_validate({"engines": ["toy"]}).engines == ["toy"]

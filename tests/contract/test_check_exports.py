"""``tuner check`` on exports of every format, with the engines' own parsers: SGLang 0.5.23's for an
SGLang trial, vLLM 0.32's for a vLLM GPU trial. The files are written by ``tuner export``'s own path
(with its real parser check), then read back and checked again, one parser run for all of them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tests.unit.deploy.test_export import _joint_study
from tuner.deploy.export import export_study
from tuner.engines import ADAPTERS
from tuner.engines.base import Config, Device
from tuner.engines.env import probe
from tuner.engines.models import default_models
from tuner.measure.trial import TrialResult
from tuner.search.objective import record

ROOT = Path(__file__).resolve().parents[2]
FORMATS = ["sh", "json", "python", "compose", "k8s"]
GPU = Device("cuda", "NVIDIA H200", 150_754_820_096)
PARAMS = {"chunk_size": 1024, "max_num_seqs": 8, "memory_fraction": 0.85, "num_speculative_tokens": 3,
          "draft_model": "draft-2l"}  # fmt: skip


def _trial(study: optuna.Study, engine: str) -> int:
    env = probe(ADAPTERS[engine]())
    model = default_models(probe(ADAPTERS["vllm"]()).python, 2048)
    launch = ADAPTERS[engine]().launch(Config(engine, PARAMS), model, GPU, 8000, env.python, env.version)
    trial = study.ask()
    trial.set_user_attr("config_kind", "sampled")
    result = TrialResult(Config(engine, PARAMS), launch, env.version, metrics={"ttft_p95_ms": 90.0,
                         "output_throughput_tok_s": 300.0, "error_rate": 0.0})  # fmt: skip
    study.tell(trial, list(record(trial, result, "pareto")))
    return trial.number


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_every_export_format_is_accepted_by_the_engines_own_parser(engine: str, tmp_path: Path) -> None:
    study = _joint_study()
    number = _trial(study, engine)
    written = export_study(study, [number], tmp_path, None, FORMATS)
    assert len(written) == len(FORMATS)
    done = subprocess.run([sys.executable, "-m", "tuner", "check", *map(str, written)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    version = probe(ADAPTERS[engine]()).version
    assert done.stdout.count(f"accepted by {engine} {version} (speculative decoding: on)") == len(FORMATS)

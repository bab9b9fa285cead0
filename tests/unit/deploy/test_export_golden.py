"""Golden files: every export format of a vLLM and an SGLang trial, byte for byte, and each one read
back to the argv it was written from. ``TUNER_UPDATE_GOLDEN=1`` rewrites the files after a change
that is meant (then review the diff: it is the change users get)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.unit.deploy.test_export import SGLANG_PARAMS, SPEC_PARAMS, _add_engine_trial, _joint_study
from tuner.deploy.export import RENDERERS, manifest
from tuner.deploy.formats import read_container_args, read_launcher, read_sh

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "golden"
READERS = {
    "sh": read_sh,
    "python": read_launcher,
    "compose": read_container_args,
    "k8s": read_container_args,
    "json": lambda text: (json.loads(text)["module"], json.loads(text)["argv"]),
}


def _manifest(engine: str) -> dict[str, object]:
    study = _joint_study()
    trial = _add_engine_trial(study, engine, SGLANG_PARAMS if engine == "sglang" else SPEC_PARAMS)
    m = manifest(study, trial)
    m.update(exported_at="2026-12-01T00:00:00+00:00", tuner_version="0.1.0")  # what changes run to run
    m["parser_check"] = {"engine_version": m["engine_version"], "ok": True, "error": None, "speculative": True}
    # the provenance a finished study gives: within-trial intervals, repeats, the stress check, a verdict
    m["ci"] = {
        "ttft_p95_ms": {"low": 111.0, "high": 131.5, "method": "bootstrap"},
        "output_throughput_tok_s": {"low": 70.2, "high": 79.9, "method": "batch means over 4 slices"},
    }
    m["repeats"] = {"trial": 0, "stats": {"output_throughput_tok_s": {"n": 5, "mean": 74.1, "low": 71.0, "high": 77.2}}}
    m["stress"] = {"ran": True, "failure": None, "ttft_p95_ms": 250.4, "prompt_tokens": 996, "concurrency": 4}
    m["verdict"] = {"kind": "winner", "metric": "goodput_req_s", "trials": [0]}
    return m


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("fmt", sorted(RENDERERS))
def test_each_format_matches_its_golden_file_and_reads_back(engine: str, fmt: str) -> None:
    m = _manifest(engine)
    suffix, render = RENDERERS[fmt]
    text = render(m)
    golden = GOLDEN / f"{engine}{suffix}"
    if os.environ.get("TUNER_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text(), f"{golden.name} changed: rerun with TUNER_UPDATE_GOLDEN=1 if that is meant"
    assert READERS[fmt](text) == (m["module"], m["argv"])

"""Compose and Kubernetes exports, and the vLLM Python launcher: valid, complete, faithful, secret-free."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
import yaml

from tuner.deploy.formats import read_container_args, read_launcher, render_compose, render_k8s, render_python
from tuner.deploy.provenance import _capacity_lines, provenance
from tuner.errors import ExportError

NASTY = '/models/my "model"; touch pwned; /x y'
SPEC = json.dumps({"model": "/models/draft 2", "num_speculative_tokens": 3, "method": "draft_model"})


def _manifest(engine: str) -> dict[str, Any]:
    module = {"vllm": "vllm.entrypoints.openai.api_server", "sglang": "sglang.launch_server"}[engine]
    argv = ["--model", NASTY, "--max-num-batched-tokens", "512", "--speculative-config", SPEC, "--enforce-eager"]
    return {
        "tuner_version": "0.1.0", "exported_at": "2026-11-30T00:00:00+00:00", "study": "rag/../x", "trial": 3,
        "config_kind": "sampled", "engine": engine, "engine_version": "0.32.0" if engine == "vllm" else "0.5.23",
        "distribution": engine, "hardware": {"name": "H200"}, "model": NASTY, "workload": "rag",
        "workload_digest": "d" * 64, "objectives": {"ttft_p95_ms": 12.5}, "module": module,
        "python": "/env/bin/python", "argv": argv,
    }  # fmt: skip


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_compose_is_valid_and_reads_back_the_argv(engine: str) -> None:
    m = _manifest(engine)
    text = render_compose(m, provenance(m))
    doc = yaml.safe_load(text)
    ((name, service),) = doc["services"].items()
    assert "/" not in name and ".." not in name
    assert service["image"].startswith({"vllm": "vllm/vllm-openai:v", "sglang": "lmsysorg/sglang:v"}[engine])
    assert service["image"].endswith(m["engine_version"])
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert service["healthcheck"]["test"][-1].endswith({"vllm": "/health", "sglang": "/health_generate"}[engine])
    assert service["volumes"][0]["read_only"] is True and service["environment"] == ["HF_TOKEN"]
    assert read_container_args(text) == (m["module"], m["argv"])


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_k8s_has_a_deployment_and_a_service_with_probes(engine: str) -> None:
    m = _manifest(engine)
    text = render_k8s(m, provenance(m))
    deployment, service = list(yaml.safe_load_all(text))
    assert (deployment["apiVersion"], deployment["kind"]) == ("apps/v1", "Deployment")
    assert (service["apiVersion"], service["kind"]) == ("v1", "Service")
    labels = deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["template"]["metadata"]["labels"] == labels == service["spec"]["selector"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] in ("/health", "/health_generate")
    assert len(deployment["metadata"]["name"]) <= 63
    assert read_container_args(text) == (m["module"], m["argv"])


def test_no_secret_value_is_ever_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_123")
    m = _manifest("vllm")
    for text in (render_compose(m, provenance(m)), render_k8s(m, provenance(m)), render_python(m, provenance(m))):
        assert "hf_secret_value_123" not in text


def test_vllm_python_launcher_reads_back_and_compiles() -> None:
    m = _manifest("vllm")
    text = render_python(m, provenance(m))
    compile(text, "launcher.py", "exec")
    assert read_launcher(text) == (m["module"], m["argv"])
    sglang = _manifest("sglang")
    assert read_launcher(render_python(sglang, provenance(sglang)))[0] == "sglang.launch_server"


@pytest.mark.parametrize("text", ["services: [", "just: text\n", "kind: Deployment\n", "services: {a: 1}\n"])
def test_reading_something_else_is_an_export_error(text: str) -> None:
    with pytest.raises(ExportError):
        read_container_args(text)


def test_the_provenance_gives_each_capacity_with_its_bracket_and_attainment_interval() -> None:
    from tuner.measure.capacity import CapacitySearch, judged_step

    search = CapacitySearch(target=0.9, resolution=0.1, start_rate=10.0)
    while (rate := search.next_rate()) is not None:
        step = judged_step(rate, 0.97 if rate <= 30.0 else 0.5, 0.9)
        search.record(replace(step, attainment_low=0.93, attainment_high=0.99) if step.passed else step)
    record = search.result().as_dict()
    m = {"model": "m", "workload": "rag", "workload_digest": "d", "metrics": {},
         "capacity": {"tiers": {"interactive": {**record, "slo": {"ttft_p95_ms": 200.0}}}}}  # fmt: skip
    line = next(x for x in _capacity_lines(m) if "interactive tier" in x)
    low, high = record["bracket_req_s"]
    assert f"{low:.3g} req/s with 90% of requests within ttft_p95_ms <= 200" in line
    assert f"in [{low:.3g}, {high:.3g}) req/s" in line and "attainment 0.97 [0.93, 0.99]" in line

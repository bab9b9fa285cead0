"""The compose and Kubernetes exports against the tools' own schemas: the Compose Specification's
JSON schema (as docker-compose 1.29.2 ships it; ``scripts/setup.sh`` puts it under .cache/schemas)
and Kubernetes' OpenAPI schemas for 1.32 (``kubernetes-validate``), strict: unknown fields fail."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.unit.deploy.test_deploy import _manifest
from tuner.deploy.formats import render_compose, render_k8s
from tuner.deploy.provenance import provenance

COMPOSE_SCHEMA = Path(__file__).resolve().parents[3] / ".cache" / "schemas" / "compose_spec.json"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_compose_export_is_valid_under_the_compose_specification(engine: str) -> None:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    m = _manifest(engine)
    doc = yaml.safe_load(render_compose(m, provenance(m)))
    jsonschema.Draft201909Validator(schema).validate(doc)


def test_the_compose_schema_would_catch_a_mistake() -> None:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    m = _manifest("vllm")
    doc = yaml.safe_load(render_compose(m, provenance(m)))
    ((service,),) = [list(doc["services"].values())]
    service["deploy"]["resources"]["reservations"]["gpus"] = 1  # not a Compose field
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft201909Validator(schema).validate(doc)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_k8s_export_is_valid_for_kubernetes_1_32(engine: str) -> None:
    m = _manifest(engine)
    for doc in yaml.safe_load_all(render_k8s(m, provenance(m))):
        kubernetes_validate.validate(doc, "1.32", strict=True)


def test_the_k8s_schema_would_catch_a_mistake() -> None:
    m = _manifest("vllm")
    deployment, _ = list(yaml.safe_load_all(render_k8s(m, provenance(m))))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = {"a": 1}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.32", strict=True)

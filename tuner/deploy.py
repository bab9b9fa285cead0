"""Container launch files: a docker-compose service and a Kubernetes Deployment + Service.

Both run the engine's official image (``vllm/vllm-openai``, ``lmsysorg/sglang``) at the version the
trial measured, with the exact argv, a GPU reservation, the port, a health check on the engine's
health endpoint and the model folder mounted read-only at the same path. Secrets never appear: a
token such as ``HF_TOKEN`` is passed by name (compose takes it from the caller's environment, k8s
from a Secret), never by value. The YAML is written with ``yaml.safe_dump``, so every value is quoted
as YAML needs and each argument stays one list item.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from tuner.errors import ExportError
from tuner.launch_sh import engine_args
from tuner.naming import safe_name

IMAGES = {"vllm": "vllm/vllm-openai", "sglang": "lmsysorg/sglang"}
PORTS = {"vllm": 8000, "sglang": 30000}
HEALTH = {"vllm": "/health", "sglang": "/health_generate"}
SECRET_ENV = ("HF_TOKEN",)
GPU_RESERVATION = {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}


def _container(m: dict[str, Any]) -> tuple[str, list[str], list[str], int]:
    engine = m["engine"]
    image = f"{IMAGES[engine]}:v{m['engine_version']}"
    port = PORTS[engine]
    entrypoint = ["python3", "-m", m["module"]]
    return image, entrypoint, [*m["argv"], "--host", "0.0.0.0", "--port", str(port)], port


def _model_dir(m: dict[str, Any]) -> str:
    return os.path.dirname(str(m["model"]).rstrip("/")) or "/"


def render_compose(m: dict[str, Any], header: list[str]) -> str:
    image, entrypoint, args, port = _container(m)
    service = {
        "image": image,
        "entrypoint": entrypoint,
        "command": args,
        "ports": [f"{port}:{port}"],
        "ipc": "host",
        "environment": list(SECRET_ENV),  # by name: the value comes from the caller's environment
        "volumes": [{"type": "bind", "source": _model_dir(m), "target": _model_dir(m), "read_only": True}],
        "deploy": {"resources": {"reservations": {"devices": [GPU_RESERVATION]}}},
        "healthcheck": {
            "test": ["CMD", "curl", "-f", f"http://localhost:{port}{HEALTH[m['engine']]}"],
            "interval": "15s", "timeout": "5s", "retries": 20, "start_period": "300s",
        },
    }  # fmt: skip
    doc = {"services": {safe_name(f"{m['engine']}-{m['study']}-{m['trial']}").lower(): service}}
    return "\n".join(header) + "\n" + yaml.safe_dump(doc, sort_keys=False, width=10_000)


def render_k8s(m: dict[str, Any], header: list[str]) -> str:
    image, entrypoint, args, port = _container(m)
    name = safe_name(f"{m['engine']}-{m['study']}-{m['trial']}").lower().replace("_", "-").replace(".", "-")[:63]
    probe = {"httpGet": {"path": HEALTH[m["engine"]], "port": port}, "periodSeconds": 15}
    container = {
        "name": m["engine"], "image": image, "command": entrypoint, "args": args,
        "ports": [{"containerPort": port}],
        "env": [{"name": s, "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": s, "optional": True}}}
                for s in SECRET_ENV],
        "resources": {"limits": {"nvidia.com/gpu": 1}},
        "readinessProbe": {**probe, "initialDelaySeconds": 60},
        "livenessProbe": {**probe, "initialDelaySeconds": 600, "failureThreshold": 5},
        "volumeMounts": [{"name": "model", "mountPath": _model_dir(m), "readOnly": True}],
    }  # fmt: skip
    labels = {"app": name}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [container],
                     "volumes": [{"name": "model", "hostPath": {"path": _model_dir(m), "type": "Directory"}}]},
        }},
    }  # fmt: skip
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
        "spec": {"selector": labels, "ports": [{"port": port, "targetPort": port}]},
    }  # fmt: skip
    return "\n".join(header) + "\n" + yaml.safe_dump_all([deployment, service], sort_keys=False, width=10_000)


def read_container_args(text: str) -> tuple[str, list[str]]:
    """The module and engine args of an exported compose or k8s file (host and port dropped)."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    except yaml.YAMLError as exc:
        raise ExportError(f"not valid YAML: {str(exc).splitlines()[0]}") from exc
    try:
        for doc in docs:
            if "services" in doc:
                service = next(iter(doc["services"].values()))
                return _split(service["entrypoint"], service["command"])
            if doc.get("kind") == "Deployment":
                container = doc["spec"]["template"]["spec"]["containers"][0]
                return _split(container["command"], container["args"])
    except (KeyError, TypeError, IndexError, StopIteration, AttributeError) as exc:
        raise ExportError(f"a launch file with a missing or malformed field: {exc!r}") from exc
    raise ExportError("neither a compose service nor a Kubernetes Deployment written by tuner export")


def _split(entrypoint: list[str], args: list[str]) -> tuple[str, list[str]]:
    return engine_args([*entrypoint[:1], *entrypoint[1:], *args])

"""Container launch files: a docker-compose service and a Kubernetes Deployment + Service.

Both run the engine's official image (the adapter's ``image``) at the version the trial measured,
with the exact engine args, a GPU reservation, the engine's default port, a health check on the
engine's health endpoint and the model folder mounted read-only at the same path. Secrets never appear: a
token such as ``HF_TOKEN`` is passed by name (compose takes it from the caller's environment, k8s
from a Secret), never by value. The YAML is written with ``yaml.safe_dump``, so every value is quoted
as YAML needs and each argument stays one list item.

Shell launch files: ``exec "$ENGINE_PYTHON" -m MODULE ARGS...``, and reading one back.

Every value is quoted with ``shlex.quote``, so a model path with spaces or quotes, or the JSON of
``--speculative-config``, stays one argument. The interpreter, host and port can be overridden
with ``ENGINE_PYTHON``, ``HOST`` and ``PORT``. ``read_sh`` reads a file as bash would, so
``tuner check`` validates exactly the command the file runs.

Python launch files: ``package.Runtime(**KWARGS)`` as users of an engine with its own Python launcher
(the adapter's ``runtime_class``: ``sglang.Runtime``) write it, else the server module run in-process.

The keyword arguments are the server flags with dashes turned into underscores; a flag with no
value is ``True``, and numbers are written as numbers (``ServerArgs`` is a typed dataclass).
``read_python`` turns the ``KWARGS`` literal back into the argv, so ``tuner check`` validates a
Python launcher with the same parser as a shell one.
"""

from __future__ import annotations

import ast
import os
import pprint
import re
import shlex
from typing import Any

import yaml

from tuner.deploy.provenance import provenance
from tuner.engines import ADAPTERS
from tuner.errors import ExportError
from tuner.naming import safe_name

SECRET_ENV = ("HF_TOKEN",)
GPU_RESERVATION = {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}


def _container(m: dict[str, Any]) -> tuple[str, list[str], list[str], int]:
    adapter = ADAPTERS[m["engine"]]()
    image = f"{adapter.image}:v{m['engine_version']}"
    port = adapter.default_port
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
            "test": ["CMD", "curl", "-f", f"http://localhost:{port}{ADAPTERS[m['engine']]().health_path}"],
            "interval": "15s", "timeout": "5s", "retries": 20, "start_period": "300s",
        },
    }  # fmt: skip
    doc = {"services": {safe_name(f"{m['engine']}-{m['study']}-{m['trial']}").lower(): service}}
    return "\n".join(header) + "\n" + yaml.safe_dump(doc, sort_keys=False, width=10_000)


def render_k8s(m: dict[str, Any], header: list[str]) -> str:
    image, entrypoint, args, port = _container(m)
    name = safe_name(f"{m['engine']}-{m['study']}-{m['trial']}").lower().replace("_", "-").replace(".", "-")[:63]
    probe = {"httpGet": {"path": ADAPTERS[m["engine"]]().health_path, "port": port}, "periodSeconds": 15}
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


# The shell launch file: written from a manifest, read back for `tuner check`.
__all__ = ["engine_args", "read_sh", "render_sh"]
ADDRESS_FLAGS = ("--host", "--port")


def engine_args(argv: list[str]) -> tuple[str, list[str]]:
    """Split a command read back from a launch file, ``python -m MODULE args...``, into MODULE and the
    args without host and port."""
    if len(argv) < 3 or argv[1] != "-m":
        raise ExportError(f"not an engine command: {argv[:3]}")
    args, rest = [], iter(argv[3:])
    for arg in rest:
        if arg in ADDRESS_FLAGS:
            next(rest, None)
        else:
            args.append(arg)
    return argv[2], args


def render_sh(m: dict[str, Any]) -> str:
    header = [
        "#!/usr/bin/env bash",
        *provenance(m),
        "# Override the interpreter with ENGINE_PYTHON, the address with HOST and PORT.",
        "set -euo pipefail",
        f"ENGINE_PYTHON=${{ENGINE_PYTHON:-{shlex.quote(m['python'])}}}",
        "HOST=${HOST:-127.0.0.1}",
        f"PORT=${{PORT:-{ADAPTERS[m['engine']]().default_port}}}",
    ]
    lines = [f'exec "$ENGINE_PYTHON" -m {shlex.quote(m["module"])}']
    lines += [f"  {shlex.quote(a)}" for a in m["argv"]]
    lines.append('  --host "$HOST" --port "$PORT"')
    return "\n".join(header) + "\n" + " \\\n".join(lines) + "\n"


def read_sh(text: str) -> tuple[str, list[str]]:
    """The module and engine args of an exported ``*.sh`` (the inverse of ``render_sh``), read as bash
    reads it: a quoted value may hold a newline, and a line ends in ``\\`` only outside quotes."""
    try:
        words = shlex.split(_join_lines(text))
    except ValueError as exc:  # an unclosed quote: not what render_sh writes
        raise ExportError(f"not a launch file written by tuner export: {exc}") from exc
    start = next((i for i, w in enumerate(words) if w == "exec"), None)
    if start is None:
        raise ExportError("no 'exec' line: not a launch file written by tuner export")
    command = words[start + 1 :]
    if len(command) < 3 or command[1] != "-m":
        raise ExportError("the exec line does not start an engine module")
    _, args = engine_args(command)
    return command[2], args


def _join_lines(text: str) -> str:
    """``text`` as bash reads it before splitting words: comments dropped, and every backslash-newline
    outside single quotes removed (``shlex.quote`` writes a quote as ``'"'"'``: double quotes count too)."""
    out, quote, i = [], "", 0
    while i < len(text):
        char = text[i]
        if char == "\\" and quote != "'":
            if text.startswith("\n", i + 1):
                i += 2
                continue
            out.append(text[i : i + 2])  # an escaped character, never a quote
            i += 2
            continue
        if char == "#" and not quote and (i == 0 or text[i - 1].isspace()):
            end = text.find("\n", i)  # a comment: its quotes are no quotes (provenance holds user text)
            i = len(text) if end < 0 else end
            continue
        if char in "'\"" and quote in ("", char):
            quote = char if quote == "" else ""
        out.append(char)
        i += 1
    return "".join(out)


# Engine flags as the engines' own parsers take them, for the compose and JSON formats.
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE]-?\d+)?")


def _value(text: str) -> Any:
    if _NUMBER.fullmatch(text):
        return float(text) if any(c in text for c in ".eE") else int(text)
    return text


def argv_to_kwargs(args: list[str]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        if not flag.startswith("--"):
            raise ExportError(f"cannot turn {flag!r} into a keyword argument")
        has_value = i + 1 < len(args) and not args[i + 1].startswith("--")
        kwargs[flag[2:].replace("-", "_")] = _value(args[i + 1]) if has_value else True
        i += 2 if has_value else 1
    return kwargs


def kwargs_to_argv(kwargs: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for key, value in kwargs.items():
        args.append("--" + key.replace("_", "-"))
        if value is not True:
            args.append(str(value))
    return args


def render_python(m: dict[str, Any], header: list[str]) -> str:
    """The engine's Python launcher: its own runtime class where its adapter names one, else its server module."""
    adapter = ADAPTERS[m["engine"]]()
    if adapter.runtime_class is None:
        argv = pprint.pformat(list(m["argv"]), indent=4)
        body = _MODULE_LAUNCHER.replace("@PORT@", str(adapter.default_port))  # before any user text
        body = body.replace("@MODULE@", repr(m["module"])).replace("@ARGV@", argv)
        return "\n".join(["#!/usr/bin/env python3", *header, body])
    return _render_runtime(m, header, adapter.runtime_class, adapter.default_port)


def _render_runtime(m: dict[str, Any], header: list[str], runtime_class: str, port: int) -> str:
    kwargs = argv_to_kwargs(m["argv"])
    body = pprint.pformat(kwargs, indent=4, sort_dicts=False)  # a Python literal: quoting is repr's
    # Plain concatenation, not an f-string: the launcher's own dict braces must stay as they are.
    package = runtime_class.rpartition(".")[0]
    launcher = _LAUNCHER.replace("@PORT@", str(port)).replace("@PACKAGE@", package)
    launcher = launcher.replace("@RUNTIME@", runtime_class).replace("@KWARGS@", body)
    return "\n".join(["#!/usr/bin/env python3", *header, launcher])


_LAUNCHER = """# Run with the engine environment's Python; HOST and PORT come from the environment.
import os
import signal

import @PACKAGE@

KWARGS = @KWARGS@

if __name__ == "__main__":
    address = {"host": os.environ.get("HOST", "127.0.0.1"), "port": int(os.environ.get("PORT", "@PORT@"))}
    runtime = @RUNTIME@(**KWARGS, **address)
    print(runtime.url, flush=True)
    try:
        signal.pause()
    finally:
        runtime.shutdown()
"""


_MODULE_LAUNCHER = """# Run with the engine environment's Python; HOST and PORT come from the environment.
# The engine's server through its Python entry point, exactly as `python -m` would start it.
import os
import runpy
import sys

MODULE = @MODULE@
ARGV = @ARGV@

if __name__ == "__main__":
    address = ["--host", os.environ.get("HOST", "127.0.0.1"), "--port", os.environ.get("PORT", "@PORT@")]
    sys.argv = [MODULE, *ARGV, *address]
    runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
"""


def read_launcher(text: str) -> tuple[str, list[str]]:
    """The module and engine args of either Python launcher: a runtime launcher's module is that of the
    engine whose runtime class it calls (a bare ``KWARGS`` literal: the one engine that has one)."""
    try:
        assigned = {
            t.id: node.value
            for node in ast.parse(text).body
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name)
        }
        if "ARGV" in assigned and "MODULE" in assigned:
            return str(ast.literal_eval(assigned["MODULE"])), [str(a) for a in ast.literal_eval(assigned["ARGV"])]
    except (SyntaxError, ValueError) as exc:
        raise ExportError(f"not a Python launcher written by tuner export: {exc}") from exc
    runtimes = [a for a in ADAPTERS.values() if a.runtime_class]
    called = [a.module for a in runtimes if f"{a.runtime_class}(" in text] or [a.module for a in runtimes]
    if len(called) != 1:
        raise ExportError("a Python launcher that runs no known engine: not written by tuner export")
    return called[0], read_python(text)


def read_python(text: str) -> list[str]:
    """The engine args of a Python launcher written by ``render_python``."""
    try:
        tree = ast.parse(text)
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "KWARGS" for t in node.targets):
                kwargs = ast.literal_eval(node.value)
                if isinstance(kwargs, dict):
                    return kwargs_to_argv(kwargs)
    except (SyntaxError, ValueError) as exc:
        raise ExportError(f"not a Python launcher written by tuner export: {exc}") from exc
    raise ExportError("no KWARGS dict: not a Python launcher written by tuner export")

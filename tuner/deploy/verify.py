"""Validate engine argv with the engine's own parser, in the engine's own environment.

The tuner imports no engine, so it runs the adapter's ``check_script``
(``tuner/engines/scripts/check_<engine>.py``) with the engine environment's Python and reads one
JSON verdict per argv. Batching matters: importing vLLM takes
15-40 s, paid once per call however many argv are checked. ``check_files`` reads the command
back out of any exported launch file and checks the files of one engine environment in one call.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tuner.deploy.formats import read_container_args, read_launcher, read_sh
from tuner.engines import ADAPTERS
from tuner.engines import env as env_probe
from tuner.engines.env import EngineEnv
from tuner.errors import ConfigError, EnvironmentSetupError, ExportError

Checked = tuple[Path, str, str, dict[str, Any]]  # file, engine, engine version, verdict


def check_argvs(env: EngineEnv, argvs: list[list[str]], timeout_s: float = 600.0) -> list[dict[str, Any]]:
    """One verdict per argv (engine arguments only, without ``python -m module``)."""
    if not argvs:
        return []
    script = ADAPTERS[env.engine]().check_script
    if script is None:
        raise EnvironmentSetupError(f"{env.engine}: no parser check is known to the tuner")
    try:
        done = subprocess.run(
            [env.python, str(script)],
            input=json.dumps(argvs),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise EnvironmentSetupError(f"cannot run {env.engine}'s parser check: {exc}") from exc
    verdicts = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or len(verdicts) != len(argvs):
        detail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise EnvironmentSetupError(f"{env.engine}'s parser check failed to run: {detail[0]}")
    return verdicts


def read_launch_file(path: Path) -> tuple[str, list[str], str | None]:
    """The engine module, its args and (for a manifest) its Python, of any exported launch file."""

    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        if path.suffix == ".json":
            m = json.loads(text)
            return m["module"], list(m["argv"]), m["python"]
        if path.suffix == ".py":  # a Python launcher: an engine's runtime class, or its server module
            return (*read_launcher(text), None)
        if path.suffix in (".yaml", ".yml"):  # docker compose or Kubernetes
            return (*read_container_args(text), None)
        return (*read_sh(text), None)
    except (ValueError, KeyError, TypeError) as exc:
        raise ExportError(f"{path}: not a file written by tuner export ({type(exc).__name__}: {exc})") from exc


def check_files(paths: list[Path], engine_env: str | None) -> Iterator[Checked]:
    """Each file's verdict, grouped by engine environment: ``engine_env``, else the one a manifest
    names, else the engine's default environment. Every file is read before any parser runs; each
    group's verdicts come as soon as its parser has run, so one missing environment still leaves
    the other groups' verdicts said."""

    # (engine, interpreter) -> the environment as first named (None: the default) and its files
    groups: dict[tuple[str, str], tuple[Path | None, list[tuple[Path, list[str]]]]] = {}
    for path in paths:
        module, argv, python = read_launch_file(path)
        engine = next((name for name, a in ADAPTERS.items() if a.module == module), None)
        if engine is None:
            raise ExportError(f"{path}: unknown engine module {module}")
        named = engine_env or python
        # keyed by the interpreter's absolute path (symlinks kept: a venv's python links to the base
        # one), so a manifest naming the default environment shares its parser run with the rest
        where = Path(named) if named else env_probe.default_env_dir(engine)
        key = (engine, os.path.abspath(env_probe.python_of(where)))
        groups.setdefault(key, (Path(named) if named else None, []))[1].append((path, argv))
    for (engine, _), (location, files) in groups.items():
        env = env_probe.probe(ADAPTERS[engine](), location)
        verdicts = check_argvs(env, [argv for _, argv in files])
        yield from ((path, engine, env.version, v) for (path, _), v in zip(files, verdicts, strict=True))

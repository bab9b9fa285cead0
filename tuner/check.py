"""Validate engine argv with the engine's own parser, in the engine's own environment.

The tuner imports no engine, so it runs ``tuner/scripts/check_<engine>.py`` with the engine
environment's Python and reads one JSON verdict per argv. Batching matters: importing vLLM takes
15-40 s, paid once per call however many argv are checked.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tuner.engines.env import EngineEnv
from tuner.errors import EnvironmentSetupError

SCRIPTS = Path(__file__).parent / "scripts"


def check_argvs(env: EngineEnv, argvs: list[list[str]], timeout_s: float = 600.0) -> list[dict[str, Any]]:
    """One verdict per argv (engine arguments only, without ``python -m module``)."""
    if not argvs:
        return []
    script = SCRIPTS / f"check_{env.engine}.py"
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

"""The one exception tree of the tuner.

    TunerError                      every failure the CLI turns into one line on stderr
    ├── ConfigError                 bad flags, YAML, search space or SLO string (exit 2)
    ├── EnvironmentSetupError       an engine environment is missing or broken
    ├── EngineError                 an engine server did not serve a trial
    │   ├── EngineLaunchError       the server exited or timed out before it was ready
    │   └── EngineCrashError        the server died or failed while serving
    ├── WorkloadError               a workload could not be built or read
    ├── ExportError                 a launch file could not be written or was rejected
    └── StorageError                the study storage could not be opened or used
        └── MissingStudyError       a command that reads found no such study (exit 2)

Foreign exceptions are wrapped with ``raise ... from exc`` so ``--debug`` still shows the cause.
Engine errors carry a ``failure`` class (``oom_boot``, ``boot_timeout``, ...) that is stored on the
trial.
"""

from __future__ import annotations


class TunerError(Exception):
    """Base class: a failure the user can act on, printed as one line."""

    exit_code = 1


class ConfigError(TunerError):
    """A usage or configuration error: nothing was started and nothing written."""

    exit_code = 2


class EnvironmentSetupError(TunerError):
    """An engine's Python environment is missing, broken, or of an unsupported version."""


class EngineError(TunerError):
    """An engine server failed a trial; ``failure`` is its class and ``log_tail`` its last lines."""

    def __init__(self, message: str, failure: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.failure = failure
        self.log_tail = log_tail


class EngineLaunchError(EngineError):
    """The server exited, or missed its readiness deadline, before it could serve."""


class EngineCrashError(EngineError):
    """The server died, or stopped answering, while the workload ran."""


class WorkloadError(TunerError):
    """A workload preset or trace could not be built or read."""


class ExportError(TunerError):
    """A launch file could not be written, or its engine's parser rejected it."""


class StorageError(TunerError):
    """The study storage could not be opened, or the study is not there."""


class MissingStudyError(StorageError):
    """A command that only reads named a study (or a SQLite file) that is not there; nothing was created."""

    exit_code = 2

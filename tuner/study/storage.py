"""Study storages that ride out a database restart, and say so in one line when they cannot.

``resilient(storage)`` puts a storage (a URL: Optuna's ``RDBStorage`` with its trial cache; or one
already made, such as ``tuner.fleet.loop``'s heartbeat storage) behind ``RetryingStorage``:

* a call that fails because the database cannot be reached (SQLAlchemy's ``OperationalError``,
  ``InterfaceError``, or a dropped connection, bare or wrapped in Optuna's
  ``StorageInternalError``) is retried with exponential backoff (0.5 s doubling to 15 s) until the
  outage has lasted ``PATIENCE_S``; then ``StorageOutage`` is raised, naming the storage (its
  password hidden). Any other error (a missing study, a finished trial) passes through at once.
  ``Outage.call`` does the same for code that talks to the database itself (advisory locks);
* URL storages check connections before use (``pool_pre_ping``), so the first call after a
  PostgreSQL restart reconnects instead of failing on a dead pooled connection;
* a heartbeat that cannot be written is skipped, never an error: a missed beat only brings the
  stale check closer, and the next storage call meets the outage anyway.

``StorageOutage`` is deliberately not an ``Exception``: Optuna's own loops catch every exception a
trial raises and then write the trial's FAIL state to the very storage that is down (retrying again
and failing in their clean-up); as a ``BaseException`` it ends the search at once, like Ctrl-C, and
``tuner.cli.main`` prints it as one line. Every finished trial is already committed; the one it
interrupted is reclaimed by the next search (``tuner.fleet.loop``).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import optuna
import sqlalchemy.engine
import sqlalchemy.exc
from optuna.storages import BaseStorage
from optuna.storages._heartbeat import BaseHeartbeat

from tuner.errors import ConfigError, MissingStudyError, StorageError
from tuner.naming import safe_name

PATIENCE_S = 300.0  # a database restart or fail-over takes seconds to a minute; a study runs for hours
FIRST_WAIT_S, MAX_WAIT_S = 0.5, 15.0
T = TypeVar("T")


class StorageOutage(BaseException):
    """The study storage stayed unreachable for longer than ``PATIENCE_S``; one line for the user."""

    exit_code = 1


def redacted(url: str) -> str:
    """``url`` fit for a message: its password, if any, replaced by ``***``."""
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except (sqlalchemy.exc.ArgumentError, ValueError):
        return re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", url)


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not be reached (worth retrying), not that a call was wrong."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
            return True
        if isinstance(seen, sqlalchemy.exc.DBAPIError) and seen.connection_invalidated:
            return True
        if not isinstance(seen, optuna.exceptions.StorageInternalError):
            return False
        seen = seen.__cause__
    return False


def reason(exc: BaseException) -> str:
    """The database driver's own first line (``Connection refused``...), under SQLAlchemy's and Optuna's wrappers."""
    seen = exc
    while getattr(seen, "orig", None) is None and seen.__cause__ is not None:
        seen = seen.__cause__
    lines = [line.strip() for line in str(getattr(seen, "orig", None) or seen).splitlines() if line.strip()]
    return (lines or [type(seen).__name__])[0][:200]


class Outage:
    """Patience with one database: calls that fail for want of it are retried until it has been
    down for ``patience_s`` in all (one outage, one patience, however many calls meet it)."""

    def __init__(self, where: str, patience_s: float | None = None) -> None:
        self.where = where
        self.patience_s = PATIENCE_S if patience_s is None else patience_s
        self.down_since: float | None = None

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        wait = FIRST_WAIT_S
        while True:
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                if not transient(exc):
                    raise
                wait = self._wait(exc, wait)
            else:
                self.down_since = None
                return result

    def _wait(self, exc: Exception, wait: float) -> float:
        now = time.monotonic()
        self.down_since = self.down_since or now
        left = self.patience_s - (now - self.down_since)
        if left <= 0:
            raise StorageOutage(
                f"the study storage {self.where} was unreachable for {now - self.down_since:.0f} s "
                f"({reason(exc)}); finished trials are kept there: rerun the command to resume"
            ) from exc
        time.sleep(min(wait, left))
        return min(2 * wait, MAX_WAIT_S)


class RetryingStorage(BaseStorage, BaseHeartbeat):
    """Forwards every storage call to ``inner``, retrying those that fail for want of the database."""

    def __init__(self, inner: BaseStorage, where: str, patience_s: float | None = None) -> None:
        self.inner = inner
        self.outage = Outage(where, patience_s)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.outage.call(getattr(self.inner, name), *args, **kwargs)

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            self._call_heartbeat("record_heartbeat", trial_id)
        except Exception as exc:  # a missed beat is harmless: the next real call meets the outage
            if not transient(exc):
                raise

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        ids: list[int] = self.outage.call(self._call_heartbeat, "_get_stale_trial_ids", study_id)
        return ids

    def get_heartbeat_interval(self) -> int | None:
        interval: int | None = self._call_heartbeat("get_heartbeat_interval") if self._beats() else None
        return interval

    def get_heartbeat_stale_trial_callback(self) -> Any:
        return self._call_heartbeat("get_heartbeat_stale_trial_callback") if self._beats() else None

    def _beats(self) -> bool:
        return isinstance(self.inner, BaseHeartbeat)

    def _call_heartbeat(self, name: str, *args: Any) -> Any:
        return getattr(self.inner, name)(*args)


def _forward(name: str) -> Any:
    def method(self: RetryingStorage, *args: Any, **kwargs: Any) -> Any:
        return self._call(name, *args, **kwargs)

    method.__name__ = name
    return method


for _name, _value in list(vars(BaseStorage).items()):  # every public storage call, abstract or not
    if callable(_value) and not _name.startswith("_"):
        setattr(RetryingStorage, _name, _forward(_name))
RetryingStorage.__abstractmethods__ = frozenset()


def resilient(storage: str | BaseStorage, patience_s: float | None = None) -> RetryingStorage:
    """``storage`` with retries (see the module docstring); a URL is opened here, which may raise."""
    if isinstance(storage, RetryingStorage):
        return storage
    if isinstance(storage, str):
        where = redacted(storage)
        kwargs = {} if storage.startswith("sqlite") else {"pool_pre_ping": True}
        storage = optuna.storages._CachedStorage(optuna.storages.RDBStorage(storage, engine_kwargs=kwargs))
    else:
        where = redacted(str(getattr(storage, "url", type(storage).__name__)))
    return RetryingStorage(storage, where, patience_s)  # type: ignore[abstract]


def storage_url(study_name: str, given: str | None, reading: bool = False) -> str:
    """``--storage``, else ``$TUNER_STORAGE``, else SQLite under ``studies/``, in a file named after
    the study that cannot leave that folder (``--study ../x`` is ``studies/_x.db``). A URL of a kind
    no database has is a ConfigError; ``reading`` (a command that only reads) makes no folder."""
    url = given_url(given)
    if url:
        return url
    if not reading:
        Path("studies").mkdir(exist_ok=True)
    return f"sqlite:///studies/{safe_name(study_name)}.db"


def given_url(given: str | None) -> str | None:
    """``--storage``, else ``$TUNER_STORAGE``, checked (``database_url``); None when neither is set."""
    url = given or os.environ.get("TUNER_STORAGE")
    if url:
        database_url(url)
    return url or None


def database_url(url: str) -> sqlalchemy.engine.URL:
    """``url`` parsed, when SQLAlchemy has a dialect for its scheme; otherwise a ConfigError (exit 2)."""
    try:
        parsed = sqlalchemy.engine.make_url(url)
        parsed.get_dialect()  # the dialect only: a missing driver is the environment's fault, met on opening
    except (sqlalchemy.exc.ArgumentError, ValueError) as exc:
        raise ConfigError(
            f"storage URL {redacted(url)}: not a database URL ({_first_line(exc)}); "
            "expected e.g. sqlite:///studies/NAME.db or postgresql://user@host/db"
        ) from exc
    return parsed


def existing_storage(url: str, name: str | None = None) -> str:
    """``url`` for a command that only reads: opening a SQLite file that is not there would create
    an empty database, so its absence is a ``MissingStudyError`` instead."""
    parsed = database_url(url)
    if parsed.get_backend_name() == "sqlite":
        where = parsed.database or ""
        if where in ("", ":memory:") or not Path(where).is_file():
            study = f"no study named {name!r}: " if name else ""
            raise MissingStudyError(f"{study}no study storage at {redacted(url)}")
    return url


def open_study(
    name: str,
    storage: str | optuna.storages.BaseStorage,
    directions: list[optuna.study.StudyDirection],
    sampler: optuna.samplers.BaseSampler,
) -> optuna.Study:
    """Create or resume the study, on a storage that retries through a database outage (``tuner.study.storage``)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(
            study_name=name,
            storage=resilient(storage),
            directions=directions,
            sampler=sampler,
            load_if_exists=True,
        )
    except _OPEN_ERRORS as exc:
        where = redacted(storage) if isinstance(storage, str) else type(storage).__name__
        raise StorageError(f"cannot open study {name!r} at {where}: {_first_line(exc)}") from exc
    # Optuna loads an existing study whatever directions were asked for; every trial of an objective
    # with another number of values would then fail, one after another, in silence.
    if list(study.directions) != list(directions):
        raise ConfigError(
            f"study {name!r} has the objectives {_directions(study.directions)}, and this --objective needs "
            f"{_directions(directions)}: use the objective it was made with, or another --study"
        )
    return study


def _directions(directions: Sequence[optuna.study.StudyDirection]) -> str:
    return "(" + ", ".join(d.name.lower() for d in directions) + ")"


_OPEN_ERRORS = (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError, ValueError, ImportError)


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """The storage at ``url`` for reading (the dashboard): it must be there already."""
    existing_storage(url)
    try:
        return optuna.storages.get_storage(url)
    except _OPEN_ERRORS as exc:
        raise StorageError(f"cannot open {redacted(url)}: {_first_line(exc)}") from exc


def load_existing(name: str, storage: str) -> optuna.Study:
    """The study ``name`` as it is; never creates a storage (``existing_storage``)."""
    try:
        return optuna.load_study(study_name=name, storage=resilient(existing_storage(storage, name)))
    except KeyError as exc:
        raise MissingStudyError(f"no study named {name!r} in {redacted(storage)}") from exc
    except _OPEN_ERRORS as exc:
        raise StorageError(f"cannot open {redacted(storage)}: {_first_line(exc)}") from exc

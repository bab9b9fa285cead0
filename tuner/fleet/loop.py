"""The loop each slot runs (``tuner.fleet.loop`` explains the protocol), and the slots of one process.

Running a study's trials: one loop per slot, in one process or in many on many hosts.

``tuner search`` runs this loop in its own thread (one slot) or in one thread per GPU slot;
``tuner worker`` runs it on every host of a fleet against one PostgreSQL study. Each turn:

1. Under the study's reservation lock (``Reservation``: a PostgreSQL advisory lock for a server
   database, a lock file beside a SQLite one), check the budget, ask Optuna for a trial, sample
   and screen it. Sampling one at a time, with TPE's ``constant_liar`` counting running trials as
   bad and each worker's sampler seeded apart (``tuner.search.samplers.resumed_seed``), keeps
   parallel workers from proposing the same point; counting under the lock keeps the study at
   exactly the budget.
2. Outside the lock, boot and drive it, with a heartbeat: a worker that dies (SIGKILL, a lost host)
   stops beating, so after the grace period another worker marks its trial FAIL and Optuna's
   ``RetryFailedTrialCallback`` enqueues the same config again, which the next free worker takes.
3. Tell the study; every trial carries its worker (host, pid, GPUs).

The budget (``--trials``) is the study's: trials that booted an engine, COMPLETE, PRUNED or still
RUNNING (screened trials are free; a FAIL is an interrupted or lost trial, redone). A worker whose
budget is spent waits while other trials run, since a lost one comes back to be retried.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import optuna
import sqlalchemy
import sqlalchemy.exc

from tuner.errors import ConfigError
from tuner.measure.trial import TrialContext
from tuner.study.attrs import SCREENED, STRESS_CHECK_KIND, TrialAttrs, trial_attrs, write_trial_attrs
from tuner.study.storage import Outage, redacted

BusyCheck = Callable[[], str | None]  # why this slot's GPUs cannot take a trial now, or None
MAX_TRIALS_PER_BOOT = 4  # screened configs are free, but a space that is all infeasible must still end


class Ticket(Protocol):
    """A trial prepared for a slot: told already (no boot needed), or to be executed."""

    @property
    def told(self) -> bool: ...
    @property
    def values(self) -> list[float]: ...
    @property
    def state(self) -> optuna.trial.TrialState: ...


T = TypeVar("T", bound=Ticket)


class TrialObjective(Protocol[T]):
    """What a slot runs: ``prepare`` samples and screens under the lock, ``execute`` boots and measures."""

    def prepare(self, trial: optuna.Trial) -> T: ...
    def execute(self, trial: optuna.Trial, prepared: T, ctx: TrialContext | None = None) -> list[float]: ...


@dataclass
class Budget:
    boots: int  # the study's: trials that booted an engine
    deadline: float | None = None  # time.monotonic() after which no trial starts

    def over(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline


@dataclass
class Slot:
    ctx: TrialContext
    gpus: tuple[int, ...] | None = None
    busy: BusyCheck = field(default=lambda: None)


def _fail_stale(study: optuna.Study) -> None:
    with warnings.catch_warnings():  # "experimental" in Optuna, and what its own optimize loop calls
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def work(study: optuna.Study, objective: TrialObjective[Any], budget: Budget, lock: Reservation, slot: Slot,
         stop: threading.Event) -> None:  # fmt: skip
    """Take trials until the study's budget is spent (waiting while others run) or ``stop`` is set."""
    said: str | None = None
    spent: list[float] = []  # wall seconds of this slot's booted trials, for the time left
    while not stop.is_set() and not budget.over():
        reason = slot.busy()
        if reason is not None:
            if reason != said:
                slot.ctx.progress.line(f"waiting: {reason}")
            said = reason
            time.sleep(WAIT_S * 5)
            continue
        _fail_stale(study)
        taken = _take(study, objective, budget, lock, slot)
        if taken is None:
            if running(study) and optuna.storages._heartbeat.is_heartbeat_enabled(study._storage):  # noqa: SLF001
                time.sleep(WAIT_S)  # a lost trial comes back WAITING, to be retried here
                continue
            return
        if isinstance(taken, tuple):
            started = time.monotonic()
            run_one(study, objective, taken[0], taken[1], slot)
            spent.append(time.monotonic() - started)
            slot.ctx.progress.line(time_left(boots_used(study), budget.boots, spent))


def time_left(done: int, boots: int, spent: list[float]) -> str:
    """``study: 3 of 12 booted trials done, about 41 min left`` from the mean booted trial so far."""
    left = max(boots - done, 0)
    head = f"study: {min(done, boots)} of {boots} booted trials done"
    if not spent or not left:
        return head
    minutes = left * sum(spent) / len(spent) / 60
    return (
        f"{head}, about {minutes:.0f} min left before the finalists" if minutes >= 1 else f"{head}, under a minute left"
    )


def _take(study: optuna.Study, objective: TrialObjective[Any], budget: Budget, lock: Reservation,
          slot: Slot) -> tuple[optuna.Trial, Ticket] | None | bool:  # fmt: skip
    """Under the lock: a prepared trial; False when it needed no boot (told already); None when spent."""
    with lock.held():
        if boots_used(study) >= budget.boots or len(study.trials) >= MAX_TRIALS_PER_BOOT * budget.boots:
            return None
        with warnings.catch_warnings():  # Optuna expects heartbeats only inside its own optimize loop
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
            trial = study.ask()
        prepared = objective.prepare(trial)
        if prepared.told:  # screened, or already measured: nothing boots
            study.tell(trial, prepared.values or None, state=prepared.state)
            return False
        # booted: counted from now on, so the budget holds exactly
        write_trial_attrs(trial, TrialAttrs(worker=worker_attrs(slot.gpus), booted=True))
        return trial, prepared


def run_one(study: optuna.Study, objective: TrialObjective[Any], trial: optuna.Trial, prepared: Ticket,
            slot: Slot) -> None:  # fmt: skip
    with heartbeat(study, trial):
        try:
            values = objective.execute(trial, prepared, slot.ctx)
        except optuna.TrialPruned:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return
        except BaseException:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
    study.tell(trial, values)


def run_slots(study: optuna.Study, objective: TrialObjective[Any], budget: Budget, lock: Reservation,
              slots: list[Slot]) -> None:  # fmt: skip
    """One slot in this thread (Ctrl-C stops its engine and fails its trial), or one thread per slot."""
    stop = threading.Event()
    if len(slots) == 1:
        work(study, objective, budget, lock, slots[0], stop)
        return
    errors: list[BaseException] = []

    def target(slot: Slot) -> None:
        try:
            work(study, objective, budget, lock, slot, stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which raises it
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=target, args=(s,), name=f"slot-{s.gpus}", daemon=True) for s in slots]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.5)
    except KeyboardInterrupt:
        stop.set()
        _fail_running(study, objective)
        raise
    if errors:
        raise errors[0]


def _fail_running(study: optuna.Study, objective: TrialObjective[Any]) -> None:
    """Ctrl-C with several slots: this process's running trials are marked FAIL before it exits
    (its engines stop with it: each is started through the reaper)."""

    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if (trial_attrs(t).get("worker") or {}).get("pid") == os.getpid():
            try:
                study.tell(t.number, state=optuna.trial.TrialState.FAIL)
            except (ValueError, RuntimeError):
                pass  # finished meanwhile


# Heartbeats: how a fleet tells a live worker from a dead one.
# A worker beats every HEARTBEAT_S; one silent for GRACE_S is taken for dead (its trial is retried).
# Tests shorten the grace through the environment; boots beat all along, so a long boot is not silence.
HEARTBEAT_S = int(os.environ.get("TUNER_HEARTBEAT_S", "10"))
GRACE_S = int(os.environ.get("TUNER_HEARTBEAT_GRACE_S", "60"))
MAX_RETRY = 2
WAIT_S = 2.0
_IN_PROCESS = threading.Lock()


def booted(t: optuna.trial.FrozenTrial) -> bool:
    attrs = trial_attrs(t)
    told = attrs.get("failure") == SCREENED or attrs.get("config_kind") == STRESS_CHECK_KIND  # never booted
    return bool(attrs.get("booted", not told))


def boots_used(study: optuna.Study) -> int:
    counted = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.RUNNING)
    return sum(1 for t in study.get_trials(deepcopy=False, states=counted) if booted(t))


def running(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))


class Reservation:
    """Mutual exclusion over the study for the moment a trial is sampled (see the module docstring)."""

    def __init__(self, storage_url: str, study_name: str) -> None:
        self.url, self.key = storage_url, int.from_bytes(hashlib.sha256(study_name.encode()).digest()[:7], "big")
        self._engine: sqlalchemy.Engine | None = None
        self._outage = Outage(redacted(storage_url))  # the lock waits out a database restart, as the storage does
        if storage_url.startswith("postgresql"):
            self._engine = sqlalchemy.create_engine(storage_url, pool_size=1, max_overflow=0, pool_pre_ping=True)

    def _locked_connection(self) -> sqlalchemy.Connection:
        assert self._engine is not None
        conn = self._engine.connect()
        conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": self.key})
        return conn

    @contextmanager
    def held(self) -> Iterator[None]:
        with _IN_PROCESS:  # threads of one process first, then processes
            if self._engine is not None:
                conn = self._outage.call(self._locked_connection)
                try:
                    yield
                finally:
                    try:
                        conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": self.key})
                        conn.close()
                    except sqlalchemy.exc.DBAPIError:
                        conn.invalidate()  # the connection died with the database, and its lock with it
            elif self.url.startswith("sqlite:///"):
                with Path(self.url.removeprefix("sqlite:///") + ".lock").open("a") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    yield
            else:
                yield


def worker_attrs(gpus: tuple[int, ...] | None) -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "gpus": list(gpus) if gpus else None}


@contextmanager
def heartbeat(study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Beat for ``trial`` every HEARTBEAT_S while the block runs, where the storage keeps heartbeats."""
    storage = study._storage  # noqa: SLF001 - Optuna's own optimize loop beats through it the same way
    if not optuna.storages._heartbeat.is_heartbeat_enabled(storage):  # noqa: SLF001
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            storage.record_heartbeat(trial._trial_id)  # type: ignore[attr-defined]  # noqa: SLF001
            stop.wait(HEARTBEAT_S)

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial.number}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def _retry() -> optuna.storages.RetryHeartbeatStaleTrialCallback:
    with warnings.catch_warnings():  # "experimental" since Optuna 2.8; the supported way all the same
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)


def heartbeat_storage(url: str) -> optuna.storages.BaseStorage:
    """An RDB storage that keeps heartbeats and retries the trials of workers that stopped beating."""
    with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna; they are what a fleet needs
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(
            url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S, heartbeat_stale_trial_callback=_retry(),
            engine_kwargs={"pool_pre_ping": True} if url.startswith("postgresql") else None,
        )  # fmt: skip


@contextmanager
def sole_process(url: str, study_name: str) -> Iterator[None]:
    """On SQLite, only one process may run a study: a second is refused with a line naming PostgreSQL."""
    if not url.startswith("sqlite:///"):
        yield
        return

    with Path(url.removeprefix("sqlite:///") + ".run.lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise ConfigError(
                f"study {study_name!r} is already being run by another process on {url}; SQLite allows one "
                "process per study: for more workers use PostgreSQL (--storage postgresql://user@host/db)"
            ) from exc
        yield


def reclaim(study: optuna.Study) -> int:
    """Trials left RUNNING by a run that died (this process holds the study alone): FAIL, and retried."""
    dead = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    retry = _retry()
    for t in dead:
        study._storage.set_trial_state_values(t._trial_id, state=optuna.trial.TrialState.FAIL)  # noqa: SLF001
        retry(study, study._storage.get_trial(t._trial_id))  # noqa: SLF001
    return len(dead)

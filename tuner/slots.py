"""The loop each slot runs (``tuner.fleet`` explains the protocol), and the slots of one process."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import optuna

from tuner.fleet import WAIT_S, Reservation, boots_used, heartbeat, running, worker_attrs
from tuner.objective import Prepared, SearchObjective
from tuner.outcome import TrialContext

BusyCheck = Callable[[], str | None]  # why this slot's GPUs cannot take a trial now, or None
MAX_TRIALS_PER_BOOT = 4  # screened configs are free, but a space that is all infeasible must still end


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


def work(study: optuna.Study, objective: SearchObjective, budget: Budget, lock: Reservation, slot: Slot,
         stop: threading.Event) -> None:  # fmt: skip
    """Take trials until the study's budget is spent (waiting while others run) or ``stop`` is set."""
    said: str | None = None
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
            run_one(study, objective, taken[0], taken[1], slot)


def _take(study: optuna.Study, objective: SearchObjective, budget: Budget, lock: Reservation,
          slot: Slot) -> tuple[optuna.Trial, Prepared] | None | bool:  # fmt: skip
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
        trial.set_user_attr("worker", worker_attrs(slot.gpus))
        trial.set_user_attr("booted", True)  # counted from now on, so the budget holds exactly
        return trial, prepared


def run_one(study: optuna.Study, objective: SearchObjective, trial: optuna.Trial, prepared: Prepared,
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


def run_slots(study: optuna.Study, objective: SearchObjective, budget: Budget, lock: Reservation,
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


def _fail_running(study: optuna.Study, objective: SearchObjective) -> None:
    """Ctrl-C with several slots: this process's running trials are marked FAIL before it exits
    (its engines stop with it: each is started through the reaper)."""
    import os

    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if (t.user_attrs.get("worker") or {}).get("pid") == os.getpid():
            try:
                study.tell(t.number, state=optuna.trial.TrialState.FAIL)
            except (ValueError, RuntimeError):
                pass  # finished meanwhile

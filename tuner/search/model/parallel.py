"""The performance model's simulations spread over worker processes forked from this one.

A fit simulates every measured step at each of its rounds, and a ``--sampler model`` proposal
simulates a capacity search for every candidate: pure Python, one core at a time, while the GPU
waits (reports/model-sampler.md, "What a proposal costs"). ``Workers`` forks a pool of processes
that inherit what they work on as it is in this process (``inherited``: the fitted model, whose
requests grow through the workload's own closure, which no pickle carries; or the measured steps),
and are sent only small tasks (a round's costs, a list of configs) and send back their results.
The work is deterministic, so the results are those this process would get, in the same order.

One pool at a time in a process: the shared work is a module global, and a study samples its trials
one at a time (under its reservation lock, ``tuner.fleet.loop``). The workers ignore Ctrl-C (the
study's process stops them), die with the thread that forked them (Linux), and are terminated when
the work ends or fails. A pool that does not answer within
``TIMEOUT_S`` is terminated and ``map`` says so (None): the caller then does the work itself,
slower, never differently.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.pool
import os
import signal
import warnings
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

MAX_WORKERS = 16
TIMEOUT_S = 1800.0
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when the thread that forked it ends

T = TypeVar("T")
R = TypeVar("R")

_SHARED: Any = None  # what the forked workers inherit


def default_workers() -> int:
    """The cores this process may run on, up to ``MAX_WORKERS``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cores))


def inherited() -> Any:
    """In a worker: what ``Workers`` was given to share, as the fork found it."""
    return _SHARED


class Workers:
    """``n`` processes forked from this one on entry (none where ``n`` <= 1 or the OS cannot fork),
    sharing ``what`` as it is then; ``map`` runs a module-level function over tasks on them."""

    def __init__(self, what: Any, n: int) -> None:
        self._what, self.n = what, n
        self._pool: multiprocessing.pool.Pool | None = None

    def __enter__(self) -> Workers:
        if self.n > 1 and "fork" in multiprocessing.get_all_start_methods():
            global _SHARED
            _SHARED = self._what
            with warnings.catch_warnings():  # Python 3.12 warns of forking a process with threads
                warnings.simplefilter("ignore", DeprecationWarning)
                self._pool = multiprocessing.get_context("fork").Pool(self.n, initializer=_start_worker)
        return self

    def map(self, fn: Callable[[T], R], tasks: Sequence[T]) -> list[R] | None:
        """``fn`` of every task, in order; None without a pool, or where it did not answer in time
        (the pool is then closed, and every later ``map`` says None too)."""
        if self._pool is None:
            return None
        try:
            return list(self._pool.map_async(fn, tasks, chunksize=1).get(TIMEOUT_S))
        except multiprocessing.TimeoutError:
            self._close()
            return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._close()

    def _close(self) -> None:
        global _SHARED
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
        _SHARED = None


def _start_worker() -> None:
    """Ctrl-C is the study's process's to handle (it terminates the pool); the pool's terminate is a
    SIGTERM, which a worker dies of quietly: the CLI turns SIGTERM into KeyboardInterrupt
    (``tuner.cli.main``), and a worker that inherited that handler could raise it where the signal
    found it and print a traceback on the study's terminal at the end of a proposal. And a worker dies with
    the thread that forked it, where Linux can say so, so not even a killed study leaves one behind."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (AttributeError, OSError):  # not Linux: the pool's own shutdown is all there is
        pass

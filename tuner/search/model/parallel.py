"""Many configs predicted at once, across the machine's cores: what a ``--sampler model`` proposal costs.

Every candidate of a proposal is a simulated capacity search (``EngineModel.predict``), pure Python,
so one core predicts them one after another while the GPU waits (reports/model-sampler.md, "What a
proposal costs"). Here they are spread over worker processes forked from this one: a fork inherits
the fitted model as it is (its requests grow through the workload's own closure, which no pickle
carries), and each worker sends back only its predictions. The predictions are the ones one process
gives: the simulator is deterministic, and the study's requests grow in the same order in every
process (``StudyRequests``).

Configs that differ only in their memory fraction go to one worker together, so a simulation it
reuses across KV pools (``EngineModel``'s ``_simulated``) is reused there as in one process. The
workers ignore Ctrl-C (the study's process stops them), die with the thread that forked them (Linux),
are terminated when the proposal ends or fails, and a pool that does not answer within ``TIMEOUT_S``
is terminated and its configs predicted here instead: slower, never a different answer.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.search.model.predict import EngineModel, Prediction

MAX_WORKERS = 16
MIN_PER_WORKER = 2  # fewer jobs than this per worker are not worth a fork
TIMEOUT_S = 1800.0
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when the thread that forked it ends
SAME_SIMULATION_BUT = "memory_fraction"  # the parameter that changes only the KV pool of a config

Job = tuple[str, Mapping[str, Any], int | None]  # engine, params, KV pool in tokens (None: unbounded)

_MODEL: EngineModel | None = None  # the model the forked workers inherit


def default_workers() -> int:
    """The cores this process may run on, up to ``MAX_WORKERS``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cores))


def predict_many(model: EngineModel, jobs: Sequence[Job], workers: int) -> list[dict[str, Prediction]]:
    """``model.predict`` of every job, in order, over up to ``workers`` processes."""
    groups = _groups(jobs)
    workers = min(workers, len(groups), len(jobs) // MIN_PER_WORKER)
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [model.predict(engine, params, kv) for engine, params, kv in jobs]
    global _MODEL
    _MODEL = model
    try:
        with warnings.catch_warnings():  # Python 3.12 warns of forking a process with threads
            warnings.simplefilter("ignore", DeprecationWarning)
            pool = multiprocessing.get_context("fork").Pool(workers, initializer=_start_worker)
        try:
            answers = pool.map_async(_predict_group, [[jobs[i] for i in g] for g in groups], chunksize=1)
            by_group = answers.get(TIMEOUT_S)
        except multiprocessing.TimeoutError:
            by_group = None
        finally:
            pool.terminate()
            pool.join()
    finally:
        _MODEL = None
    if by_group is None:
        return [model.predict(engine, params, kv) for engine, params, kv in jobs]
    out: list[dict[str, Prediction] | None] = [None] * len(jobs)
    for group, predictions in zip(groups, by_group, strict=True):
        for i, p in zip(group, predictions, strict=True):
            out[i] = p
    return [p for p in out if p is not None]


def _groups(jobs: Sequence[Job]) -> list[list[int]]:
    """Job indices, those alike but for the memory fraction together, in first-seen order."""
    by_key: dict[str, list[int]] = {}
    for i, (engine, params, _) in enumerate(jobs):
        key = repr((engine, sorted((k, repr(v)) for k, v in params.items() if k != SAME_SIMULATION_BUT)))
        by_key.setdefault(key, []).append(i)
    return list(by_key.values())


def _start_worker() -> None:
    """Ctrl-C is the study's process's to handle (it terminates the pool); and a worker dies with the
    thread that forked it, where Linux can say so, so not even a killed study leaves one behind."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (AttributeError, OSError):  # not Linux: the pool's own shutdown is all there is
        pass


def _predict_group(jobs: list[Job]) -> list[dict[str, Prediction]]:
    assert _MODEL is not None, "a worker forked without the model"
    return [_MODEL.predict(engine, params, kv) for engine, params, kv in jobs]

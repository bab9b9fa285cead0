"""Many configs predicted over worker processes (``tuner.search.model.parallel``): the very predictions
one process gives, in order, and no worker left behind, whether the pool answers or is given up on."""

from __future__ import annotations

import ctypes
import multiprocessing
import signal
import subprocess
import sys

import pytest

from tests.unit.search.test_model import CPU, _served, _truth
from tuner.engines.vllm import VllmAdapter
from tuner.search.model import parallel, predict
from tuner.search.model.fit import fit_costs
from tuner.search.model.history import observed
from tuner.search.model.predict import Job

PR_GET_PDEATHSIG = 2  # prctl(2)
JOBS: list[Job] = [
    ("vllm", {"max_num_seqs": seqs, "chunk_size": chunk, "memory_fraction": memory}, kv)
    for seqs in (1, 4) for chunk in (512, 2048) for memory, kv in ((0.5, 600), (0.9, None))
]  # fmt: skip


def _alone() -> list[dict[str, object]]:
    model = _truth()
    return [model.predict(engine, params, kv) for engine, params, kv in JOBS]


def test_workers_give_the_predictions_one_process_gives_in_order_and_leave_none_behind() -> None:
    model = _truth()
    assert model.predict_many(JOBS, 2) == _alone()
    assert model._simulated == {}, "this process simulated: the workers did not"  # noqa: SLF001
    assert multiprocessing.active_children() == []
    assert parallel._SHARED is None  # noqa: SLF001


def test_a_pool_that_does_not_answer_in_time_is_given_up_and_the_configs_predicted_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(parallel, "TIMEOUT_S", 1e-3)
    model = _truth()
    assert model.predict_many(JOBS, 2) == _alone()
    assert model._simulated, "given up on, the pool's configs were predicted here"  # noqa: SLF001
    assert multiprocessing.active_children() == []


def test_configs_alike_but_for_their_memory_go_to_one_worker_and_few_jobs_fork_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    groups = predict._alike(JOBS)  # noqa: SLF001
    assert [len(g) for g in groups] == [2, 2, 2, 2]
    assert all(JOBS[g[0]][1]["chunk_size"] == JOBS[g[1]][1]["chunk_size"] for g in groups)

    def no_fork(*args: object, **kwargs: object) -> None:
        raise AssertionError("forked for too few jobs")

    monkeypatch.setattr(multiprocessing, "get_context", no_fork)
    assert _truth().predict_many(JOBS[:3], 4) == _alone()[:3]


def _death_signal() -> int:
    parallel._start_worker()  # noqa: SLF001
    value = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(PR_GET_PDEATHSIG, ctypes.byref(value))
    return value.value


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_worker_dies_with_the_thread_that_forked_it() -> None:
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_death_signal) == signal.SIGKILL


QUIET_END = """
import signal
from tuner.cli.main import _interrupt
from tuner.search.model import parallel

def dies_of_sigterm(n):
    return n if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL else -1

signal.signal(signal.SIGTERM, _interrupt)  # as `tuner search` runs: SIGTERM becomes KeyboardInterrupt
with parallel.Workers(None, 2) as workers:
    print(workers.map(dies_of_sigterm, list(range(6))))
"""


def test_the_pool_ends_quietly_under_the_clis_sigterm_handler() -> None:
    """The pool's terminate is a SIGTERM: a worker that kept the CLI's handler could raise
    KeyboardInterrupt where the signal found it and print a traceback on the study's terminal at the
    end of a proposal (seen in a real study). Each worker must die of it as the default does."""
    done = subprocess.run([sys.executable, "-c", QUIET_END], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[0, 1, 2, 3, 4, 5]", (done.stdout, done.stderr)
    assert done.stderr == "", done.stderr


def test_a_fit_over_workers_is_the_fit_of_one_process() -> None:
    """Each round's steps simulated over two workers, in the same order: the very same costs."""
    truth = _truth()
    served = [_served(truth, {"max_num_seqs": 8, "chunk_size": 512}), _served(truth, {"max_num_seqs": 1})]
    steps = [step for s in served for step in observed(s, VllmAdapter(), CPU, 0.0)]
    alone, spread = fit_costs(steps), fit_costs(steps, workers=2)
    assert alone is not None and spread == alone
    assert multiprocessing.active_children() == []

"""``reaper.kill_and_wait``: a SIGKILLed process counts as stopped only once it is gone or a zombie.

A signal is delivered asynchronously, so a real process is usually gone at once and a test on one
alone could pass without the wait; the stand-ins below die only after a set number of looks."""

from __future__ import annotations

import subprocess
import time

import psutil

from tuner.measure import reaper


class SlowToDie:
    """A process that reads ``running`` for ``looks`` status reads after its kill, then is gone."""

    def __init__(self, looks: int) -> None:
        self.looks = looks
        self.killed = False

    def kill(self) -> None:
        self.killed = True

    def status(self) -> str:
        if not self.killed:
            return psutil.STATUS_SLEEPING
        if self.looks == 0:
            raise psutil.NoSuchProcess(1)
        self.looks -= 1
        return psutil.STATUS_RUNNING


class PidReused(SlowToDie):
    def kill(self) -> None:
        raise psutil.NoSuchProcess(1)  # what psutil raises when the pid now names another process


def test_it_returns_only_once_every_killed_process_is_gone() -> None:
    procs = [SlowToDie(3), SlowToDie(5)]
    reaper.kill_and_wait(procs)  # type: ignore[arg-type]
    assert all(p.killed and p.looks == 0 for p in procs)


def test_a_process_it_could_not_kill_is_not_waited_for() -> None:
    stranger = PidReused(10**9)
    started = time.monotonic()
    reaper.kill_and_wait([stranger], timeout_s=30.0)  # type: ignore[list-item]
    assert time.monotonic() - started < 5.0


def test_a_process_that_never_dies_is_waited_for_at_most_the_timeout() -> None:
    started = time.monotonic()
    reaper.kill_and_wait([SlowToDie(10**9)], timeout_s=0.3)  # type: ignore[list-item]
    assert 0.3 <= time.monotonic() - started < 5.0


def test_a_real_child_reads_dead_as_a_zombie_before_anyone_waits_for_it() -> None:
    child = subprocess.Popen(["sleep", "600"])
    try:
        reaper.kill_and_wait([psutil.Process(child.pid)], timeout_s=30.0)
        assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -9

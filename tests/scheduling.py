"""How the suite's test files are spread over its worker processes (``scripts/test.sh``: ``-n 4
--dist loadfile``, each file whole in one worker).

On this project's machines the run's length is set by the files that boot real engines: each boots
several, on two cores shared by every worker. xdist's own ``loadfile`` order works against them
twice. It queues files by their number of tests, most first, and these files have few tests, so
they start last. And it sends a worker its next file while the current one still has two tests to
go, so a file of one or two long tests gets the next file in the queue, another slow one, stuck
behind it while other workers may sit idle. Together they made the run's tail: the slowest files
started late and ran nearly alone at the end.

So here the files that boot an engine are sent first, those that boot most first (the module's
``pytest.mark.engine(boots=N)``, what its docstring counts), then every other file in pytest's order.
A worker gets more only once it is down to its last test, which it cannot start until it knows what
follows (pytest tears a module's fixtures down by the next test): then, if that last test is an
engine file's, it gets the last file of the queue that boots nothing, so that nothing slow waits
behind a long test; otherwise the next file as above.

The controller reads each file's boots from its source (it collects nothing itself; the workers do).
This extends xdist's ``LoadFileScheduling`` through its internals (its queue, its per-node work and
how it sends a unit), which are no API: pyproject.toml pins pytest-xdist, and
tests/unit/test_scheduling.py runs the scheduler under xdist, so a change there fails a test.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadFileScheduling
from xdist.workermanage import WorkerController

ENGINE_MARK = re.compile(r"pytest\.mark\.engine\(boots=(\d+)\)")


@cache
def boots_of(path: Path) -> int:
    """The engine boots a test file declares (0: it boots none, or it is no file)."""
    try:
        found = ENGINE_MARK.search(path.read_text(errors="replace"))
    except OSError:
        return 0
    return int(found.group(1)) if found else 0


class EngineFilesFirst(LoadFileScheduling):  # type: ignore[misc]  # xdist ships no type hints
    """``loadfile`` with the engine files sent first and nothing queued behind a long test."""

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        self.root = config.rootpath
        # the queue in collection order (xdist's schedule() sorts it by number of tests unless this is
        # off): the back then holds the unit tests' files, the lightest
        config.option.loadscopereorder = False

    def _boots(self, scope: str) -> int:
        return boots_of(self.root / scope)

    def _reschedule(self, node: WorkerController) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        pending = self._pending_of(self.assigned_work[node])
        if pending > 1:
            return
        held = [scope for scope, tests in self.assigned_work[node].items() if not all(tests.values())]
        if held and self._boots(held[0]) > 0:
            light = [scope for scope in reversed(self.workqueue) if self._boots(scope) == 0]
            self._send(node, light[0] if light else next(reversed(self.workqueue)))
        else:
            self._assign_work_unit(node)

    def _assign_work_unit(self, node: WorkerController) -> None:
        # the first of the files that boot most (min keeps the first of equals)
        self._send(node, min(self.workqueue, key=lambda scope: -self._boots(scope)))

    def _send(self, node: WorkerController, scope: str) -> None:
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LoadFileScheduling | None:
    return EngineFilesFirst(config, log) if config.getvalue("dist") == "loadfile" else None

"""Settings every test suite shares.

Hypothesis draws the same inputs on every run by default, so a run passes or fails on the code,
never on the draw (CI once failed on an input no earlier run had drawn). ``TUNER_FUZZ_EXPLORE=1``
draws fresh inputs each run: that is how new cases are found, and each one found becomes a fixed
regression test.

Tiers: some tests need more than Python. The ``postgres`` tier needs a PostgreSQL server
(``TUNER_TEST_POSTGRES``, which ``scripts/test.sh`` starts and sets; the fault suite starts its own
with ``initdb``), the ``browser`` tier Chromium and chromedriver at /usr/bin with selenium. Where a
tier's dependency is missing its tests fail, saying what is missing; they never skip.
``TUNER_SKIP_TIERS=postgres,browser`` deselects those tiers' tests instead, on purpose, and the run
says how many it left out.

Runs: ``TUNER_RUN_ID`` names this test run (made at its start unless already set, with the run's
stamp) and is inherited by every process a test starts; the fault suite keeps its records by it
(``tests.faults.outcomes``).

Signals: a run started as a background job of a non-interactive shell (``cmd &`` in a script, as
CI or a nohup may start it) inherits SIGINT ignored, and so would every CLI a test starts: Python
keeps an inherited "ignore" at startup, and the tests that Ctrl-C the tuner would see it carry on.
So the run takes SIGINT back as Python's default here, and the processes it starts get the default.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import signal

import pytest
from hypothesis import settings

from tests.faults.outcomes import start_run

pytest_plugins = ["tests.scheduling"]  # the order test files run in, and on which worker

settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False, database=None)
settings.load_profile("explore" if os.environ.get("TUNER_FUZZ_EXPLORE") else "repeatable")

SKIP_ENV = "TUNER_SKIP_TIERS"
TIERS = ("postgres", "browser")
BROWSER_BINARIES = ("/usr/bin/chromium", "/usr/bin/chromedriver")
# Tests whose modules do not carry their tier's marker (pytest.mark.browser) yet, by name.
BROWSER_TESTS = {"test_report_renders_in_a_real_browser"}
_skipped = pytest.StashKey[frozenset[str]]()
_deselected = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for tier in TIERS:
        config.addinivalue_line(
            "markers", f"{tier}: needs the {tier} tier (tests/conftest.py); {SKIP_ENV} leaves it out"
        )
    config.stash[_skipped] = skipped_tiers()
    start_run()  # here, before any test changes the environment or starts a process


def skipped_tiers() -> frozenset[str]:
    asked = {name.strip() for name in os.environ.get(SKIP_ENV, "").split(",") if name.strip()}
    if unknown := asked - set(TIERS):
        raise pytest.UsageError(
            f"{SKIP_ENV} names unknown tiers {', '.join(sorted(unknown))}; known: {', '.join(TIERS)}"
        )
    return frozenset(asked)


def tier_of(item: pytest.Item) -> str | None:
    """The tier a test needs: its marker, else how it reaches the dependency (for modules not marked yet)."""
    for tier in TIERS:
        if item.get_closest_marker(tier):
            return tier
    fixtures = set(getattr(item, "fixturenames", ()))
    callspec = getattr(item, "callspec", None)
    if {"postgres", "fleet"} & fixtures or (callspec and callspec.params.get("storage") == "postgresql"):
        return "postgres"
    if getattr(item, "originalname", item.name) in BROWSER_TESTS:
        return "browser"
    return None


def missing(tier: str, item: pytest.Item) -> str | None:
    """What this machine lacks for ``item``'s tier, in a few words (None: nothing)."""
    if tier == "browser":
        absent = [path for path in BROWSER_BINARIES if not os.access(path, os.X_OK)]
        absent += [] if importlib.util.find_spec("selenium") else ["the selenium package"]
        fix = "install Debian's chromium and chromium-driver (scripts/test.sh does, as root)"
        return f"Chromium/chromedriver missing: {', '.join(absent)}; {fix}" if absent else None
    if "postgres" in getattr(item, "fixturenames", ()):  # the fault suite's own server, started with initdb
        found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
        fix = "install Debian's postgresql (scripts/test.sh does, as root)"
        return None if found else f"PostgreSQL's initdb missing (no /usr/lib/postgresql/*/bin/initdb); {fix}"
    if not os.environ.get("TUNER_TEST_POSTGRES"):
        return "no PostgreSQL: TUNER_TEST_POSTGRES is not set; run through scripts/test.sh or scripts/with-postgres.sh"
    return None


@pytest.hookimpl(trylast=True)  # after -m and -k: count only what they left
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skipped = config.stash[_skipped]
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        (dropped if skipped and tier_of(item) in skipped else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    config.stash[_deselected] = len(dropped)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    tier = tier_of(item)
    reason = missing(tier, item) if tier else None
    if reason:
        pytest.fail(f"{reason}; or set {SKIP_ENV}={tier} to leave these tests out", pytrace=False)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    skipped = config.stash[_skipped]
    if skipped:
        tiers = ",".join(sorted(skipped))
        n = config.stash.get(_deselected, 0)
        terminalreporter.write_line(f"{SKIP_ENV}={tiers}: {n} test{'' if n == 1 else 's'} deselected on request")

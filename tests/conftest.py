"""Settings every test suite shares.

Hypothesis draws the same inputs on every run by default, so a run passes or fails on the code,
never on the draw (CI once failed on an input no earlier run had drawn). ``TUNER_FUZZ_EXPLORE=1``
draws fresh inputs each run: that is how new cases are found, and each one found becomes a fixed
regression test.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False, database=None)
settings.load_profile("explore" if os.environ.get("TUNER_FUZZ_EXPLORE") else "repeatable")

"""Progress lines: one per phase of each trial, and a summary at the end. Tests pass ``Quiet``."""

from __future__ import annotations

import sys
from typing import TextIO


class Progress:
    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr

    def line(self, text: str) -> None:
        print(text, file=self._stream, flush=True)

    def phase(self, trial: int, phase: str, detail: str = "") -> None:
        self.line(f"trial {trial:>3} {phase:<7} {detail}".rstrip())


class Quiet(Progress):
    def line(self, text: str) -> None:
        pass

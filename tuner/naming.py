"""File names derived from user input (study names, trace names) that cannot leave their folder."""

from __future__ import annotations

import re


def safe_name(text: str) -> str:
    """Only letters, digits, ``_``, ``-`` and inner dots: no ``/``, no ``..``, no leading dot."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", text).lstrip(".")
    return cleaned.replace("..", "_") or "_"

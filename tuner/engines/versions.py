"""Which of an adapter's supported versions an installed version is: the one rule for matching them."""

from __future__ import annotations

from collections.abc import Iterable


def matches(version: str, versions: Iterable[str]) -> bool:
    """Whether ``version`` is one of ``versions``, each a full version or a "major.minor" prefix of one
    (``0.26`` covers ``0.26.0`` and ``0.26.1``, not ``0.260``)."""
    return any(version == v or version.startswith(v + ".") for v in versions)

"""The public API is what ``tuner.__all__`` lists, and it is importable; a change to it is deliberate."""

from __future__ import annotations

import tuner

PUBLIC = [
    "Progress",
    "Quiet",
    "SearchOptions",
    "Space",
    "TunerError",
    "__version__",
    "export_study",
    "load_space",
    "run_search",
]


def test_the_public_api_is_exactly_this_list() -> None:
    assert sorted(tuner.__all__) == sorted(PUBLIC)


def test_every_public_name_is_there() -> None:
    for name in PUBLIC:
        assert getattr(tuner, name) is not None, name
    assert tuner.SearchOptions(workload="rag").objective == "capacity"
    assert isinstance(tuner.load_space(), tuner.Space)

"""A space's ``enqueue:`` configs as a study's trials: booted right after the engine defaults, once.

The space has checked each entry against itself (``tuner.search.space.enqueue_problem``). What only
this run knows is checked here: an engine left out by ``--engines``, or a method left out of an
engine's space here (its version, environment or the model cannot run it), leaves the entry out
with one line; a draft that does not serve the entry's method is bad input. An entry becomes Optuna's
params exactly as the sampler would draw them (``tuner.search.space.suggest`` then reads them back),
so an enqueued config goes through the same screens as a sampled one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.engines.speculation import LABELS, WITH_DRAFT
from tuner.errors import ConfigError
from tuner.search.space import PAIR_SEP, Enqueued, Space, distributions, pair_label
from tuner.search.speculation import Offer


def enqueued_points(space: Space, offers: Mapping[str, Offer]) -> tuple[list[dict[str, Any]], list[str]]:
    """Each entry of the space's ``enqueue:`` as Optuna params, in its order, for the engines run
    here; and one line for each entry left out."""
    points, notes = [], []
    for i, entry in enumerate(space.enqueue):
        offer = offers.get(entry.engine)
        if offer is None:
            notes.append(f"enqueue.{i} ({entry.engine}): left out: {entry.engine} is not among this run's engines")
            continue
        method = entry.params.get("spec_method")
        if method is not None and method not in offer.methods:
            notes.append(
                f"enqueue.{i} ({entry.engine}): left out: {LABELS.get(method, method)} is left out of "
                f"{entry.engine}'s space here"
            )
            continue
        draft = entry.params.get("draft_model")
        if method in WITH_DRAFT and draft not in offer.drafts.get(method, ()):
            serving = ", ".join(offer.drafts.get(method, ())) or "none"
            raise ConfigError(
                f"enqueue.{i} ({entry.engine}): draft_model {draft!r} does not serve {LABELS[method]} here "
                f"(those that do: {serving})"
            )
        points.append(_point(entry, space, offer))
    return points, notes


def _point(entry: Enqueued, space: Space, offer: Offer) -> dict[str, Any]:
    """The entry under Optuna's names (``engine``, ``<engine>.<param>``), with the choices' labels."""
    method = entry.params.get("spec_method")
    point: dict[str, Any] = {"engine": entry.engine}
    for name, value in entry.params.items():
        key = f"{method}.draft" if name == "draft_model" else name
        point[f"{entry.engine}.{key}"] = pair_label(value, PAIR_SEP[name]) if name in PAIR_SEP else value
    # an engine that speculates with nothing here draws no method, so `off` is no param of its trials
    drawn = distributions(space, {entry.engine: offer})
    return {key: value for key, value in point.items() if key in drawn}

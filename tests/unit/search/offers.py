"""Offers for the search tests: what each engine of a space may speculate with, on a model whose
drafts and heads are named (no folder is read), at each engine's newest supported version."""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence

from tuner.engines import ADAPTERS
from tuner.engines.base import ModelSpec
from tuner.search.space import Space
from tuner.search.speculation import Offer, study_offers

DRAFTS = ["draft-2l", "draft-1l"]


def model_of(drafts: Sequence[str] = DRAFTS, kinds: Mapping[str, str] | None = None, mtp_layers: int = 0) -> ModelSpec:
    return ModelSpec("/m/target", {d: f"/m/{d}" for d in drafts}, draft_kinds=dict(kinds or {}), mtp_layers=mtp_layers)


def offers(
    space: Space, engines: Sequence[str] | None = None, model: ModelSpec | None = None,
    modules: Container[str] | None = None,
) -> dict[str, Offer]:  # fmt: skip
    at = {e: (ADAPTERS[e](), ADAPTERS[e].supported_versions[-1], modules) for e in engines or space.engines}
    p = space.parameters
    return study_offers(p.methods(), p.named_drafts(), at, model or model_of())[0]

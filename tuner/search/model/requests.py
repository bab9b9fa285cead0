"""The study's requests as the performance model simulates them: each one's shape and its prompt's
blocks, in the order a capacity search sends them, grown as the search grows its workload."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from tuner.workloads.base import Request
from tuner.workloads.inspection import prompt_blocks

GROWTH_CAP = 64  # the study's requests grow to cover ids of its steps' rows up to this many times the workload


@dataclass(frozen=True)
class Shape:
    """A request of the study's workload as the model simulates it: prompt and output tokens, and its
    prompt's full blocks (``tuner.workloads.inspection.block_keys``, numbered) where known."""

    prompt_tokens: int
    output_tokens: int
    blocks: tuple[int, ...] | None = None


class StudyRequests:
    """The study's requests as the model reads them, in the order a capacity search sends them: each
    one's shape (``first``) and its prompt's blocks by request id (``blocks``).

    A preset's workload grows on demand through its own ``grow``, as a capacity search grows it
    (``tuner.measure.supply``): a simulated step of more requests than the workload was built with
    sends new prompts, as a real step does, with their own prefix structure. Without ``grow`` (a
    trace, or requests known only by their rows) the requests are sent again in order. Block numbers
    are assigned once, in order of first appearance, so equal numbers stay equal prefixes as it grows."""

    def __init__(
        self, shapes: Sequence[Shape], blocks: Mapping[str, tuple[int, ...]] | None = None,
        grow: Callable[[int], Sequence[Request]] | None = None, tokenizer: Tokenizer | None = None,
    ) -> None:  # fmt: skip
        """Requests known by their shapes and blocks; ``of_workload`` reads a workload's own."""
        self._shapes = list(shapes)
        self._blocks = dict(blocks or {})
        self._grow = grow
        self._tokenizer = tokenizer
        self._numbering: dict[bytes, int] = {}
        self._grown_from: int | None = None  # how many requests the workload was built with, once it grows

    @classmethod
    def of_workload(
        cls, requests: Sequence[Request], grow: Callable[[int], Sequence[Request]] | None, tokenizer: Tokenizer | None
    ) -> StudyRequests:
        """A workload's requests (``tokenizer``: the target's, to cut prompts into blocks; None where it
        cannot be read: no blocks, the model then spreads each step's measured prefix hits)."""
        study = cls([], grow=grow, tokenizer=tokenizer)
        study._read(requests)
        return study

    def __len__(self) -> int:
        return len(self._shapes)

    @property
    def blocks(self) -> Mapping[str, tuple[int, ...]]:
        return self._blocks

    def first(self, n: int) -> list[Shape]:
        """The first ``n`` requests' shapes, the workload grown to them where it grows (fewer where not)."""
        while n > len(self._shapes) and self._more(n):
            pass
        return self._shapes[:n]

    def cover(self, request_ids: Iterable[str]) -> Mapping[str, tuple[int, ...]]:
        """The blocks of every request in ``request_ids`` the workload holds or grows to (a served
        step sent requests the search grew beyond the workload's first ones)."""
        wanted = {str(i) for i in request_ids}
        missing = wanted - self._blocks.keys()
        # a search hands its requests out in order, so those it sent are among the first twice as many
        # as it sent (or GROWTH_CAP times the workload as built): ids that never come (another
        # workload's) stop the growth there
        built = self._grown_from if self._grown_from is not None else len(self._shapes)
        limit = max(2 * (len(wanted) + built), GROWTH_CAP * built)
        while missing and len(self._shapes) < limit and self._more(2 * max(len(self._shapes), 1)):
            missing -= self._blocks.keys()
        return self._blocks

    def _more(self, n: int) -> bool:
        """Grow the workload to at least ``n`` requests (twice as many at least); False where it cannot."""
        if self._grow is None:
            return False
        if self._grown_from is None:
            self._grown_from = len(self._shapes)
        grown = self._grow(max(n, 2 * len(self._shapes)))
        if len(grown) <= len(self._shapes):
            self._grow = None  # a trace read to its end
            return False
        self._read(grown[len(self._shapes) :])
        return True

    def _read(self, requests: Sequence[Request]) -> None:
        for r in requests:
            blocks = None
            if self._tokenizer is not None:
                keys = prompt_blocks(r, self._tokenizer)
                blocks = tuple(self._numbering.setdefault(k, len(self._numbering)) for k in keys)
                self._blocks[r.request_id] = blocks
            self._shapes.append(Shape(r.prompt_tokens, r.max_tokens, blocks))

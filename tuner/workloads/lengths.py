"""Exact prompt lengths in tokens of the target's tokenizer, and fitting a preset to the context.

A preset's prompt has fixed text and one elastic part made of corpus words. ``Fitter.fit`` finds
how many of those words (and, where a whole word overshoots, how much of the next word) bring the
prompt to its target, within one token. Encoding the whole prompt is what costs, so the word count
is first estimated from cached per-word counts (a byte-level BPE tokenizes each space-led word on
its own), then corrected with a few exact counts of the real prompt.
"""

from __future__ import annotations

import sys
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from tokenizers import Tokenizer

from tuner.errors import WorkloadError
from tuner.workloads.base import count_tokens

CONTEXT_MARGIN = 16  # room for a BOS token and small count differences at the server
TOLERANCE_TOKENS = 1

# render(n, partial): the prompt holding the first n elastic words, then ``partial`` (a prefix of word n)
Render = Callable[[int, str], str]


@dataclass(frozen=True)
class Fit:
    """The first ``n_words`` elastic words and ``partial`` (a cut next word) give ``tokens`` tokens."""

    n_words: int
    partial: str
    text: str
    tokens: int


@dataclass
class Fitter:
    tokenizer: Tokenizer
    _word_tokens: dict[str, int] = field(default_factory=dict)

    def count(self, text: str) -> int:
        return count_tokens(self.tokenizer, text)

    def fit_content(self, render: Render, words: Sequence[str], content_tokens: int, what: str) -> Fit:
        """``fit`` to the fixed text's own tokens plus ``content_tokens`` of elastic words."""
        return self.fit(render, words, self.count(render(0, "")) + content_tokens, what)

    def fit(self, render: Render, words: Sequence[str], target: int, what: str) -> Fit:
        """The rendering nearest ``target`` tokens (within one, where the words allow)."""

        def measure(n_words: int, partial: str = "") -> Fit:
            text = render(n_words, partial)
            return Fit(n_words, partial, text, self.count(text))

        empty = measure(0)
        if empty.tokens > target:
            raise WorkloadError(f"{what}: the fixed text alone is {empty.tokens} tokens, over the target of {target}")
        cum = list(accumulate((self._word_count(w) for w in words), initial=0))
        best = measure(_guess(cum, target - empty.tokens))
        for _ in range(3):  # the estimate misses by what joins words to the fixed text: learn it
            again = _guess(cum, target - (best.tokens - cum[best.n_words]))
            if again == best.n_words:
                break
            best = measure(again)
        while best.tokens > target and best.n_words > 0:
            best = measure(best.n_words - 1)
        over: Fit | None = None
        while best.n_words < len(words):
            longer = measure(best.n_words + 1)
            if longer.tokens > target:
                over = longer
                break
            best = longer
        if target - best.tokens <= TOLERANCE_TOKENS:
            return best
        if over is not None and over.tokens - target <= TOLERANCE_TOKENS:
            return over
        if over is None:
            raise WorkloadError(f"{what}: ran out of text at {best.tokens} tokens of a target of {target}")
        return _cut_next_word(measure, best, words[best.n_words], target)

    def _word_count(self, word: str) -> int:
        if word not in self._word_tokens:
            self._word_tokens[word] = self.count(" " + word)
        return self._word_tokens[word]


def _cut_next_word(measure: Callable[[int, str], Fit], best: Fit, word: str, target: int) -> Fit:
    """Add the next word cut short: each extra character adds a token or two."""
    for end in range(1, len(word)):
        cut = measure(best.n_words, word[:end])
        if abs(cut.tokens - target) < abs(best.tokens - target):
            best = cut
        if cut.tokens >= target:
            break
    return best


def _guess(cum: list[int], budget: int) -> int:
    """The most words whose cached counts fit ``budget``."""
    return max(bisect_right(cum, budget) - 1, 0)


def fit_scale(preset: str, max_model_len: int, scalable: int, fixed: int = 0) -> float:
    """``context_scale``'s factor, said nowhere: for a build of part of a workload whose whole said it."""
    if scalable + fixed + CONTEXT_MARGIN <= max_model_len:
        return 1.0
    scale = (max_model_len - fixed - CONTEXT_MARGIN) / scalable
    if scale <= 0:
        raise WorkloadError(f"{preset}: model context {max_model_len} cannot hold {fixed} output tokens")
    return scale


def context_scale(preset: str, max_model_len: int, scalable: int, fixed: int = 0, what: str = "input lengths") -> float:
    """The factor for ``scalable`` tokens so that they, ``fixed`` tokens and a margin fit the context.

    1.0 when everything fits; otherwise one line on stderr says what was scaled and by how much.
    """
    scale = fit_scale(preset, max_model_len, scalable, fixed)
    if scale == 1.0:
        return scale
    needed = scalable + fixed + CONTEXT_MARGIN
    print(
        f"{preset}: model context {max_model_len} is shorter than the preset needs ({needed}); "
        f"{what} scaled by {scale:.2f}",
        file=sys.stderr,
    )
    return scale


def excerpt(words: Sequence[str], start: int, n_words: int) -> list[str]:
    """``n_words`` words of ``words`` from ``start``, wrapping around the end."""
    return [words[(start + i) % len(words)] for i in range(n_words)]

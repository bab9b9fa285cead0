"""The ``rag`` preset: retrieval-augmented question answering with long prompts and short answers.

Each prompt is, in order:

1. one shared system prompt (fixed text, about 120 tokens), identical in every request;
2. ``K_PASSAGES`` = 3 retrieved documents. Each starts at a corpus passage drawn with Zipf-like
   popularity (weight ``1 / rank**1.1`` over a seeded shuffle of the corpus), so a small set of
   popular documents repeats across requests as popular documents do in real retrieval. A
   document runs on into the following corpus passages and is cut at a word boundary;
3. a question built from words of the three documents, then ``Answer:``.

Each request draws its own input-length target uniformly from 800..1000 tokens, and the documents
are cut (equal word counts each) so the exact prompt lands within ``TOLERANCE_TOKENS`` of it. The
output is short: ``max_tokens`` (48) with ``ignore_eos`` so every request generates all of them.

When the model context cannot hold the longest prompt plus the output plus a margin, every target
is scaled down by one factor and one line says so on stderr. All randomness comes from one
``random.Random(seed)``: the same seed and tokenizer give byte-identical requests. Measured requests
are drawn before warmup requests, so changing ``n_warmup`` leaves them unchanged.
"""

from __future__ import annotations

import random
import re
import sys
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import accumulate

from tokenizers import Tokenizer

from tuner.errors import WorkloadError
from tuner.workloads.base import COMPLETIONS_ENDPOINT, Request, Workload, count_tokens, load_corpus

K_PASSAGES = 3
TARGET_LOW, TARGET_HIGH = 800, 1000
DEFAULT_MAX_TOKENS = 48
CONTEXT_MARGIN = 16  # room for a BOS token and small count differences at the server
TOLERANCE_TOKENS = 8
ZIPF_EXPONENT = 1.1
DOC_WORDS = 400  # words available per document before cutting: 3 x 400 words is well over 1000 tokens
QUESTION_SCAN_WORDS = 30  # question words come from each document's opening, which survives cutting

SYSTEM_PROMPT = (
    "You are a careful technical assistant for a team that maintains a large Python code base. "
    "You will be given several passages retrieved from the language reference and a question "
    "from an engineer. Answer the question using only the information in the passages. If the "
    "passages do not contain the answer, say that you do not know instead of guessing. Keep the "
    "answer short and precise, quote the exact names of statements, types and methods as they "
    "appear in the passages, and do not repeat the question. When two passages disagree, prefer "
    "the one that describes the more specific case."
)
QUESTION_TEMPLATES = (
    "According to the passages, how does {0} relate to {1} and {2}?",
    "What do the passages say about {0}, and where do {1} and {2} come in?",
    "Using the passages, explain the role of {0} together with {1} and {2}.",
    "Which rules in the passages connect {0}, {1} and {2}?",
)
_STOPWORDS = frozenset({"before", "should", "between", "because", "however", "following", "without"})
_WORD = re.compile(r"[a-z]{6,}")


@dataclass(frozen=True)
class _PromptMaker:
    tokenizer: Tokenizer
    corpus: tuple[str, ...]
    popular_first: tuple[int, ...]  # corpus indices, most popular first
    cum_weights: tuple[float, ...]
    max_tokens: int
    scale: float
    # per document start: tokens covering its first m words; popular documents hit this often
    _prefix_tokens: dict[int, list[int]] = field(default_factory=dict)

    def make(self, rng: random.Random, request_id: str) -> Request:
        starts = self._draw_starts(rng)
        docs = [self._document(i) for i in starts]
        question = _question(rng, docs)
        target = round(rng.uniform(TARGET_LOW, TARGET_HIGH) * self.scale)
        prompt, n_tokens = self._fit(starts, docs, question, target)
        body = {"prompt": prompt, "max_tokens": self.max_tokens, "temperature": 0.0, "ignore_eos": True}
        return Request(request_id, COMPLETIONS_ENDPOINT, body, n_tokens, self.max_tokens)

    def _draw_starts(self, rng: random.Random) -> list[int]:
        starts: list[int] = []
        while len(starts) < K_PASSAGES:
            (idx,) = rng.choices(self.popular_first, cum_weights=self.cum_weights)
            if idx not in starts:
                starts.append(idx)
        return starts

    def _document(self, start: int) -> list[str]:
        words: list[str] = []
        i = start
        while len(words) < DOC_WORDS:
            words.extend(self.corpus[i % len(self.corpus)].split())
            i += 1
        return words[:DOC_WORDS]

    def _doc_prefix_tokens(self, start: int, words: list[str]) -> list[int]:
        if start not in self._prefix_tokens:
            ends = list(accumulate((len(w) + 1 for w in words), initial=-1))
            offsets = self.tokenizer.encode(" ".join(words), add_special_tokens=False).offsets
            token_starts = [begin for begin, _ in offsets]
            self._prefix_tokens[start] = [bisect_left(token_starts, max(end, 0)) for end in ends]
        return self._prefix_tokens[start]

    def _fit(self, starts: list[int], docs: list[list[str]], question: str, target: int) -> tuple[str, int]:
        """Cut the documents so the prompt is as close to ``target`` tokens as whole words allow.

        Encoding is the cost here, so the word count is first estimated from per-document token
        offsets (no encode), then corrected with exact counts of whole prompts, one word at a time.
        """
        fixed = count_tokens(self.tokenizer, _render(docs, question, 0))
        prefixes = [self._doc_prefix_tokens(s, d) for s, d in zip(starts, docs, strict=True)]
        n_max = sum(len(d) for d in docs)
        lo, hi = K_PASSAGES, n_max
        while lo < hi:  # largest word count whose estimate fits the target
            mid = (lo + hi + 1) // 2
            estimate = fixed + sum(p[m] for p, m in zip(prefixes, _split(mid, len(docs)), strict=True))
            lo, hi = (mid, hi) if estimate <= target else (lo, mid - 1)
        return self._correct(docs, question, target, lo, n_max)

    def _correct(self, docs: list[list[str]], question: str, target: int, n: int, n_max: int) -> tuple[str, int]:
        def exact(n_words: int) -> tuple[str, int]:
            prompt = _render(docs, question, n_words)
            return prompt, count_tokens(self.tokenizer, prompt)

        best = exact(n)
        while best[1] > target and n > K_PASSAGES:
            n -= 1
            best = exact(n)
        while n < n_max:
            longer = exact(n + 1)
            if longer[1] > target:  # one word over: keep it if it lands closer to the target
                best = min(best, longer, key=lambda pc: abs(pc[1] - target))
                break
            n, best = n + 1, longer
        if best[1] > target + TOLERANCE_TOKENS:
            raise WorkloadError(
                f"rag: a prompt needs at least {best[1]} tokens but its target is {target}; "
                "the model context is too short for this preset"
            )
        return best


def _split(n_words: int, n_docs: int) -> list[int]:
    """Equal word counts per document, the first ones taking the remainder."""
    return [n_words // n_docs + (i < n_words % n_docs) for i in range(n_docs)]


def _render(docs: list[list[str]], question: str, n_words: int) -> str:
    parts = [SYSTEM_PROMPT, ""]
    for i, (doc, n) in enumerate(zip(docs, _split(n_words, len(docs)), strict=True), start=1):
        parts += [f"Passage {i}: {' '.join(doc[:n])}", ""]
    parts += [f"Question: {question}", "Answer:"]
    return "\n".join(parts)


def _question(rng: random.Random, docs: list[list[str]]) -> str:
    topics = []
    for doc in docs:
        words = [w for w in _WORD.findall(" ".join(doc[:QUESTION_SCAN_WORDS]).lower()) if w not in _STOPWORDS]
        topics.append(rng.choice(words) if words else "this topic")
    return rng.choice(QUESTION_TEMPLATES).format(*topics)


def _context_scale(max_model_len: int, max_tokens: int) -> float:
    needed = TARGET_HIGH + max_tokens + CONTEXT_MARGIN
    if needed <= max_model_len:
        return 1.0
    scale = (max_model_len - max_tokens - CONTEXT_MARGIN) / TARGET_HIGH
    if scale <= 0:
        raise WorkloadError(f"rag: model context {max_model_len} cannot hold {max_tokens} output tokens")
    print(
        f"rag: model context {max_model_len} is shorter than the preset needs ({needed}); "
        f"input lengths scaled by {scale:.2f}",
        file=sys.stderr,
    )
    return scale


def build_rag(
    tokenizer: Tokenizer,
    *,
    seed: int,
    n_requests: int,
    max_model_len: int,
    concurrency: int = 4,
    n_warmup: int = 2,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> Workload:
    """Build the ``rag`` workload (see the module docstring) for a tokenizer and model context."""
    if n_requests < 1 or concurrency < 1 or n_warmup < 0 or max_tokens < 1:
        raise WorkloadError("rag: n_requests, concurrency and max_tokens must be >= 1, n_warmup >= 0")
    scale = _context_scale(max_model_len, max_tokens)
    corpus = load_corpus()
    rng = random.Random(seed)
    order = list(range(len(corpus)))
    rng.shuffle(order)  # which documents are popular depends on the seed
    weights = (1.0 / rank**ZIPF_EXPONENT for rank in range(1, len(order) + 1))
    maker = _PromptMaker(tokenizer, corpus, tuple(order), tuple(accumulate(weights)), max_tokens, scale)
    requests = tuple(maker.make(rng, f"r{i:04d}") for i in range(n_requests))
    warmup = tuple(maker.make(rng, f"w{i:03d}") for i in range(n_warmup))
    low, high = round(TARGET_LOW * scale), round(TARGET_HIGH * scale)
    description = (
        f"RAG: shared system prompt + {K_PASSAGES} Zipf-popular passages + question; "
        f"input {low}-{high} tokens, output {max_tokens} tokens, concurrency {concurrency}"
    )
    return Workload("rag", seed, requests, warmup, concurrency, description)

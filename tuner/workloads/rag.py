"""The ``rag`` preset: retrieval-augmented question answering with long prompts and short answers.

Each prompt (``/v1/completions``) is, in order:

1. one shared system prompt: instructions and a worked example, about 400 tokens, the same in
   every request (a RAG application's fixed preamble);
2. retrieved passages. The corpus passages are the fixed chunks of a retrieval index: a passage is
   always the same text. Popularity is Zipf-like (weight ``1 / rank**1.1`` over a seeded shuffle of
   the corpus) and each request retrieves ``K_PASSAGES`` = 4 distinct ones (more when 4 are too
   short for its length). They are packed in
   popularity order, as a pipeline fills its context budget with the best-ranked chunks: the last
   one that fits is cut short and any after it dropped. So popular passages repeat across
   requests, at the same place after the shared preamble;
3. a question built from words of the first two passages, then ``Answer:``. (Where a passage's
   header makes a jump of tokens that no cut can land in, the question takes another phrasing.)

Lengths: each request draws its input length uniformly from 800..1000 tokens and lands within one
token of it; the output is a short answer, ``max_tokens`` 48 with ``ignore_eos``. Closed loop at
concurrency 4. SLOs: TTFT p95 <= 2000 ms, E2E p95 <= 3000 ms (GuideLLM's RAG guide: E2E <= 3 s).

When the model context cannot hold the longest prompt plus the output plus a margin, every input
length (the preamble's included) is scaled down by one factor and one line says so on stderr.
Each request is drawn from a generator seeded by the preset's seed and its own id, so request i is the
same in every build that holds it, whatever ``n_requests`` or ``n_warmup``: a capacity search grows the
workload by building only the requests it lacks, in parallel (``tuner.workloads.preset.grow``).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import partial
from itertools import accumulate

from tokenizers import Tokenizer

from tuner.workloads.arrivals import Arrival
from tuner.workloads.base import COMPLETIONS_ENDPOINT, Request, Slo, Tiers, load_corpus
from tuner.workloads.lengths import TOLERANCE_TOKENS, Fit, Fitter, context_scale
from tuner.workloads.preset import Drafted, Preset

K_PASSAGES = 4
TARGET_LOW, TARGET_HIGH = 800, 1000
MAX_TOKENS = 48
ZIPF_EXPONENT = 1.1
QUESTION_SCAN_WORDS = 30  # question words come from each passage's opening, which is always kept

SYSTEM_PROMPT = (
    "You are a careful technical assistant for a team that maintains a large Python code base. "
    "You will be given several passages retrieved from the language reference and a question "
    "from an engineer. Answer the question using only the information in the passages. If the "
    "passages do not contain the answer, say that you do not know instead of guessing. Keep the "
    "answer short and precise, quote the exact names of statements, types and methods as they "
    "appear in the passages, and do not repeat the question. When two passages disagree, prefer "
    "the one that describes the more specific case. Rules for the answer: write at most three "
    "sentences; put every quoted name in backticks; cite the passages you used by their numbers "
    "in square brackets after the sentence that relies on them, for example [1] or [2, 3]; never "
    "cite a passage that you did not use; do not add examples of your own unless the question asks "
    "for one. A passage may be cut off mid-sentence: do not guess how it ends.\n\n"
    "Example.\n"
    "Passage 1: The pass statement is a null operation; when it is executed, nothing happens. It is "
    "useful as a placeholder when a statement is required syntactically, but no code needs to be "
    "executed.\n"
    "Passage 2: The del statement removes the binding of a name from the local or global namespace.\n"
    "Question: What does the pass statement do, and when is it used?\n"
    "Answer: `pass` is a null operation: executing it does nothing [1]. It serves as a placeholder "
    "where the syntax requires a statement but no code needs to run [1].\n\n"
    "Now answer the engineer's question."
)
QUESTION_TEMPLATES = (
    "According to the passages, how does {0} relate to {1}?",
    "What do the passages say about {0}, and where does {1} come in?",
    "Using the passages, explain the role of {0} together with {1}.",
    "Which rules in the passages connect {0} and {1}?",
)
_STOPWORDS = frozenset({"before", "should", "between", "because", "however", "following", "without"})
_WORD = re.compile(r"[a-z]{6,}")
PRESET_SLO = Slo(ttft_p95_ms=2000, e2e_p95_ms=3000)


def _render(preamble: str, passages: list[list[str]], question: str, n_words: int, cut: str) -> str:
    """The prompt with the first ``n_words`` passage words (in packing order), then ``cut``."""
    parts = [preamble, ""]
    left = n_words
    for number, words in enumerate(passages, start=1):
        if left >= len(words):
            parts += [f"Passage {number}: {' '.join(words)}", ""]
            left -= len(words)
            continue
        shown = words[:left] + ([cut] if cut else [])
        if shown:
            parts += [f"Passage {number}: {' '.join(shown)}", ""]
        break
    parts += [f"Question: {question}", "Answer:"]
    return "\n".join(parts)


def _questions(rng: random.Random, passages: list[list[str]]) -> list[str]:
    """The drawn question first, then the same topics in the other phrasings."""
    topics = []
    for words in passages[:2]:
        found = [w for w in _WORD.findall(" ".join(words[:QUESTION_SCAN_WORDS]).lower()) if w not in _STOPWORDS]
        topics.append(rng.choice(found) if found else "this topic")
    first = rng.randrange(len(QUESTION_TEMPLATES))
    order = QUESTION_TEMPLATES[first:] + QUESTION_TEMPLATES[:first]
    return [template.format(*topics) for template in order]


def _fit(fitter: Fitter, preamble: str, passages: list[list[str]], questions: list[str], target: int) -> Fit:
    """The first phrasing that lands within tolerance (a passage's header makes a jump of a few
    tokens that no cut can land in, another phrasing can), else the closest."""
    words = [w for p in passages for w in p]
    best: Fit | None = None
    for question in questions:
        fit = fitter.fit(partial(_render, preamble, passages, question), words, target, "rag")
        best = fit if best is None or abs(fit.tokens - target) < abs(best.tokens - target) else best
        if abs(best.tokens - target) <= TOLERANCE_TOKENS:
            break
    assert best is not None, "there is always a question"
    return best


@dataclass(frozen=True)
class _Index:
    """What every request of one seed shares: the scaled preamble and the seeded popularity order."""

    preamble: str
    corpus: list[list[str]]
    by_popularity: list[int]
    cum_weights: list[float]
    scale: float


def _index(seed: int, max_model_len: int) -> _Index:
    scale = context_scale("rag", max_model_len, TARGET_HIGH, fixed=MAX_TOKENS)
    preamble_words = SYSTEM_PROMPT.split(" ")
    preamble = " ".join(preamble_words[: max(round(len(preamble_words) * scale), 1)])
    corpus = [passage.split() for passage in load_corpus()]
    by_popularity = list(range(len(corpus)))
    random.Random(seed).shuffle(by_popularity)  # which passages are popular depends on the seed
    cum_weights = list(accumulate(1.0 / rank**ZIPF_EXPONENT for rank in range(1, len(corpus) + 1)))
    return _Index(preamble, corpus, by_popularity, cum_weights, scale)


def _request(index: _Index, fitter: Fitter, seed: int, request_id: str) -> Request:
    """One request: a pure function of the seed and its id, so any range of them can be built alone."""
    rng = random.Random(f"rag:{seed}:{request_id}")
    corpus = index.corpus
    target = round(rng.uniform(TARGET_LOW, TARGET_HIGH) * index.scale)
    ranks: list[int] = []
    # every word is at least one token: this many words always reach the target
    while len(ranks) < K_PASSAGES or sum(len(corpus[index.by_popularity[r]]) for r in ranks) < target:
        (rank,) = rng.choices(range(len(corpus)), cum_weights=index.cum_weights)
        if rank not in ranks:
            ranks.append(rank)
    passages = [corpus[index.by_popularity[rank]] for rank in sorted(ranks)]
    fit = _fit(fitter, index.preamble, passages, _questions(rng, passages), target)
    body = {"prompt": fit.text, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
    return Request(request_id, COMPLETIONS_ENDPOINT, body, fit.tokens, MAX_TOKENS)


def _make_range(tokenizer: Tokenizer, seed: int, start: int, stop: int, max_model_len: int) -> list[Request]:
    """Measured requests ``start`` to ``stop`` (excluded), the same as in any build that holds them."""
    index, fitter = _index(seed, max_model_len), Fitter(tokenizer)
    return [_request(index, fitter, seed, f"r{i:04d}") for i in range(start, stop)]


def _make(tokenizer: Tokenizer, seed: int, n_requests: int, max_model_len: int, n_warmup: int) -> Drafted:
    index, fitter = _index(seed, max_model_len), Fitter(tokenizer)
    requests = [_request(index, fitter, seed, f"r{i:04d}") for i in range(n_requests)]
    warmup = [_request(index, fitter, seed, f"w{i:03d}") for i in range(n_warmup)]
    low, high = round(TARGET_LOW * index.scale), round(TARGET_HIGH * index.scale)
    description = (
        f"RAG: shared preamble + up to {K_PASSAGES} Zipf-popular fixed passages + question; "
        f"input {low}-{high} tokens, output {MAX_TOKENS} tokens"
    )
    return Drafted(requests, warmup, description)


# Interactive: the first token within a blink and reading speed well above a reader's; relaxed: a
# chat answer that starts within a second. On the CPU build, scaled to the generated model's speed:
# with every request of a search distinct, each prompt's passages are mostly prefilled anew there, so
# the CPU build's interactive bounds leave room for that prefill (and the relaxed tier stays looser).
TIERS = Tiers(
    gpu={"interactive": Slo(ttft_p95_ms=200, tpot_p95_ms=6), "relaxed": Slo(ttft_p95_ms=1000, tpot_p95_ms=20)},
    cpu={"interactive": Slo(ttft_p95_ms=2000, tpot_p95_ms=100), "relaxed": Slo(ttft_p95_ms=4000, tpot_p95_ms=150)},
)
PRESET = Preset("rag", Arrival(concurrency=4), PRESET_SLO, _make, TIERS, make_range=_make_range)

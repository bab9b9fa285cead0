"""The ``rag`` preset: retrieval-augmented answers over long retrieved contexts, with a stated reuse share.

Each prompt (``/v1/completions``) is, in order:

1. the shared system prompt: instructions and a worked example (a RAG application's fixed preamble);
2. the opening of one of ``N_DOCUMENTS`` documents (a manual, a contract: what a knowledge base's
   users keep asking about), drawn Zipf-popular (weight ``1 / rank**1.1``). A document is a seeded
   recombination of the packaged corpus's passages, the same text in every request that draws it;
3. passages retrieved for this question alone: an excerpt from a seeded random place in the corpus;
4. a question built from words of those passages, then ``Answer:``.

The system prompt and the document's opening make up the request's **reuse share** (``--prefix-reuse``,
default ``DEFAULT_REUSE``) of its prompt, exact to a token or two (a prompt keeps ``OWN_MIN_TOKENS``
for its own part, which bounds the share of the shortest prompts at a high share): a request shares that much of its
prompt, as a prefix, with every earlier request of the same document that reached as far, and
nothing after it. So the hit rate a server with a large prefix cache measures approaches the share
(less each document's first reading, and whatever the cache evicts); reports/workloads.md measures it.

Lengths (tokens of the target's tokenizer), from GuideLLM's RAG scenario
(``src/guidellm/benchmark/scenarios/rag.json``: prompt 4096 ± 512 tokens in 2048..6144, output
512 ± 128): each prompt draws a normal length (mean 4096, sd 512, cut to 2048..6144) and lands
within one token of it; each answer draws a normal length (mean 512, sd 128) cut to ±2 sd,
256..768, with ``ignore_eos``. Reuse: the Mooncake trace's prefix-cache hit rates of 30-50 % (its
paper, FAST '25); the default share is inside that range.

SLO tiers, from GuideLLM's SLO guide (``docs/guides/service_level_objectives.md``): RAG,
"TTFT <= 300 ms, ITL <= 100 ms for 99 % of requests (if iterative outputs are shown)", is the
interactive tier, and the guide's internal content-generation bounds (TTFT <= 600 ms, ITL <= 200 ms)
the relaxed one. GuideLLM's ITL excludes the first token, as the tuner's TPOT does. The guide's
share (99 %) becomes the capacity objective's attainment target (0.9 by default; ``--attainment
0.99`` for the guide's): at 99 % a step of a few hundred requests at the knee cannot decide. The
guide's whole-request bound (3 s) is left out: at 512 output tokens it would demand a TPOT near an
8B model's floor on one GPU, and the answers are streamed, where the guide says TTFT and ITL apply.

Closed loop at concurrency 4 for the objectives that are not capacity; their SLO is ``PRESET_SLO``.
When the model context cannot hold the longest prompt plus the longest answer plus a margin, every
length (preamble, document, prompt and answer) is scaled by one factor, said once on stderr: the
CPU build's context gives the same shapes scaled down. Each request is drawn from a generator seeded
by the preset's seed and its own id, so request i is the same in every build that holds it, whatever
``n_requests`` or ``n_warmup``: a capacity search grows the workload by building only the requests it
lacks, in parallel (``tuner.workloads.preset.grow``).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import lru_cache, partial
from itertools import accumulate

from tokenizers import Tokenizer

from tuner.errors import ConfigError
from tuner.workloads.arrivals import Arrival
from tuner.workloads.base import COMPLETIONS_ENDPOINT, Request, Slo, Tiers, corpus_words, load_corpus
from tuner.workloads.lengths import TOLERANCE_TOKENS, Fit, Fitter, context_scale, excerpt, fit_scale
from tuner.workloads.preset import Drafted, Preset


@dataclass(frozen=True)
class Normal:
    """A length in tokens: normal, rounded, cut to ``low..high``."""

    mean: float
    sd: float
    low: int
    high: int

    def draw(self, rng: random.Random, scale: float) -> int:
        value = min(max(rng.gauss(self.mean, self.sd), self.low), self.high)
        return max(round(value * scale), 1)


PROMPT_TOKENS = Normal(4096, 512, 2048, 6144)  # GuideLLM rag.json
OUTPUT_TOKENS = Normal(512, 128, 256, 768)  # GuideLLM rag.json's 512 +- 128, cut to +-2 sd
DEFAULT_REUSE = 0.5  # a server's hit rate lands below it (a document's first request misses): issue 25 asks 30-50 %
MAX_REUSE = 0.9
OWN_MIN_TOKENS = 64  # a prompt keeps at least this many tokens for its own passages and question
N_DOCUMENTS = 64
ZIPF_EXPONENT = 1.1
QUESTION_SCAN_WORDS = 30  # question words come from the retrieved passages' opening

SYSTEM_PROMPT = (
    "You are a careful technical assistant for a team that maintains a large Python code base. "
    "You will be given a reference document, passages retrieved for the question, and a question "
    "from an engineer. Answer the question using only the information in the document and the "
    "passages. If they do not contain the answer, say that you do not know instead of guessing. "
    "Quote the exact names of statements, types and methods as they appear in the text, and do not "
    "repeat the question. When two passages disagree, prefer the one that describes the more "
    "specific case. Rules for the answer: explain the reasoning step by step; put every quoted name "
    "in backticks; cite what you used after the sentence that relies on it, as [document] or "
    "[passages]; never cite text that you did not use; add a short example only when it helps. A "
    "passage may be cut off mid-sentence: do not guess how it ends.\n\n"
    "Example.\n"
    "Passages: The pass statement is a null operation; when it is executed, nothing happens. It is "
    "useful as a placeholder when a statement is required syntactically, but no code needs to be "
    "executed.\n"
    "Question: What does the pass statement do, and when is it used?\n"
    "Answer: `pass` is a null operation: executing it does nothing [passages]. It serves as a "
    "placeholder where the syntax requires a statement but no code needs to run [passages].\n\n"
    "Now answer the engineer's question."
)
QUESTION_TEMPLATES = (
    "According to the passages, how does {0} relate to {1}?",
    "What do the document and the passages say about {0}, and where does {1} come in?",
    "Using the passages, explain the role of {0} together with {1}.",
    "Which rules connect {0} and {1}?",
)
_STOPWORDS = frozenset({"before", "should", "between", "because", "however", "following", "without"})
_WORD = re.compile(r"[a-z]{6,}")


@dataclass(frozen=True)
class _Index:
    """What every request of one seed, context and share has in common."""

    preamble: list[str]
    documents: list[list[str]]
    cum_weights: list[float]
    scale: float
    reuse: float


NEEDED = PROMPT_TOKENS.high + OUTPUT_TOKENS.high  # the context the preset takes unscaled, less the margin


@lru_cache(maxsize=8)
def _index(seed: int, scale: float, reuse: float) -> _Index:
    passages = [p.split() for p in load_corpus()]
    documents = []
    for number in range(N_DOCUMENTS):  # each long enough for any share: every word is a token or more
        order = list(range(len(passages)))
        random.Random(f"rag-document:{seed}:{number}").shuffle(order)
        words: list[str] = []
        for i in order:
            words += passages[i]
            if len(words) >= PROMPT_TOKENS.high:
                break
        documents.append(words)
    cum_weights = list(accumulate(1.0 / rank**ZIPF_EXPONENT for rank in range(1, N_DOCUMENTS + 1)))
    return _Index(SYSTEM_PROMPT.split(" "), documents, cum_weights, scale, reuse)


def _prefix_text(preamble: list[str], document: list[str], n_words: int, cut: str) -> str:
    """The shared prefix holding its first ``n_words`` words (preamble first, then the document)."""
    words = preamble + document
    shown = words[:n_words] + ([cut] if cut else [])
    head, tail = shown[: len(preamble)], shown[len(preamble) :]
    parts = [" ".join(head)] if head else []
    if tail:
        parts.append("Document:\n" + " ".join(tail))
    return "\n\n".join(parts)


def _render(prefix: str, passages: list[str], question: str, n_words: int, cut: str) -> str:
    shown = passages[:n_words] + ([cut] if cut else [])
    head = f"{prefix}\n\n" if prefix else ""
    return f"{head}Retrieved passages:\n{' '.join(shown)}\n\nQuestion: {question}\nAnswer:"


def _questions(rng: random.Random, passages: list[str]) -> list[str]:
    """The drawn question first, then the same topics in the other phrasings."""
    found = [w for w in _WORD.findall(" ".join(passages[:QUESTION_SCAN_WORDS]).lower()) if w not in _STOPWORDS]
    topics = [rng.choice(found), rng.choice(found)] if found else ["this topic", "its rules"]
    first = rng.randrange(len(QUESTION_TEMPLATES))
    order = QUESTION_TEMPLATES[first:] + QUESTION_TEMPLATES[:first]
    return [template.format(*topics) for template in order]


def _prefix(index: _Index, fitter: Fitter, document: int, target: int) -> str:
    if target <= 0:
        return ""
    words = index.preamble + index.documents[document]
    fit = fitter.fit(partial(_prefix_text, index.preamble, index.documents[document]), words, target, "rag prefix")
    return fit.text


def _fit(fitter: Fitter, prefix: str, passages: list[str], questions: list[str], target: int) -> Fit:
    """The first phrasing that lands within one token (a jump of tokens no cut can land in, another can)."""
    best: Fit | None = None
    for question in questions:
        fit = fitter.fit(partial(_render, prefix, passages, question), passages, target, "rag")
        best = fit if best is None or abs(fit.tokens - target) < abs(best.tokens - target) else best
        if abs(best.tokens - target) <= TOLERANCE_TOKENS:
            break
    assert best is not None, "there is always a question"
    return best


def _request(index: _Index, fitter: Fitter, seed: int, request_id: str) -> Request:
    """One request: a pure function of the seed, the share and its id, so any range can be built alone."""
    rng = random.Random(f"rag:{seed}:{request_id}")
    target = PROMPT_TOKENS.draw(rng, index.scale)
    max_tokens = OUTPUT_TOKENS.draw(rng, index.scale)
    (document,) = rng.choices(range(N_DOCUMENTS), cum_weights=index.cum_weights)
    prefix = _prefix(index, fitter, document, min(round(index.reuse * target), target - OWN_MIN_TOKENS))
    words = corpus_words()
    start = rng.randrange(len(words))
    passages = excerpt(words, start, target)  # a word is a token or more: enough to reach the target
    fit = _fit(fitter, prefix, passages, _questions(rng, passages), target)
    body = {"prompt": fit.text, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    return Request(request_id, COMPLETIONS_ENDPOINT, body, fit.tokens, max_tokens)


def _make_range(
    tokenizer: Tokenizer, seed: int, start: int, stop: int, max_model_len: int, *, reuse: float = DEFAULT_REUSE
) -> list[Request]:
    """Measured requests ``start`` to ``stop`` (excluded), the same as in any build that holds them."""
    # the whole build said how it scaled; a range of it (a capacity search's growth) says nothing
    index, fitter = _index(seed, fit_scale("rag", max_model_len, NEEDED), reuse), Fitter(tokenizer)
    return [_request(index, fitter, seed, f"r{i:04d}") for i in range(start, stop)]


def _make(
    tokenizer: Tokenizer, seed: int, n_requests: int, max_model_len: int, n_warmup: int, *,
    reuse: float = DEFAULT_REUSE,
) -> Drafted:  # fmt: skip
    scale = context_scale("rag", max_model_len, NEEDED, what="input and output lengths")
    index, fitter = _index(seed, scale, reuse), Fitter(tokenizer)
    requests = [_request(index, fitter, seed, f"r{i:04d}") for i in range(n_requests)]
    warmup = [_request(index, fitter, seed, f"w{i:03d}") for i in range(n_warmup)]
    s = index.scale
    description = (
        f"RAG: shared preamble + one of {N_DOCUMENTS} Zipf-popular documents ({reuse:.0%} of each prompt "
        f"shared) + its own passages + question; input {round(PROMPT_TOKENS.low * s)}-"
        f"{round(PROMPT_TOKENS.high * s)} tokens (mean {round(PROMPT_TOKENS.mean * s)}), output "
        f"{round(OUTPUT_TOKENS.low * s)}-{round(OUTPUT_TOKENS.high * s)} (mean {round(OUTPUT_TOKENS.mean * s)})"
    )
    return Drafted(requests, warmup, description)


# GPU: GuideLLM's SLO guide (the module docstring). On the CPU build, scaled to the generated model's
# speed: each prompt's own passages are prefilled anew there, so the interactive bounds leave room for
# that prefill, and the relaxed tier stays looser.
TIERS = Tiers(
    gpu={"interactive": Slo(ttft_p95_ms=300, tpot_p95_ms=100), "relaxed": Slo(ttft_p95_ms=600, tpot_p95_ms=200)},
    cpu={"interactive": Slo(ttft_p95_ms=2000, tpot_p95_ms=100), "relaxed": Slo(ttft_p95_ms=4000, tpot_p95_ms=150)},
)
# The objectives that are not capacity score one SLO: the CPU build's interactive tier, since the
# no-GPU default is where they run without --slo; on a GPU, give --slo (or use the capacity tiers).
PRESET_SLO = TIERS.cpu["interactive"]


def preset(reuse: float = DEFAULT_REUSE) -> Preset:
    """The preset with ``reuse`` of each prompt shared as a prefix (``--prefix-reuse``)."""
    if not 0.0 <= reuse <= MAX_REUSE:
        raise ConfigError(f"--prefix-reuse must be between 0 and {MAX_REUSE}, got {reuse:g}")
    return Preset(
        "rag", Arrival(concurrency=4), PRESET_SLO, partial(_make, reuse=reuse), TIERS,
        make_range=partial(_make_range, reuse=reuse), with_reuse=preset,
    )  # fmt: skip


PRESET = preset()

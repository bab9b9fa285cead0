"""The ``json`` preset: structured output, each request's reply constrained by a JSON schema.

Each request (``/v1/chat/completions``) asks to turn a passage of the corpus into JSON following
one of four schemas (``tuner.workloads.schemas.EXTRACTION_SCHEMAS``: ticket, glossary,
classification, summary), drawn uniformly. The system prompt states the task and shows the schema,
so requests that use the same schema share it (four shared prefixes of about 100-200 tokens); the
user message is a passage excerpt from a random place in the corpus.

Lengths: the passage's text draws its length uniformly from 150..300 tokens of the target's
tokenizer, on top of the system prompt (about 180-220 tokens of the generated models' tokenizer);
the prompt is exact within one token. Output: ``response_format`` with the schema, ended by the grammar, capped at
128 tokens (every schema bounds its strings and arrays, so a complete object fits). Arrivals:
bursty open loop, gamma gaps with burstiness 0.5 at 0.5 requests per second, no cap, as API
clients send batches. SLO: E2E p95 <= 2000 ms (the client needs the whole object).

Sources: the output cap is vLLM's structured-output serving benchmark's default
(``benchmarks/benchmark_serving_structured_output.py``, ``--output-len 128``), and JSONSchemaBench's
MaskBench (``guidance-ai/jsonschemabench``, ``maskbench/README.md``) states 133 tokens per valid
instance on average over its 12,821 (simple schemas far fewer, its hardest splits several times
more). The task's shape (the schema in the system prompt, a document in the user message) is that
of ``NousResearch/json-mode-eval``, which vLLM's and SGLang's JSON benchmarks use; no public source
states its input lengths, so the passage length is the preset's own. GuideLLM's SLO guide has no
structured-output use case: the SLO is the preset's own.
"""

from __future__ import annotations

import random
from typing import Any

from tokenizers import Tokenizer

from tuner.workloads.arrivals import Arrival
from tuner.workloads.base import CHAT_ENDPOINT, Request, Slo, Tiers, corpus_words
from tuner.workloads.chat_format import render_chat
from tuner.workloads.lengths import Fitter, context_scale, excerpt
from tuner.workloads.preset import Drafted, Preset
from tuner.workloads.schemas import EXTRACTION_SCHEMAS, response_format, schema_text

PASSAGE_LOW, PASSAGE_HIGH = 150, 300  # tokens of the passage's text
SYSTEM_ESTIMATE = 230  # about what the longest schema's system prompt takes, for the context check
MAX_TOKENS = 128
PRESET_SLO = Slo(e2e_p95_ms=2000)


def _system(name: str) -> str:
    return (
        "You turn passages of technical documentation into JSON records for a search index. Reply "
        f"with exactly one JSON object that follows the schema {name} and nothing else: no prose, no "
        f"code fences. Keep strings short and copy names exactly as the passage writes them.\n"
        f"Schema {name}: {schema_text(EXTRACTION_SCHEMAS[name])}"
    )


def _make(tokenizer: Tokenizer, seed: int, n_requests: int, max_model_len: int, n_warmup: int) -> Drafted:
    scale = context_scale("json", max_model_len, SYSTEM_ESTIMATE + PASSAGE_HIGH, fixed=MAX_TOKENS)
    rng = random.Random(seed)
    fitter, words, names = Fitter(tokenizer), corpus_words(), sorted(EXTRACTION_SCHEMAS)

    def make(request_id: str) -> Request:
        name = rng.choice(names)
        target = round(rng.uniform(PASSAGE_LOW, PASSAGE_HIGH) * scale)
        text = excerpt(words, rng.randrange(len(words)), target)

        def messages(n: int, partial: str) -> list[dict[str, str]]:
            passage = " ".join(text[:n] + ([partial] if partial else []))
            return [{"role": "system", "content": _system(name)}, {"role": "user", "content": f"Passage:\n{passage}"}]

        fit = fitter.fit_content(lambda n, part: render_chat(messages(n, part)), text, target, "json")
        body: dict[str, Any] = {"messages": messages(fit.n_words, fit.partial), "max_tokens": MAX_TOKENS}
        body.update(temperature=0.0, response_format=response_format(name, EXTRACTION_SCHEMAS[name]))
        return Request(request_id, CHAT_ENDPOINT, body, fit.tokens, MAX_TOKENS)

    requests = [make(f"r{i:04d}") for i in range(n_requests)]
    warmup = [make(f"w{i:03d}") for i in range(n_warmup)]
    low, high = round(PASSAGE_LOW * scale), round(PASSAGE_HIGH * scale)
    description = (
        f"json: one of {len(names)} schemas (shown in a per-schema system prompt) + a {low}-{high}-token passage; "
        f"output JSON by response_format, <= {MAX_TOKENS} tokens"
    )
    return Drafted(requests, warmup, description)


TIERS = Tiers(
    gpu={"interactive": Slo(ttft_p95_ms=300, tpot_p95_ms=10), "relaxed": Slo(ttft_p95_ms=1500, tpot_p95_ms=40)},
    cpu={"interactive": Slo(ttft_p95_ms=1000, tpot_p95_ms=60), "relaxed": Slo(ttft_p95_ms=4000, tpot_p95_ms=150)},
)
PRESET = Preset("json", Arrival(rate=0.5, burstiness=0.5, concurrency=None), PRESET_SLO, _make, TIERS)

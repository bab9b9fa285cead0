"""The ``chat`` preset: short conversations with lognormal lengths, shaped like public chat logs.

A conversation has 1 turn (probability 0.75), 2 (0.20) or 3 (0.05), on ``/v1/chat/completions``.
The first turn is a one-line system prompt ("You are a helpful assistant.", shorter than any cache
block) and a user message; a later turn appends the actual previous response and a new user
message, sent once that response has arrived. User messages are an opener and an excerpt from a
random place in the corpus, so prompts share almost nothing beyond their own conversation.

Lengths (tokens of the target's tokenizer, exact within one): a user message's text is lognormal
with median 48 and sigma 0.9 (4..800; mean about 72), on top of the fixed opener and template tags,
and every reply is lognormal median 160, sigma 0.7 (8..512; mean about 200) with ``ignore_eos``:
short prompts and longer answers, as in LMSYS-Chat-1M (69.5 prompt and 214.5 response tokens per
turn on average). A conversation ends early rather than outgrow the model context.

Arrivals: open loop, conversations start as a Poisson process at 0.5 per second, no cap.
SLOs: TTFT p95 <= 200 ms (GuideLLM's chat guide), TPOT p95 <= 50 ms.
"""

from __future__ import annotations

import math
import random
from typing import Any

from tokenizers import Tokenizer

from tuner.workloads.arrivals import Arrival
from tuner.workloads.base import CHAT_ENDPOINT, Request, Slo, Tiers, corpus_words
from tuner.workloads.chat_format import render_chat, render_follow_up
from tuner.workloads.lengths import CONTEXT_MARGIN, Fitter, context_scale, excerpt
from tuner.workloads.preset import Drafted, Preset, split_count

TURN_WEIGHTS = (0.75, 0.20, 0.05)  # conversations of 1, 2 and 3 turns
USER = (48, 0.9, 4, 800)  # lognormal median, sigma, min, max of a user message's text, in tokens
REPLY = (160, 0.7, 8, 512)
FIXED_ESTIMATE = 48  # about what the system prompt, an opener and the tags take, for the context check
RETOKENIZE_SLACK = 1.5  # a reply's text sent back can re-tokenize longer than it was generated
SYSTEM_PROMPT = "You are a helpful assistant."
OPENERS = (
    "Can you explain this part of the Python docs to me?",
    "Summarize the following in plain words:",
    "What does this mean in practice?",
    "I am confused by this, please help:",
    "Rewrite this so a beginner understands it:",
    "Is this still true in current Python?",
)
PRESET_SLO = Slo(ttft_p95_ms=200, tpot_p95_ms=50)


def _lognormal(rng: random.Random, shape: tuple[int, float, int, int], scale: float) -> int:
    median, sigma, low, high = shape
    value = rng.lognormvariate(math.log(median), sigma)
    return max(round(min(value, high) * scale), low)


class _ConversationMaker:
    def __init__(self, tokenizer: Tokenizer, rng: random.Random, scale: float, max_model_len: int) -> None:
        self.fitter, self.rng, self.scale = Fitter(tokenizer), rng, scale
        self.budget = max_model_len - CONTEXT_MARGIN
        self.words = corpus_words()

    def conversation(self, session_id: str | None, n_turns: int, first_id: str) -> list[Request]:
        turns: list[Request] = []
        used = 0
        for turn in range(n_turns):
            target = _lognormal(self.rng, USER, self.scale)
            reply = _lognormal(self.rng, REPLY, self.scale)
            text = excerpt(self.words, self.rng.randrange(len(self.words)), target)
            opener = self.rng.choice(OPENERS)
            if turn > 0 and used + FIXED_ESTIMATE + target + reply > self.budget:
                break  # the conversation ends rather than outgrow the context
            request_id = first_id if turn == 0 else f"{session_id}t{turn}"
            turns.append(self._turn(request_id, session_id, turn, text, opener, target, reply))
            used += turns[-1].prompt_tokens + math.ceil(reply * RETOKENIZE_SLACK)
        return turns

    def _turn(
        self, request_id: str, session_id: str | None, turn: int, text: list[str], opener: str, target: int, reply: int
    ) -> Request:
        def messages(n: int, partial: str) -> list[dict[str, str]]:
            user = {"role": "user", "content": f"{opener}\n{' '.join(text[:n] + ([partial] if partial else []))}"}
            return [{"role": "system", "content": SYSTEM_PROMPT}, user] if turn == 0 else [user]

        render = render_chat if turn == 0 else render_follow_up
        fit = self.fitter.fit_content(lambda n, part: render(messages(n, part)), text, target, "chat")
        body: dict[str, Any] = {"messages": messages(fit.n_words, fit.partial), "max_tokens": reply}
        body.update(temperature=0.0, ignore_eos=True)
        return Request(request_id, CHAT_ENDPOINT, body, fit.tokens, reply, session_id, turn, turn > 0)


def _make(tokenizer: Tokenizer, seed: int, n_requests: int, max_model_len: int, n_warmup: int) -> Drafted:
    needed = FIXED_ESTIMATE + USER[3] + REPLY[3]
    scale = context_scale("chat", max_model_len, needed, what="input and output lengths")
    rng = random.Random(seed)
    maker = _ConversationMaker(tokenizer, rng, scale, max_model_len)
    requests: list[Request] = []
    index = 0
    while len(requests) < n_requests:
        (n_turns,) = rng.choices((1, 2, 3), weights=TURN_WEIGHTS)
        (n_turns,) = split_count(n_requests - len(requests), [n_turns])
        session_id = f"c{index:04d}" if n_turns > 1 else None
        requests += maker.conversation(session_id, n_turns, f"{session_id}t0" if session_id else f"r{index:04d}")
        index += 1
    warmup = [maker.conversation(None, 1, f"w{i:03d}")[0] for i in range(n_warmup)]
    description = (
        f"chat: 1-3 turns; lognormal user messages (median {round(USER[0] * scale)} tokens) "
        f"and replies (median {round(REPLY[0] * scale)} tokens)"
    )
    return Drafted(requests, warmup, description)


# GPU: GuideLLM's SLO guide, chat (TTFT <= 200 ms, ITL <= 50 ms) and, looser, its internal content
# generation (TTFT <= 600 ms, ITL <= 200 ms); its 99 % is the attainment target, as rag.py says.
TIERS = Tiers(
    gpu={"interactive": Slo(ttft_p95_ms=200, tpot_p95_ms=50), "relaxed": Slo(ttft_p95_ms=600, tpot_p95_ms=200)},
    cpu={"interactive": Slo(ttft_p95_ms=500, tpot_p95_ms=60), "relaxed": Slo(ttft_p95_ms=2000, tpot_p95_ms=150)},
)
PRESET = Preset("chat", Arrival(rate=0.5, burstiness=1.0, concurrency=None), PRESET_SLO, _make, TIERS)

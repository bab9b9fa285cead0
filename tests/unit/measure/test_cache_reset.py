"""Emptying the prefix cache between capacity steps: SGLang refuses while requests still run.

On the H200, after a step the tuner cut short, SGLang answered ``/flush_cache`` with 400 ("Cache
not flushed because there are pending requests ... #running-req: 202"), and the next step started
warm. The reset asks again until the server has ended them, for a bounded time.
"""

from __future__ import annotations

import httpx
import pytest

from tuner.engines.base import EngineAdapter
from tuner.engines.sglang import SglangAdapter
from tuner.engines.vllm import VllmAdapter
from tuner.measure.trial import reset_prefix_cache


def _server(answers: list[int]) -> tuple[httpx.Client, list[str]]:
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(answers.pop(0) if len(answers) > 1 else answers[0])

    return httpx.Client(transport=httpx.MockTransport(handle)), seen


def test_sglang_busy_with_cut_requests_is_asked_again_until_it_empties_its_cache() -> None:
    client, seen = _server([400, 400, 200])
    assert reset_prefix_cache(client, "http://engine", SglangAdapter(), patience_s=5.0)
    assert seen == ["/flush_cache"] * 3


def test_a_refusal_that_outlasts_the_patience_is_reported_not_waited_forever() -> None:
    client, seen = _server([400])
    assert not reset_prefix_cache(client, "http://engine", SglangAdapter(), patience_s=0.0)
    assert seen == ["/flush_cache"]


@pytest.mark.parametrize("adapter", [VllmAdapter(), SglangAdapter()], ids=["vllm", "sglang"])
def test_any_other_refusal_is_final_at_once(adapter: EngineAdapter) -> None:
    client, seen = _server([404])  # vLLM without VLLM_SERVER_DEV_MODE has no reset route
    assert not reset_prefix_cache(client, "http://engine", adapter, patience_s=5.0)
    assert seen == [adapter.reset_cache_path]

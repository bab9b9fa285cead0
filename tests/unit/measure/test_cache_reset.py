"""Emptying the prefix cache between capacity steps: the engines refuse while requests still run.

On the H200, after a step the tuner cut short, SGLang answered ``/flush_cache`` with 400 ("Cache
not flushed because there are pending requests ... #running-req: 202"), and the next step started
warm. vLLM answers such a reset 200 with ``{"success": false}`` (its dev cache router). The reset asks
again until the server has ended them, for a bounded time, and waits for a slow answer as long.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import httpx
import pytest

from tests.loopback import serving
from tuner.engines.base import EngineAdapter
from tuner.engines.sglang import SglangAdapter
from tuner.engines.vllm import VllmAdapter
from tuner.measure.trial import reset_prefix_cache

BUSY_VLLM = (200, {"success": False})
DONE_VLLM = (200, {"success": True})


def _server(answers: list[tuple[int, object] | int]) -> tuple[httpx.Client, list[str]]:
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        status, body = answer if isinstance(answer, tuple) else (answer, None)
        return httpx.Response(status, content=b"" if body is None else json.dumps(body).encode())

    return httpx.Client(transport=httpx.MockTransport(handle)), seen


def test_sglang_busy_with_cut_requests_is_asked_again_until_it_empties_its_cache() -> None:
    client, seen = _server([400, 400, 200])
    assert reset_prefix_cache(client, "http://engine", SglangAdapter(), patience_s=5.0)
    assert seen == ["/flush_cache"] * 3


def test_vllm_saying_success_false_is_busy_not_done_and_is_asked_again() -> None:
    client, seen = _server([BUSY_VLLM, BUSY_VLLM, DONE_VLLM])
    assert reset_prefix_cache(client, "http://engine", VllmAdapter(), patience_s=5.0)
    assert seen == ["/reset_prefix_cache"] * 3
    client, seen = _server([BUSY_VLLM])
    assert not reset_prefix_cache(client, "http://engine", VllmAdapter(), patience_s=0.0)
    assert seen == ["/reset_prefix_cache"]


def test_vllm_answering_200_without_the_key_is_done() -> None:
    client, _ = _server([200])  # an empty body, as a route that says nothing more answers
    assert reset_prefix_cache(client, "http://engine", VllmAdapter(), patience_s=0.0)


def test_a_refusal_that_outlasts_the_patience_is_reported_not_waited_forever() -> None:
    client, seen = _server([400])
    assert not reset_prefix_cache(client, "http://engine", SglangAdapter(), patience_s=0.0)
    assert seen == ["/flush_cache"]


@pytest.mark.parametrize("adapter", [VllmAdapter(), SglangAdapter()], ids=["vllm", "sglang"])
def test_any_other_refusal_is_final_at_once(adapter: EngineAdapter) -> None:
    client, seen = _server([404])  # vLLM without VLLM_SERVER_DEV_MODE has no reset route
    assert not reset_prefix_cache(client, "http://engine", adapter, patience_s=5.0)
    assert seen == [adapter.reset_cache_path]


ANSWER_AFTER_S = 1.5  # the slow server's answer, past the client's own timeout below


@pytest.fixture
def slow_server() -> Iterator[str]:
    """A real HTTP server on loopback that answers the vLLM reset ``ANSWER_AFTER_S`` late."""

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            time.sleep(ANSWER_AFTER_S)
            body = json.dumps({"success": True}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with serving(Slow) as url:
        yield url


def test_a_slow_answer_within_the_patience_is_waited_for_past_the_clients_own_timeout(slow_server: str) -> None:
    """The drive's client allows 10 s a request; a loaded vLLM ending a cut step's requests has answered
    the reset later than that, and the step was recorded as starting warm though the cache was emptied."""
    with httpx.Client(timeout=ANSWER_AFTER_S / 3) as client:
        with pytest.raises(httpx.TimeoutException):  # the client alone gives up: what the reset waits past
            client.post(slow_server + "/reset_prefix_cache")
        began = time.monotonic()
        assert reset_prefix_cache(client, slow_server, VllmAdapter(), patience_s=2 * ANSWER_AFTER_S)
        assert time.monotonic() - began >= ANSWER_AFTER_S

"""The load generator against httpx.MockTransport: parsing, error recording, closed-loop concurrency."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import httpx
import pytest

from tuner.client.driver import DriveResult, RequestRecord, drive, drive_sync
from tuner.workloads.base import Request

Handler = Callable[[httpx.Request], Coroutine[None, None, httpx.Response]]
BASE_URL = "http://engine.test"


def _request(i: int = 0, endpoint: str = "/v1/completions") -> Request:
    body = {"prompt": f"prompt {i}", "max_tokens": 4, "temperature": 0.0, "ignore_eos": True}
    return Request(f"r{i:04d}", endpoint, body, prompt_tokens=2, max_tokens=4)


def _chunk(text: str | None, completion_tokens: int | None = None, prompt_tokens: int = 2) -> str:
    event: dict[str, Any] = {"choices": [] if text is None else [{"index": 0, "text": text}]}
    if completion_tokens is not None:
        event["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    return "data: " + json.dumps(event)


def _sse(lines: list[str], status: int = 200) -> Handler:
    async def body() -> AsyncIterator[bytes]:
        for line in lines:
            await asyncio.sleep(0.001)  # distinct arrival times per chunk
            yield (line + "\n\n").encode()

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body(), headers={"content-type": "text/event-stream"})

    return handler


def _run(handler: Handler, requests: list[Request], concurrency: int = 1, timeout_s: float = 5.0) -> DriveResult:
    async def go() -> DriveResult:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await drive(client, BASE_URL, "m", requests, concurrency=concurrency, request_timeout_s=timeout_s)

    return asyncio.run(go())


def _one(handler: Handler, request: Request | None = None) -> RequestRecord:
    (record,) = _run(handler, [request or _request()]).records
    return record


def test_success_with_continuous_usage() -> None:
    lines = [_chunk("Hel", 1), _chunk("lo", 2), _chunk(" there", 3), _chunk(None, 3), "data: [DONE]"]
    record = _one(_sse(lines))
    assert record.error is None
    assert record.output_tokens == 3 and record.prompt_tokens == 2
    assert record.chunk_tokens == (1, 1, 1)
    assert len(record.token_times_s) == 3
    assert record.first_token_s == record.token_times_s[0]
    assert record.done_s is not None
    assert record.sent_s < record.first_token_s < record.token_times_s[-1] <= record.done_s


def test_payload_adds_model_and_stream_options() -> None:
    seen: list[dict[str, Any]] = []
    inner = _sse([_chunk("a", 1), "data: [DONE]"])

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        assert str(request.url) == BASE_URL + "/v1/completions"
        return await inner(request)

    _one(handler)
    assert seen[0]["model"] == "m" and seen[0]["stream"] is True
    assert seen[0]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert seen[0]["prompt"] == "prompt 0" and seen[0]["ignore_eos"] is True


def test_chunk_carrying_several_tokens_is_counted() -> None:
    lines = [_chunk("a", 1), _chunk("bcd", 4), _chunk("ef", 6), _chunk(None, 6), "data: [DONE]"]
    record = _one(_sse(lines))
    assert record.chunk_tokens == (1, 3, 2)
    assert record.output_tokens == 6


def test_without_usage_each_text_chunk_counts_one() -> None:
    record = _one(_sse([_chunk("a"), _chunk(""), _chunk("b"), "data: [DONE]"]))
    assert record.error is None
    assert record.chunk_tokens == (1, 1)  # the empty chunk carries no text and is not timed
    assert record.output_tokens == 0 and record.prompt_tokens == 0


def test_chat_delta_content() -> None:
    def chat(content: str | None, n: int) -> str:
        event = {
            "choices": [{"delta": {"role": "assistant", "content": content}}],
            "usage": {"completion_tokens": n},
        }
        return "data: " + json.dumps(event)

    record = _one(_sse([chat("", 0), chat("Hi", 1), chat("!", 2), "data: [DONE]"]), _request(0, "/v1/chat/completions"))
    assert record.error is None and record.chunk_tokens == (1, 1) and record.output_tokens == 2


def test_http_500_is_recorded() -> None:
    record = _one(_sse(['{"error": "boom"}'], status=500))
    assert record.error == "HTTP 500" and record.detail == "boom"  # the server's words, kept apart
    assert record.first_token_s is None and record.output_tokens == 0


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ('{"error": {"message": "too long", "code": 400}}', "too long"),  # OpenAI's shape
        ('{"object": "error", "message": "no such model", "code": 404}', "no such model"),  # vLLM's
        ('{"detail": "Not Found"}', "Not Found"),  # FastAPI's
        ("Bad\n  gateway", "Bad gateway"),  # plain text, on one line
        ("", None),
    ],
)
def test_an_error_body_gives_the_detail(body: str, detail: str | None) -> None:
    assert _one(_sse([body] if body else [], status=400)).detail == detail


def test_stream_cut_without_done() -> None:
    record = _one(_sse([_chunk("a", 1), _chunk("b", 2)]))
    assert record.error == "stream ended without [DONE]"
    assert record.chunk_tokens == (1, 1)


def test_malformed_sse_line() -> None:
    record = _one(_sse([_chunk("a", 1), "data: {not json", "data: [DONE]"]))
    assert record.error == "malformed SSE"


def test_server_error_event_mid_stream() -> None:
    record = _one(_sse([_chunk("a", 1), 'data: {"error": {"message": "engine died"}}']))
    assert record.error is not None and "engine died" in record.error


def test_connection_error_and_timeout_are_recorded_not_raised() -> None:
    async def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async def stall(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200)

    assert _one(refuse).error == "ConnectError"
    (record,) = _run(stall, [_request()], timeout_s=0.05).records
    assert record.error == "timeout"


def test_closed_loop_keeps_exactly_concurrency_in_flight() -> None:
    in_flight, peak = 0, 0
    inner = _sse([_chunk("a", 1), "data: [DONE]"])

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        if json.loads(request.content)["prompt"] == "prompt 5":
            return httpx.Response(500)
        return await inner(request)

    result = _run(handler, [_request(i) for i in range(12)], concurrency=3)
    assert peak == 3
    assert [r.request_id for r in result.records] == [f"r{i:04d}" for i in range(12)]
    assert [r.error for r in result.records].count("HTTP 500") == 1  # a failure is kept, in place
    assert result.started_s <= min(r.sent_s for r in result.records) and result.ended_s > result.started_s


def test_drive_sync_with_client_and_callback() -> None:
    seen: list[str] = []
    client = httpx.AsyncClient(transport=httpx.MockTransport(_sse([_chunk("a", 1), "data: [DONE]"])))
    result = drive_sync(
        client,
        BASE_URL,
        "m",
        [_request(i) for i in range(4)],
        concurrency=2,
        on_record=lambda r: seen.append(r.request_id),
    )
    assert sorted(seen) == [f"r{i:04d}" for i in range(4)]
    assert all(r.error is None for r in result.records)


def test_drive_sync_without_client_records_connection_failure() -> None:
    # nothing listens on port 9 of localhost: the owned client is built and the failure recorded
    result = drive_sync(None, "http://127.0.0.1:9", "m", [_request()], concurrency=1, request_timeout_s=2.0)
    assert result.records[0].error is not None


def test_bad_concurrency_is_rejected() -> None:
    with pytest.raises(ValueError):
        _run(_sse(["data: [DONE]"]), [_request()], concurrency=0)


def test_callback_error_stops_the_run_and_surfaces_as_is() -> None:
    def explode(record: RequestRecord) -> None:
        raise RuntimeError("abort trial")

    client = httpx.AsyncClient(transport=httpx.MockTransport(_sse([_chunk("a", 1), "data: [DONE]"])))
    with pytest.raises(RuntimeError, match="abort trial"):
        drive_sync(client, BASE_URL, "m", [_request(i) for i in range(6)], concurrency=2, on_record=explode)


def test_the_first_token_is_heard_while_the_request_still_runs() -> None:
    """A step's monitor reads in-flight requests: their first token must reach it before they end."""
    heard: dict[str, float] = {}
    seen_running: list[bool] = []

    async def body() -> AsyncIterator[bytes]:
        yield (_chunk("a", 1) + "\n\n").encode()
        await asyncio.sleep(0.05)
        seen_running.append("r0000" in heard)  # the first token is known, the request not yet ended
        for line in (_chunk("b", 2), _chunk(None, 2), "data: [DONE]"):
            yield (line + "\n\n").encode()

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    async def go() -> DriveResult:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await drive(client, BASE_URL, "m", [_request()], concurrency=1, on_first_token=heard.__setitem__)

    (record,) = asyncio.run(go()).records
    assert seen_running == [True] and heard == {"r0000": record.first_token_s}

"""The load generator's sessions and open loop, against httpx.MockTransport.

Concurrency is shown by counts and order, never by wall-clock thresholds a loaded machine misses: a
server that holds its replies until ``together`` requests are in flight (waiting on an event, with
a generous deadline) proves those requests were sent without waiting for any reply.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from tuner.client.driver import SESSION_ABORTED, DriveResult, drive
from tuner.workloads.base import CHAT_ENDPOINT, Request

BASE_URL = "http://engine.test"


def _turn(session: str, turn: int, text: str, arrival_s: float | None = None) -> Request:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 2}
    return Request(f"{session}t{turn}", CHAT_ENDPOINT, body, 3, 2, session, turn, turn > 0, arrival_s)


def _single(i: int, arrival_s: float | None = None) -> Request:
    body = {"prompt": f"p{i}", "max_tokens": 2}
    return Request(f"r{i}", "/v1/completions", body, 1, 2, arrival_s=arrival_s)


GATE_DEADLINE_S = 10.0  # a held reply waits this long at most for the others: generous on a loaded machine


class Server:
    """Replies ``reply-N`` to the N-th request it sees; remembers payloads, timings and how many
    requests were in flight at most. With ``together``, every reply is held until that many requests
    have arrived; one still alone at the deadline is answered 504."""

    def __init__(self, delay_s: float = 0.01, fail_on: str | None = None, together: int = 0) -> None:
        self.payloads: list[dict[str, Any]] = []
        self.spans: dict[str, tuple[float, float]] = {}
        self.delay_s, self.fail_on, self.together = delay_s, fail_on, together
        self.in_flight = self.max_in_flight = 0
        self.gathered = asyncio.Event()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        payload = json.loads(request.content)
        self.payloads.append(payload)
        text = f"reply-{len(self.payloads)}"
        last = payload["messages"][-1]["content"] if "messages" in payload else payload["prompt"]
        started = time.perf_counter()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.together and not await self._gather():
                return httpx.Response(504)
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        self.spans[last] = (started, time.perf_counter())
        if self.fail_on == last:
            return httpx.Response(500)
        delta = {"choices": [{"delta": {"content": text}, "text": text}], "usage": {"completion_tokens": 1}}
        body = f"data: {json.dumps(delta)}\n\ndata: [DONE]\n\n"
        return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})

    async def _gather(self) -> bool:
        if len(self.payloads) >= self.together:
            self.gathered.set()
        try:
            await asyncio.wait_for(self.gathered.wait(), GATE_DEADLINE_S)
        except TimeoutError:
            return False
        return True


def _run(server: Server, requests: list[Request], concurrency: int = 2) -> DriveResult:
    async def go() -> DriveResult:
        async with httpx.AsyncClient(transport=httpx.MockTransport(server)) as client:
            return await drive(client, BASE_URL, "m", requests, concurrency=concurrency)

    return asyncio.run(go())


def test_a_turn_is_sent_after_the_history_and_the_actual_previous_response() -> None:
    server = Server()
    result = _run(server, [_turn("s", 0, "task"), _turn("s", 1, "tool result"), _turn("s", 2, "more")])
    assert [r.error for r in result.records] == [None, None, None]
    first, second, third = server.payloads
    assert first["messages"] == [{"role": "user", "content": "task"}]
    assert second["messages"] == [
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "reply-1"},
        {"role": "user", "content": "tool result"},
    ]
    assert third["messages"][:3] == second["messages"] and third["messages"][3:] == [
        {"role": "assistant", "content": "reply-2"},
        {"role": "user", "content": "more"},
    ]


def test_completions_sessions_append_the_reply_to_the_prompt() -> None:
    server = Server()
    first = Request("a0", "/v1/completions", {"prompt": "Q1:", "max_tokens": 2}, 2, 2, "a")
    second = Request("a1", "/v1/completions", {"prompt": " Q2:", "max_tokens": 2}, 2, 2, "a", 1, True)
    _run(server, [first, second])
    assert server.payloads[1]["prompt"] == "Q1:reply-1 Q2:"


def test_a_sessions_turns_never_overlap_while_sessions_run_side_by_side() -> None:
    server = Server(together=2)  # both sessions' first turns must be in flight at once to be answered
    requests = [_turn(s, t, f"{s}{t}") for s in ("a", "b") for t in range(3)]
    result = _run(server, requests, concurrency=2)
    assert [r.error for r in result.records] == [None] * 6
    for s in ("a", "b"):
        spans = [server.spans[f"{s}{t}"] for t in range(3)]
        assert all(spans[t][1] <= spans[t + 1][0] for t in range(2))
    assert server.max_in_flight == 2  # side by side, and never two turns of one session


def test_a_failed_turn_aborts_the_rest_of_its_session_only() -> None:
    server = Server(fail_on="a1")
    requests = [_turn("a", t, f"a{t}") for t in range(3)] + [_turn("b", t, f"b{t}") for t in range(2)]
    result = _run(server, requests)
    errors = {r.request_id: r.error for r in result.records}
    assert errors == {"at0": None, "at1": "HTTP 500", "at2": SESSION_ABORTED, "bt0": None, "bt1": None}
    assert [r.request_id for r in result.records] == [r.request_id for r in requests]  # kept in order
    assert len(server.payloads) == 4  # the aborted turn was never sent


def test_open_loop_releases_at_the_scheduled_times_whatever_the_server_does() -> None:
    server = Server(together=4)  # no reply before the last request: a loop that waited on one would stall
    requests = [_single(i, arrival_s=0.05 * i) for i in range(4)]
    result = _run(server, requests, concurrency=10)
    assert [r.error for r in result.records] == [None] * 4 and server.max_in_flight == 4  # none waited
    offsets = [r.sent_s - result.started_s for r in result.records]
    assert offsets == sorted(offsets), offsets  # in the order of their arrival times
    due = [r.scheduled_s - result.started_s for r in result.records if r.scheduled_s is not None]
    assert due == pytest.approx([0.0, 0.05, 0.10, 0.15])  # each keeps the time it was due
    assert all(r.sent_s >= r.scheduled_s for r in result.records if r.scheduled_s is not None), "never early"


def test_open_loop_cap_limits_requests_in_flight() -> None:
    server = Server(together=2)  # the first two are answered only once both are in flight
    result = _run(server, [_single(i, arrival_s=0.0) for i in range(4)], concurrency=2)
    assert [r.error for r in result.records] == [None] * 4
    assert server.max_in_flight == 2  # two at once, then the other two as the first end: never more
    first_end = min(end for _, end in server.spans.values())
    later = sorted(start for start, _ in server.spans.values())[2:]
    assert all(start >= first_end for start in later)


def test_closed_loop_records_no_schedule() -> None:
    result = _run(Server(), [_single(i) for i in range(3)])
    assert all(r.scheduled_s is None for r in result.records)

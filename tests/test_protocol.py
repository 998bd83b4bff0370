"""The webhook endpoints' one-write answers write exactly what uvicorn's ASGI path writes.

`Cycle.respond` and `Cycle.body_in_full` skip uvicorn's `send` and `receive` for speed; here each
is run beside the path it replaces, on cycles alike but for that, over a transport that records
what it is given, for every status the endpoints send, with and without keep-alive.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import pytest
from uvicorn.protocols.http.flow_control import FlowControl

from webhook.server.app import Send, _send
from webhook.server.protocol import Cycle

BODY = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}'
DEFAULT_HEADERS = [(b"date", b"Tue, 01 Dec 2026 22:00:00 GMT"), (b"server", b"uvicorn")]


class Recording(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def cycle(keep_alive: bool = True, expect_100: bool = False) -> tuple[Cycle, Recording, list[int]]:
    transport = Recording()
    completed: list[int] = []
    made = Cycle(
        scope={"type": "http", "method": "POST", "http_version": "1.1", "headers": []},  # type: ignore[typeddict-item]
        transport=transport,
        flow=FlowControl(transport),
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test.access"),
        access_log=False,
        default_headers=list(DEFAULT_HEADERS),
        message_event=asyncio.Event(),
        expect_100_continue=expect_100,
        keep_alive=keep_alive,
        on_response=lambda: completed.append(1),
    )
    return made, transport, completed


def asgi_send(made: Cycle) -> Send:
    return cast(Send, made.send)


@pytest.mark.asyncio
@pytest.mark.parametrize("keep_alive", [True, False])
@pytest.mark.parametrize("status", [200, 400, 408, 413, 500])
async def test_an_answer_in_one_write_is_what_send_writes(status: int, keep_alive: bool) -> None:
    fast, fast_out, fast_done = cycle(keep_alive)
    asgi, asgi_out, asgi_done = cycle(keep_alive)
    await _send(asgi_send(fast), status, BODY, fast)
    await _send(asgi_send(asgi), status, BODY)  # no cycle given: the two ASGI messages
    assert len(fast_out.writes) == 1
    assert fast_out.writes == [b"".join(asgi_out.writes)]
    assert (fast_out.closed, fast.keep_alive) == (asgi_out.closed, asgi.keep_alive)
    assert fast.response_complete and asgi.response_complete
    assert fast_done == asgi_done == [1]
    closing = status in (408, 413) or not keep_alive
    assert (b"connection: close\r\n" in fast_out.writes[0]) is closing
    assert fast_out.closed is closing


@pytest.mark.asyncio
@pytest.mark.parametrize("expect_100", [False, True])
async def test_a_body_in_full_is_what_receive_gives(expect_100: bool) -> None:
    fast, fast_out, _ = cycle(expect_100=expect_100)
    asgi, asgi_out, _ = cycle(expect_100=expect_100)
    for made in (fast, asgi):  # as the protocol leaves a cycle once the body has come
        made.body, made.more_body = bytearray(BODY), False
        made.message_event.set()
    assert fast.body_in_full() == BODY
    message = await asgi.receive()
    assert message == {"type": "http.request", "body": BODY, "more_body": False}
    assert fast_out.writes == asgi_out.writes  # the 100 Continue too, when one was asked for
    await _send(asgi_send(fast), 200, BODY, fast)
    await _send(asgi_send(asgi), 200, BODY)
    assert b"".join(fast_out.writes) == b"".join(asgi_out.writes)


def test_a_body_still_coming_or_a_response_begun_is_left_to_asgi() -> None:
    coming, _, _ = cycle()
    coming.body, coming.more_body = bytearray(BODY[:10]), True
    assert coming.body_in_full() is None
    assert coming.body == bytearray(BODY[:10])  # kept for `receive`
    begun, out, _ = cycle()
    begun.response_started = True
    assert begun.respond(200, b"application/json", BODY, False) is False
    assert out.writes == []

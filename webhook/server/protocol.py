"""uvicorn's httptools protocol, with the limits a server facing the network needs.

* **Header deadline.** uvicorn closes idle keep-alive connections, but a client that opens a
  connection and then sends nothing, or sends its headers a byte at a time (slowloris), holds the
  connection and its memory for ever. Here every request's headers must be complete within
  `header_timeout` seconds of the connection opening (the TLS handshake has the same deadline,
  see `servers.py`) or of the request's first byte; otherwise the client gets `408 Request
  Timeout` and the connection is closed. The body has its own deadline in the endpoint.
* **Header size.** httptools buffers a header of any size until it ends; a header section over
  `max_header_bytes` gets `431 Request Header Fields Too Large` and the connection is closed.
* **One write per answer.** uvicorn writes a response's head and its body in two transport
  writes: two TLS records and two sends. Here the head is held and goes out with the body's
  first bytes (every answer of this service comes in one body message). The webhook endpoints go
  further (`Cycle.body_in_full`, `Cycle.respond`): a body already in full is taken without the
  ASGI receive, and a whole answer is written as `send` would write it, without two ASGI
  messages and the re-check of headers this service wrote itself.
* **Draining.** When the service shuts down (`Drain.begin`), answers carry `Connection: close`
  so clients move to another replica, and a connection is closed only between requests: one
  idle at that moment is closed after `Drain.idle_grace` seconds without a request, so a request
  already on its way is answered rather than cut off (uvicorn would close it at once).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import TYPE_CHECKING

from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

if TYPE_CHECKING:
    from uvicorn._types import ASGISendEvent

log = logging.getLogger("webhook.admission")


def _response(status: bytes, message: str) -> bytes:
    body = b'{"error":"%s"}' % message.encode()
    return (
        b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n%s" % (status, len(body), body)
    )


# Set in a request's scope once its whole body has arrived: reading it then needs no deadline.
BODY_RECEIVED = "trainjob_scheduling.body_received"

REQUEST_TIMEOUT = _response(b"408 Request Timeout", "request headers not received in time")
HEADERS_TOO_LARGE = _response(b"431 Request Header Fields Too Large", "request headers too large")


class _HeadHeld(asyncio.Transport):
    """The transport of one response once its head is written: the head (the first write) is
    kept and sent with the next write, or before a close."""

    __slots__ = ("head", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        super().__init__()
        self.transport = transport
        self.head: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.head is None:
            self.head = bytes(data)
            return
        if self.head:
            data, self.head = self.head + data, b""
        self.transport.write(data)

    def release(self) -> asyncio.Transport:
        """Sends a head still held (a response that wrote no body: HEAD, an empty 204) and
        gives back the connection's own transport."""
        if self.head:
            self.transport.write(self.head)
        self.head = b""
        return self.transport

    def close(self) -> None:
        self.release().close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()


_CLOSE_LINE = b"connection: close\r\n"


class Cycle(RequestResponseCycle):
    """uvicorn's request/response cycle, writing each response's head with its body."""

    def body_in_full(self) -> bytes | None:
        """For the first read of a request's body: the whole of it when it has all arrived (what
        `receive` would return, without its wait); else None (then `receive` reads it)."""
        if self.more_body or self.disconnected or self.response_complete or self.response_started:
            return None
        if self.waiting_for_100_continue and not self.transport.is_closing():
            # As `receive` does (a client that sent the body without waiting for it).
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        body, self.body = bytes(self.body), bytearray()
        self.flow.resume_reading()  # as `receive` does: reading may have paused for a big body
        return body

    def respond(self, status: int, content_type: bytes, body: bytes, close: bool) -> bool:
        """Writes a whole response in one write, the bytes `send` would write for a start
        message with content-type, content-length (and, with `close`, `connection: close`)
        headers and one body message; False (nothing done) when it must go through `send`: a
        response already begun, a client gone, a paused write buffer, a HEAD request, uvicorn's
        access log on. Headers are not re-checked: the service wrote them, and the default ones
        are uvicorn's (the date and server; the service configures no others)."""
        if (
            self.response_started
            or self.disconnected
            or self.flow.write_paused
            or self.scope["method"] == "HEAD"
            or self.access_log  # uvicorn's send writes its access line
        ):
            return False
        self.response_started = True
        self.waiting_for_100_continue = False
        if close:
            self.keep_alive = False
        defaults = b"".join(b"%s: %s\r\n" % (n.lower(), v) for n, v in self.default_headers)
        self.transport.write(
            b"%s%scontent-type: %s\r\ncontent-length: %d\r\n%s\r\n%s"
            % (
                STATUS_LINE[status],
                defaults,
                content_type,
                len(body),
                b"" if self.keep_alive else _CLOSE_LINE,
                body,
            )
        )
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()
        return True

    async def send(self, message: ASGISendEvent) -> None:
        if not self.response_started and message["type"] == "http.response.start":
            self.transport = _HeadHeld(self.transport)
        await super().send(message)
        transport = self.transport
        if self.response_complete and isinstance(transport, _HeadHeld):
            # uvicorn writes no body for HEAD (and may end a response without one): the head
            # must not wait for a write that never comes.
            self.transport = transport.release()


class Drain:
    """The connections of one server, told together when the server starts to shut down."""

    def __init__(self, idle_grace: float = 1.0) -> None:
        self.idle_grace = idle_grace
        self.draining = False
        self._connections: weakref.WeakSet[HardenedProtocol] = weakref.WeakSet()

    def add(self, connection: HardenedProtocol) -> None:
        self._connections.add(connection)
        if self.draining:
            connection.drain()

    def discard(self, connection: HardenedProtocol) -> None:
        self._connections.discard(connection)

    def begin(self) -> None:
        """From now on every answer closes its connection; idle ones close after the grace."""
        if self.draining:
            return
        self.draining = True
        for connection in list(self._connections):
            connection.drain()


class HardenedProtocol(HttpToolsProtocol):
    header_timeout: float = 10.0
    max_header_bytes: int = 64 * 1024
    drainer: Drain | None = None  # set on the webhook server's protocol class only

    _header_deadline: float | None = None  # loop time the headers under way are due by
    _deadline_timer: asyncio.TimerHandle | None = None
    _idle_close: asyncio.TimerHandle | None = None
    _in_body = False  # between the end of a request's headers and the end of its body
    _receiving = False  # a request has begun and its headers are not complete
    _header_bytes = 0
    _headers_done = 0  # header sections completed on this connection
    _draining = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()
        if self.drainer is not None:
            self.drainer.add(self)

    def data_received(self, data: bytes) -> None:
        in_body, done = self._in_body, self._headers_done
        super().data_received(data)
        # Counted: chunks that began and ended within one header section (one that opens after
        # a body in the same chunk is counted from its next chunk on).
        if in_body or self._headers_done != done or self.transport.is_closing():
            return
        self._header_bytes += len(data)
        if self._header_bytes > self.max_header_bytes:
            self._refuse(431, HEADERS_TOO_LARGE, "headers too large")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._receiving = True
        self._cancel_idle_close()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._receiving = False
        self._in_body = True
        self._header_bytes = 0
        self._headers_done += 1
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and type(cycle) is RequestResponseCycle:
            # Made just now and not yet run (its task starts on the next loop turn).
            cycle.__class__ = Cycle
        if self._draining and cycle is not None:
            cycle.keep_alive = False  # the answer says Connection: close

    def on_message_complete(self) -> None:
        self._in_body = False
        super().on_message_complete()
        self.scope[BODY_RECEIVED] = True  # type: ignore[literal-required]

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self._cancel_idle_close()
        if self.drainer is not None:
            self.drainer.discard(self)
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._draining and self._idle():
            self._close_when_idle()

    def shutdown(self) -> None:
        """uvicorn's shutdown closes idle connections at once; with a drainer, they are drained."""
        if self.drainer is None:
            super().shutdown()
        else:
            self.drain()

    def drain(self) -> None:
        self._draining = True
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False
        if self._idle():
            self._close_when_idle()

    def _idle(self) -> bool:
        return not self._receiving and (self.cycle is None or self.cycle.response_complete)

    def _close_when_idle(self) -> None:
        if self._idle_close is None and self.drainer is not None:
            self._idle_close = self.loop.call_later(self.drainer.idle_grace, self._idle_expired)

    def _idle_expired(self) -> None:
        self._idle_close = None
        if self._idle() and not self.transport.is_closing():
            self.transport.close()

    def _cancel_idle_close(self) -> None:
        if self._idle_close is not None:
            self._idle_close.cancel()
            self._idle_close = None

    # One timer per connection, not one per request: a deadline moves with each request and
    # the timer, when it fires, looks again (a timer made and cancelled per request costs as
    # much as a tenth of a pod review).
    def _arm(self) -> None:
        self._header_deadline = self.loop.time() + self.header_timeout
        if self._deadline_timer is None:
            self._deadline_timer = self.loop.call_at(self._header_deadline, self._check_deadline)

    def _disarm(self) -> None:
        self._header_deadline = None

    def _check_deadline(self) -> None:
        self._deadline_timer = None
        due = self._header_deadline
        if due is None:
            return
        if self.loop.time() < due:
            self._deadline_timer = self.loop.call_at(due, self._check_deadline)
            return
        self._header_deadline = None
        if not self.transport.is_closing():
            self._refuse(408, REQUEST_TIMEOUT, "headers too slow")

    def _refuse(self, status: int, answer: bytes, why: str) -> None:
        """Answers a request whose headers are not acceptable, and closes the connection."""
        if self.cycle is None or self.cycle.response_complete:  # nothing in flight to answer
            log.warning(
                "request rejected",
                extra={"fields": {"status": status, "error": why, "client": self.client}},
            )
            self.transport.write(answer)
        self.transport.close()


def protocol_class(
    header_timeout: float, max_header_bytes: int = 64 * 1024, drain: Drain | None = None
) -> type[HardenedProtocol]:
    """The protocol class to give uvicorn (`Config(http=...)`) for these limits."""
    attrs = {
        "header_timeout": header_timeout,
        "max_header_bytes": max_header_bytes,
        "drainer": drain,
    }
    return type("HardenedProtocol", (HardenedProtocol,), attrs)


def own_cycle(send: object) -> Cycle | None:
    """The cycle whose `send` this is when it is this server's (its one-write paths can be
    used); None for any other send (another server, a wrapping middleware, a test's)."""
    cycle = getattr(send, "__self__", None)
    return cycle if isinstance(cycle, Cycle) else None

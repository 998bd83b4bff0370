"""The limits a server facing the network needs, in front of a stock uvicorn protocol.

`Guard` is an `asyncio.Protocol` that owns the connection and feeds uvicorn's own HTTP protocol
(made the way uvicorn makes it, from its public `Config`); it reads the same bytes with its own
httptools parser, only to know where each request begins and where its headers end.

* **Header deadline.** uvicorn closes idle keep-alive connections, but a client that opens a
  connection and then sends nothing, or sends its headers a byte at a time (slowloris), holds the
  connection and its memory for ever. Here every request's headers must be complete within
  `header_timeout` seconds of the connection opening (the TLS handshake has the same deadline,
  see `servers.py`) or of the request's first byte; otherwise the client gets `408 Request
  Timeout` and the connection is closed. The body has its own deadline in the endpoint.
* **Header size.** httptools buffers a header of any size until it ends; a header section over
  `max_header_bytes` gets `431 Request Header Fields Too Large` and the connection is closed.
* **Connection bounds.** A client keeps its connections, so after a rollout the replica that
  came up last would answer nearly every review. An answer carries `Connection: close` once its
  connection has carried `max_requests` requests or is `max_age` seconds old: the client dials
  again and the Service spreads the new connection over the replicas. The answer itself is
  whole; uvicorn closes the connection after it (as it does for any `Connection: close`).
* **Draining.** When the service shuts down (`Drain.begin`), every answer carries `Connection:
  close` so clients move to another replica, and a connection is closed only between requests:
  one idle at that moment is closed after `Drain.idle_grace` seconds without a request, so a
  request already on its way is answered rather than cut off (uvicorn would close it at once).

The answers' `Connection: close` is added by `CloseWhenDue`, the ASGI app in front of the
server's app; it finds its connection's `Guard` in the request's `scope["state"]`, which uvicorn
copies from the state the protocol was made with.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, cast

import httptools

log = logging.getLogger("webhook.admission")

# The key of a request's connection (its `Guard`) in the ASGI scope's "state".
CONNECTION = "trainjob_scheduling.connection"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _response(status: bytes, message: str) -> bytes:
    body = b'{"error":"%s"}' % message.encode()
    return (
        b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n%s" % (status, len(body), body)
    )


REQUEST_TIMEOUT = _response(b"408 Request Timeout", "request headers not received in time")
HEADERS_TOO_LARGE = _response(b"431 Request Header Fields Too Large", "request headers too large")
UPGRADE_NOT_SERVED = _response(b"400 Bad Request", "protocol upgrade not served")


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float = 10.0  # seconds for a request's headers (and the TLS handshake)
    max_header_bytes: int = 64 * 1024
    max_requests: int = 0  # requests a connection carries before its answer closes it; 0: any
    max_age: float = 0.0  # seconds after which a connection's next answer closes it; 0: never


class Drain:
    """The connections of one server, told together when the server starts to shut down."""

    def __init__(self, idle_grace: float = 1.0) -> None:
        self.idle_grace = idle_grace
        self.draining = False
        self._connections: weakref.WeakSet[Guard] = weakref.WeakSet()

    def add(self, connection: Guard) -> None:
        self._connections.add(connection)
        if self.draining:
            connection.drain()

    def discard(self, connection: Guard) -> None:
        self._connections.discard(connection)

    def begin(self) -> None:
        """From now on every answer closes its connection; idle ones close after the grace."""
        if self.draining:
            return
        self.draining = True
        for connection in list(self._connections):
            connection.drain()


class _Transport:
    """The connection's transport as uvicorn's protocol sees it: the same, but its closes go
    through the guard (which, while draining, lets an idle connection wait for the grace)."""

    def __init__(self, transport: asyncio.Transport, guard: Guard) -> None:
        self._transport = transport
        self.write = transport.write  # bound once: the path of every answer
        self.close = guard.close_requested

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


ProtocolFactory = Callable[[dict[str, Any]], asyncio.Protocol]


class Guard(asyncio.Protocol):
    """One connection: its limits applied to the bytes, the rest handed to uvicorn's protocol
    (made by `make_protocol` from the ASGI state its requests get)."""

    def __init__(
        self,
        make_protocol: ProtocolFactory,
        limits: ConnectionLimits,
        drain: Drain | None = None,
        state: dict[str, Any] | None = None,
    ) -> None:
        self.limits = limits
        self.drainer = drain
        self.loop = asyncio.get_running_loop()
        self.protocol = make_protocol({**(state or {}), CONNECTION: self})
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.opened = self.loop.time()
        self.requests = 0  # requests handed to the app (counted by CloseWhenDue)
        self.answered = 0  # requests the app is done with
        self.begun = 0  # requests whose first byte has arrived
        self.closing = False  # an answer said Connection: close
        self.draining = False
        self._lost = False
        self._receiving = False  # a request has begun and its headers are not complete
        self._in_body = False  # between the end of a request's headers and the end of its body
        self._header_bytes = 0
        self._headers_done = 0
        self._header_deadline: float | None = None  # loop time the headers under way are due by
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._idle_close: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.protocol.connection_made(cast(asyncio.Transport, _Transport(self.transport, self)))
        self._arm()
        if self.drainer is not None:
            self.drainer.add(self)

    def data_received(self, data: bytes) -> None:
        in_body, done = self._in_body, self._headers_done
        if self.parser is not None:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                # uvicorn's protocol meets the same bytes, answers 400 and closes.
                self.parser = None
                self._disarm()
            except httptools.HttpParserUpgrade:
                # No endpoint serves an upgrade, and past one neither parser reads the bytes
                # that follow: the deadlines would no longer watch the connection (uvicorn
                # keeps it, and logs every chunk). Refused before uvicorn sees it.
                self.parser = None
                self._refuse(400, UPGRADE_NOT_SERVED, "upgrade requested")
                return
        # Counted: chunks that began and ended within one header section (one that opens after
        # a body in the same chunk is counted from its next chunk on).
        if self._receiving and not in_body and self._headers_done == done:
            self._header_bytes += len(data)
            if self._header_bytes > self.limits.max_header_bytes:
                self._refuse(431, HEADERS_TOO_LARGE, "headers too large")
                return
        self.protocol.data_received(data)

    def eof_received(self) -> bool | None:
        return self.protocol.eof_received()

    def pause_writing(self) -> None:
        self.protocol.pause_writing()

    def resume_writing(self) -> None:
        self.protocol.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._disarm()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self._cancel_idle_close()
        if self.drainer is not None:
            self.drainer.discard(self)
        self.protocol.connection_lost(exc)

    # --- httptools parser callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        self.begun += 1
        self._receiving = True
        self._header_bytes = 0
        self._cancel_idle_close()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._receiving = False
        self._in_body = True
        self._header_bytes = 0
        self._headers_done += 1

    def on_message_complete(self) -> None:
        self._in_body = False

    # --- what the app and uvicorn's protocol tell ---------------------------------------------

    def due(self) -> bool:
        """Whether the answer being started should close the connection."""
        limits = self.limits
        return (
            self.draining
            or 0 < limits.max_requests <= self.requests
            or (0 < limits.max_age <= self.loop.time() - self.opened)
        )

    def app_done(self) -> None:
        self.answered += 1
        if self.draining and self._idle():
            self._close_when_idle()

    def close_requested(self) -> None:
        """uvicorn's protocol closes the connection: at once, unless it is draining and idle
        (uvicorn's shutdown closes idle connections): then after the grace, if still idle."""
        if self.draining and not self.closing and not self._lost and self._idle():
            self._close_when_idle()
        elif self.transport is not None:
            self.transport.close()

    def drain(self) -> None:
        self.draining = True
        if self._idle():
            self._close_when_idle()

    # --- internals -----------------------------------------------------------------------------

    def _idle(self) -> bool:
        return not self._receiving and not self._in_body and self.begun == self.answered

    def _close_when_idle(self) -> None:
        if self._idle_close is None and self.drainer is not None and not self._lost:
            self._idle_close = self.loop.call_later(self.drainer.idle_grace, self._idle_expired)

    def _idle_expired(self) -> None:
        self._idle_close = None
        transport = self.transport
        if self._idle() and transport is not None and not transport.is_closing():
            transport.close()

    def _cancel_idle_close(self) -> None:
        if self._idle_close is not None:
            self._idle_close.cancel()
            self._idle_close = None

    # One timer per connection, not one per request: a deadline moves with each request and
    # the timer, when it fires, looks again.
    def _arm(self) -> None:
        self._header_deadline = self.loop.time() + self.limits.header_timeout
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
        if self.transport is not None and not self.transport.is_closing():
            self._refuse(408, REQUEST_TIMEOUT, "headers too slow")

    def _refuse(self, status: int, answer: bytes, why: str) -> None:
        """Answers a request whose headers are not acceptable, and closes the connection."""
        transport = self.transport
        assert transport is not None
        if self.answered >= self.begun - 1:  # nothing before it still to be answered
            client = transport.get_extra_info("peername")
            log.warning(
                "request rejected",
                extra={"fields": {"status": status, "error": why, "client": client}},
            )
            transport.write(answer)
        transport.close()


class CloseWhenDue:
    """ASGI app in front of a server's app: counts each connection's requests and adds
    `Connection: close` to the answer that is due to close it (`Guard.due`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = scope.get("state")
        guard = state.get(CONNECTION) if state is not None else None
        if guard is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_closing_when_due(message: Message) -> None:
            if message["type"] == "http.response.start" and guard.due():
                headers = list(message.get("headers", ()))
                if not any(
                    n.lower() == b"connection" and b"close" in v.lower() for n, v in headers
                ):
                    headers.append((b"connection", b"close"))
                message = {**message, "headers": headers}
                guard.closing = True
            await send(message)

        guard.requests += 1
        try:
            await self.app(scope, receive, send_closing_when_due)
        finally:
            guard.app_done()

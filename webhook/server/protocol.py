"""uvicorn's httptools protocol, plus a deadline for request headers.

uvicorn closes idle keep-alive connections, but a client that opens a connection and then sends
nothing, or sends its headers a byte at a time (slowloris), holds the connection and its memory
for ever. Here every request's headers must be complete within `header_timeout` seconds of the
connection opening (after the TLS handshake, which asyncio bounds itself) or of the request's
first byte; otherwise the client gets `408 Request Timeout` and the connection is closed. The
body has its own deadline in the endpoint (`Limits.body_timeout`).
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("webhook.admission")

_BODY = b'{"error":"request headers not received in time"}'
REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_BODY), _BODY)
)


class HeaderDeadlineProtocol(HttpToolsProtocol):
    header_timeout: float = 10.0
    _header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(self.header_timeout, self._expire)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _expire(self) -> None:
        self._header_deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:  # nothing in flight to answer
            log.warning(
                "request rejected",
                extra={
                    "fields": {"status": 408, "error": "headers too slow", "client": self.client}
                },
            )
            self.transport.write(REQUEST_TIMEOUT)
        self.transport.close()


def with_header_timeout(seconds: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class to give uvicorn (`Config(http=...)`) for a given deadline."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout": seconds})

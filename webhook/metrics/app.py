"""The metrics endpoint: `GET /metrics` over TLS, behind TokenReview + SubjectAccessReview.

A raw ASGI app (one path, one method: no framework needed), and the uvicorn server that serves
it on the webhooks' reloading certificate.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

import uvicorn

from ..server.logs import FIELDS
from ..server.protocol import ConnectionLimits
from ..server.servers import server
from ..tls.reload import ReloadingContext
from .auth import AuthResult
from .registry import Metrics

log = logging.getLogger("webhook.metrics")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PATH = "/metrics"


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


async def _send(
    send: Send, status: int, body: bytes, content_type: str, extra: list[tuple[bytes, bytes]]
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _text(
    send: Send, status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    await _send(send, status, f"{message}\n".encode(), "text/plain; charset=utf-8", extra or [])


class Checker(Protocol):
    async def check(self, authorization_header: str | None, path: str, verb: str) -> AuthResult: ...


class MetricsApp:
    """`GET /metrics`; `authorizer` None serves everyone (local use only)."""

    def __init__(self, metrics: Metrics, authorizer: Checker | None) -> None:
        self.metrics = metrics
        self.authorizer = authorizer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] != PATH:
            await _text(send, 404, f"not found: only {PATH} is served here")
            return
        if scope["method"] != "GET":
            await _text(send, 405, "method not allowed: use GET", [(b"allow", b"GET")])
            return
        if self.authorizer is not None:
            header = _header(scope, b"authorization")
            verb = scope["method"].lower()  # the SubjectAccessReview verb, as the reference says
            result = await self.authorizer.check(header, PATH, verb)
            if result.status != 200:
                fields = {"status": result.status, "user": result.username, "error": result.message}
                log.info("metrics request refused", extra={FIELDS: fields})
                extra = [(b"www-authenticate", b"Bearer")] if result.status == 401 else []
                await _text(send, result.status, result.message, extra)
                return
        body, content_type = self.metrics.render(_header(scope, b"accept"))
        await _send(send, 200, body, content_type, [])


def metrics_server(
    app: ASGIApp, host: str, port: int, tls: ReloadingContext, header_timeout: float = 10.0
) -> uvicorn.Server:
    """uvicorn for `app` on `tls`'s certificate, configured as the webhook server is."""
    return server(app, host, port, ConnectionLimits(header_timeout=header_timeout), tls)


class NoCluster:
    """The authorizer when authentication is on but there is no cluster to ask: every scrape
    gets 503, never an allow (turn authentication off for local use instead)."""

    async def check(self, authorization_header: str | None, path: str, verb: str) -> AuthResult:
        return AuthResult(503, "no cluster to check the token with (TokenReview)")

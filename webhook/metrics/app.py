"""The metrics endpoint: `GET /metrics` over TLS, behind TokenReview + SubjectAccessReview.

A raw ASGI app (one path, one method: no framework needed), and the uvicorn server that serves
it on the webhooks' reloading certificate.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

import uvicorn

from ..server.logs import FIELDS
from ..server.protocol import with_header_timeout
from ..tls.reload import ReloadingContext
from .auth import Authorizer
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


class MetricsApp:
    """`GET /metrics`; `authorizer` None serves everyone (local use only)."""

    def __init__(self, metrics: Metrics, authorizer: Authorizer | None) -> None:
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


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the service decides when its servers stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def metrics_server(
    app: ASGIApp, host: str, port: int, tls: ReloadingContext, header_timeout: float = 10.0
) -> uvicorn.Server:
    """uvicorn for `app` on `tls`'s certificate (new connections get a rotated one), configured
    as the webhook server is. Serve it with `await server.serve([listen(host, port)])`; stop it
    with `server.should_exit = True`."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=with_header_timeout(header_timeout),
        ssl_context_factory=lambda config, default: tls.context,
        log_config=None,
        access_log=False,
        lifespan="off",
        proxy_headers=False,
    )
    return _Server(config)

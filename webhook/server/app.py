"""The ASGI apps: admission webhooks (served over TLS) and health probes (plain HTTP).

Each webhook path is a small raw-ASGI endpoint: the body is read once (bounded in size and time),
parsed once with orjson and answered with orjson. An exact-path dispatcher hands reviews straight
to their endpoint and everything else to a FastAPI app (404/405 answers, logged); a review passes
through no FastAPI routing or middleware.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from ..admission.review import (
    BadReview,
    Decision,
    Review,
    encode,
    errored,
    parse,
    shown_warnings,
)
from ..admission.routes import WEBHOOKS, Webhook
from ..kube.cache import Cache
from ..metrics.registry import Metrics
from ..metrics.webhooks import WebhookMeter
from .logs import FIELDS
from .reviewlog import ReviewLog

log = logging.getLogger("webhook.admission")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 6 * 1024 * 1024  # object + oldObject at the 1.5 MiB etcd limit, and more
    body_timeout: float = 10.0  # the API server gives up after timeoutSeconds (at most 30) anyway


# After these the rest of the body is unread (or the client is too slow to wait for): the
# connection cannot carry another request, and keeping it would let a trickling client hold it.
_CLOSING = frozenset({408, 413})


class _BodyError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def _read_body(receive: Receive, scope: Scope, limits: Limits) -> bytes:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise _BodyError(400, "Content-Length is not a number") from None
            if declared > limits.max_body_bytes:
                raise _BodyError(413, f"body over {limits.max_body_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(limits.body_timeout):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _BodyError(400, "client disconnected")
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limits.max_body_bytes:
                    raise _BodyError(413, f"body over {limits.max_body_bytes} bytes")
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    except TimeoutError:
        raise _BodyError(408, f"body not received within {limits.body_timeout:g}s") from None


_JSON = (b"content-type", b"application/json")
_CLOSE = (b"connection", b"close")


async def _send(send: Send, status: int, body: bytes) -> None:
    headers = [_JSON, (b"content-length", b"%d" % len(body))]
    if status in _CLOSING:
        headers.append(_CLOSE)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@dataclass
class AdmissionEndpoint:
    """One webhook path as a raw ASGI app."""

    webhook: Webhook
    cache: Cache
    limits: Limits = field(default_factory=Limits)
    review_log: ReviewLog = field(default_factory=ReviewLog)
    metrics: Metrics | None = None
    meter: WebhookMeter | None = field(init=False, default=None)
    _log_head: bytes = field(init=False, default=b"")

    def __post_init__(self) -> None:
        if self.metrics is not None:
            self.meter = WebhookMeter(self.metrics, self.webhook.path)
        self._log_head = ReviewLog.head(webhook=self.webhook.name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        meter = self.meter
        if meter is None:
            await self._answer(scope, receive, send, time.perf_counter())
            return
        start = time.perf_counter()
        meter.in_flight += 1
        status = 500  # if the answer fails on the way out
        try:
            status = await self._answer(scope, receive, send, start)
        finally:
            meter.in_flight -= 1
            meter.answered(status, time.perf_counter() - start)

    async def _answer(self, scope: Scope, receive: Receive, send: Send, start: float) -> int:
        """Reads, judges and answers one review; returns the HTTP status sent."""
        try:
            body = await _read_body(receive, scope, self.limits)
        except _BodyError as err:
            self._log_rejected(err.status, str(err), start)
            await _send(send, err.status, orjson.dumps({"error": str(err)}))
            return err.status
        review: Review | None = None
        try:
            review = parse(body)
            judged = self.webhook.judge(review) or self.webhook.handler(review, self.cache)
            # A handler answers from the cache; only the pod webhook's rare live read awaits.
            decision = await judged if inspect.isawaitable(judged) else judged
            uid = review.uid
        except BadReview as err:
            if err.uid is None:  # nothing to answer a review with: a plain 400
                self._log_rejected(400, str(err), start)
                await _send(send, 400, orjson.dumps({"error": str(err)}))
                return 400
            decision, uid = errored(400, str(err)), err.uid
        except Exception:  # a bug of ours must not become a traceback to the API server
            uid = review.uid if review is not None else ""
            log.exception("handler failed", extra={FIELDS: {"uid": uid}})
            if review is None:
                await _send(send, 500, orjson.dumps({"error": "internal error"}))
                return 500
            decision = errored(500, f"internal error in {self.webhook.path}; see the service log")
        out, patch_bytes = encode(uid, decision)
        # Logged before the answer goes out, so no answered review is missing from the log.
        self._log_review(review, uid, decision, patch_bytes, start)
        if self.meter is not None:
            self.meter.decided(review.operation if review is not None else "", decision)
        await _send(send, 200, out)
        return 200

    def _log_review(
        self, review: Review | None, uid: str, decision: Decision, patch_bytes: int, start: float
    ) -> None:
        if not self.review_log.enabled:
            return
        fields: dict[str, Any] = {
            "uid": uid,
            "decision": "allowed" if decision.allowed else "denied",
            "patch_ops": len(decision.patch) if decision.patch else 0,
            "patch_bytes": patch_bytes,
            "duration_ms": round((time.perf_counter() - start) * 1000, 3),
        }
        if review is not None:
            fields["kind"] = review.kind
            fields["namespace"] = review.namespace
            fields["name"] = review.object_name
            fields["operation"] = review.operation
            fields["user"] = review.username
            fields["dry_run"] = review.dry_run
        if decision.warnings:
            fields["warnings"] = shown_warnings(decision.warnings)
        if decision.note:
            fields["note"] = decision.note
        if not decision.allowed:
            fields["code"] = decision.code
            fields["message"] = decision.message
        self.review_log.write(self._log_head, fields)

    def _log_rejected(self, status: int, message: str, start: float) -> None:
        fields = {
            "webhook": self.webhook.name,
            "status": status,
            "error": message,
            "duration_ms": round((time.perf_counter() - start) * 1000, 3),
        }
        log.warning("request rejected", extra={FIELDS: fields})


class AdmissionApp:
    """The webhook port's ASGI app: POSTs to a webhook path go straight to its endpoint."""

    def __init__(self, endpoints: dict[str, AdmissionEndpoint], fallback: FastAPI) -> None:
        self.endpoints = endpoints
        self.fallback = fallback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.endpoints.get(scope["path"])
            if endpoint is not None:
                await endpoint(scope, receive, send)
                return
        await self.fallback(scope, receive, send)


def admission_app(
    cache: Cache,
    limits: Limits | None = None,
    review_log: ReviewLog | None = None,
    metrics: Metrics | None = None,
) -> AdmissionApp:
    """The webhook port's app; with `metrics`, each webhook path counts its requests, answers
    and decisions (the other paths, whatever a client sends, are not counted)."""
    limits, review_log = limits or Limits(), review_log or ReviewLog()
    endpoints = {w.path: AdmissionEndpoint(w, cache, limits, review_log, metrics) for w in WEBHOOKS}
    # No slash redirects: the API server would not follow one, so a wrong path is a plain 404.
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False)
    for path, endpoint in endpoints.items():  # reached only by other methods: they get 405
        app.router.routes.append(Route(path, endpoint, methods=["POST"]))

    @app.exception_handler(StarletteHTTPException)
    async def not_a_webhook(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # A wrong path or method usually means a misconfigured webhook configuration: say so.
        fields = {"path": request.url.path, "method": request.method, "status": exc.status_code}
        log.warning("request rejected", extra={FIELDS: fields})
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    return AdmissionApp(endpoints, app)


# --- probes ------------------------------------------------------------------------------------


@dataclass
class Readiness:
    """What must hold before the service takes reviews: name -> check."""

    checks: dict[str, Callable[[], bool]] = field(default_factory=dict)

    def failing(self) -> list[str]:
        return [name for name, check in self.checks.items() if not check()]


def health_app(readiness: Readiness) -> FastAPI:
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        failing = readiness.failing()
        if failing:
            return JSONResponse({"status": "not ready", "failing": failing}, status_code=503)
        return JSONResponse({"status": "ok"})

    return app

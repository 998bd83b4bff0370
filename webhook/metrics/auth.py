"""Who may read /metrics, decided the Kubernetes way (as controller-runtime's metrics filter
and kube-rbac-proxy do): the bearer token goes to a TokenReview, the user it names to a
SubjectAccessReview for the non-resource URL.

Answers: no or malformed token, or a token the API server does not authenticate (or not for our
audiences): 401. Authenticated but not allowed: 403, naming the user. The API server failing or
not answering within `timeout`: 503, and never an allow. Review answers are cached (tokens by
their SHA-256, never the token itself; access by the user's whole identity plus path and verb),
and concurrent identical reviews share one request. Tokens are never logged.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes.aio.client import (
    ApiClient,
    AuthenticationV1Api,
    AuthorizationV1Api,
    V1NonResourceAttributes,
    V1SubjectAccessReview,
    V1SubjectAccessReviewSpec,
    V1TokenReview,
    V1TokenReviewSpec,
)
from kubernetes.aio.client.exceptions import ApiException

from ..server.logs import FIELDS
from .ttlcache import TTLCache

log = logging.getLogger("webhook.metrics")


@dataclass(frozen=True)
class AuthSettings:
    audiences: tuple[str, ...] = ()  # empty: the API server's own audience
    token_ttl: float = 60.0  # an authenticated token's review
    allow_ttl: float = 300.0
    deny_ttl: float = 30.0  # a denial, and a token the API server did not authenticate
    max_entries: int = 4096  # per cache
    timeout: float = 5.0  # per review request


@dataclass(frozen=True)
class AuthResult:
    status: int  # 200, 401, 403 or 503
    message: str
    username: str = ""


@dataclass(frozen=True)
class User:
    username: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]


@dataclass(frozen=True)
class _TokenVerdict:
    user: User | None  # None: not authenticated


@dataclass(frozen=True)
class _AccessVerdict:
    allowed: bool
    reason: str


class ReviewError(Exception):
    """A review request failed; the message is safe to log and to answer with."""


def bearer_token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or any(c.isspace() for c in token):
        return None
    return token


def _user(info: Any) -> User:
    extra = info.extra or {}
    return User(
        username=info.username or "",
        uid=info.uid or "",
        groups=tuple(sorted(info.groups or ())),
        extra=tuple(sorted((key, tuple(values or ())) for key, values in extra.items())),
    )


class Authorizer:
    def __init__(
        self,
        api: ApiClient,
        settings: AuthSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = s = settings or AuthSettings()
        self._authn = AuthenticationV1Api(api)
        self._authz = AuthorizationV1Api(api)
        self._tokens: TTLCache[bytes, _TokenVerdict] = TTLCache(s.max_entries, clock)
        self._access: TTLCache[tuple[Any, ...], _AccessVerdict] = TTLCache(s.max_entries, clock)

    async def check(self, authorization_header: str | None, path: str, verb: str) -> AuthResult:
        token = bearer_token(authorization_header)
        if token is None:
            return AuthResult(401, "a bearer token is required")
        digest = hashlib.sha256(token.encode()).digest()
        try:
            verdict = await self._tokens.get_or_load(digest, lambda: self._review_token(token))
        except ReviewError as err:
            return AuthResult(503, f"cannot verify the token now: {err}")
        if verdict.user is None:
            return AuthResult(401, "the bearer token is not valid")
        user = verdict.user
        key = (user.username, user.uid, user.groups, user.extra, path, verb)
        try:
            access = await self._access.get_or_load(
                key, lambda: self._review_access(user, path, verb)
            )
        except ReviewError as err:
            return AuthResult(503, f"cannot check access now: {err}", user.username)
        if not access.allowed:
            why = f": {access.reason}" if access.reason else ""
            message = f'user "{user.username}" is not allowed to {verb} {path}{why}'
            return AuthResult(403, message, user.username)
        return AuthResult(200, "allowed", user.username)

    async def _review_token(self, token: str) -> tuple[_TokenVerdict, float]:
        s = self.settings
        body = V1TokenReview(
            api_version="authentication.k8s.io/v1",
            kind="TokenReview",
            spec=V1TokenReviewSpec(token=token, audiences=list(s.audiences) or None),
        )
        call = self._authn.create_token_review(body, _request_timeout=float(s.timeout))
        status = (await self._call("TokenReview", call)).status
        if status is None or status.error or not status.authenticated or status.user is None:
            return _TokenVerdict(None), s.deny_ttl
        # As the API server's webhook authenticator: the token must be meant for one of ours.
        if s.audiences and not set(status.audiences or ()) & set(s.audiences):
            return _TokenVerdict(None), s.deny_ttl
        return _TokenVerdict(_user(status.user)), s.token_ttl

    async def _review_access(
        self, user: User, path: str, verb: str
    ) -> tuple[_AccessVerdict, float]:
        spec = V1SubjectAccessReviewSpec(
            user=user.username,
            uid=user.uid or None,
            groups=list(user.groups),
            extra={key: list(values) for key, values in user.extra},
            non_resource_attributes=V1NonResourceAttributes(path=path, verb=verb),
        )
        body = V1SubjectAccessReview(
            api_version="authorization.k8s.io/v1", kind="SubjectAccessReview", spec=spec
        )
        timeout = float(self.settings.timeout)
        call = self._authz.create_subject_access_review(body, _request_timeout=timeout)
        status = (await self._call("SubjectAccessReview", call, user=user.username)).status
        if status is not None and status.allowed and not status.denied:
            return _AccessVerdict(True, ""), self.settings.allow_ttl
        reason = (status.reason or status.evaluation_error or "") if status is not None else ""
        return _AccessVerdict(False, reason), self.settings.deny_ttl

    async def _call(self, kind: str, call: Awaitable[Any], user: str = "") -> Any:
        """The review's answer within the timeout, else a ReviewError (logged). A TokenReview
        and its answer carry the token, so the text of errors that may quote them (an API
        error's body, a malformed answer) is left out."""
        try:
            async with asyncio.timeout(self.settings.timeout):
                return await call
        except TimeoutError:
            error = f"no answer within {self.settings.timeout:g}s"
        except ApiException as err:
            error = f"API server answered {err.status} {err.reason}"
        except (aiohttp.ClientConnectionError, OSError) as err:  # says host and port, no more
            error = f"{type(err).__name__}: {err}"
        except Exception as err:  # e.g. an answer that does not parse
            error = type(err).__name__
        fields = {"review": kind, "error": error, **({"user": user} if user else {})}
        log.warning("review failed", extra={FIELDS: fields})
        raise ReviewError(f"{kind} failed: {error}")

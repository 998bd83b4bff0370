"""List, then watch, one resource into a `Store`, for as long as the service runs.

The watch resumes from the last resourceVersion it saw; `410 Gone` (that version is too old)
means list again; any other failure (dropped connection, 5xx, timeout) waits with exponential
backoff and resumes. Only this module and `client.py` talk to the API server for the cache.

"Too large resource version" (the API server's watch cache has not reached the version asked
for, routine for a few seconds after it restarts) is retried the same way, but logged at debug
until it persists (TRANSIENT_RETRIES failures in a row, or TRANSIENT_SECONDS).

With `page_size` the list comes in pages (`limit` and `continue`, as client-go's reflector
lists), each item trimmed by the store as it arrives, so listing 10,000 Nodes never holds
them all whole.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from kubernetes.aio.client import ApiClient
from kubernetes.aio.client.exceptions import ApiException

from . import rest
from .store import Sink

log = logging.getLogger("webhook.informer")

Sleep = Callable[[float], Awaitable[None]]
MIN_WATCH_SECONDS = 1.0
TRANSIENT_RETRIES = 5  # "Too large resource version" in a row before it is a warning
TRANSIENT_SECONDS = 10.0  # or this long since the first of them
YIELD_EVERY = 64  # watch events handled between two turns of the event loop
NOT_SERVED = " (the resource is not served: is the Kubeflow Trainer CRD installed?)"


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}/{self.version}" if self.group else self.plural


@dataclass
class Backoff:
    """Exponential backoff with full jitter, so replicas do not retry in step."""

    initial: float = 0.5
    maximum: float = 30.0
    attempt: int = 0

    def next_delay(self) -> float:
        ceiling = min(self.maximum, self.initial * 2**self.attempt)
        self.attempt += 1
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempt = 0


class Informer:
    def __init__(
        self,
        api: ApiClient,
        resource: Resource,
        store: Sink,
        *,
        namespace: str | None = None,
        watch_timeout: int = 300,
        backoff: Backoff | None = None,
        not_served_hint: str = NOT_SERVED,
        forbidden_hint: str = "",
        page_size: int | None = None,
        label_selector: str | None = None,
        on_restart: Callable[[], None] | None = None,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.resource = resource
        self.store = store
        self.namespace = namespace  # None: all namespaces
        self.not_served_hint = not_served_hint
        self.forbidden_hint = forbidden_hint
        """Said with a 403; the same failure again is then logged at debug only."""
        self.page_size = page_size
        self.selector = [("labelSelector", label_selector)] if label_selector else []
        self._last_error = ""
        self.watch_timeout = watch_timeout
        self.backoff = backoff or Backoff()
        self.sleep = sleep
        self.clock = clock
        self.resource_version: str | None = None
        self.restarts = 0  # lists and watches that ended in an error
        self.on_restart = on_restart
        # "Too large resource version" failures in a row, and when the first of them happened.
        self._lagging = 0
        self._lagging_since = 0.0

    async def run(self) -> None:
        while True:
            step = "list"
            try:
                if self.resource_version is None:
                    await self._list()
                step = "watch"
                started = self.clock()
                events = await self._watch()
                self._lagging = 0  # a watch that ended well: the server had caught up
                if events == 0 and self.clock() - started < MIN_WATCH_SECONDS:
                    # Like client-go: a watch that ends at once with nothing is a failure, or a
                    # misbehaving server (or proxy) would have us re-watch in a hot loop.
                    await self._retry("watch", "ended at once without events")
            except ApiException as err:
                if err.status == 410:
                    log.info("watch expired, listing again", extra=self._fields())
                    self.resource_version = None
                    continue
                hint = self.not_served_hint if err.status == 404 and step == "list" else ""
                hint = self.forbidden_hint if err.status == 403 else hint
                transient = too_large_resource_version(err)
                await self._retry(step, f"HTTP {err.status}: {err.reason}{hint}", transient)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # connection drops, timeouts, garbage on the stream
                await self._retry(step, f"{type(err).__name__}: {err}")

    def _path(self) -> str:
        r = self.resource
        return rest.collection(r.group, r.version, r.plural, self.namespace)

    async def _list(self) -> None:
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            query: list[tuple[str, Any]] = [*self.selector]
            if self.page_size:
                query.append(("limit", self.page_size))
            if token:
                query.append(("continue", token))
            listing = await rest.get_json(self.api, self._path(), query, timeout=60)
            items += [self.store.trim(item) for item in rest.items_of(listing)]
            meta = listing.get("metadata")
            token = meta.get("continue") if isinstance(meta, dict) and self.page_size else None
            if not token:
                break
        self.store.replace(items, self.namespace)
        self.resource_version = _resource_version(listing) or ""
        self.backoff.reset()
        self._last_error = ""
        self._lagging = 0
        log.info("listed", extra=self._fields(objects=len(self.store)))

    async def _watch(self) -> int:
        """One watch request, read line by line until the server ends it.

        The stream is read here rather than through `kubernetes.aio.watch.Watch`, which takes an
        HTTP error with an empty body (a proxy's 503) for a clean end and would retry at once,
        forever; here any status but 200 is an ApiException, and so is an ERROR event. Returns
        how many events arrived.
        """
        query: list[tuple[str, Any]] = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", self.watch_timeout),
            *self.selector,
        ]
        if self.resource_version:
            query.append(("resourceVersion", self.resource_version))
        # The request's own timeout outlasts the watch's, or long watches would be cut short.
        response: Any = await rest.request(
            self.api, "GET", self._path(), query=query, timeout=self.watch_timeout + 30
        )
        events = 0
        try:
            if response.status != 200:
                body = (await response.read())[:500].decode(errors="replace")
                raise ApiException(status=response.status, reason=response.reason, body=body)
            self._last_error = ""
            async for line in response.content:
                if line.strip():
                    self._apply(_event(line))
                    self.backoff.reset()
                    events += 1
                    if events % YIELD_EVERY == 0:  # a burst's buffered lines: let others run
                        await asyncio.sleep(0)
        finally:
            response.release()
        return events

    def _apply(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object")
        if not isinstance(obj, dict):
            return
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self.store.apply(kind, obj)
        rv = _resource_version(obj)
        if rv:
            self.resource_version = rv

    async def _retry(self, step: str, error: str, transient: bool = False) -> None:
        self.restarts += 1
        if self.on_restart:
            self.on_restart()
        delay = self.backoff.next_delay()
        # With a hint for 403 (a resource the service can do without), one warning says so;
        # the same failure again, retried, is only debug.
        quiet = bool(self.forbidden_hint) and error == self._last_error
        self._last_error = error
        more: dict[str, Any] = {}
        if transient:  # routine for a moment after an API server restart: warn if it persists
            now = self.clock()
            self._lagging_since = now if self._lagging == 0 else self._lagging_since
            self._lagging += 1
            lasted = now - self._lagging_since
            quiet = self._lagging < TRANSIENT_RETRIES and lasted < TRANSIENT_SECONDS
            more = {"failures_in_a_row": self._lagging, "for_seconds": round(lasted, 1)}
        else:
            self._lagging = 0
        log.log(
            logging.DEBUG if quiet else logging.WARNING,
            f"{step} failed, retrying",
            extra=self._fields(error=error, retry_in=round(delay, 2), **more),
        )
        await self.sleep(delay)

    def _fields(self, **more: Any) -> dict[str, Any]:
        scope = {"namespace": self.namespace} if self.namespace else {}
        return {"fields": {"resource": str(self.resource), **scope, **more}}


def _event(line: bytes) -> dict[str, Any]:
    event = orjson.loads(line)
    if not isinstance(event, dict):
        raise ValueError("a watch event is not a JSON object")
    if event.get("type") == "ERROR":  # e.g. 410 Gone: the resourceVersion is too old
        status = event.get("object")
        status = status if isinstance(status, dict) else {}
        body = orjson.dumps(status).decode()  # the Status, for its details
        raise ApiException(status=status.get("code"), reason=status.get("message"), body=body)
    return event


def too_large_resource_version(err: ApiException) -> bool:
    """Whether the API server's cache has not reached the resourceVersion asked for yet: its
    Status (a 504 Timeout; a real API server was also seen to send it as a 500) has the cause
    ResourceVersionTooLarge, or, before Kubernetes 1.18.6, only says so in its message. As
    client-go's reflector tells it."""
    try:
        status = orjson.loads(err.body) if isinstance(err.body, str | bytes) and err.body else {}
    except orjson.JSONDecodeError:
        status = {}
    status = status if isinstance(status, dict) else {}
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    if any(
        isinstance(c, dict) and c.get("reason") == "ResourceVersionTooLarge"
        for c in (causes if isinstance(causes, list) else [])[:16]
    ):
        return True
    message = status.get("message") or err.reason
    return isinstance(message, str) and "Too large resource version" in message


def _resource_version(obj: dict[str, Any]) -> str | None:
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return rv if isinstance(rv, str) else None

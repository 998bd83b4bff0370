"""List, then watch, one resource into a `Store`, for as long as the service runs.

The watch resumes from the last resourceVersion it saw; `410 Gone` (that version is too old)
means list again; any other failure (dropped connection, 5xx, timeout) waits with exponential
backoff and resumes. Only this module and `client.py` talk to the API server for the cache.
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
from kubernetes.aio.client import ApiClient, CustomObjectsApi
from kubernetes.aio.client.exceptions import ApiException

from .cache import Store

log = logging.getLogger("webhook.informer")

Sleep = Callable[[float], Awaitable[None]]
MIN_WATCH_SECONDS = 1.0
NOT_SERVED = " (the resource is not served: is the Kubeflow Trainer CRD installed?)"


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}/{self.version}"


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
        store: Store,
        *,
        namespace: str | None = None,
        watch_timeout: int = 300,
        backoff: Backoff | None = None,
        not_served_hint: str = NOT_SERVED,
        on_restart: Callable[[], None] | None = None,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = CustomObjectsApi(api)
        self.resource = resource
        self.store = store
        self.namespace = namespace  # None: all namespaces
        self.not_served_hint = not_served_hint
        self.watch_timeout = watch_timeout
        self.backoff = backoff or Backoff()
        self.sleep = sleep
        self.clock = clock
        self.resource_version: str | None = None
        self.restarts = 0  # lists and watches that ended in an error
        self.on_restart = on_restart

    async def run(self) -> None:
        while True:
            step = "list"
            try:
                if self.resource_version is None:
                    await self._list()
                step = "watch"
                started = self.clock()
                events = await self._watch()
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
                await self._retry(step, f"HTTP {err.status}: {err.reason}{hint}")
            except asyncio.CancelledError:
                raise
            except Exception as err:  # connection drops, timeouts, garbage on the stream
                await self._retry(step, f"{type(err).__name__}: {err}")

    async def _list(self) -> None:
        r = self.resource
        if self.namespace:
            listing: Any = await self.api.list_namespaced_custom_object(
                r.group, r.version, self.namespace, r.plural
            )
        else:
            listing = await self.api.list_cluster_custom_object(r.group, r.version, r.plural)
        if not isinstance(listing, dict):
            raise ValueError("the list is not a JSON object")
        items = listing.get("items") or []
        self.store.replace([item for item in items if isinstance(item, dict)], self.namespace)
        self.resource_version = _resource_version(listing) or ""
        self.backoff.reset()
        log.info("listed", extra=self._fields(objects=len(self.store)))

    async def _watch(self) -> int:
        """One watch request, read line by line until the server ends it.

        The stream is read here rather than through `kubernetes.aio.watch.Watch`, which takes an
        HTTP error with an empty body (a proxy's 503) for a clean end and would retry at once,
        forever; here any status but 200 is an ApiException, and so is an ERROR event. Returns
        how many events arrived.
        """
        r = self.resource
        scope: tuple[str, ...] = (self.namespace,) if self.namespace else ()
        call: Any = (
            self.api.list_namespaced_custom_object_without_preload_content
            if self.namespace
            else self.api.list_cluster_custom_object_without_preload_content
        )
        response: Any = await call(
            r.group,
            r.version,
            *scope,
            r.plural,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=self.resource_version or None,
            timeout_seconds=self.watch_timeout,
            # The client's default request timeout (300 s) would cut long watches short.
            _request_timeout=self.watch_timeout + 30,
        )
        events = 0
        try:
            if response.status != 200:
                body = (await response.read())[:500].decode(errors="replace")
                raise ApiException(status=response.status, reason=response.reason, body=body)
            async for line in response.content:
                if line.strip():
                    self._apply(_event(line))
                    self.backoff.reset()
                    events += 1
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

    async def _retry(self, step: str, error: str) -> None:
        self.restarts += 1
        if self.on_restart:
            self.on_restart()
        delay = self.backoff.next_delay()
        log.warning(
            f"{step} failed, retrying", extra=self._fields(error=error, retry_in=round(delay, 2))
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
        raise ApiException(status=status.get("code"), reason=status.get("message"))
    return event


def _resource_version(obj: dict[str, Any]) -> str | None:
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return rv if isinstance(rv, str) else None

"""List, then watch, one resource into a `Store`, for as long as the service runs.

The watch resumes from the last resourceVersion it saw; `410 Gone` (that version is too old)
means list again; any other failure (dropped connection, 5xx, timeout) waits with exponential
backoff and resumes. Only this module and `client.py` talk to the API server for the cache.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kubernetes.aio import watch
from kubernetes.aio.client import ApiClient, CustomObjectsApi
from kubernetes.aio.client.exceptions import ApiException

from .cache import Store

log = logging.getLogger("webhook.informer")

Sleep = Callable[[float], Awaitable[None]]


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
        watch_timeout: int = 300,
        backoff: Backoff | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.api = CustomObjectsApi(api)
        self.resource = resource
        self.store = store
        self.watch_timeout = watch_timeout
        self.backoff = backoff or Backoff()
        self.sleep = sleep
        self.resource_version: str | None = None
        self.restarts = 0  # watches that ended in an error (a metric in the metrics issue)

    async def run(self) -> None:
        while True:
            try:
                if self.resource_version is None:
                    await self._list()
                await self._watch()
            except ApiException as err:
                if err.status == 410:
                    log.info("watch expired, listing again", extra=self._fields())
                    self.resource_version = None
                    continue
                await self._retry(f"HTTP {err.status}: {err.reason}")
            except asyncio.CancelledError:
                raise
            except Exception as err:  # connection drops, timeouts, garbage on the stream
                await self._retry(f"{type(err).__name__}: {err}")

    async def _list(self) -> None:
        r = self.resource
        listing: Any = await self.api.list_cluster_custom_object(r.group, r.version, r.plural)
        if not isinstance(listing, dict):
            raise ValueError("the list is not a JSON object")
        items = listing.get("items") or []
        self.store.replace([item for item in items if isinstance(item, dict)])
        self.resource_version = _resource_version(listing) or ""
        self.backoff.reset()
        log.info("listed", extra=self._fields(objects=len(self.store)))

    async def _watch(self) -> None:
        r = self.resource
        new_watch: Any = watch.Watch  # untyped in the client
        stream = new_watch()
        async with stream:
            async for event in stream.stream(
                self.api.list_cluster_custom_object,
                r.group,
                r.version,
                r.plural,
                resource_version=self.resource_version or None,
                timeout_seconds=self.watch_timeout,
                allow_watch_bookmarks=True,
            ):
                self._apply(event)
                self.backoff.reset()

    def _apply(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("raw_object")
        if not isinstance(obj, dict):
            return
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self.store.apply(kind, obj)
        rv = _resource_version(obj)
        if rv:
            self.resource_version = rv

    async def _retry(self, error: str) -> None:
        self.restarts += 1
        delay = self.backoff.next_delay()
        log.warning(
            "watch failed, retrying", extra=self._fields(error=error, retry_in=round(delay, 2))
        )
        await self.sleep(delay)

    def _fields(self, **more: Any) -> dict[str, Any]:
        return {"fields": {"resource": str(self.resource), **more}}


def _resource_version(obj: dict[str, Any]) -> str | None:
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return rv if isinstance(rv, str) else None

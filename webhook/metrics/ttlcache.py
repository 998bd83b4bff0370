"""A bounded cache with a time to live per entry, whose misses share one load (singleflight).

Scrapers ask the same question every few seconds; the answer (a TokenReview, a
SubjectAccessReview) is cached for a while, and concurrent misses for one key wait for a single
review instead of sending one each.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """At most `max_entries` entries; the least recently used goes first when full."""

    def __init__(self, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.clock = clock
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._inflight: dict[K, asyncio.Future[V]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        found = self._entries.get(key)
        if found is None:
            return None
        expires, value = found
        if self.clock() >= expires:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V, ttl: float) -> None:
        if ttl <= 0 or self.max_entries <= 0:
            return
        self._entries[key] = (self.clock() + ttl, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    async def get_or_load(self, key: K, load: Callable[[], Awaitable[tuple[V, float]]]) -> V:
        """The cached value, else `load()`'s (value, ttl), cached for ttl seconds. Concurrent
        callers of one key share one `load()`; its exceptions reach them all and are not cached.
        A caller that gives up (cancelled) does not cancel the load the others wait for."""
        cached = self.get(key)
        if cached is not None:
            return cached
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.ensure_future(self._load(key, load))
            self._inflight[key] = task
            task.add_done_callback(lambda done: self._forget(key, done))
        return await asyncio.shield(task)

    async def _load(self, key: K, load: Callable[[], Awaitable[tuple[V, float]]]) -> V:
        value, ttl = await load()
        self.put(key, value, ttl)
        return value

    def _forget(self, key: K, done: asyncio.Future[V]) -> None:
        if self._inflight.get(key) is done:
            del self._inflight[key]

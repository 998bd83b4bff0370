"""A keyed work queue with client-go's contract, for asyncio.

* A key waiting in the queue is there once, however often it is added (de-duplicated).
* A key being worked on is never handed to a second worker; added meanwhile, it is queued again
  when the first worker calls `done`, so the latest change is always seen.
* `add_rate_limited` brings a key back after a per-key exponential delay (a key that keeps
  failing backs off alone); `forget` resets it after a success.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge, Histogram

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class QueueMetrics:
    """The workqueue_* families of one queue (label children bound once)."""

    depth: Gauge
    adds: Counter
    queue_duration: Histogram
    work_duration: Histogram
    unfinished_work: Gauge
    longest_running: Gauge
    retries: Counter


class ShutDown(Exception):
    """The queue is shut down: the worker should stop."""


class WorkQueue(Generic[K]):
    def __init__(
        self,
        *,
        base_delay: float = 0.005,
        max_delay: float = 300.0,
        metrics: QueueMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.metrics = metrics
        self.clock = clock
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: dict[K, float] = {}  # key -> when its worker took it
        self._added_at: dict[K, float] = {}
        self._failures: dict[K, int] = {}
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._wakeup = asyncio.Event()
        self._shut = False

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, key: K) -> None:
        if self._shut or key in self._dirty:
            return
        self._dirty.add(key)
        if self.metrics:
            self.metrics.adds.inc()
        if key in self._processing:
            return  # queued again by `done`
        self._added_at[key] = self.clock()
        self._queue.append(key)
        self._changed()

    def add_after(self, key: K, delay: float) -> None:
        """Adds `key` after `delay` seconds; an earlier pending add of the same key wins."""
        if self._shut:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        pending = self._timers.get(key)
        if pending is not None and pending.when() <= loop.time() + delay:
            return
        if pending is not None:
            pending.cancel()
        self._timers[key] = loop.call_later(delay, self._fire, key)

    def add_rate_limited(self, key: K) -> float:
        """Adds `key` again after its own backoff (base * 2^failures, capped); returns the delay."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = min(self.max_delay, self.base_delay * 2.0**failures)
        if self.metrics:
            self.metrics.retries.inc()
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    async def get(self) -> K:
        """The next key; raises ShutDown once the queue is shut down."""
        while not self._queue and not self._shut:
            self._wakeup.clear()
            await self._wakeup.wait()
        if self._shut:
            raise ShutDown
        key = self._queue.popleft()
        self._dirty.discard(key)
        now = self.clock()
        self._processing[key] = now
        added = self._added_at.pop(key, now)
        if self.metrics:
            self.metrics.queue_duration.observe(now - added)
            self._update_gauges()
        return key

    def done(self, key: K) -> None:
        started = self._processing.pop(key, None)
        if self.metrics and started is not None:
            self.metrics.work_duration.observe(self.clock() - started)
        if key in self._dirty and not self._shut:  # changed while being worked on
            self._added_at[key] = self.clock()
            self._queue.append(key)
            self._changed()
        elif self.metrics:
            self._update_gauges()

    def shut_down(self) -> None:
        self._shut = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._queue.clear()
        self._dirty.clear()
        self._changed()

    def update_gauges(self) -> None:
        """Refreshes the unfinished-work gauges (call periodically, as client-go does)."""
        if self.metrics:
            self._update_gauges()

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def _changed(self) -> None:
        if self.metrics:
            self._update_gauges()
        self._wakeup.set()  # every waiting worker looks; those that find nothing wait again

    def _update_gauges(self) -> None:
        assert self.metrics is not None
        self.metrics.depth.set(len(self._queue))
        now = self.clock()
        running = [now - started for started in self._processing.values()]
        self.metrics.unfinished_work.set(sum(running))
        self.metrics.longest_running.set(max(running, default=0.0))

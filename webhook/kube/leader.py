"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

Every replica runs a `LeaderElector`; only the one holding the Lease runs `lead()` (the
reconciler). A candidate reads the Lease every retry period (with jitter): it takes a missing one
by creating it, and a free, expired or already its own one by a PUT carrying the resourceVersion
it read, so of two replicas racing for it one wins and the other gets 409 Conflict.

A Lease held by another replica is expired once its record has not changed for its
leaseDurationSeconds, timed on this replica's monotonic clock from when it saw the record change
(client-go's observedTime): the holder's renewTime is never compared with our wall clock, so
clock skew between nodes does not matter.

The leader renews every retry period. It stops leading, cancelling `lead()` and waiting for it to
end, as soon as a renewal finds another holder, or once no renewal has succeeded for
renew_deadline: shorter than lease_duration, so it has stopped before another replica may take
over. Every request has a timeout, so a hung API server cannot keep it leading. When `run()` is
cancelled (shutdown) it releases the Lease (holder cleared, as client-go's ReleaseOnCancel), so
another replica takes over at once rather than after lease_duration.
"""

from __future__ import annotations

import asyncio
import datetime
import enum
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kubernetes.aio.client import (
    ApiClient,
    CoordinationV1Api,
    V1Lease,
    V1LeaseSpec,
    V1ObjectMeta,
)
from kubernetes.aio.client.exceptions import ApiException

from .microtime import MicroTime

log = logging.getLogger("webhook.leader")

JITTER = 1.2  # client-go's JitterFactor: a candidate retries after 1 to 2.2 retry periods


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not (self.namespace and self.name and self.identity):
            raise ValueError(
                "leader election needs the Lease's namespace and name, and an identity"
            )
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs 0 < retry_period < renew_deadline < lease_duration, got "
                f"{self.retry_period}, {self.renew_deadline} and {self.lease_duration}"
            )


@dataclass(frozen=True)
class _Record:
    """What a Lease says of its holder; any change is a sign of the holder's life."""

    holder: str
    duration: int | None
    acquired: datetime.datetime | None
    renewed: datetime.datetime | None
    transitions: int

    @classmethod
    def of(cls, lease: V1Lease) -> _Record:
        spec = lease.spec or V1LeaseSpec()
        return cls(
            holder=spec.holder_identity or "",
            duration=spec.lease_duration_seconds,
            acquired=spec.acquire_time,
            renewed=spec.renew_time,
            transitions=spec.lease_transitions or 0,
        )


class _Outcome(enum.Enum):
    HELD = "we hold the lease"
    TAKEN = "another replica holds the lease"
    FAILED = "no answer, an error or a lost race"


class LeaderElector:
    """Runs `lead()` only while this replica holds the Lease (see the module's docstring)."""

    def __init__(
        self,
        api: ApiClient,
        settings: LeaseSettings,
        *,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.leases = CoordinationV1Api(api)
        self.settings = settings
        self.on_change = on_change
        self.clock = clock
        self.sleep = sleep
        self._leader = False
        self._lease: V1Lease | None = None  # as last read or written: our resourceVersion
        self._observed: _Record | None = None
        self._observed_at = 0.0  # our clock when the record last changed
        self._succeeded_at = 0.0  # our clock when the last attempt that got the lease began
        self._last_error = ""  # a failure is logged when it starts, not every retry period

    @property
    def is_leader(self) -> bool:
        return self._leader

    async def run(self, lead: Callable[[], Awaitable[None]]) -> None:
        """Forever: try to acquire every retry_period (with jitter); once leading, run lead() as a
        task and renew every retry_period; if no renewal has succeeded within renew_deadline, or
        a renewal finds another holder, cancel lead() at once and wait for it to end, then go
        back to acquiring. lead() must end when cancelled. If it ends by itself (returns or
        fails), the lease is released so that another replica can lead, and this one competes
        again after a retry period.
        When run() itself is cancelled (shutdown): cancel lead(), then release the lease
        best-effort (holderIdentity cleared, leaseDurationSeconds 1) so another replica takes
        over at once."""
        try:
            while True:
                await self._acquire()
                await self._lead(lead)
                await self.sleep(self._jittered())  # a lead() that keeps failing must not spin
        except asyncio.CancelledError:
            await self._release()
            raise

    async def _acquire(self) -> None:
        while await self._try(self.settings.renew_deadline) is not _Outcome.HELD:
            await self.sleep(self._jittered())

    async def _lead(self, lead: Callable[[], Awaitable[None]]) -> None:
        task = asyncio.ensure_future(lead())
        self._set_leader(True, "acquired the lease")
        reason = "shutting down"
        try:
            reason = await self._renew(task)
        finally:
            ended = task.done()
            self._set_leader(False, reason)
            await self._stop(task)
        if ended:
            await self._release()

    async def _renew(self, task: asyncio.Future[None]) -> str:
        """Renews until leadership is lost; returns why."""
        s = self.settings
        renewed_at = self._succeeded_at
        while True:
            deadline = renewed_at + s.renew_deadline
            await self.sleep(max(0.0, min(s.retry_period, deadline - self.clock())))
            if task.done():
                return "lead() ended"
            if self.clock() >= deadline:
                return f"no renewal succeeded within {s.renew_deadline}s"
            outcome = await self._try(deadline - self.clock())
            if outcome is _Outcome.HELD:
                renewed_at = self._succeeded_at
            elif outcome is _Outcome.TAKEN:
                holder = self._observed.holder if self._observed else "?"
                return f"the lease is held by {holder}"

    async def _stop(self, task: asyncio.Future[None]) -> None:
        """Cancels lead() and waits for it to end: two replicas must not lead at once."""
        task.cancel()
        await asyncio.wait({task})
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.error("lead() failed", exc_info=error, extra=self._fields())

    async def _try(self, timeout: float) -> _Outcome:
        """One attempt to acquire or renew, within `timeout` seconds."""
        started = self.clock()
        try:
            async with asyncio.timeout(timeout):
                outcome = await self._try_acquire_or_renew(started)
        except Exception as err:
            self._failed(err, timeout)
            return _Outcome.FAILED
        if outcome is _Outcome.HELD:
            self._succeeded_at = started
            self._last_error = ""
        return outcome

    async def _try_acquire_or_renew(self, now: float) -> _Outcome:
        s = self.settings
        try:
            lease = await self.leases.read_namespaced_lease(s.name, s.namespace)
        except ApiException as err:
            if err.status != 404:
                raise
            return await self._create(now)
        record = self._observe(lease, now)
        if record.holder not in ("", s.identity) and not self._expired(record, now):
            return _Outcome.TAKEN
        ours = record.holder == s.identity
        wall = MicroTime.now(datetime.UTC)
        spec = lease.spec or V1LeaseSpec()
        spec.holder_identity = s.identity
        spec.lease_duration_seconds = self._duration_seconds()
        spec.acquire_time = MicroTime.of(record.acquired) if ours and record.acquired else wall
        spec.renew_time = wall
        spec.lease_transitions = record.transitions + (0 if ours else 1)
        lease.spec = spec
        try:
            written = await self.leases.replace_namespaced_lease(s.name, s.namespace, lease)
        except ApiException as err:
            if err.status != 409:
                raise
            log.debug("lost a race for the lease", extra=self._fields())
            return _Outcome.FAILED
        self._observe(written, now)
        return _Outcome.HELD

    async def _create(self, now: float) -> _Outcome:
        s = self.settings
        wall = MicroTime.now(datetime.UTC)
        lease = V1Lease(
            api_version="coordination.k8s.io/v1",
            kind="Lease",
            metadata=V1ObjectMeta(name=s.name, namespace=s.namespace),
            spec=V1LeaseSpec(
                holder_identity=s.identity,
                lease_duration_seconds=self._duration_seconds(),
                acquire_time=wall,
                renew_time=wall,
                lease_transitions=0,
            ),
        )
        try:
            created = await self.leases.create_namespaced_lease(s.namespace, lease)
        except ApiException as err:
            if err.status != 409:
                raise
            log.debug("another replica created the lease first", extra=self._fields())
            return _Outcome.FAILED
        self._observe(created, now)
        return _Outcome.HELD

    async def _release(self) -> None:
        """Best effort: clears the holder, if the Lease still names us."""
        try:
            async with asyncio.timeout(self.settings.renew_deadline):
                released = await self._clear_holder()
        except Exception as err:
            log.warning("could not release the lease", extra=self._fields(error=_describe(err)))
            return
        if released:
            log.info("released the lease", extra=self._fields())

    async def _clear_holder(self) -> bool:
        s = self.settings
        for attempt in (1, 2):
            lease, record = self._lease, self._observed
            if lease is None or record is None or record.holder != s.identity:
                return False
            wall = MicroTime.now(datetime.UTC)
            lease.spec = V1LeaseSpec(
                holder_identity="",
                lease_duration_seconds=1,
                acquire_time=wall,
                renew_time=wall,
                lease_transitions=record.transitions,
            )
            try:
                written = await self.leases.replace_namespaced_lease(s.name, s.namespace, lease)
            except ApiException as err:
                if err.status != 409 or attempt == 2:
                    raise
                # A renewal cut short by the shutdown may have been stored: read it again.
                lease = await self.leases.read_namespaced_lease(s.name, s.namespace)
                self._observe(lease, self.clock())
                continue
            self._observe(written, self.clock())
            return True
        return False

    def _observe(self, lease: V1Lease, now: float) -> _Record:
        record = _Record.of(lease)
        if record != self._observed:
            self._observed, self._observed_at = record, now
        self._lease = lease
        return record

    def _expired(self, record: _Record, now: float) -> bool:
        # As client-go: the duration the holder wrote, timed from when we saw the record change.
        duration = record.duration if record.duration else self.settings.lease_duration
        return now >= self._observed_at + duration

    def _duration_seconds(self) -> int:
        return max(1, math.ceil(self.settings.lease_duration))

    def _jittered(self) -> float:
        return self.settings.retry_period * (1 + random.random() * JITTER)

    def _failed(self, err: Exception, timeout: float) -> None:
        error = f"no answer within {timeout:.1f}s" if isinstance(err, TimeoutError) else None
        error = error or _describe(err)
        if error != self._last_error:
            log.warning("lease request failed", extra=self._fields(error=error))
        self._last_error = error

    def _set_leader(self, leading: bool, reason: str) -> None:
        if leading == self._leader:
            return
        self._leader = leading
        message = "leading" if leading else "stopped leading"
        log.info(message, extra=self._fields(reason=reason))
        if self.on_change is not None:
            try:
                self.on_change(leading)
            except Exception:  # a broken metric must not break leader election
                log.exception("on_change failed", extra=self._fields())

    def _fields(self, **more: Any) -> dict[str, Any]:
        s = self.settings
        return {"fields": {"lease": f"{s.namespace}/{s.name}", "identity": s.identity, **more}}


def _describe(err: Exception) -> str:
    if isinstance(err, ApiException):
        return f"HTTP {err.status}: {err.reason}"
    return f"{type(err).__name__}: {err}"

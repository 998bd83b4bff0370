"""Gang signals from the group objects this service made, as their schedulers tell them.

Each backend reads its own objects' status (`GangBackend.status`). For the native one,
kube-scheduler writes `PodGroupInitiallyScheduled` on a PodGroup: `False` with reason
`Unschedulable` (capacity, affinity, topology: the gang does not fit) or `SchedulerError`, and
`True` once the gang is placed (it never goes back). Before the scheduler has judged the group
there is no condition: the gang's pods are still being created or have not reached the scheduler
(assembly). Every family has a `backend` label. So:

* `trainjob_scheduling_gangs{policy, state, reason}` counts PodGroups now, at scrape time:
  `state="scheduled", reason="Scheduled"`, or `state="waiting"` with `reason` one of
  `NotEvaluated` (no verdict yet: assembly), `Unschedulable` (does not fit: capacity/placement),
  `SchedulerError`, `Other` (another `False` reason). Every combination is exported, zeros too.
* `trainjob_scheduling_gangs_waiting_oldest_seconds{policy, reason}`: age of the oldest waiting
  PodGroup per reason (0 when none), the signal for "a gang is stuck".
* `trainjob_scheduling_gang_time_to_scheduled_seconds{policy, waited_on}`: creation to
  `PodGroupInitiallyScheduled=True`, observed once per PodGroup that this process saw waiting;
  `waited_on` is `pods` (no `False` verdict was seen: the time went into assembling the gang),
  `capacity` (`Unschedulable` was seen), `scheduler_error` (`SchedulerError` was seen) or `other`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from prometheus_client import Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..backends.base import WAITING_REASONS, GangBackend, GangStatus, Kind, is_managed
from ..backends.native import pod_group_status
from ..kube.store import EventType
from .registry import Metrics

if TYPE_CHECKING:
    from ..kube.cache import Cache

POLICIES = ("gang", "basic")
WAITED_ON = {"Unschedulable": "capacity", "SchedulerError": "scheduler_error", "Other": "other"}
# Of the `False` verdicts a group went through, the one `waited_on` names: an error to fix
# outranks a lack of capacity, which outranks anything else.
_RANK = {"": 0, "Other": 1, "Unschedulable": 2, "SchedulerError": 3}
# Seconds to minutes for a healthy cluster, hours when capacity is short.
TIME_TO_SCHEDULED_BUCKETS = (
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0,
)  # fmt: skip
MAX_TRACKED = 100_000  # waiting groups remembered; far above any real cluster's count


@dataclass(frozen=True)
class GangState:
    policy: str  # gang or basic
    scheduled: bool
    reason: str  # Scheduled, or one of WAITING_REASONS
    created: float | None  # unix time
    scheduled_at: float | None  # when it was scheduled, if the object says


def _timestamp(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def managed(raw: dict[str, Any] | None) -> bool:
    return is_managed(raw)


def state_of(status: GangStatus, raw: dict[str, Any]) -> GangState:
    meta = raw.get("metadata")
    created = _timestamp(meta.get("creationTimestamp")) if isinstance(meta, dict) else None
    reason = status.reason if status.scheduled or status.reason in WAITING_REASONS else "Other"
    return GangState(
        status.policy, status.scheduled, reason, created, _timestamp(status.scheduled_at)
    )


def gang_state(raw: dict[str, Any]) -> GangState:
    """What a native PodGroup's spec and status say about its gang."""
    return state_of(pod_group_status(raw), raw)


def _uid(raw: dict[str, Any]) -> str:
    meta = raw.get("metadata") or {}
    uid = meta.get("uid")
    return uid if isinstance(uid, str) and uid else f"{meta.get('namespace')}/{meta.get('name')}"


class GangTracker(Collector):
    """Follows the cache's stores of every backend's group objects: observes time-to-scheduled
    as their status changes, and counts the gangs at scrape time. Create one per service; it
    registers itself."""

    def __init__(
        self, metrics: Metrics, cache: Cache, clock: Callable[[], float] = time.time
    ) -> None:
        self.clock = clock
        self.followed: list[tuple[GangBackend, Kind]] = []
        self.cache = cache
        self.time_to_scheduled = Histogram(
            "trainjob_scheduling_gang_time_to_scheduled_seconds",
            "Time from a group object's creation to its scheduling, by backend, policy and by "
            "what it waited on: pods (assembly), capacity (Unschedulable), scheduler_error.",
            ["backend", "policy", "waited_on"],
            buckets=TIME_TO_SCHEDULED_BUCKETS,
            registry=metrics.registry,
        )
        # uid -> the top-ranked `False` reason seen ("" for none), for groups seen waiting.
        self._waiting: dict[str, str] = {}
        metrics.registry.register(self)
        probe: dict[str, Any] = {"metadata": {}}
        for backend in cache.backends.backends:
            for kind in backend.kinds:
                if backend.status(kind, probe) is None:
                    continue  # this kind carries no gang status (the native Workload)
                self.followed.append((backend, kind))
                cache.store(kind).subscribe(self._follower(backend, kind))

    def _follower(
        self, backend: GangBackend, kind: Kind
    ) -> Callable[[EventType, dict[str, Any] | None, dict[str, Any] | None], None]:
        def changed(
            event: EventType, old: dict[str, Any] | None, new: dict[str, Any] | None
        ) -> None:
            self._changed(backend, kind, event, old, new)

        return changed

    def _state(self, backend: GangBackend, kind: Kind, raw: dict[str, Any]) -> GangState | None:
        status = backend.status(kind, raw)
        return None if status is None else state_of(status, raw)

    def _changed(
        self,
        backend: GangBackend,
        kind: Kind,
        event: EventType,
        old: dict[str, Any] | None,
        new: dict[str, Any] | None,
    ) -> None:
        if new is None or event == "DELETED":
            if old is not None:
                self._waiting.pop(_uid(old), None)
            return
        if not managed(new):
            return
        uid, state = _uid(new), self._state(backend, kind, new)
        if state is None:
            return
        seen = self._waiting.get(uid)
        if state.scheduled:
            # Seen waiting before: observe once. Never seen waiting (scheduled before this
            # process started, or before it listed): not observed, so a restart adds nothing.
            if seen is not None:
                del self._waiting[uid]
                self._observe(backend, state, seen)
            return
        if seen is None and len(self._waiting) >= MAX_TRACKED:
            return
        verdict = "" if state.reason == "NotEvaluated" else state.reason
        self._waiting[uid] = max(seen or "", verdict, key=_RANK.__getitem__)

    def _observe(self, backend: GangBackend, state: GangState, seen: str) -> None:
        if state.created is None or state.scheduled_at is None:
            return
        waited_on = WAITED_ON[seen] if seen else "pods"
        seconds = max(0.0, state.scheduled_at - state.created)  # clocks may disagree slightly
        self.time_to_scheduled.labels(backend.name, state.policy, waited_on).observe(seconds)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gangs, ages = self._families()
        now = self.clock()
        for name in dict.fromkeys(b.name for b, _ in self.followed):
            counts = {(p, r): 0 for p in POLICIES for r in ("Scheduled", *WAITING_REASONS)}
            oldest = {(p, r): 0.0 for p in POLICIES for r in WAITING_REASONS}
            for backend, kind in self.followed:
                if backend.name != name:
                    continue
                for _, entry in self.cache.store(kind).items():
                    if not managed(entry.raw):
                        continue
                    state = self._state(backend, kind, entry.raw)
                    if state is None:
                        continue
                    key = (state.policy, state.reason)
                    counts[key] += 1
                    if not state.scheduled and state.created is not None:
                        oldest[key] = max(oldest[key], now - state.created)
            for (policy, reason), count in counts.items():
                phase = "scheduled" if reason == "Scheduled" else "waiting"
                gangs.add_metric([name, policy, phase, reason], count)
            for (policy, reason), age in oldest.items():
                ages.add_metric([name, policy, reason], age)
        yield gangs
        yield ages

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        gangs = GaugeMetricFamily(
            "trainjob_scheduling_gangs",
            "This service's group objects by backend, policy, state (scheduled, waiting) and "
            "reason (Scheduled; NotEvaluated = assembling, Unschedulable, SchedulerError, Other).",
            labels=["backend", "policy", "state", "reason"],
        )
        ages = GaugeMetricFamily(
            "trainjob_scheduling_gangs_waiting_oldest_seconds",
            "Age of the oldest waiting group object by backend, policy and reason (0 when none).",
            labels=["backend", "policy", "reason"],
        )
        return gangs, ages

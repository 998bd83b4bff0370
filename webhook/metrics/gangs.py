"""Gang signals from the PodGroups this service made, as kube-scheduler's conditions tell them.

kube-scheduler writes `PodGroupInitiallyScheduled` on a PodGroup: `False` with reason
`Unschedulable` (capacity, affinity, topology: the gang does not fit) or `SchedulerError`, and
`True` once the gang is placed (it never goes back). Before the scheduler has judged the group
there is no condition: the gang's pods are still being created or have not reached the scheduler
(assembly). So:

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
from typing import Any

from prometheus_client import Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..backends.base import MANAGED_BY, MANAGED_BY_LABEL
from ..kube.cache import EventType, Store
from .registry import Metrics

CONDITION = "PodGroupInitiallyScheduled"
POLICIES = ("gang", "basic")
WAITING_REASONS = ("NotEvaluated", "Unschedulable", "SchedulerError", "Other")
WAITED_ON = {"Unschedulable": "capacity", "SchedulerError": "scheduler_error", "Other": "other"}
# Of the `False` verdicts a PodGroup went through, the one `waited_on` names: an error to fix
# outranks a lack of capacity, which outranks anything else.
_RANK = {"": 0, "Other": 1, "Unschedulable": 2, "SchedulerError": 3}
# Seconds to minutes for a healthy cluster, hours when capacity is short.
TIME_TO_SCHEDULED_BUCKETS = (
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0,
)  # fmt: skip
MAX_TRACKED = 100_000  # waiting PodGroups remembered; far above any real cluster's count


@dataclass(frozen=True)
class GangState:
    policy: str  # gang or basic
    scheduled: bool
    reason: str  # Scheduled, or one of WAITING_REASONS
    created: float | None  # unix time
    scheduled_at: float | None  # the condition's lastTransitionTime when True


def _timestamp(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def managed(raw: dict[str, Any] | None) -> bool:
    meta = raw.get("metadata") if raw else None
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return isinstance(labels, dict) and labels.get(MANAGED_BY_LABEL) == MANAGED_BY


def gang_state(raw: dict[str, Any]) -> GangState:
    """What a PodGroup's spec and status say about its gang."""
    spec = raw.get("spec")
    policy = spec.get("schedulingPolicy") if isinstance(spec, dict) else None
    kind = "gang" if isinstance(policy, dict) and "gang" in policy else "basic"
    meta = raw.get("metadata")
    created = _timestamp(meta.get("creationTimestamp")) if isinstance(meta, dict) else None
    status = raw.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for cond in conditions if isinstance(conditions, list) else ():
        if not isinstance(cond, dict) or cond.get("type") != CONDITION:
            continue
        if cond.get("status") == "True":
            return GangState(
                kind, True, "Scheduled", created, _timestamp(cond.get("lastTransitionTime"))
            )
        if cond.get("status") == "False":
            reason = cond.get("reason")
            if reason not in ("Unschedulable", "SchedulerError"):
                reason = "Other"  # any other value would be a label value without bound
            return GangState(kind, False, str(reason), created, None)
    return GangState(kind, False, "NotEvaluated", created, None)


def _uid(raw: dict[str, Any]) -> str:
    meta = raw.get("metadata") or {}
    uid = meta.get("uid")
    return uid if isinstance(uid, str) and uid else f"{meta.get('namespace')}/{meta.get('name')}"


class GangTracker(Collector):
    """Follows the cache's PodGroup store: observes time-to-scheduled as conditions change, and
    counts the gangs at scrape time. Create one per service; it registers itself."""

    def __init__(
        self, metrics: Metrics, store: Store, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.clock = clock
        self.time_to_scheduled = Histogram(
            "trainjob_scheduling_gang_time_to_scheduled_seconds",
            "Time from a PodGroup's creation to PodGroupInitiallyScheduled=True, by policy and "
            "by what it waited on: pods (assembly), capacity (Unschedulable), scheduler_error.",
            ["policy", "waited_on"],
            buckets=TIME_TO_SCHEDULED_BUCKETS,
            registry=metrics.registry,
        )
        # uid -> the top-ranked `False` reason seen ("" for none), for PodGroups seen waiting.
        self._waiting: dict[str, str] = {}
        metrics.registry.register(self)
        store.subscribe(self._changed)

    def _changed(
        self, event: EventType, old: dict[str, Any] | None, new: dict[str, Any] | None
    ) -> None:
        if new is None or event == "DELETED":
            if old is not None:
                self._waiting.pop(_uid(old), None)
            return
        if not managed(new):
            return
        uid, state = _uid(new), gang_state(new)
        seen = self._waiting.get(uid)
        if state.scheduled:
            # Seen waiting before: observe once. Never seen waiting (scheduled before this
            # process started, or before it listed): not observed, so a restart adds nothing.
            if seen is not None:
                del self._waiting[uid]
                self._observe(state, seen)
            return
        if seen is None and len(self._waiting) >= MAX_TRACKED:
            return
        verdict = "" if state.reason == "NotEvaluated" else state.reason
        self._waiting[uid] = max(seen or "", verdict, key=_RANK.__getitem__)

    def _observe(self, state: GangState, seen: str) -> None:
        if state.created is None or state.scheduled_at is None:
            return
        waited_on = WAITED_ON[seen] if seen else "pods"
        seconds = max(0.0, state.scheduled_at - state.created)  # clocks may disagree slightly
        self.time_to_scheduled.labels(state.policy, waited_on).observe(seconds)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        counts = {(p, r): 0 for p in POLICIES for r in ("Scheduled", *WAITING_REASONS)}
        oldest = {(p, r): 0.0 for p in POLICIES for r in WAITING_REASONS}
        now = self.clock()
        for _, entry in self.store.items():
            if not managed(entry.raw):
                continue
            state = gang_state(entry.raw)
            key = (state.policy, state.reason)
            counts[key] += 1
            if not state.scheduled and state.created is not None:
                oldest[key] = max(oldest[key], now - state.created)
        gangs, ages = self._families()
        for (policy, reason), count in counts.items():
            phase = "scheduled" if reason == "Scheduled" else "waiting"
            gangs.add_metric([policy, phase, reason], count)
        for (policy, reason), age in oldest.items():
            ages.add_metric([policy, reason], age)
        yield gangs
        yield ages

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        gangs = GaugeMetricFamily(
            "trainjob_scheduling_gangs",
            "This service's PodGroups by policy, state (scheduled, waiting) and reason "
            "(Scheduled; NotEvaluated = assembling, Unschedulable, SchedulerError, Other).",
            labels=["policy", "state", "reason"],
        )
        ages = GaugeMetricFamily(
            "trainjob_scheduling_gangs_waiting_oldest_seconds",
            "Age of the oldest waiting PodGroup by policy and reason (0 when none waits).",
            labels=["policy", "reason"],
        )
        return gangs, ages

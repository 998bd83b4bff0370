"""Writes the GangScheduling condition (`core/condition.py`) at the end of each reconcile pass:
the leader only (the reconciler runs only while it leads), and only when the stored condition
says something else (the cache's TrainJob, as the watch shows it: a condition reverted or
dropped by another writer is applied again; an unchanged one costs no request).

The pass tells what it found (`Outcome`); the gangs' state is read here from the cache (each
group object's status, through its backend) and from the pod counts (`kube/gangpods.py`).
A gang that falls below its minCount after admission gets one Warning Event, a place in the
degraded gauge and a count in the per-namespace counter. A TrainJob whose gang objects exist
while some of its present pods have no `spec.schedulingGroup` (untied: the gang may wait for
them for ever) is said `PodsUntied` and counted in the untied gauge.

A pass decides the condition; `run`'s senders write it, off the workers' path and in the
writer's reporting lane (after the gang writes, `kube/writer.py`): a worker goes on to the next
TrainJob's gang instead of waiting to report on the last one. A condition decided again before
it is written replaces the one waiting (one write, the latest); a failed write is tried again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubernetes.aio.client.exceptions import ApiException

from ..backends.base import Context, GangBackend, GangStatus
from ..backends.native import POD_GROUP
from ..core import condition as cond
from ..core.lifecycle import is_finished, runs_elsewhere
from ..core.plan import GroupPlan, Plan
from ..core.trainer import TrainJob
from ..core.validation import CheckedRuntime
from ..kube.cache import Cache, Key
from ..kube.events import EventRecorder
from ..kube.feasibility import domains_by_node_labels, mode_of
from ..kube.gangpods import GangPods, JobKey, JobPods
from ..kube.rest import status_message
from ..kube.writer import ApiWriter

if TYPE_CHECKING:
    from ..metrics.registry import Metrics

log = logging.getLogger("webhook.status")

EXPECTATION_TTL = 30.0  # seconds a write stands in for its watch event
RECOUNT_AFTER = 10.0  # seconds between writes that only change a pod count (Degraded, PodsUntied)
COUNTED = (cond.DEGRADED, cond.PODS_UNTIED)  # reasons whose message carries a pod count
PODS_UNLISTED_RETRY = 1.0  # seconds: a Degraded TrainJob's first wait for the pods to be listed
PODS_UNLISTED_TRIES = 6  # its waits, each twice the last (a minute in all); then pods are unknown
SENDERS = 4  # condition writes under way at once (the reporting budget paces them)
RETRY_AFTER = 0.5  # seconds before a failed condition write is tried again, doubling to
RETRY_AT_MOST = 30.0  # this


@dataclass
class Pending:
    """A condition decided, waiting for (or under) its write."""

    condition: dict[str, Any]
    reason: str
    resource_version: str | None  # the TrainJob's, when last decided
    tries: int = 0


@dataclass
class Outcome:
    """What one reconcile pass found, for the condition; None of it for a TrainJob that is not
    this service's (its runtime has no spec.scheduling)."""

    lifecycle: cond.Lifecycle = "active"
    blocker: tuple[str, str] | None = None  # (Event reason, note) that stopped it short
    dropped: str | None = None  # FeatureGateOff's note
    # Whether the API server kept the topology constraint of this TrainJob's gang objects
    # (None: they set none, or none was looked at; then the cluster's, `kube/constraints.py`).
    topology_kept: bool | None = None
    plan: Plan | None = None
    backend: GangBackend | None = None
    trainjob: TrainJob | None = None
    runtime: CheckedRuntime | None = None


def lifecycle_of(trainjob: TrainJob) -> cond.Lifecycle:
    if runs_elsewhere(trainjob):
        return "elsewhere"
    if is_finished(trainjob):
        return "finished"
    if trainjob.spec.suspend is True:
        return "suspended"
    return "active"


class StatusWriter:
    def __init__(
        self,
        cache: Cache,
        writer: ApiWriter,
        events: EventRecorder,
        pods: GangPods | None = None,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.cache = cache
        self.writer = writer
        self.events = events
        self.pods = pods
        self.metrics = metrics
        self.clock = clock
        self.monotonic = monotonic
        self.sleep = sleep
        self.pending: dict[Key, Pending] = {}  # conditions to write, oldest first
        self._writing: dict[Key, Pending] = {}  # those under way (or waiting to be tried again)
        self._more = asyncio.Event()  # a condition to write, or a key free to be written again
        self._written: dict[Key, tuple[str, float]] = {}  # resourceVersion written over, when
        self._last_write: dict[Key, float] = {}  # monotonic time of the last write
        self.degraded: dict[Key, frozenset[str]] = {}  # TrainJob -> its degraded gangs
        self.untied: set[Key] = set()  # TrainJobs said PodsUntied
        self._refused: set[int] = set()  # HTTP statuses already logged at warning
        self._pods_waits: dict[Key, int] = {}  # TrainJob -> its waits for the pods to be listed

    async def sync(self, key: Key, outcome: Outcome | None) -> float | None:
        """Applies the condition the stored TrainJob should carry, if it carries another;
        returns when to look again when a write was put off."""
        entry = self.cache.trainjobs.get(*key)
        if entry is None or outcome is None:
            self._follow_untied(key, None)
            return None  # gone, or not this service's: never a write of any kind
        raw = entry.raw
        stored = cond.stored_condition(raw)
        wait = self._pods_wait(key, stored, outcome)
        if wait is not None:
            return wait
        now = cond.rfc3339(self.clock())
        situation = self.situation(raw, outcome)
        desired = cond.decide(situation, stored, now)
        self._follow_degraded(key, raw, situation, desired, stored)
        self._follow_untied(key, desired)
        if desired is None or cond.unchanged(stored, desired):
            if desired is not None:
                self._drop(key)  # the stored one says it already
            return None
        wait = self._recount_wait(key, stored, desired)
        if wait is not None:
            return wait
        meta = raw.get("metadata") or {}
        rv = meta.get("resourceVersion")
        rv = rv if isinstance(rv, str) else None
        written = self._written.get(key)
        if written is not None:
            if written[0] == rv and self.monotonic() - written[1] < EXPECTATION_TTL:
                return None  # written: the watch has not brought it back yet (it wakes a pass)
            del self._written[key]
        waiting = self.pending.get(key)
        if waiting is not None and cond.unchanged(waiting.condition, desired):
            waiting.resource_version = rv
            return None  # already on its way
        generation = meta.get("generation")
        condition = cond.condition(
            desired, stored, generation if isinstance(generation, int) else None, now
        )
        self.pending[key] = Pending(condition, desired.reason, rv)
        self._more.set()
        return None

    async def run(self, senders: int = SENDERS) -> None:
        """Writes the conditions decided until cancelled (the reconciler runs this while it
        leads), `senders` at a time, one write at a time per TrainJob."""
        await asyncio.gather(*(self._send() for _ in range(senders)))

    async def _send(self) -> None:
        while True:
            key, waiting = await self._next()
            again = True  # kept, if cancelled part way
            try:
                again = await self._write(key, waiting)
                if again:  # the key stays taken while it waits: no other sender retries it now
                    waiting.tries += 1
                    await self.sleep(min(RETRY_AFTER * 2 ** (waiting.tries - 1), RETRY_AT_MOST))
            finally:
                del self._writing[key]
                if self.pending.get(key) is waiting and not again:
                    del self.pending[key]
                self._more.set()  # a newer condition for the key may wait for this one

    async def _next(self) -> tuple[Key, Pending]:
        while True:
            for key, waiting in self.pending.items():
                if key not in self._writing:
                    self._writing[key] = waiting
                    return key, waiting
            self._more.clear()
            await self._more.wait()

    async def _write(self, key: Key, waiting: Pending) -> bool:
        """Applies the condition; whether to try again."""
        try:
            await self.writer.apply_condition(*key, waiting.condition)
        except asyncio.CancelledError:
            raise
        except ApiException as err:
            if err.status == 404:
                return False  # deleted meanwhile
            if err.status in (403, 422):
                self._say_refused(key, err)
                return False  # retried by the next pass it would change; not in a loop
            self._say_failed(key, f"HTTP {err.status}: {status_message(err) or ''}")
            return True
        except Exception as err:  # timeouts, dropped connections
            self._say_failed(key, f"{type(err).__name__}: {err}")
            return True
        if waiting.resource_version is not None:
            self._written[key] = (waiting.resource_version, self.monotonic())
        self._last_write[key] = self.monotonic()
        if self.metrics is not None:
            self.metrics.status_writes.labels(reason=waiting.reason).inc()
        return False

    def _drop(self, key: Key) -> None:
        """No write for the key, but the one under way (it finishes)."""
        waiting = self.pending.get(key)
        if waiting is not None and self._writing.get(key) is not waiting:
            del self.pending[key]

    def _pods_wait(
        self, key: Key, stored: Mapping[str, Any] | None, outcome: Outcome
    ) -> float | None:
        """A new leader, before its pod watch has listed, would say Scheduled of a Degraded gang
        (no counts) and Degraded again a moment later (one more Event, two more writes; the
        same of PodsUntied): the TrainJob waits, when its answer depends on pod counts. A
        bounded number of times: a pod watch that never lists (RBAC without pods) must not hold
        the condition back forever, nor cost a pass every second."""
        if self.pods is None or self.pods.synced:
            self._pods_waits.clear()
            return None
        if stored is None or stored.get("reason") not in COUNTED:
            return None
        if outcome.lifecycle != "active" or outcome.blocker is not None or outcome.plan is None:
            return None  # finished, suspended or blocked: said without counts
        tries = self._pods_waits.get(key, 0)
        if tries >= PODS_UNLISTED_TRIES:
            return None  # the pods count as unknown
        self._pods_waits[key] = tries + 1
        return float(PODS_UNLISTED_RETRY * 2**tries)

    def _recount_wait(
        self, key: Key, stored: Mapping[str, Any] | None, desired: cond.Desired
    ) -> float | None:
        """A Degraded gang whose pod count alone changed (pods lost or coming back one by one),
        or a PodsUntied one whose count of untied pods did, is written at most every
        RECOUNT_AFTER seconds: each write wakes Trainer's worker."""
        if stored is None or stored.get("reason") not in COUNTED:
            return None
        if desired.reason != stored.get("reason") or stored.get("status") != desired.status:
            return None
        last = self._last_write.get(key)
        left = RECOUNT_AFTER - (self.monotonic() - last) if last is not None else 0.0
        return left if left > 0 else None

    def reset(self) -> None:
        """Leadership lost: what this replica remembered is the next leader's to judge (and its
        gauge no longer counts gangs this replica no longer follows)."""
        self._written.clear()
        self._last_write.clear()
        self._pods_waits.clear()
        self.pending.clear()
        self.degraded.clear()
        self.untied.clear()
        self._publish()

    def forget(self, key: Key) -> None:
        """The TrainJob is gone: never degraded."""
        self._written.pop(key, None)
        self._last_write.pop(key, None)
        self._pods_waits.pop(key, None)
        self._follow_untied(key, None)
        self._drop(key)
        if self.degraded.pop(key, None):
            self._publish()

    # --- what is known ---------------------------------------------------------------------------

    def situation(self, raw: Mapping[str, Any], outcome: Outcome) -> cond.Situation:
        if outcome.lifecycle != "active":
            return cond.Situation(outcome.lifecycle)
        if outcome.blocker is not None:
            return cond.Situation(blocker=outcome.blocker)
        plan, backend = outcome.plan, outcome.backend
        if plan is None or backend is None:
            return cond.Situation(blocker=("GangBackendUnavailable", "no gang backend"))
        statuses = self._statuses(plan, backend)
        pods = self.pods
        jobs = pods.jobs(plan.namespace, plan.trainjob_name) if pods and pods.synced else None
        counts, untied = _pods_by_group(plan, jobs) if jobs is not None else (None, None)
        gangs = tuple(_gang(g, statuses.get(g.pod_group_name), counts) for g in plan.groups)
        if POD_GROUP not in backend.kinds:
            # Only the native backend ties pods by spec.schedulingGroup; the others' pods carry
            # an annotation or label and have none.
            untied = None
        return cond.Situation(
            gangs=gangs,
            dropped=outcome.dropped,
            untied=untied,
            infeasible=self._infeasible(raw, outcome)
            if not all(g.scheduled for g in gangs)
            else None,
        )

    def _statuses(self, plan: Plan, backend: GangBackend) -> dict[str, GangStatus]:
        found: dict[str, GangStatus] = {}
        for kind in backend.kinds:
            for obj in self.cache.owned(kind, plan.trainjob_uid):
                status = backend.status(kind, obj)
                name = (obj.get("metadata") or {}).get("name")
                if status is not None and isinstance(name, str):
                    found[name] = status
        return found

    def _infeasible(self, raw: Mapping[str, Any], outcome: Outcome) -> str | None:
        """Feasibility's message for a gang that can never fit (its judgements are memoised:
        a dict lookup until a node changes). A gang whose topology constraint the API server
        dropped is judged over the whole cluster: kube-scheduler places it across domains."""
        plan, backend, trainjob, runtime = (
            outcome.plan, outcome.backend, outcome.trainjob, outcome.runtime
        )  # fmt: skip
        if plan is None or backend is None or trainjob is None or runtime is None:
            return None
        feasibility = self.cache.feasibility
        if mode_of(runtime.runtime, feasibility.mode)[0] == "off":
            return None
        kept = outcome.topology_kept
        kept = self.cache.topology.kept if kept is None else kept
        topology = domains_by_node_labels(backend, Context.of(raw), kept)
        judged = feasibility.plan(plan, runtime.runtime, trainjob, topology=topology)
        never = next((j for j in judged[0] if not j.fit.fits), None) if judged else None
        return never.message if never is not None else None

    # --- degraded gangs ------------------------------------------------------------------------

    def _follow_degraded(
        self,
        key: Key,
        raw: Mapping[str, Any],
        situation: cond.Situation,
        desired: cond.Desired | None,
        stored: Mapping[str, Any] | None,
    ) -> None:
        before = self.degraded.get(key, frozenset())
        now: frozenset[str] = frozenset()
        if desired is not None and desired.reason == cond.DEGRADED:
            now = frozenset(g.name for g in situation.gangs if g.short())
        if now == before:
            return
        if now:
            self.degraded[key] = now
        else:
            del self.degraded[key]
        self._publish()
        restarted = not before and stored is not None and stored.get("reason") == cond.DEGRADED
        new = now - before
        if new and not restarted and desired is not None:
            self.events.record(raw, "Warning", "GangDegraded", "Watch", desired.message)
            if self.metrics is not None:
                self.metrics.gang_degradations.labels(namespace=key[0]).inc(len(new))
        elif not now and desired is not None and desired.reason == cond.SCHEDULED:
            note = f"every gang holds its minCount of live pods again: {desired.message}"
            self.events.record(raw, "Normal", "GangRecovered", "Watch", note)

    def _follow_untied(self, key: Key, desired: cond.Desired | None) -> None:
        untied = desired is not None and desired.reason == cond.PODS_UNTIED
        if untied == (key in self.untied):
            return
        if untied:
            self.untied.add(key)
        else:
            self.untied.discard(key)
        self._publish()

    def _publish(self) -> None:
        if self.metrics is not None:
            self.metrics.gangs_degraded.set(sum(len(g) for g in self.degraded.values()))
            self.metrics.gangs_with_untied_pods.set(len(self.untied))

    def _say_failed(self, key: Key, error: str) -> None:
        log.warning(
            "cannot write the GangScheduling condition, trying again",
            extra={"fields": {"trainjob": "/".join(key), "error": error[:300]}},
        )

    def _say_refused(self, key: Key, err: ApiException) -> None:
        status = int(err.status or 0)
        level = logging.DEBUG if status in self._refused else logging.WARNING
        self._refused.add(status)
        hint = " (the ClusterRole needs patch on trainjobs/status)" if status == 403 else ""
        log.log(
            level,
            "cannot write the GangScheduling condition" + hint,
            extra={
                "fields": {
                    "trainjob": "/".join(key),
                    "error": (status_message(err) or f"HTTP {status}")[:300],
                }
            },
        )


def _pods_by_group(plan: Plan, jobs: Mapping[JobKey, JobPods]) -> tuple[dict[str, cond.Pods], int]:
    """Each group's live and succeeded pods, and the grouped Jobs' untied pods (pods of an
    untargeted ReplicatedJob rightly have no group), from one walk of the Jobs (whose keys come
    from pod labels anyone who makes pods can set: work in their number, not times the
    groups')."""
    counts: dict[str, tuple[int, int]] = {}
    untied = 0
    for (rj, index), job in jobs.items():
        group = plan.group_for(rj, index)
        if group is not None:
            live, succeeded = counts.get(group.pod_group_name, (0, 0))
            counts[group.pod_group_name] = (live + job.live, succeeded + job.succeeded)
            untied += job.untied
    return {name: cond.Pods(*c) for name, c in counts.items()}, untied


def _gang(
    group: GroupPlan, status: GangStatus | None, counts: Mapping[str, cond.Pods] | None
) -> cond.Gang:
    pods = None
    if counts is not None:
        pods = counts.get(group.pod_group_name, cond.Pods(0, 0))
    return cond.Gang(
        name=group.pod_group_name,
        min_count=group.min_count if group.policy == "gang" else None,
        exists=status is not None,
        scheduled=status is not None and status.scheduled,
        verdict=status.reason if status is not None else "NotEvaluated",
        scheduler_message=status.message if status is not None else "",
        pods=pods,
    )

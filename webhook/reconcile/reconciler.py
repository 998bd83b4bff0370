"""Turns each TrainJob's plan into its gang backend's objects, and keeps them so (was-api.md 8).

One pass over one TrainJob (`reconcile`) reads only the cache, decides, and writes through
`ApiWriter`. Which objects a plan needs, and how a stored one differs from them, the TrainJob's
backend says (`backends/`); this module knows no object shapes. Changes to TrainJobs and to the
objects they control put the TrainJob's key on a work queue; workers take keys one at a time
per key, so two passes over one TrainJob never race.

Only objects this service made (its label) are changed or deleted. When the TrainJob controls
objects another controller made (the Trainer controller's own Workload-Aware Scheduling, say),
the service stands down for it: nothing is created, nothing of theirs touched.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from kubernetes.aio.client.exceptions import ApiException

from ..backends.base import Context, Drift, GangBackend, Kind, expresses, is_managed
from ..backends.native import UNKNOWN_GATE
from ..core.fields import parse
from ..core.layout import Layout
from ..core.lifecycle import is_finished, no_gang_reason, runs_elsewhere
from ..core.ownership import controlled_by, controller_ref, is_trainjob_ref
from ..core.plan import Plan, PlanningError, build_plan
from ..core.snapshot import PLAN_VERSION, newer_version, snapshot, snapshot_of
from ..core.trainer import TrainJob
from ..core.validation import CheckedRuntime
from ..kube.cache import Cache, EventType, Key, key_of
from ..kube.constraints import FIELD as CONSTRAINT
from ..kube.constraints import created_at, sets_constraint
from ..kube.events import EventRecorder
from ..kube.gangpods import LIVE, PENDING
from ..kube.rest import status_message
from ..kube.writer import ApiWriter
from .changes import Changes
from .queue import QueueMetrics, ShutDown, WorkQueue
from .status import Outcome, StatusWriter, lifecycle_of

if TYPE_CHECKING:
    from ..metrics.registry import Metrics

log = logging.getLogger("webhook.reconciler")

CONTROLLER = "trainjob-scheduling"
EXPECTATION_TTL = 30.0  # seconds a created object stands in for its missing watch event
# Seconds after a TrainJob's creation during which pods of its name that have no group may be
# an earlier TrainJob's of the same name (the garbage collector deletes them within seconds).
PREDECESSOR_GRACE = 30.0
JsonObject = dict[str, Any]
Dropped = tuple[str, str, str]  # (kind, field, gate)


@dataclass(frozen=True)
class ReconcilerSettings:
    workers: int = 4
    resync_period: float = 600.0  # every TrainJob again, in case an event was missed
    conflict_retry: float = 60.0  # a foreign object holds our name: look again this much later
    wait_retry: float = 1.0  # an object is being deleted, or the cache has not caught up:
    wait_max: float = 60.0  # the first look again after wait_retry, doubling up to wait_max
    gc_grace: float = 2.0  # after someone else deleted one of ours, before looking again


@dataclass(frozen=True)
class Result:
    requeue_after: float | None = None
    wait: bool = False
    """Look again after the TrainJob's own backoff: wait_retry, doubling while it keeps waiting
    (an object that stays Terminating as long as its pods' grace period is never polled at a
    fixed rate)."""


DONE = Result()
WAIT = Result(wait=True)


class Reconciler:
    def __init__(
        self,
        cache: Cache,
        writer: ApiWriter,
        events: EventRecorder,
        settings: ReconcilerSettings = ReconcilerSettings(),
        *,
        metrics: Metrics | None = None,
        status: StatusWriter | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.cache = cache
        self.status = status  # the GangScheduling condition, written after each pass
        self.writer = writer
        self.events = events
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.wall = wall  # compared with creationTimestamps
        self.backends = cache.backends
        self.queue: WorkQueue[Key] | None = None  # exists while leading
        self._deleted: set[str] = set()  # uids deleted whose DELETED event has not come yet
        # Objects created whose ADDED event has not come yet: the next pass must not create
        # them again (client-go's "expectations").
        self._created: dict[tuple[Kind, str, str], tuple[float, JsonObject]] = {}
        # Snapshots written, until the watch brings them: TrainJob -> (uid, when, snapshot).
        self._snapshots: dict[Key, tuple[str, float, str]] = {}
        self._waiting: dict[tuple[str, str, str], set[Key]] = {}  # runtime -> TrainJobs
        self._waits: dict[Key, int] = {}  # TrainJob -> passes in a row that ended waiting
        self.stood_down: set[Key] = set()  # TrainJobs another controller schedules
        # Fields the API server dropped from a TrainJob's gang objects, as (kind, field, gate):
        # what the last pass saw, what its Events have said, and what the log has said at all.
        self.dropped: dict[Key, frozenset[Dropped]] = {}
        self._dropped_said: dict[Key, frozenset[Dropped]] = {}
        self._dropped_logged: set[Dropped] = set()
        self._dropped_series: set[Dropped] = set()
        self.without_backend: dict[str, set[Key]] = {}  # backend -> TrainJobs its API would serve
        cache.trainjobs.subscribe(self._trainjob_changed)
        for kind, store in cache.gang_stores.items():
            store.subscribe(functools.partial(self._owned_changed, kind))
        cache.cluster_runtimes.subscribe(self._runtime_changed)
        cache.jobsets.subscribe(self._jobset_changed)
        cache.training_runtimes.subscribe(self._runtime_changed)
        self._pods = status.pods if status is not None else None
        if self._pods is not None:
            self._pods.subscribe(self._pods_changed)

    # --- running -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Reconciles until cancelled (the leader runs this; losing the lease cancels it)."""
        queue: WorkQueue[Key] = WorkQueue(metrics=self._queue_metrics(), clock=self.clock)
        while not self._caches_synced():
            await asyncio.sleep(0.1)
        self.queue = queue
        self._created.clear()  # a new term starts from the caches alone
        self._snapshots.clear()
        log.info("reconciling", extra={"fields": {"workers": self.settings.workers}})
        self.resync()
        tasks = [asyncio.create_task(self._worker(queue)) for _ in range(self.settings.workers)]
        tasks.append(asyncio.create_task(self._resync_periodically()))
        if self.status is not None:  # its condition writes, off the workers' path (issue 29)
            tasks.append(asyncio.create_task(self.status.run()))
        try:
            await asyncio.gather(*tasks)
        finally:
            self.queue = None
            if self.status is not None:
                self.status.reset()  # the next leader counts the degraded gangs
            queue.shut_down()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            log.info("stopped reconciling")

    def resync(self) -> None:
        """Every TrainJob in the cache onto the queue (at start, when gang scheduling becomes
        available, and periodically)."""
        if self.queue is not None:
            for key, _ in self.cache.trainjobs.items():
                self.queue.add(key)

    def _caches_synced(self) -> bool:
        served = [b for b in self.backends.backends if self.cache.api(b) == "served"]
        return self.cache.synced and all(self.cache.backend_ready(b) for b in served)

    async def _resync_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_period)
            self.resync()

    async def _worker(self, queue: WorkQueue[Key]) -> None:
        while True:
            try:
                key = await queue.get()
            except ShutDown:
                return
            started = self.clock()
            try:
                result = await self.reconcile(key)
            except asyncio.CancelledError:
                queue.done(key)
                raise
            except Exception as err:  # API errors, timeouts, dropped connections: retry later
                queue.done(key)
                delay = queue.add_rate_limited(key)
                self._count("error", started)
                log.warning(
                    "reconcile failed, retrying",
                    extra={"fields": {"trainjob": "/".join(key), "error": _describe(err),
                                      "retry_in": round(delay, 3)}},
                )  # fmt: skip
                continue
            queue.done(key)
            queue.forget(key)
            self._publish()
            if result.requeue_after is not None:
                queue.add_after(key, result.requeue_after)
                self._count("requeue_after", started)
            else:
                self._count("success", started)
            # A pass that wrote nothing never awaited: without this, one worker would drain a
            # whole resync while the webhooks, probes and Lease renewals on this loop wait.
            await asyncio.sleep(0)

    # --- one pass ------------------------------------------------------------------------------

    async def reconcile(self, key: Key) -> Result:
        changes = Changes()
        try:
            result = await self._reconcile(key, changes)
        finally:  # also after a failure part way: what was done is told
            changes.record(self.events)
            if changes.dropped is None:  # no gang objects looked at: none lack a field
                self.dropped.pop(key, None)
        if result.wait:
            waited = self._waits.get(key, 0)
            self._waits[key] = waited + 1
            delay = self.settings.wait_retry * 2.0 ** min(waited, 32)
            result = Result(min(self.settings.wait_max, delay))
        else:
            self._waits.pop(key, None)
        if self.status is not None:
            again = await self.status.sync(key, changes.outcome)
            if again is not None and (result.requeue_after is None or again < result.requeue_after):
                result = Result(again)  # a condition write put off: look again then
        return result

    async def _reconcile(self, key: Key, changes: Changes) -> Result:
        namespace, name = key
        entry = self.cache.trainjobs.get(namespace, name)
        if entry is None:
            self._forget(key)
            return DONE  # deleted: garbage collection removes what it owned
        raw = entry.raw
        trainjob, _ = parse(TrainJob, raw)
        if trainjob is None or not trainjob.metadata.uid:
            log.warning("TrainJob does not parse", extra={"fields": {"trainjob": "/".join(key)}})
            return DONE
        if not self._known_everywhere():
            # An API just served (discovery): until its watches have listed, the cache cannot
            # tell what exists, and every create (or removal) would be a guess.
            return WAIT
        if _meta(raw).get("deletionTimestamp"):
            # Being deleted (a foreground delete, another controller's finalizer): nothing is
            # made for it; the garbage collector removes what it owns.
            note = "the TrainJob is being deleted: no gang objects are made for it"
            _blocked(changes, self.events, raw, "TrainJobDeleting", note)
            return DONE
        if runs_elsewhere(trainjob):
            return await self._elsewhere(key, raw, trainjob, changes)
        frozen = self._frozen(key, raw, trainjob.metadata.uid)
        read = self.cache.snapshot_runtime(frozen) if frozen is not None else None
        if frozen is not None and read is None:
            # Written by a newer release (a rollback), or not readable: this release would
            # guess. Hands off: nothing made, changed or removed; its pods are held.
            newer = newer_version(frozen)
            if newer is not None:
                note = (
                    f"its plan was frozen by a newer release of this service (plan version "
                    f"{newer}; this release knows up to {PLAN_VERSION}): its gang objects are "
                    "left as they are and its pods are held; run the newer release"
                )
                _blocked(changes, self.events, raw, "PlanVersionUnknown", note)
            else:
                note = "its runtime snapshot does not parse: its gang objects are left alone"
                _blocked(changes, self.events, raw, "InvalidSnapshot", note)
            return DONE
        no_gang = no_gang_reason(trainjob)
        plan: Plan | None = None
        if read is None:
            if is_finished(trainjob) and not self._owned(trainjob.metadata.uid):
                return DONE  # finished before we ever saw it: nothing to make or remove
            # Suspended ones too (Kueue creates TrainJobs suspended): the runtime is frozen when
            # the TrainJob is new, not when quota lets it run.
            taken = await self._take_snapshot(key, raw, trainjob, changes)
            if isinstance(taken, Result):
                return taken
            runtime, plan = taken
            try:
                plan = plan or build_plan(trainjob, runtime)
            except PlanningError as err:
                note = f"cannot plan its gang: {err.errors[0]}"
                _blocked(changes, self.events, raw, "InvalidScheduling", note)
                return DONE
        else:
            version, frozen_runtime = read
            if frozen_runtime is None:  # it started without a gang: it keeps none
                return await self._remove_all(raw, "it started without a gang", False, changes)
            runtime = frozen_runtime
            try:
                plan = build_plan(trainjob, runtime, version)
            except PlanningError as err:
                note = f"cannot plan its gang: {err.errors[0]}"
                _blocked(changes, self.events, raw, "InvalidScheduling", note)
                return DONE
        if plan is not None and no_gang is not None:
            changes.outcome = Outcome(lifecycle_of(trainjob))
        if plan is None or no_gang is not None:
            why = no_gang or "the runtime has no spec.scheduling"
            return await self._remove_all(raw, why, False, changes)
        attempt = self._attempt(key, trainjob.metadata.uid)
        if attempt is None:
            return WAIT  # the JobSets are not listed yet: which attempt is current is not known
        in_use = self._groups_in_use(key)
        plan = plan.at_attempt(attempt)
        backend = self._backend(key, raw, plan, changes)
        if backend is None:
            if self.backends.for_plan(plan) is None:
                return await self._remove_all(
                    raw, "no gang backend serves its scheduler", False, changes
                )
            return DONE  # its API is not served: discovery resyncs every TrainJob once it is
        foreign = self.cache.foreign(backend, plan.trainjob_uid)
        self._track(self.stood_down, key, foreign is not None)
        if foreign is not None:
            kind, obj = foreign
            note = (
                f"{kind.kind} {_meta(obj).get('name')!r} for this TrainJob was made by another "
                "controller: this service stands down (it creates nothing and ties no pod)"
            )
            _blocked(changes, self.events, raw, "StandingDown", note)
            return DONE
        changes.outcome = Outcome(plan=plan, backend=backend, trainjob=trainjob, runtime=runtime)
        changes.dropped = set()
        try:
            return await self._converge(raw, plan, backend, changes, in_use)
        finally:
            self._say_dropped(key, raw, changes)

    async def _elsewhere(
        self, key: Key, raw: JsonObject, trainjob: TrainJob, changes: Changes
    ) -> Result:
        """A TrainJob MultiKueue dispatches: no snapshot and no gang here. Kueue copies its
        annotations onto the worker cluster's copy, and a worker running this service denies a
        CREATE that carries a snapshot from anyone but itself: a snapshot here would stop the
        dispatch. One an earlier release froze is removed (the uid in the patch keeps it off a
        TrainJob recreated under the name)."""
        changes.outcome = Outcome(lifecycle_of(trainjob))  # says nothing: the worker's copy does
        assert trainjob.metadata.uid is not None
        if snapshot_of(raw) is not None:
            try:
                await self.writer.remove_snapshot(
                    *key, trainjob.metadata.uid, _meta(raw).get("resourceVersion")
                )
            except ApiException as err:
                if err.status in (404, 409, 422):  # gone, or another TrainJob now has the name
                    return WAIT
                raise
            log.info(
                "runtime snapshot removed from a TrainJob MultiKueue dispatches",
                extra={"fields": {"trainjob": "/".join(key)}},
            )
        why = "the TrainJob runs on a MultiKueue worker cluster"
        return await self._remove_all(raw, why, False, changes)

    def _backend(
        self, key: Key, raw: JsonObject, plan: Plan, changes: Changes
    ) -> GangBackend | None:
        """The backend whose objects the plan needs, if it can have them now (else an Event
        says why, once, and the TrainJob is counted as waiting for that backend's API)."""
        backend = self.backends.for_plan(plan)
        if backend is None:
            note = (
                f"its pods name the scheduler {plan.scheduler_name!r}, which no gang backend "
                "here serves (see the --*-schedulers flags): it gets no gang"
            )
            _blocked(changes, self.events, raw, "NoGangBackend", note)
            return None
        waiting = self.without_backend.setdefault(backend.name, set())
        self._track(waiting, key, self.cache.api(backend) != "served")
        if key in waiting:
            version = backend.kinds[0].group_version
            note = (
                f"its pods name the scheduler {plan.scheduler_name!r}, whose API ({version}) "
                f"the cluster does not serve: no {backend.name} gang until it does"
            )
            _blocked(changes, self.events, raw, "GangBackendUnavailable", note)
            return None
        return backend

    def _known_everywhere(self) -> bool:
        """Every served backend's objects have been listed."""
        return all(
            self.cache.backend_ready(b)
            for b in self.backends.backends
            if self.cache.api(b) == "served"
        )

    @staticmethod
    def _track(keys: set[Key], key: Key, present: bool) -> None:
        if present:
            keys.add(key)
        else:
            keys.discard(key)

    def _forget(self, key: Key) -> None:
        self._snapshots.pop(key, None)
        self._waits.pop(key, None)
        self.stood_down.discard(key)
        self.dropped.pop(key, None)
        self._dropped_said.pop(key, None)
        for keys in self.without_backend.values():
            keys.discard(key)
        if self.status is not None:
            self.status.forget(key)

    def _frozen(self, key: Key, raw: JsonObject, uid: str) -> str | None:
        """The TrainJob's runtime snapshot: in the cache, or written by this service and not yet
        back through the watch (a pass woken by its own creates must not write it again)."""
        frozen = snapshot_of(raw)
        written = self._snapshots.get(key)
        if written is None:
            return frozen
        written_uid, at, text = written
        if frozen is not None or written_uid != uid or self.clock() - at > EXPECTATION_TTL:
            del self._snapshots[key]
            return frozen
        return text

    async def _take_snapshot(
        self, key: Key, raw: JsonObject, trainjob: TrainJob, changes: Changes
    ) -> tuple[CheckedRuntime, Plan | None] | Result:
        """Freezes the runtime into the TrainJob, and its plan (None when it cannot be planned:
        planned again to say why); a Result when there is nothing to do yet."""
        kind, ref = trainjob.runtime_kind, trainjob.spec.runtime_ref.name or ""
        checked = self.cache.runtime(kind, trainjob.namespace, ref)
        runtime_key = (kind, trainjob.namespace if kind == "TrainingRuntime" else "", ref)
        if checked is None or checked.layout is None or not checked.verdict.allowed:
            # A runtime change looks again: also for one without spec.scheduling, whose
            # TrainJob's pods the pod webhook holds as soon as the runtime gains it.
            self._waiting.setdefault(runtime_key, set()).add(key)
            if checked is None:
                note = f'{kind} "{ref}" not found; waiting for it'
                _blocked(changes, self.events, raw, "RuntimeNotFound", note)
            elif checked.layout is not None:
                note = f"{kind} {ref!r} is invalid: {checked.verdict.errors[0]}"
                _blocked(changes, self.events, raw, "InvalidRuntime", note)
            return DONE  # no spec.scheduling: not ours
        try:
            plan = build_plan(trainjob, checked)
        except PlanningError:
            plan = None  # said after the snapshot, from the frozen runtime
        untied = self._untied_pods(key, plan, checked.layout)
        if untied is None:
            return WAIT  # the pod watch has not listed: whether pods run loose is not known
        if untied:
            if self._age(raw) < PREDECESSOR_GRACE:
                # Pods of the name without a group may still be an earlier TrainJob's (deleted,
                # and its pods not yet reached by the garbage collector): look again.
                return WAIT
            # Its pods already run without a group (its runtime gained spec.scheduling while it
            # ran): a gang now would half-group it and hold its new pods for ever. Freeze "no
            # gang", as KEP-5547 does for a Job with pods (MixedSchedulingGroup).
            return await self._freeze_no_gang(key, raw, trainjob, untied, changes)
        # Frozen even when its backend's API is not served (yet): the pod webhook holds its
        # pods with that reason, and the gang is made once the API is there.
        assert trainjob.metadata.uid is not None
        namespace, name = key
        text = snapshot(checked.runtime)
        try:
            await self.writer.snapshot_runtime(
                namespace, name, trainjob.metadata.uid, text, _meta(raw).get("resourceVersion")
            )
        except ApiException as err:
            if err.status in (404, 409, 422):  # gone, or another TrainJob now has the name
                return WAIT
            raise
        self._snapshots[key] = (trainjob.metadata.uid, self.clock(), text)
        log.info(
            "runtime snapshot written",
            extra={"fields": {"trainjob": "/".join(key), "runtime": f"{kind}/{ref}"}},
        )
        return checked, plan

    async def _freeze_no_gang(
        self, key: Key, raw: JsonObject, trainjob: TrainJob, untied: int, changes: Changes
    ) -> Result:
        assert trainjob.metadata.uid is not None
        text = snapshot(None)
        try:
            await self.writer.snapshot_runtime(
                *key, trainjob.metadata.uid, text, _meta(raw).get("resourceVersion")
            )
        except ApiException as err:
            if err.status in (404, 409, 422):  # gone, or another TrainJob now has the name
                return WAIT
            raise
        self._snapshots[key] = (trainjob.metadata.uid, self.clock(), text)
        note = (
            f"{untied} of its pods already run without a group: it keeps running without a "
            "gang (a gang now would hold its next pods for ever)"
        )
        changes.warn(self.events, raw, "MixedSchedulingGroup", "Reconcile", note)
        return DONE

    def _age(self, raw: JsonObject) -> float:
        """Seconds since the TrainJob was created (its creationTimestamp, by the wall clock)."""
        created = _meta(raw).get("creationTimestamp")
        try:
            when = datetime.fromisoformat(str(created).replace("Z", "+00:00")).timestamp()
        except ValueError:
            return PREDECESSOR_GRACE  # no readable time: as old as the grace
        return self.wall() - when

    def _untied_pods(self, key: Key, plan: Plan | None, layout: Layout | None = None) -> int | None:
        """The TrainJob's pending or running pods without a scheduling group, of the Jobs its
        plan groups (an untargeted ReplicatedJob's rightly have none), or, when it does not
        plan, its runtime's layout does; None while the pod watch has not listed. Without a pod
        watch (a reconciler built without the status writer, in tests) no pods are known."""
        pods = self._pods
        if pods is None:
            return 0
        if not pods.synced:
            return None
        if plan is not None:
            return pods.untied(*key, lambda rj, index: plan.group_for(rj, index) is not None)
        if layout is not None:
            groups = layout.groups
            return pods.untied(
                *key,
                lambda rj, index: any(
                    rj in g.targets and g.job_index in (None, index) for g in groups
                ),
            )
        return pods.untied(*key)

    def _has_pods(self, key: Key) -> bool | None:
        """Whether the TrainJob has pods that are pending or running (None: not known yet)."""
        pods = self._pods
        if pods is None:
            return False
        if not pods.synced:
            return None
        return any(job.counts[PENDING] or job.counts[LIVE] for job in pods.jobs(*key).values())

    def _attempt(self, key: Key, uid: str | None) -> int | None:
        """The TrainJob's JobSet restart attempt, from its JobSet (never from pod labels, which
        anyone who may create a pod can write); 0 while the JobSet of its name is an earlier
        TrainJob's; None until the JobSets are listed."""
        if not self.cache.jobsets.synced:
            return None
        found = self.cache.restart_attempt(*key, uid)
        return 0 if found is None else found

    def _groups_in_use(self, key: Key) -> frozenset[str] | None:
        """The groups the TrainJob's pending or live pods name: never deleted under them, of
        any restart attempt or run (a restart's old pods end in their own time; a suspend and
        resume that the JobSet never saw leaves the old run's pods running). None until the
        pod watch has listed (a new leader must not take "no pods seen" for "none": nothing
        stale is deleted meanwhile, what the plan wants is still made)."""
        pods = self._pods
        if pods is None:
            return frozenset()
        return pods.groups_in_use(*key) if pods.synced else None

    async def _converge(
        self,
        trainjob: JsonObject,
        plan: Plan,
        backend: GangBackend,
        changes: Changes,
        in_use: frozenset[str] | None = frozenset(),
    ) -> Result:
        """Creates what is missing (parents first), repairs drift, and removes what this
        TrainJob no longer needs, of any backend (children first)."""
        uid = plan.trainjob_uid
        context = Context.of(trainjob)
        if not expresses(backend, plan):  # admission denies this; a runtime edited since may not
            note = (
                f"its runtime combines levels into a tree of groups of groups, which the "
                f"{backend.name} gang backend cannot express: no gang"
            )
            _blocked(changes, self.events, trainjob, "GangKindUnavailable", note)
            return DONE
        kind = self.cache.missing_kind(backend, plan)
        if kind is not None:
            if self.cache.kind_states.get(kind) != "not-served":
                return WAIT  # discovery has not said yet
            note = (
                f"its plan needs {kind.kind}s, which the cluster does not serve "
                f"({kind.group_version}: is the feature gate on?): no gang until it does"
            )
            _blocked(changes, self.events, trainjob, "GangKindUnavailable", note)
            return DONE  # discovery looks at every TrainJob again once they are served
        # Children point at their parents' uids: those stored now, and rendered again only
        # when a parent stored during this pass changes them (the first pass's creates).
        stored_uids = {
            (kind.kind, name): obj_uid
            for kind in backend.kinds
            for obj in self.cache.owned(kind, uid)
            if isinstance(name := _meta(obj).get("name"), str)
            and isinstance(obj_uid := _meta(obj).get("uid"), str)
        }
        rendered, rendered_for = backend.render(plan, context, stored_uids), dict(stored_uids)
        wanted: set[tuple[Kind, str]] = set()
        for kind in backend.kinds:
            if stored_uids != rendered_for:
                rendered, rendered_for = (
                    backend.render(plan, context, stored_uids),
                    dict(stored_uids),
                )
            for desired in rendered:
                if desired.get("kind") != kind.kind:
                    continue
                name = desired["metadata"]["name"]
                wanted.add((kind, name))
                stored = self._stored(kind, plan.namespace, name)
                if stored is None:
                    try:
                        stored = await self._create(trainjob, kind, desired, changes)
                    except ApiException as err:
                        if _namespace_terminating(err):
                            return DONE  # nothing can be made there again: no Event, no retry
                        if err.status not in (400, 403, 422):
                            raise
                        # Refused as it is (another scheduler's webhook: a closed queue, a
                        # quota): say why, and try again later rather than in a tight loop.
                        note = f"the API server refused {kind.kind} {name!r}: {_reason(err)}"
                        _blocked(changes, self.events, trainjob, "Refused", note, "Create")
                        return Result(self.settings.conflict_retry)
                    if stored is None:
                        return WAIT
                    self._saw(changes, kind, desired, stored, backend.drift(desired, stored))
                else:
                    wait = self._check_ours(trainjob, kind, stored, uid, changes)
                    if wait is not None:
                        return wait
                    drift = backend.drift(desired, stored)
                    self._saw(changes, kind, desired, stored, drift)
                    outcome = await self._apply_drift(trainjob, kind, stored, drift, changes)
                    if outcome is not None:
                        return outcome
                stored_uid = _meta(stored).get("uid")
                if isinstance(stored_uid, str):
                    stored_uids[(kind.kind, name)] = stored_uid
        kept = False  # a group of another attempt or run still in use: its parents stay too
        for kind in reversed(self.kinds):  # children first
            for stale in self._deepest_first(kind, self.cache.owned(kind, uid)):
                name = _meta(stale).get("name")
                if not is_managed(stale) or (kind, name) in wanted:
                    continue
                # Pods unknown (the pod watch has not listed): nothing stale is deleted yet.
                if in_use is None or name in in_use or (kept and self._is_parent(kind)):
                    kept = True
                    continue
                await self._delete(trainjob, kind, stale, "no longer in the plan", changes)
        return DONE

    def _is_parent(self, kind: Kind) -> bool:
        """Whether objects of `kind` hold others (a backend's kinds but its last, the PodGroups
        pods name)."""
        backend = self.backends.of_kind(kind)
        return backend is not None and kind != backend.kinds[-1]

    @property
    def kinds(self) -> tuple[Kind, ...]:
        """Every backend's kinds, each parents first, in the versions discovery chose now."""
        return self.backends.kinds

    def _deepest_first(self, kind: Kind, objs: list[JsonObject]) -> list[JsonObject]:
        """Children before parents within a kind (a tree's composites)."""
        backend = self.backends.of_kind(kind)
        if backend is None:
            return objs
        return sorted(objs, key=lambda obj: -backend.depth(kind, obj))

    def _check_ours(
        self,
        trainjob: JsonObject,
        kind: Kind,
        stored: JsonObject,
        uid: str | None,
        changes: Changes,
    ) -> Result | None:
        """None when `stored` is ours and settled; else when to look again."""
        meta = _meta(stored)
        owner = controller_ref(stored)
        if (
            owner is not None
            and is_trainjob_ref(owner)
            and owner.get("name") == _meta(trainjob).get("name")
            and owner.get("uid") != uid
        ):
            # Left by an earlier TrainJob of the same name: the garbage collector removes it.
            return WAIT
        if not controlled_by(stored, uid) or not is_managed(stored):
            note = (
                f"{kind.kind} {meta.get('name')!r} exists and was not made by this service for "
                "this TrainJob; leaving it alone (delete it to let this TrainJob have its gang)"
            )
            _blocked(changes, self.events, trainjob, "Conflict", note)
            return Result(self.settings.conflict_retry)
        if meta.get("deletionTimestamp") or meta.get("uid") in self._deleted:
            # Going away: made again once it has gone. A PodGroup stays Terminating while pods
            # name it (scheduling.k8s.io/podgroup-protection), as long as their grace period.
            note = (
                f"{kind.kind} {meta.get('name')!r} of an earlier gang of this TrainJob is still "
                "being deleted (its pods are terminating); it is made again once it is gone"
            )
            _blocked(changes, self.events, trainjob, "PodGroupCleanupBlocked", note)
            return WAIT
        return None

    async def _apply_drift(
        self, trainjob: JsonObject, kind: Kind, stored: JsonObject, drift: Drift, changes: Changes
    ) -> Result | None:
        meta = _meta(stored)
        if drift.kind == "patch":
            try:
                await self.writer.json_patch(
                    kind, meta["namespace"], meta["name"], list(drift.patch)
                )
            except ApiException as err:
                if err.status in (404, 409, 422):  # changed or gone meanwhile: look again
                    return WAIT
                raise
            note = f"{kind.kind} {meta['name']!r} updated in place: {drift.reason}"
            changes.add(trainjob, "Updated", "Update", note)
        elif drift.kind == "recreate":
            key = (meta.get("namespace", ""), _meta(trainjob).get("name", ""))
            in_use = self._has_pods(key)
            if in_use is None:
                return WAIT  # the pod watch has not listed: whether pods use it is not known
            if in_use:
                # Never tear down a gang its pods use (LWS, KEP-5547): say so, and leave it.
                note = (
                    f"{kind.kind} {meta.get('name')!r} differs from the plan ({drift.reason}) "
                    "but the TrainJob's pods use it: not recreated while they run"
                )
                _blocked(changes, self.events, trainjob, "DriftHeld", note)
                return DONE
            why = f"{kind.kind} drifted: {drift.reason}"
            return await self._remove_all(trainjob, why, True, changes)
        return None

    async def _remove_all(
        self, trainjob: JsonObject, why: str, recreate: bool, changes: Changes
    ) -> Result:
        """Children first, then parents (rule 8(e)), of every backend; only objects this
        service made for this TrainJob. With `recreate`, look again once they are gone."""
        uid = _meta(trainjob).get("uid")
        removed = False
        for kind in reversed(self.kinds):
            owned = self.cache.owned(kind, uid if isinstance(uid, str) else None)
            for obj in self._deepest_first(kind, owned):
                if is_managed(obj) and _meta(obj).get("uid") not in self._deleted:
                    await self._delete(trainjob, kind, obj, why, changes)
                    removed = True
        return WAIT if removed and recreate else DONE

    async def _create(
        self, trainjob: JsonObject, kind: Kind, obj: JsonObject, changes: Changes
    ) -> JsonObject | None:
        """Creates `obj`; None when its name is taken (the cache will tell by whom)."""
        try:
            created: JsonObject = await self.writer.create(kind, obj)
        except ApiException as err:
            if err.status == 409:  # AlreadyExists: the cache has not seen it yet, or a foreign one
                return None
            raise
        meta = obj["metadata"]
        if self._stored(kind, meta["namespace"], meta["name"]) is None:
            # Until the watch brings it (if it already has, there is nothing to remember).
            self._created[(kind, meta["namespace"], meta["name"])] = (self.clock(), created)
        changes.add(trainjob, "Created", "Create", f"created {kind.kind} {meta['name']!r}")
        return created

    async def _delete(
        self, trainjob: JsonObject, kind: Kind, obj: JsonObject, why: str, changes: Changes
    ) -> None:
        meta = _meta(obj)
        uid = meta.get("uid")
        try:
            await self.writer.delete(kind, meta["namespace"], meta["name"], uid)
        except ApiException as err:
            if err.status not in (404, 409):  # gone already, or replaced by a newer object
                raise
            return  # its DELETED event has come or will: nothing to wait for
        if isinstance(uid, str):
            self._deleted.add(uid)
        changes.add(trainjob, "Deleted", "Delete", f"deleted {kind.kind} {meta['name']!r}: {why}")

    def _stored(self, kind: Kind, namespace: str, name: str) -> JsonObject | None:
        entry = self.cache.store(kind).get(namespace, name)
        if entry is not None:
            return entry.raw
        created = self._created.get((kind, namespace, name))
        if created is None:
            return None
        if self.clock() - created[0] > EXPECTATION_TTL:
            # Its ADDED event never came (deleted again inside a watch gap): stop believing it.
            del self._created[(kind, namespace, name)]
            return None
        return created[1]

    def _owned(self, uid: str) -> bool:
        return any(self.cache.owned(kind, uid) for kind in self.kinds)

    def _saw(
        self, changes: Changes, kind: Kind, desired: JsonObject, stored: JsonObject, drift: Drift
    ) -> None:
        """What the API server stored of one of this TrainJob's gang objects: the fields it
        dropped (a feature gate is off), and, for an object that asked for a topology
        constraint, whether it kept it: for the TrainJob's condition, and as evidence for the
        whole cluster (`kube/constraints.py`), dated by the object's creation."""
        _collect_dropped(changes, kind, drift)
        if drift.kind == "recreate" or not sets_constraint(desired):
            return  # (a recreate's comparison stopped at the first difference)
        kept = all(name != CONSTRAINT for name, _ in drift.dropped)
        outcome = changes.outcome
        if outcome is not None:
            was = outcome.topology_kept
            outcome.topology_kept = kept if was is None else was and kept
        meta = _meta(stored)
        self.cache.topology.observe(
            kept,
            created_at(stored) or self.wall(),
            f"{kind.kind} {meta.get('namespace')}/{meta.get('name')} as stored",
        )

    def _say_dropped(self, key: Key, trainjob: JsonObject, changes: Changes) -> None:
        """What the API server dropped from this TrainJob's gang objects: in its condition on
        every pass (it stays so), in one Warning Event per field it had not said yet for this
        TrainJob, and in the log once per kind and field for the whole cluster."""
        found = frozenset(changes.dropped or ())
        if found:
            self.dropped[key] = found
        else:
            self.dropped.pop(key, None)
        if not found:
            return
        note = dropped_note(found)
        if changes.outcome is not None:
            changes.outcome.dropped = note
        said = self._dropped_said.get(key, frozenset())
        if not found <= said:
            self._dropped_said[key] = said | found
            changes.warn(self.events, trainjob, "FeatureGateOff", "Reconcile", note)
        for item in sorted(found - self._dropped_logged):
            self._dropped_logged.add(item)
            kind, name, gate = item
            log.warning(
                "the API server drops a field of the gang objects: a feature gate is off",
                extra={"fields": {"kind": kind, "field": name, "gate": gate,
                                  "trainjob": "/".join(key)}},
            )  # fmt: skip

    # --- what puts keys on the queue -----------------------------------------------------------

    def _trainjob_changed(
        self, event: EventType, old: JsonObject | None, new: JsonObject | None
    ) -> None:
        key = key_of(new or old or {})
        if key is not None and self.queue is not None:
            self.queue.add(key)

    def _owned_changed(
        self, kind: Kind, event: EventType, old: JsonObject | None, new: JsonObject | None
    ) -> None:
        obj = new or old or {}
        meta = _meta(obj)
        self._created.pop((kind, meta.get("namespace", ""), meta.get("name", "")), None)
        uid = meta.get("uid", "")
        ours = uid in self._deleted
        if event == "DELETED":
            self._deleted.discard(uid)
        # A PodGroup deleted by someone else first only gets a deletionTimestamp (its
        # protection finalizer waits for its pods): as good as gone for what to do next.
        going = event == "DELETED" or (
            event == "MODIFIED"
            and bool(meta.get("deletionTimestamp"))
            and not _meta(old or {}).get("deletionTimestamp")
        )
        owner = controller_ref(obj)
        if owner is None or not is_trainjob_ref(owner) or self.queue is None:
            return
        namespace, name = meta.get("namespace"), owner.get("name")
        if not isinstance(namespace, str) or not isinstance(name, str):
            return
        if going and not ours:
            # Deleted by someone else: most often the garbage collector, because the TrainJob
            # is gone and its own DELETED event is still on the way. Look again a little later
            # rather than recreate for a TrainJob that no longer exists.
            self.queue.add_after((namespace, name), self.settings.gc_grace)
        else:
            self.queue.add((namespace, name))

    def _jobset_changed(
        self, event: EventType, old: JsonObject | None, new: JsonObject | None
    ) -> None:
        """A JobSet restart (status.restarts) is a new gang: made before its pods come."""
        was, now = (o.get("status") if o else None for o in (old, new))
        if was != now or event != "MODIFIED":
            key = key_of(new or old or {})
            if key is not None and self.queue is not None:
                self.queue.add(key)

    def _pods_changed(self, namespace: str, jobset: str) -> None:
        """A Job's live pods changed: its TrainJob's gang health is judged again (the queue
        holds a key once, so a burst of pod events costs one pass per TrainJob)."""
        if self.queue is not None and self.cache.trainjobs.get(namespace, jobset) is not None:
            self.queue.add((namespace, jobset))

    def _runtime_changed(
        self, event: EventType, old: JsonObject | None, new: JsonObject | None
    ) -> None:
        obj = new or old or {}
        meta = _meta(obj)
        runtime_key = (obj.get("kind", ""), meta.get("namespace") or "", meta.get("name", ""))
        for key in self._waiting.pop(runtime_key, ()):
            if self.queue is not None:
                self.queue.add(key)

    # --- metrics -------------------------------------------------------------------------------

    def _queue_metrics(self) -> QueueMetrics | None:
        m = self.metrics
        if m is None:
            return None
        labels = {"name": CONTROLLER, "controller": CONTROLLER}
        return QueueMetrics(
            depth=m.workqueue_depth.labels(**labels),
            adds=m.workqueue_adds.labels(**labels),
            queue_duration=m.workqueue_queue_duration.labels(**labels),
            work_duration=m.workqueue_work_duration.labels(**labels),
            unfinished_work=m.workqueue_unfinished_work.labels(**labels),
            longest_running=m.workqueue_longest_running.labels(**labels),
            retries=m.workqueue_retries.labels(**labels),
        )

    def _publish(self) -> None:
        """The TrainJobs without a gang for a reason outside this service, as gauges."""
        m = self.metrics
        if m is None:
            return
        m.trainjobs_stood_down.set(len(self.stood_down))
        counts: dict[Dropped, int] = {}
        for found in self.dropped.values():
            for item in found:
                counts[item] = counts.get(item, 0) + 1
        self._dropped_series |= set(counts)
        for kind, name, gate in self._dropped_series:  # a series once seen goes back to 0
            m.gang_fields_dropped.labels(kind=kind, field=name, gate=gate).set(
                counts.get((kind, name, gate), 0)
            )
        for name in self.backends.names:
            m.trainjobs_without_backend.labels(backend=name).set(
                len(self.without_backend.get(name, ()))
            )

    def _count(self, result: str, started: float) -> None:
        m = self.metrics
        if m is None:
            return
        m.reconcile_total.labels(controller=CONTROLLER, result=result).inc()
        m.reconcile_time.labels(controller=CONTROLLER).observe(self.clock() - started)
        if result == "error":
            m.reconcile_errors.labels(controller=CONTROLLER).inc()


def _collect_dropped(changes: Changes, kind: Kind, drift: Drift) -> None:
    if changes.dropped is not None:
        changes.dropped.update((kind.kind, name, gate) for name, gate in drift.dropped)


def dropped_note(found: frozenset[Dropped]) -> str:
    """What the API server dropped, by field: its gate, and the kinds it was dropped from."""
    by_field: dict[tuple[str, str], list[str]] = {}
    for kind, name, gate in sorted(found):
        by_field.setdefault((name, gate), []).append(kind)
    said = [
        f"{name} from its {' and '.join(kinds)}"
        + (" (feature gate unknown)" if gate == UNKNOWN_GATE else f" (feature gate {gate} is off)")
        for (name, gate), kinds in by_field.items()
    ]
    return (
        f"the API server dropped {'; '.join(said)}: its gang is made without "
        f"{'them' if len(said) > 1 else 'it'}; turn the gate on in kube-apiserver and "
        "kube-scheduler to have it"
    )


def _blocked(
    changes: Changes,
    events: EventRecorder,
    trainjob: JsonObject,
    reason: str,
    note: str,
    action: str = "Reconcile",
) -> None:
    """A Warning Event for what keeps the TrainJob from its gang, which its condition says too."""
    changes.warn(events, trainjob, reason, action, note)
    changes.outcome = Outcome(blocker=(reason, note))


def _meta(obj: JsonObject) -> JsonObject:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _namespace_terminating(err: ApiException) -> bool:
    """A 403 for a create in a namespace being deleted (the NamespaceLifecycle plugin)."""
    if err.status != 403:
        return False
    cause = "NamespaceTerminating"
    return cause in str(err.body or "") or "because it is being terminated" in status_message(err)


def _describe(err: BaseException) -> str:
    if isinstance(err, ApiException):
        return f"HTTP {err.status}: {err.reason}"
    return f"{type(err).__name__}: {err}"[:300]


def _reason(err: ApiException) -> str:
    """The message of the Status an API error carries, else its HTTP reason (cut short)."""
    return (status_message(err) or f"HTTP {err.status} {err.reason}")[:300]

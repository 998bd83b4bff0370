"""One handler per webhook: (review, cache) -> decision. No I/O: the cache is in memory.

Mutations diff the raw request object against a mutated copy of itself (`jsonpatch`), except on
the pod path, which builds its one-operation patch directly (tests prove it equal to jsonpatch's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import jsonpatch

from ..backends.base import (
    Context,
    Defaulting,
    GangBackend,
    Kind,
    TiesJobs,
    add_to_map,
    api_versions,
    composite_kind,
    expresses,
    is_managed,
)
from ..backends.native import scheduling_group_of
from ..core import defaults, kueue, overcommit
from ..core import errors as fe
from ..core.defaults import GANG_LABEL
from ..core.errors import FieldError, Path
from ..core.fields import parse
from ..core.layout import is_multi_level
from ..core.lifecycle import gang_exists, runs_elsewhere
from ..core.ownership import (
    controlled_by,
    controller_ref,
    controller_uid,
    controlling_trainjob,
    is_trainjob_ref,
)
from ..core.plan import (
    JOB_INDEX,
    JOBSET_NAME,
    REPLICATED_JOB_NAME,
    RESTART_ATTEMPT,
    GroupPlan,
    Plan,
    PlanningError,
    attempt_of,
    build_plan,
    group_for_labels,
)
from ..core.snapshot import SNAPSHOT_ANNOTATION, snapshot, snapshot_of
from ..core.trainer import DEFAULT_SCHEDULER, Runtime, TrainJob
from ..core.validation import (
    CheckedRuntime,
    Verdict,
    check_stored_runtime,
    check_trainjob,
    judge_runtime,
    runtime_layout,
)
from ..kube.cache import Cache, PlanLookup
from ..kube.waker import HeldPod
from .feasibility import feasibility_verdict
from .review import MAX_WARNING, Decision, Review
from .snapshot_guard import guard_snapshot

Handler = Callable[[Review, Cache], Decision | Awaitable[Decision]]
WRITES = ("CREATE", "UPDATE")


def _skips(review: Review) -> bool:
    """DELETE, CONNECT and subresources (status) carry nothing these webhooks judge."""
    return review.operation not in WRITES or bool(review.sub_resource)


def denied(review: Review, errors: Sequence[FieldError], warnings: Sequence[str] = ()) -> Decision:
    """A 422 Invalid worded the way the API server words its own (`Kind.group "name" is ...`)."""
    qualified = f"{review.kind}.{review.group}" if review.group else review.kind
    name = review.object_name
    return Decision(
        allowed=False,
        warnings=list(warnings),
        code=422,
        reason="Invalid",
        message=fe.render(qualified, name, errors),
        details={
            "name": name,
            "group": review.group,
            "kind": review.kind,
            "causes": [
                {"reason": e.type.reason, "message": e.body, "field": e.path}
                for e in fe.shown(errors)[0]
            ],
        },
    )


def _diff(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]] | None:
    """jsonpatch's diff of the raw object and its mutated copy.

    The defaults copy only what they change, so every subtree the two share is the same object;
    jsonpatch would still walk each one (recursing as deep as the object is nested), so shared
    subtrees are first replaced by one stand-in: the diff then sees just the changed spine.
    """
    ops: list[dict[str, Any]] = jsonpatch.make_patch(*_prune(before, after)).patch
    return ops or None


_SHARED = 0  # stands in for a subtree both sides share


def _prune(before: Any, after: Any) -> tuple[Any, Any]:
    if before is after:
        return _SHARED, _SHARED
    if isinstance(before, dict) and isinstance(after, dict):
        b: dict[str, Any] = {}
        a: dict[str, Any] = {}
        for key, value in before.items():
            if key in after:
                b[key], a[key] = _prune(value, after[key])
            else:
                b[key] = value
        for key, value in after.items():
            if key not in before:
                a[key] = value
        return b, a
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        pairs = [_prune(x, y) for x, y in zip(before, after, strict=True)]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    return before, after


# --- runtimes ----------------------------------------------------------------------------------


def _schedules(review: Review) -> bool:
    """Whether the runtime (or the one an update replaces) has spec.scheduling: a runtime that
    never had is no gang's, and the runtime webhooks leave it alone (the chart's matchConditions
    do not even send it)."""
    old = review.old_object if review.operation == "UPDATE" else None
    return any(
        isinstance(spec := (o or {}).get("spec"), dict) and spec.get("scheduling") is not None
        for o in (review.object, old)
    )


def validate_runtime_review(review: Review, cache: Cache) -> Decision:
    if _skips(review) or not _schedules(review):
        return Decision()
    assert review.object is not None
    new, old = review.object, review.old_object if review.operation == "UPDATE" else None
    # Worked out once per content: the same version comes again (dry run, then the apply).
    verdict, tree_scheduler = cache.runtime_verdicts.get(
        lambda: _judge_runtime(new, old), new, old, keep=_small
    )
    if not verdict.allowed:
        return denied(review, verdict.errors, verdict.warnings)
    if tree_scheduler is not None:  # what the cluster serves may change: asked every time
        errors = tree_errors(cache.backends.for_scheduler(tree_scheduler), cache)
        if errors:
            return denied(review, errors, verdict.warnings)
    return Decision(warnings=list(verdict.warnings))


def _small(judged: tuple[Verdict, str | None]) -> bool:
    """A verdict worth remembering: a denial or warnings may quote what a tenant wrote, and 256
    of them must stay small (the usual verdict has no error and a warning or two)."""
    verdict = judged[0]
    said = [*map(str, verdict.errors), *verdict.warnings]
    return len(said) <= 16 and sum(map(len, said)) <= 4096


def _judge_runtime(
    new: Mapping[str, Any], old: Mapping[str, Any] | None
) -> tuple[Verdict, str | None]:
    """The runtime's verdict, and when its levels combine into a tree, its pods' scheduler."""
    runtime, verdict = judge_runtime(new, old)
    if runtime is not None and verdict.allowed:  # requests no pod could be created with
        verdict = Verdict((), (*verdict.warnings, *_said(overcommit.runtime_warnings(runtime))))
    scheduling = runtime.spec.scheduling if runtime is not None else None
    if (
        runtime is None
        or not verdict.allowed
        or scheduling is None
        or not is_multi_level(scheduling)
    ):
        return verdict, None
    return verdict, next((rj.scheduler for rj in runtime.replicated_jobs), DEFAULT_SCHEDULER)


def tree_errors(backend: GangBackend | None, cache: Cache) -> list[FieldError]:
    """Levels combined (a tree of groups of groups) need a backend with CompositePodGroups,
    and a cluster that serves them (checked once discovery has said so)."""
    if backend is None:
        return []
    kind = composite_kind(backend)
    where = Path("spec", "scheduling")
    if kind is None:
        return [
            fe.forbidden(
                where,
                f"levels combined make groups of groups, which the {backend.name} gang backend "
                "cannot express; keep each ReplicatedJob at one level",
            )
        ]
    if cache.connected and cache.kind_states.get(kind) == "not-served":
        return [
            fe.forbidden(
                where,
                "levels combined make groups of groups (CompositePodGroup), which this cluster "
                f"does not serve: enable the CompositePodGroup feature gate and "
                f"--runtime-config={kind.group_version}=true, or keep each ReplicatedJob at "
                "one level",
            )
        ]
    return []


def mutate_runtime_review(review: Review, cache: Cache) -> Decision:
    if _skips(review) or not _schedules(review):
        return Decision()
    assert review.object is not None
    defaulted = defaults.with_default_policies(review.object)
    labelled = defaults.with_gang_labels(defaulted, _grouped(defaulted))
    return Decision(patch=_diff(review.object, labelled))


def _grouped(raw: dict[str, Any]) -> frozenset[str]:
    """The ReplicatedJobs a group of the runtime's plan holds (none when it does not plan: the
    validating webhook says why)."""
    runtime, _ = parse(Runtime, raw)  # checked once below: the verdict is the validator's
    if runtime is None or runtime.spec.scheduling is None:
        return frozenset()
    layout, _ = runtime_layout(runtime)
    if layout is None:
        return frozenset()
    return frozenset(rj for group in layout.groups for rj in group.targets)


# --- TrainJobs ---------------------------------------------------------------------------------


def mutate_trainjob_review(review: Review, cache: Cache) -> Decision:
    """Freezes the runtime into a TrainJob when it is created (what the reconciler would do a
    moment later): its pods are tied the moment they come, never held for it (issue 36).
    Best effort (the chart's failurePolicy is Ignore): one created while no replica answers is
    frozen by the reconciler when it first sees it."""
    if review.operation != "CREATE" or review.sub_resource:
        return Decision()
    obj = review.object
    assert obj is not None
    if snapshot_of(obj) is not None:
        return Decision()  # carried in (a restore, a copy): the TrainJob webhook judges it
    text = frozen_now(obj, review.namespace, cache)
    if text is None:
        return Decision()
    return Decision(patch=add_to_map(obj, ("metadata", "annotations"), SNAPSHOT_ANNOTATION, text))


def frozen_now(obj: Mapping[str, Any], namespace: str, cache: Cache) -> str | None:
    """The snapshot the service freezes into this TrainJob now: of its runtime in the cache, when
    that runtime schedules gangs and the TrainJob plans under it; None when it gets none (no
    scheduling, invalid, unknown runtime, or a TrainJob MultiKueue runs elsewhere)."""
    trainjob = parse(TrainJob, obj)[0]
    if trainjob is None or runs_elsewhere(trainjob):
        return None
    ref = trainjob.spec.runtime_ref
    checked = cache.runtime(trainjob.runtime_kind, namespace or trainjob.namespace, ref.name or "")
    return _frozen_under(trainjob, checked)


def _frozen_under(trainjob: TrainJob, checked: CheckedRuntime | None) -> str | None:
    if checked is None or checked.layout is None or not checked.verdict.allowed:
        return None
    try:
        build_plan(trainjob, checked)
    except PlanningError:
        return None  # validation denies it
    return snapshot(checked.runtime)


def guard_trainjob_review(review: Review, cache: Cache) -> Decision | Awaitable[Decision]:
    """The runtime snapshot's tamper check: the chart sends only requests that set, change or
    remove the snapshot here, with failurePolicy Fail, so a TrainJob's create, label and delete
    never wait on the service while its snapshot stays unforgeable.

    A snapshot set on CREATE is the service's own when it is what the service freezes into that
    TrainJob (its TrainJob mutating webhook froze it in this very request). The replica that
    froze it may have seen a version of the runtime this one has not yet, or no longer has: the
    snapshot of a version replaced within the last minute counts, and one of a version this
    replica has not seen is compared with the runtime the API server has now (one GET)."""
    if _skips(review):
        return Decision()
    obj = review.object if review.operation == "CREATE" else None
    written = snapshot_of(obj) if obj is not None else None
    trainjob = parse(TrainJob, obj)[0] if obj is not None and written is not None else None
    if trainjob is None or runs_elsewhere(trainjob):
        return guard_snapshot(review, cache.service_username) or Decision()
    namespace = review.namespace or trainjob.namespace
    kind, name = trainjob.runtime_kind, trainjob.spec.runtime_ref.name or ""
    now = _frozen_under(trainjob, cache.runtime(kind, namespace, name))
    accepted = (*((now,) if now else ()), *cache.earlier_snapshots(kind, namespace, name))
    denial = guard_snapshot(review, cache.service_username, accepted)
    fetch = cache.runtime_fetch
    if denial is None or fetch is None:
        return denial or Decision()

    async def compared() -> Decision:
        raw = await fetch(kind, namespace, name)
        runtime = parse(Runtime, raw)[0] if raw is not None else None
        if runtime is not None and runtime.spec.scheduling is not None:
            live = _frozen_under(trainjob, check_stored_runtime(runtime))
            if live is not None and live == written:
                return Decision()
        return denial

    return compared()


def validate_trainjob_review(review: Review, cache: Cache) -> Decision:
    if _skips(review):
        return Decision()
    # (The snapshot's tamper check is its own webhook, `guard_trainjob_review`.)
    assert review.object is not None
    trainjob, errs = parse(TrainJob, review.object)
    if trainjob is None:
        return denied(review, errs)
    old = None
    if review.operation == "UPDATE" and review.old_object is not None:
        old = parse(TrainJob, review.old_object)[0]
    namespace = review.namespace or trainjob.namespace
    ref = trainjob.spec.runtime_ref
    runtime = cache.runtime(trainjob.runtime_kind, namespace, ref.name or "")
    if runtime is None and old is None and not cache.knows_runtimes(trainjob.runtime_kind):
        return denied(review, [_runtime_unknowable(trainjob, cache.connected)])
    verdict = check_trainjob(trainjob, runtime, old, gang_exists(old, runtime))
    # The runtime's own warnings went to its author at its apply; the TrainJob's author would
    # only see them on every submission, so they are not repeated here. But requests no pod
    # could be created with are said on its CREATE (and on a change of resourcesPerNode).
    if not verdict.allowed:
        return denied(review, verdict.errors)
    unpodded: list[str] = []
    if old is None or old.resources_per_node != trainjob.resources_per_node:
        unpodded = _said(
            overcommit.trainjob_warnings(trainjob, runtime.runtime if runtime else None)
        )
    if old is not None or runtime is None:
        return Decision(warnings=unpodded)  # an update is never blocked by its gang's scheduler
    decision = _gang_verdict(review, trainjob, runtime, cache)
    return dataclasses.replace(decision, warnings=[*unpodded, *decision.warnings])


def _said(warnings: list[overcommit.Said]) -> list[str]:
    """Each warning in lines short enough for the API server and kubectl to keep whole."""
    return [line for said in warnings for line in overcommit.lines(said, MAX_WARNING)]


def _gang_verdict(
    review: Review, trainjob: TrainJob, runtime: CheckedRuntime, cache: Cache
) -> Decision:
    """What the TrainJob's gang backend says of its plan at `kubectl apply`: whether its API is
    served, what the plan becomes with that scheduler, what it would never schedule, and which
    gangs could never fit on the cluster's nodes."""
    try:
        plan = build_plan(trainjob, runtime)
    except PlanningError:
        return Decision()  # said by validation already
    if plan is None:
        return Decision()
    assert review.object is not None
    context = Context.of(review.object)
    warnings = kueue.topology_warnings(plan, runtime.runtime, context.labels)
    backend = cache.backends.for_plan(plan)
    if backend is None:
        warnings.append(
            f"its pods name the scheduler {plan.scheduler_name!r}, which no gang backend of "
            "this service serves: the TrainJob gets no gang"
        )
        return Decision(warnings=warnings)
    if cache.api(backend) == "not-served":
        version = api_versions(backend)
        warnings.append(
            f"{backend.name} gang scheduling is unavailable ({version} is not served): the "
            "TrainJob's pods are held until it is"
        )
    warnings += backend.admission_warnings(plan, context)
    errors = tree_errors(backend, cache) if plan.composites else []
    errors += backend.admission_errors(plan, context, cache.facts())
    if cache.api(backend) != "not-served":  # (without the API there is no gang to fit)
        # Whether each gang could ever fit on the nodes the cache has (never an API call).
        said, never = feasibility_verdict(trainjob, runtime, plan, backend, context, cache)
        warnings += said
        errors += never
    return denied(review, errors, warnings) if errors else Decision(warnings=warnings)


def _runtime_unknowable(trainjob: TrainJob, connected: bool) -> FieldError:
    # Without a cluster, or before the first list, the cache cannot know the runtime: denied
    # (while no replica answers at all, the chart's Ignore lets the TrainJob through, and the
    # reconciler judges it when it first sees it).
    kind = trainjob.runtime_kind
    why = (
        f"the webhook service has not read the {kind}s from the cluster yet; retry shortly"
        if connected
        else f"the webhook service has no cluster connection, so it cannot find the {kind}; "
        "start it with a kubeconfig"
    )
    return fe.not_found(Path("spec", "runtimeRef", "name"), trainjob.spec.runtime_ref.name, why)


# --- Pods (the hot path: every pod of every TrainJob) -------------------------------------------
#
# A pod of a TrainJob that will be ganged is tied to its group or held, never admitted loose:
# `spec.schedulingGroup` can only be set when a pod is created, and kube-scheduler holds a gang
# until minCount pods name its PodGroup, so one pod let through without it would leave the rest
# of the gang Pending for ever. Holding is a denial, as KEP-5547 blocks a Job's pod creation:
# the Job controller creates the pod again with its backoff, by which time the reason has
# usually gone (the watch caught up, the reconciler froze the runtime, the old PodGroup went).

HOLD_CODE = 403
# A plan lookup that found no plan, as the reason label of a hold.
# A finished TrainJob's pod is held rather than tied: its gang was released, and the cache keeps
# no plan for it (a tombstone, `core/kept.py`); a pod tied to a released gang would wait for ever.
_HELD_FOR = {
    "unfrozen": "NotFrozen",
    "no-runtime": "RuntimeNotFound",
    "invalid": "InvalidPlan",
    "unknown-version": "PlanVersionUnknown",
    "finished": "TrainJobFinished",
}


def held(reason: str, why: str) -> Decision:
    """A pod creation denied to hold it, with the reason the counters and the log carry."""
    return Decision(
        allowed=False,
        code=HOLD_CODE,
        reason="Forbidden",
        message=(
            f"SchedulingBlocked: the pod is held until it can join its TrainJob's gang: {why}; "
            "its Job creates it again shortly (trainjob-scheduling)"
        ),
        untied=reason,
    )


def mutate_pod_review(review: Review, cache: Cache) -> Decision | Awaitable[Decision]:
    if review.operation != "CREATE" or review.sub_resource:
        return Decision()
    pod = review.object
    assert pod is not None
    meta = pod.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    trainjob = labels.get(JOBSET_NAME) if isinstance(labels, dict) else None
    if not isinstance(trainjob, str):
        return Decision()  # not a JobSet pod, so not a TrainJob's
    # A pod that already names a group is judged too: of a ganged TrainJob, it is tied to its
    # gang whoever named another (the Job controller names its own per-Job gang on the pods of
    # a Job made before this service could mark it, `mutate_job_review`).
    namespace = _namespace(review, pod)
    lookup = cache.plan_for(namespace, trainjob)
    assert isinstance(labels, dict)
    if lookup.state == "no-trainjob":
        ganged = _ganged_jobset(namespace, trainjob, labels, cache)
        asked = _not_cached(namespace, trainjob, lookup.detail, cache, ganged)
        return _remembered(review, pod, namespace, trainjob, asked, cache)
    decision = _judge_pod(pod, labels, namespace, trainjob, lookup, cache)
    return _remembered(review, pod, namespace, trainjob, decision, cache)


def would_hold(pod: HeldPod, cache: Cache) -> bool:
    """Whether a pod of the held Job would still be held now (the waker's question; from the
    cache alone: a TrainJob not cached yet still holds it)."""
    lookup = cache.plan_for(pod.namespace, pod.trainjob)
    if lookup.state == "no-trainjob":
        return True
    raw: dict[str, Any] = {"metadata": {"namespace": pod.namespace, "labels": dict(pod.labels)}}
    raw["spec"] = {"schedulerName": pod.scheduler} if pod.scheduler else {}
    labels = raw["metadata"]["labels"]
    return not _judge_pod(raw, labels, pod.namespace, pod.trainjob, lookup, cache).allowed


def hold_is_moot(pod: HeldPod, cache: Cache) -> bool:
    """Whether no pod of the held Job will come to be tied: its TrainJob is gone (the API
    server said so: a TrainJob it has but the cache lacks is a lagging watch, a fault whose hold
    must age into the alert), being deleted or suspended, or its restart attempt is over. The
    waker forgets a moot hold only after a grace (`WakerSettings.moot_after`): a cache that
    says suspended may lag a resume."""
    lookup = cache.plan_for(pod.namespace, pod.trainjob)
    if lookup.state == "no-trainjob":
        return cache.trainjobs.synced and pod.reason == "TrainJobGone"
    if cache.not_running(pod.namespace, pod.trainjob) is not None:
        return True
    plan = lookup.plan
    attempt = attempt_of(pod.labels)
    if plan is None or attempt is None:
        return False
    current = cache.restart_attempt(pod.namespace, pod.trainjob, plan.trainjob_uid)
    return current is not None and attempt < current


# The pod labels that place a pod in its gang: what a held Job's pods are judged again by.
_PLACING = (JOBSET_NAME, REPLICATED_JOB_NAME, JOB_INDEX, RESTART_ATTEMPT)


def _remembered(
    review: Review,
    pod: dict[str, Any],
    namespace: str,
    trainjob: str,
    decision: Decision | Awaitable[Decision],
    cache: Cache,
) -> Decision | Awaitable[Decision]:
    """The decision; a hold is told to the waker (`cache.on_hold`), which wakes the pod's Job
    once its pods would be tied."""
    hook = cache.on_hold
    if hook is None or review.dry_run:
        return decision

    def tell(found: Decision) -> Decision:
        job = _job_of(pod)
        if not found.allowed and found.untied and job is not None:
            meta = pod.get("metadata")
            labels = meta.get("labels") if isinstance(meta, dict) else None
            placing = {
                k: v
                for k in _PLACING
                if isinstance(labels, dict) and isinstance(v := labels.get(k), str)
            }
            spec = pod.get("spec")
            scheduler = spec.get("schedulerName") if isinstance(spec, dict) else None
            named = scheduler if isinstance(scheduler, str) else None
            hook(HeldPod(namespace, job, trainjob, placing, named, found.untied))
        return found

    if isinstance(decision, Decision):
        return tell(decision)

    async def told() -> Decision:
        return tell(await decision)

    return told()


def _job_of(pod: dict[str, Any]) -> str | None:
    """The Job that makes the pod (its controller reference), which the Job controller creates
    again; None when no Job controls it."""
    ref = controller_ref(pod)
    name = ref.get("name") if ref is not None and ref.get("kind") == "Job" else None
    return name if isinstance(name, str) else None


def _judge_pod(
    pod: dict[str, Any],
    labels: dict[str, Any],
    namespace: str,
    trainjob: str,
    lookup: PlanLookup,
    cache: Cache,
) -> Decision:
    """A cached TrainJob's pod: tied, held or let through."""
    if lookup.plan is not None and (why := cache.not_running(namespace, trainjob)) is not None:
        if why == "deleting":
            # A foreground delete (or another controller's finalizer) keeps the TrainJob while
            # its JobSet's Jobs still make pods; its gang objects are not remade, so a pod tied
            # now would wait for ever, and one let through would run loose.
            return held("TrainJobDeleting", "the TrainJob is being deleted")
        # A suspended TrainJob makes no pods: this one comes from a resume this replica's
        # watch has not brought yet, whose gang is named by the run it starts.
        return held("TrainJobSuspended", "the TrainJob's resume has not reached this replica")
    return _tie(pod, labels, lookup, cache)


def _ganged_jobset(namespace: str, name: str, labels: dict[str, Any], cache: Cache) -> bool:
    """Whether the pod's JobSet is a TrainJob's: its owner when the cache has the JobSet (a
    label anyone can copy, such as a plain JobSet made from a runtime's template or one a
    `--cascade=orphan` delete left, does not make it one); the gang label only while the
    JobSet's watch has not brought it."""
    entry = cache.jobsets.get(namespace, name)
    if entry is None:
        return labels.get(GANG_LABEL) == "true"
    owner = controller_ref(entry.raw)
    return owner is not None and is_trainjob_ref(owner)


def _not_cached(
    namespace: str, trainjob: str, detail: str, cache: Cache, ganged: bool
) -> Decision | Awaitable[Decision]:
    """A JobSet pod whose TrainJob this replica has not seen: a plain JobSet's (let through,
    silently), or a TrainJob's that the watch has not brought yet (held). Only the API server
    can tell: asked once per TrainJob name for a few seconds (kube/lookup.py). A pod of a
    TrainJob's JobSet (`ganged`: the gang label its runtime stamps, or its JobSet's owner) whose
    TrainJob is gone is held too: its JobSet is being garbage collected, and a pod admitted now
    would run loose (Trainer may make the JobSet again just before a foreground delete ends)."""
    lookup = cache.trainjob_lookup
    if lookup is None:  # no cluster: nothing will ever be known
        return Decision(warnings=[f"not tied to a gang: {detail}"])

    async def asked() -> Decision:
        exists = await lookup.exists(namespace, trainjob)
        if exists is False and ganged:
            return held("TrainJobGone", f'TrainJob "{trainjob}" is gone: its JobSet is an orphan')
        if exists is False:
            return Decision(note=detail)  # a JobSet of the same name but no TrainJob
        if exists is None:
            return held("LookupFailed", f"{detail}, and the API server could not be asked")
        return held(
            "TrainJobNotCached", f'TrainJob "{trainjob}" is not in this replica\'s cache yet'
        )

    return asked()


def _tie(pod: dict[str, Any], labels: dict[str, Any], lookup: PlanLookup, cache: Cache) -> Decision:
    """The pod's group, or why it is held, or why it is let through without one."""
    if lookup.plan is None:
        if lookup.state == "no-scheduling":
            return Decision()  # not a ganged TrainJob
        if lookup.state == "frozen-no-gang":
            note = f"not tied to a gang: {lookup.detail}"
            return Decision(patch=_unnamed(pod, cache), note=note, untied="FrozenNoGang")
        if lookup.state == "elsewhere":  # Trainer makes no pods for it here: not its pod
            return Decision(note=f"not tied to a gang: {lookup.detail}")
        return held(_HELD_FOR.get(lookup.state, "Other"), lookup.detail)
    attempt = attempt_of(labels)
    if attempt is None:
        return held("InvalidLabels", f"its label {RESTART_ATTEMPT} is not a restart count")
    plan = lookup.plan.at_attempt(attempt)
    group = group_for_labels(plan, labels)
    if group is None:
        return Decision()  # an untargeted ReplicatedJob: default scheduling
    if plan.plan_version >= 2:  # (version 1 named every attempt alike)
        # The attempt is its JobSet's, never what a label claims: a pod labelled with another
        # (forged, or of an attempt already over) would join, or make, a gang of its own.
        current = cache.restart_attempt(plan.namespace, plan.trainjob_name, plan.trainjob_uid)
        if current is None:
            return held("JobSetUnknown", "its JobSet is not in this replica's cache yet")
        if attempt != current:
            why = (
                f"its label {RESTART_ATTEMPT} says attempt {attempt}, its JobSet is at "
                f"attempt {current}"
            )
            return held("RestartAttemptMismatch", why)
    backend = cache.backends.for_plan(plan)
    if backend is None:  # no gang will ever be made for it: let through, and count it
        note = f"not tied to a gang: no gang backend serves the scheduler {plan.scheduler_name!r}"
        return Decision(note=note, untied="NoGangBackend")
    api = cache.api(backend)
    if api != "served" or not cache.backend_ready(backend):
        version = api_versions(backend)
        why = (
            "is not served" if api == "not-served"
            else "is not known to be served yet" if api == "unknown"
            else "is served, but this replica has not listed its objects yet"
        )  # fmt: skip
        return held("GangApiUnavailable", f"the gang API {version} {why}")
    spec = pod.get("spec")
    scheduler = (spec.get("schedulerName") if isinstance(spec, dict) else None) or DEFAULT_SCHEDULER
    if scheduler != plan.scheduler_name:
        why = f"it names the scheduler {scheduler!r}, its gang is for {plan.scheduler_name!r}"
        return held("SchedulerMismatch", why)
    if cache.foreign(backend, plan.trainjob_uid) is not None:
        note = "not tied to a gang: another controller schedules this TrainJob"
        ours = frozenset(g.pod_group_name for g in plan.groups)
        return Decision(patch=_unnamed(pod, cache, ours), note=note, untied="StoodDown")
    if not expresses(backend, plan):
        return held("GangKindUnavailable", f"the {backend.name} backend cannot express its tree")
    if cache.missing_kind(backend, plan) is not None:
        return held("GangKindUnavailable", "its tree needs CompositePodGroups, not served")
    blocked = _group_blocked(backend, plan, group, cache)
    if blocked is not None:
        return blocked
    patch = backend.pod_patch(pod, plan, group) or None
    named = scheduling_group_of(pod)
    if patch and named is not None and named != group.pod_group_name:
        note = f"tied to {group.pod_group_name!r} instead of the PodGroup it named, {named!r}"
        return Decision(patch=patch, note=note, regrouped=True)
    return Decision(patch=patch)


def _unnamed(
    pod: dict[str, Any], cache: Cache, ours: frozenset[str] | None = None
) -> list[dict[str, Any]] | None:
    """For a pod that gets no gang of ours: the group its Job's template named (this service's
    Job webhook, before it knew) taken off, when no object of that name exists (it names a gang
    nobody makes, and would wait for it for ever); a group that exists (another controller's)
    stays. With `ours` (the names this service's plan gives), a name that is not one of them
    stays too: another controller's PodGroup that this replica's watch has not brought yet."""
    named = scheduling_group_of(pod)
    if named is None or (ours is not None and named not in ours):
        return None
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    for backend in cache.backends.backends:
        for kind in backend.kinds:
            if cache.kind_served(kind) and cache.store(kind).get(namespace, named) is not None:
                return None
    return [{"op": "remove", "path": "/spec/schedulingGroup"}]


def _group_blocked(
    backend: GangBackend, plan: Plan, group: GroupPlan, cache: Cache
) -> Decision | None:
    """A pod may name a group that does not exist yet (kube-scheduler waits for it, and the
    reconciler makes it: a JobSet restart's pods come before their PodGroups), but never one
    that is going away (it would keep it Terminating for ever) or that is not this TrainJob's."""
    for kind in backend.kinds:
        entry = cache.store(kind).get(plan.namespace, group.pod_group_name)
        if entry is None:
            continue
        obj = entry.raw
        if not controlled_by(obj, plan.trainjob_uid) or not is_managed(obj):
            why = f"{kind.kind} {group.pod_group_name!r} exists but is not this TrainJob's"
            return held("PodGroupNotOurs", why)
        meta = obj.get("metadata")
        if isinstance(meta, dict) and meta.get("deletionTimestamp"):
            why = f"{kind.kind} {group.pod_group_name!r} of an earlier gang is still terminating"
            return held("PodGroupTerminating", why)
    return None


def _namespace(review: Review, obj: dict[str, Any]) -> str:
    """The request's namespace, else the object's (a review always has one for these kinds)."""
    if review.namespace:
        return review.namespace
    meta = obj.get("metadata")
    ns = meta.get("namespace") if isinstance(meta, dict) else None
    return ns if isinstance(ns, str) else ""


# --- Jobs (a ganged TrainJob's Jobs name their PodGroup: the Job controller's gangs stand down) --
#
# With WorkloadWithJob (alpha in 1.36, planned on by default in 1.38) the Job controller makes
# a Workload and PodGroup of its own for every Indexed Job whose parallelism equals its
# completions, and names it on the Job's pods, unless the Job's pod template already names a
# group (KEP-5547: a parent that gangs several Jobs sets `schedulingGroup` on its child Jobs).
# So a ganged TrainJob's Jobs get their PodGroup in their pod template when JobSet creates them:
# one gang per pod set, never two. Best effort (the chart's failurePolicy is Ignore): a Job made
# while this service cannot answer gets the Job controller's gang, whose pods the pod webhook
# ties to this TrainJob's gang instead.


def mutate_job_review(review: Review, cache: Cache) -> Decision:
    if review.operation != "CREATE" or review.sub_resource:
        return Decision()
    job = review.object
    assert job is not None
    template = _at(job, "spec", "template")
    labels = _at(template, "metadata", "labels")
    trainjob = labels.get(JOBSET_NAME)
    if not isinstance(trainjob, str) or scheduling_group_of(job, ("spec", "template")):
        return Decision()  # not a JobSet's Job, or its template names a group already
    if _at(job, "spec").get("suspend") is True:
        # Made suspended (Kueue queues the TrainJob): the Job controller never makes a gang of
        # its own for a Job that was suspended, and the name of the run it will start is not
        # known yet; its pods are tied when they come.
        return Decision()
    namespace = _namespace(review, job)
    if cache.not_running(namespace, trainjob) == "deleting":
        # Setting a custom resource's deletionTimestamp bumps its generation, so the plan names
        # a run that is never made; its pods are held (TrainJobDeleting) whatever they name.
        return Decision()
    plan = _job_plan(cache, namespace, trainjob)
    if plan is None:
        return Decision()  # not a ganged TrainJob's (or not known yet: best effort)
    attempt = attempt_of(labels)
    group = group_for_labels(plan.at_attempt(attempt), labels) if attempt is not None else None
    backend = cache.backends.for_plan(plan)
    if group is None or not isinstance(backend, TiesJobs):
        return Decision()  # an untargeted ReplicatedJob, or a backend that ties pods otherwise
    if cache.foreign(backend, plan.trainjob_uid) is not None:
        return Decision()  # another controller gangs it: its Jobs are not this service's
    ops = backend.job_patch(job, plan.at_attempt(attempt or 0), group)
    # Its pods carry the gang label too (the pod webhook that holds them selects it), also
    # when its runtime lost it after the TrainJob was frozen with a gang.
    ops += add_to_map(job, ("spec", "template", "metadata", "labels"), GANG_LABEL, "true")
    return Decision(patch=ops or None)


def _job_plan(cache: Cache, namespace: str, trainjob: str) -> Plan | None:
    """The TrainJob's plan: the frozen one, else (not frozen yet: the reconciler freezes it in a
    moment) the one its runtime gives now. Either names the group its pods will be tied to."""
    lookup = cache.plan_for(namespace, trainjob)
    if lookup.plan is not None or lookup.state != "unfrozen":
        return lookup.plan
    entry = cache.trainjobs.get(namespace, trainjob)
    parsed = parse(TrainJob, entry.raw)[0] if entry is not None else None
    if parsed is None:
        return None
    runtime = cache.runtime(parsed.runtime_kind, namespace, parsed.spec.runtime_ref.name or "")
    if runtime is None or not runtime.verdict.allowed:
        return None
    try:
        return build_plan(parsed, runtime)
    except PlanningError:
        return None


def _at(obj: Any, *path: str) -> dict[str, Any]:
    for part in path:
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj if isinstance(obj, dict) else {}


# --- a backend's own objects (the native Workload and PodGroup: minCount defaulting) ---------


def mutate_backend_object_review(review: Review, cache: Cache) -> Decision:
    obj = review.object
    found = _defaulting(cache, review.group, review.resource)
    if _skips(review) or obj is None or found is None:
        return Decision()
    backend, kind = found
    if not backend.needs_default(kind, obj):
        return Decision()  # most objects: nothing to look up
    trainjob = controlling_trainjob(obj)
    if trainjob is None:
        return Decision()  # not a TrainJob's: the API server will ask for what is missing
    lookup = cache.plan_for(_namespace(review, obj), trainjob)
    if lookup.plan is None:
        return Decision(warnings=[f"minCount not defaulted: {lookup.detail or lookup.state}"])
    uid = controller_uid(obj)
    if uid and lookup.plan.trainjob_uid and uid != lookup.plan.trainjob_uid:
        # Left over from an earlier TrainJob of the same name: its plan is not this one's.
        detail = f'owner uid {uid} is not TrainJob "{trainjob}" ({lookup.plan.trainjob_uid})'
        return Decision(warnings=[f"minCount not defaulted: {detail}"])
    mutated, warnings = backend.default(kind, obj, lookup.plan)
    return Decision(patch=_diff(obj, mutated), warnings=warnings)


def _defaulting(cache: Cache, group: str, resource: str) -> tuple[Defaulting, Kind] | None:
    for backend in cache.backends.backends:
        if isinstance(backend, Defaulting):
            for kind in backend.defaulted:
                if (kind.group, kind.plural) == (group, resource):
                    return backend, kind
    return None

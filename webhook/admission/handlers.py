"""One handler per webhook: (review, cache) -> decision. No I/O: the cache is in memory.

Mutations diff the raw request object against a mutated copy of itself (`jsonpatch`), except on
the pod path, which builds its one-operation patch directly (tests prove it equal to jsonpatch's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jsonpatch

from ..core import defaults
from ..core import errors as fe
from ..core.errors import FieldError, Path
from ..core.fields import parse
from ..core.lifecycle import gang_exists
from ..core.plan import JOBSET_NAME, Plan, pod_group_for_labels
from ..core.trainer import TrainJob
from ..core.validation import check_trainjob, validate_runtime
from ..kube.cache import Cache
from .review import Decision, Review

Handler = Callable[[Review, Cache], Decision]
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


def validate_runtime_review(review: Review, cache: Cache) -> Decision:
    if _skips(review):
        return Decision()
    assert review.object is not None
    old = review.old_object if review.operation == "UPDATE" else None
    verdict = validate_runtime(review.object, old)
    if not verdict.allowed:
        return denied(review, verdict.errors, verdict.warnings)
    return Decision(warnings=list(verdict.warnings))


def mutate_runtime_review(review: Review, cache: Cache) -> Decision:
    if _skips(review):
        return Decision()
    assert review.object is not None
    return Decision(patch=_diff(review.object, defaults.with_default_policies(review.object)))


# --- TrainJobs ---------------------------------------------------------------------------------


def validate_trainjob_review(review: Review, cache: Cache) -> Decision:
    if _skips(review):
        return Decision()
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
    # only see them on every submission, so they are not repeated here.
    return Decision() if verdict.allowed else denied(review, verdict.errors)


def _runtime_unknowable(trainjob: TrainJob, connected: bool) -> FieldError:
    # Without a cluster, or before the first list, the cache cannot know the runtime. The chart's
    # failurePolicy for this webhook is Fail ("no TrainJob goes unchecked"): denied too.
    kind = trainjob.runtime_kind
    why = (
        f"the webhook service has not read the {kind}s from the cluster yet; retry shortly"
        if connected
        else f"the webhook service has no cluster connection, so it cannot find the {kind}; "
        "start it with a kubeconfig"
    )
    return fe.not_found(Path("spec", "runtimeRef", "name"), trainjob.spec.runtime_ref.name, why)


# --- Pods (the hot path: every pod of every TrainJob) -------------------------------------------


def mutate_pod_review(review: Review, cache: Cache) -> Decision:
    if review.operation != "CREATE" or review.sub_resource:
        return Decision()
    pod = review.object
    assert pod is not None
    meta = pod.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    trainjob = labels.get(JOBSET_NAME) if isinstance(labels, dict) else None
    if not isinstance(trainjob, str):
        return Decision()  # not a JobSet pod, so not a TrainJob's
    spec = pod.get("spec")
    if isinstance(spec, dict) and spec.get("schedulingGroup") is not None:
        return Decision()  # already in a group: whoever set it decides
    if cache.gang_api == "not-served":
        # The API server would drop the field silently (GenericWorkload off): say so in the log.
        return Decision(note="schedulingGroup not set: scheduling.k8s.io/v1beta1 is not served")
    lookup = cache.plan_for(_namespace(review, pod), trainjob)
    if lookup.plan is None:
        if lookup.state == "no-scheduling":
            return Decision()
        if lookup.state == "no-trainjob" and cache.connected and cache.trainjobs.synced:
            # A JobSet of the same name but no TrainJob: someone else's pod, silently.
            return Decision(note=lookup.detail)
        return Decision(warnings=[f"schedulingGroup not set: {lookup.detail}"])
    assert isinstance(labels, dict)
    group = pod_group_for_labels(lookup.plan, labels)
    if group is None:
        return Decision()  # an untargeted ReplicatedJob: default scheduling
    return Decision(patch=[pod_group_op(pod, group)])


def _namespace(review: Review, obj: dict[str, Any]) -> str:
    """The request's namespace, else the object's (a review always has one for these kinds)."""
    if review.namespace:
        return review.namespace
    meta = obj.get("metadata")
    ns = meta.get("namespace") if isinstance(meta, dict) else None
    return ns if isinstance(ns, str) else ""


def pod_group_op(pod: dict[str, Any], pod_group: str) -> dict[str, Any]:
    """The one JSON Patch operation that puts a pod in `pod_group` (what jsonpatch would say)."""
    value = {"podGroupName": pod_group}
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        op = "replace" if "spec" in pod else "add"
        return {"op": op, "path": "/spec", "value": {"schedulingGroup": value}}
    op = "replace" if "schedulingGroup" in spec else "add"
    return {"op": op, "path": "/spec/schedulingGroup", "value": value}


# --- Workloads and PodGroups -------------------------------------------------------------------


def mutate_workload_review(review: Review, cache: Cache) -> Decision:
    return _default_min_count(
        review, cache, defaults.workload_lacks_min_count, defaults.with_workload_min_counts
    )


def mutate_pod_group_review(review: Review, cache: Cache) -> Decision:
    return _default_min_count(
        review, cache, defaults.pod_group_lacks_min_count, defaults.with_pod_group_min_count
    )


def _default_min_count(
    review: Review,
    cache: Cache,
    lacks: Callable[[dict[str, Any]], bool],
    fill: Callable[[dict[str, Any], Plan], tuple[dict[str, Any], list[str]]],
) -> Decision:
    obj = review.object
    if _skips(review) or obj is None or not lacks(obj):
        return Decision()  # most Workloads and PodGroups: nothing to look up
    trainjob = defaults.controlling_trainjob(obj)
    if trainjob is None:
        return Decision()  # not a TrainJob's: the API server will ask for minCount itself
    lookup = cache.plan_for(_namespace(review, obj), trainjob)
    if lookup.plan is None:
        return Decision(warnings=[f"minCount not defaulted: {lookup.detail or lookup.state}"])
    uid = defaults.controller_uid(obj)
    if uid and lookup.plan.trainjob_uid and uid != lookup.plan.trainjob_uid:
        # Left over from an earlier TrainJob of the same name: its plan is not this one's.
        detail = f'owner uid {uid} is not TrainJob "{trainjob}" ({lookup.plan.trainjob_uid})'
        return Decision(warnings=[f"minCount not defaulted: {detail}"])
    mutated, warnings = fill(obj, lookup.plan)
    return Decision(patch=_diff(obj, mutated), warnings=warnings)

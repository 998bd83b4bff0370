"""The KAI Scheduler backend: one `scheduling.run.ai/v2alpha2` PodGroup per plan group.

Each plan group is its own gang, so each gets its own KAI PodGroup; binding them as subGroups of
one root would make the root wait for all of them, and a dataset initializer that must finish
before the trainer's pods exist would wait forever (KAI's own Workload API design maps
independent groups to separate PodGroups for this reason). Inside a gang the PodGroup is flat:
`minMember` is the plan's minCount, exactly the pods that exist before admission, and a
ReplicatedJob that joins later (a launcher started once the workers are Ready) is scheduled as
one more member of the running group. A `basic` group is a PodGroup with `minMember: 1` (pod by
pod), so every pod of a group has exactly one PodGroup.

Pods join with the annotation `pod-group-name` and carry `kai.scheduler/skip-podgrouper: "true"`:
without it KAI's podgrouper makes its own PodGroup for the JobSet of a TrainJob and rewrites the
pod's `pod-group-name`, so the gang would have two PodGroups. The queue is the TrainJob's
`kai.scheduler/queue` label, else a setting; the Topology a required level refers to is the
TrainJob's `kai.scheduler/topology` annotation, else a setting.

Drift: KAI's PodGroup webhook checks structure only (nothing is immutable), so the fields this
backend owns are patched back in place. Fields it leaves unset (preemptibility, backoff, ...)
may be set by an admin or a KAI default and are not drift.

Status (KAI v0.17.0): the scheduler writes the annotation `kai.scheduler/last-start-timestamp`
while the gang runs, and `status.schedulingConditions` (`UnschedulableOnNodePool`) when it cannot
place it; those conditions stay after a later start, so the annotation decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core import errors as fe
from ..core.errors import FieldError, Path
from ..core.fields import is_dns_subdomain
from ..core.plan import GroupPlan, Plan
from .base import (
    OBJECT_VERBS,
    POLICY_ANNOTATION,
    ClusterFacts,
    Context,
    Drift,
    GangStatus,
    JsonObject,
    Kind,
    Rule,
    Uids,
    annotate,
    metadata,
    priority_class_errors,
    spec_of,
    with_uid_test,
)

GROUP, VERSION = "scheduling.run.ai", "v2alpha2"
API_VERSION = f"{GROUP}/{VERSION}"
POD_GROUP = Kind(GROUP, VERSION, "podgroups", "PodGroup")

QUEUE_LABEL = "kai.scheduler/queue"  # on the TrainJob (as KAI's podgrouper reads its owners')
TOPOLOGY_ANNOTATION = "kai.scheduler/topology"  # likewise, on the TrainJob
POD_GROUP_ANNOTATION = "pod-group-name"  # on pods: the PodGroup they belong to
SKIP_PODGROUPER = "kai.scheduler/skip-podgrouper"
LAST_START = "kai.scheduler/last-start-timestamp"  # the scheduler's, while the gang runs
UNSCHEDULABLE = "UnschedulableOnNodePool"
QUEUE_MISSING = "QueueDoesNotExist"
DEFAULT_QUEUE = "default-queue"  # the queue KAI's podgrouper falls back to
DEFAULT_TOPOLOGY = "cluster-topology"  # the name KAI's documentation uses
# The spec fields this backend owns; a difference in any of them is patched back.
OWNED = (
    "minMember", "minSubGroup", "subGroups", "queue", "priorityClassName", "topologyConstraint",
)  # fmt: skip
MAX_WARNING = 120


@dataclass(frozen=True)
class KaiSettings:
    default_queue: str = DEFAULT_QUEUE
    """For TrainJobs without the queue label; empty: such TrainJobs are denied."""
    topology: str = DEFAULT_TOPOLOGY
    """The KAI Topology of required levels; empty: KAI ignores the constraint."""

    def __post_init__(self) -> None:
        for what, value in (("default queue", self.default_queue), ("topology", self.topology)):
            if value and not is_dns_subdomain(value):
                raise ValueError(f"kai {what} {value!r} is not a valid object name")


# --- rendering -------------------------------------------------------------------------------


def queue_of(context: Context, settings: KaiSettings) -> str:
    return context.labels.get(QUEUE_LABEL) or settings.default_queue


def topology_of(context: Context, settings: KaiSettings) -> str:
    return context.annotations.get(TOPOLOGY_ANNOTATION) or settings.topology


def pod_group(plan: Plan, group: GroupPlan, queue: str, topology: str) -> JsonObject:
    min_member = group.min_count if group.policy == "gang" and group.min_count else 1
    spec: JsonObject = {"minMember": min_member}
    if queue:  # none: KAI never schedules it (admission denies such a TrainJob)
        spec["queue"] = queue
    if group.priority_class_name:
        spec["priorityClassName"] = group.priority_class_name
    if group.topology_key:
        constraint = {"requiredTopologyLevel": group.topology_key}
        if topology:  # without a Topology, KAI ignores the level (admission warns)
            constraint["topology"] = topology
        spec["topologyConstraint"] = constraint
    meta = metadata(plan, group.pod_group_name)
    meta["annotations"] = {POLICY_ANNOTATION: group.policy}
    return {"apiVersion": API_VERSION, "kind": POD_GROUP.kind, "metadata": meta, "spec": spec}


# --- drift -----------------------------------------------------------------------------------


def pod_group_drift(desired: Mapping[str, Any], stored: Mapping[str, Any]) -> Drift:
    want, have = spec_of(desired), stored.get("spec")
    if not isinstance(have, dict):
        return _patch(stored, [{"op": "add", "path": "/spec", "value": want}], ["spec"])
    ops: list[dict[str, Any]] = []
    changed: list[str] = []
    for key in OWNED:
        if key in want and have.get(key) != want[key]:
            op = "replace" if key in have else "add"
            ops.append({"op": op, "path": f"/spec/{key}", "value": want[key]})
        elif key not in want and key in have:
            ops.append({"op": "remove", "path": f"/spec/{key}"})
        else:
            continue
        changed.append(key)
    return _patch(stored, ops, changed)


def _patch(stored: Mapping[str, Any], ops: list[dict[str, Any]], changed: list[str]) -> Drift:
    drift = with_uid_test(stored, ops)
    if drift.kind == "none":
        return drift
    fields = ", ".join(f"spec.{k}" if k != "spec" else k for k in changed)
    return Drift("patch", drift.patch, f"{fields} differ{'s' if len(changed) == 1 else ''}")


# --- the pod tie -----------------------------------------------------------------------------


def pod_ops(pod: Mapping[str, Any], pod_group_name: str) -> list[JsonObject]:
    """The JSON Patch that annotates a pod with its PodGroup and keeps the podgrouper away."""
    # A pod template's own values are replaced: the plan owns the tie.
    return annotate(pod, {POD_GROUP_ANNOTATION: pod_group_name, SKIP_PODGROUPER: "true"})


# --- status ----------------------------------------------------------------------------------


def pod_group_status(obj: Mapping[str, Any]) -> GangStatus:
    meta = obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    annotations = annotations if isinstance(annotations, dict) else {}
    policy = annotations.get(POLICY_ANNOTATION)
    policy = policy if policy in ("gang", "basic") else "gang"
    started = annotations.get(LAST_START)
    if isinstance(started, str) and started:
        return GangStatus(policy, True, "Scheduled", started)
    status = obj.get("status")
    conditions = status.get("schedulingConditions") if isinstance(status, dict) else None
    verdicts = [
        c for c in (conditions if isinstance(conditions, list) else [])
        if isinstance(c, dict) and c.get("status") == "True"
    ]  # fmt: skip
    if not verdicts:
        return GangStatus(policy, False, "NotEvaluated")
    last = verdicts[-1]  # KAI appends the latest verdict at the end
    reasons = last.get("reasons")
    names = {r.get("reason") for r in reasons if isinstance(r, dict)} if isinstance(
        reasons, list
    ) else set()  # fmt: skip
    said = last.get("message")
    said = said if isinstance(said, str) else ""
    if last.get("type") == UNSCHEDULABLE and QUEUE_MISSING not in names:
        return GangStatus(policy, False, "Unschedulable", message=said)
    # No such queue, or a verdict of another kind.
    return GangStatus(policy, False, "Other", message=said)


# --- admission -------------------------------------------------------------------------------


def _short(value: str, limit: int = 40) -> str:
    return value if len(value) <= limit else value[: limit - 3] + "..."


def warnings(plan: Plan, context: Context, settings: KaiSettings) -> list[str]:
    out: list[str] = []
    queue = queue_of(context, settings)
    if queue and not context.labels.get(QUEUE_LABEL):
        out.append(
            f"KAI queue {_short(queue)!r}: the TrainJob has no {QUEUE_LABEL} label; that Queue "
            "must exist"
        )
    topology = topology_of(context, settings)
    for key in dict.fromkeys(g.topology_key for g in plan.groups if g.topology_key):
        if topology:
            out.append(
                f"{_short(key)} is a required level of KAI Topology {_short(topology)!r}: it must "
                "exist with that node label"
            )
        else:
            out.append(
                f"KAI ignores the {_short(key)} constraint: no Topology named (--kai-topology, "
                f"{TOPOLOGY_ANNOTATION})"
            )
    if plan.untargeted:
        first, more = plan.untargeted[0], len(plan.untargeted) - 1
        which = f'"{_short(first, 30)}"' + (f" (and {more} more)" if more else "")
        out.append(
            f"{which} has no gang: KAI's podgrouper puts its pods in a JobSet PodGroup that may "
            "wait for every ReplicatedJob"
        )
    return [w if len(w) <= MAX_WARNING else w[: MAX_WARNING - 3] + "..." for w in out]


def errors(
    plan: Plan, context: Context, facts: ClusterFacts, settings: KaiSettings
) -> list[FieldError]:
    out = priority_class_errors(plan, facts)
    label = context.labels.get(QUEUE_LABEL)
    labels = Path("metadata", f"labels[{QUEUE_LABEL}]")
    if label and not is_dns_subdomain(label):
        out.append(fe.invalid(labels, label, "not a possible KAI Queue name (a DNS subdomain)"))
    elif not queue_of(context, settings):
        out.append(
            fe.required(labels, "KAI schedules a PodGroup only in a Queue, and no default is "
                        "set: label the TrainJob with its queue")
        )  # fmt: skip
    named = context.annotations.get(TOPOLOGY_ANNOTATION)
    if named and any(g.topology_key for g in plan.groups) and not is_dns_subdomain(named):
        where = Path("metadata", f"annotations[{TOPOLOGY_ANNOTATION}]")
        out.append(fe.invalid(where, named, "not a possible KAI Topology name (a DNS subdomain)"))
    return out


# --- the backend ------------------------------------------------------------------------------


class KaiBackend:
    name: str = "kai"
    kinds: tuple[Kind, ...] = (POD_GROUP,)

    def __init__(self, settings: KaiSettings | None = None) -> None:
        self.settings = settings or KaiSettings()

    @property
    def rbac(self) -> tuple[Rule, ...]:
        return (Rule((GROUP,), (POD_GROUP.plural,), OBJECT_VERBS),)

    def render(self, plan: Plan, context: Context, uids: Uids | None = None) -> list[JsonObject]:
        queue, topology = queue_of(context, self.settings), topology_of(context, self.settings)
        return [pod_group(plan, g, queue, topology) for g in plan.groups]

    def drift(self, desired: JsonObject, stored: JsonObject) -> Drift:
        return pod_group_drift(desired, stored)

    def pod_patch(self, pod: JsonObject, plan: Plan, group: GroupPlan) -> list[JsonObject]:
        return pod_ops(pod, group.pod_group_name)

    def depth(self, kind: Kind, obj: JsonObject) -> int:
        return 0  # flat: one PodGroup per plan group, no parents

    def status(self, kind: Kind, obj: JsonObject) -> GangStatus | None:
        return pod_group_status(obj) if kind == POD_GROUP else None

    def admission_warnings(self, plan: Plan, context: Context) -> list[str]:
        return warnings(plan, context, self.settings)

    def admission_errors(
        self, plan: Plan, context: Context, facts: ClusterFacts
    ) -> list[FieldError]:
        return errors(plan, context, facts, self.settings)

"""The Volcano backend: one `scheduling.volcano.sh/v1beta1` PodGroup per group of the plan.

Pods join with the annotation `scheduling.k8s.io/group-name` (the only key vc-scheduler reads).
vc-controller-manager makes a `podgroup-<owner uid>` for every pod of its scheduler that lacks
the annotation; setting it opts out, so each group has exactly one PodGroup: ours. A basic group
gets one too (`minMember: 1`), so the TrainJob's queue and priority hold for all of its pods.

* `minMember` is the group's minCount; `minResources` what its counted pods request together.
* `minTaskMember`, for a group of several ReplicatedJobs: the counted pods of each, keyed by the
  ReplicatedJob's name, which the pods carry in `volcano.sh/task-spec` (the scheduler's task
  role). A ReplicatedJob whose pods join after admission (a Ready dependent) is left out: the
  gang could never be valid while waiting for pods that only come once it runs.
* `queue`: the TrainJob's `scheduling.volcano.sh/queue-name` label, else its annotation (as
  Trainer reads it), else left out for Volcano's webhook to fill in (its default queue; some
  versions the namespace's). An empty value counts as none, as Volcano reads it.
* `networkTopology`: a topology key the settings map to a HyperNode tier becomes `mode: hard`
  with `highestTierAllowed`; any other key is not enforced (a warning at admission).

Drift: what Volcano's own job controller changes in place on its PodGroups (`minMember`,
`minTaskMember`, `minResources`, `priorityClassName`) is patched in place; a different `queue`
or `networkTopology`, or a `subGroupPolicy` someone added, means delete and create again.
vc-scheduler writes whole objects back (the CRD has no status subresource), re-serializing
quantities, so `minResources` is compared by value, and fields it leaves out when empty or
defaults (`queue: default`, `mode: hard`) are read as such; a queue Volcano chose for a
TrainJob that names none is not drift.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from ..core import errors as fe
from ..core.errors import FieldError, Path
from ..core.fields import is_dns_subdomain
from ..core.plan import REPLICATED_JOB_NAME, GroupPlan, Plan
from ..core.resources import parse
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
    pointer,
    priority_class_errors,
    spec_of,
    with_uid_test,
)

GROUP, VERSION = "scheduling.volcano.sh", "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
POD_GROUP = Kind(GROUP, VERSION, "podgroups", "PodGroup")

GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
TASK_SPEC_ANNOTATION = "volcano.sh/task-spec"
QUEUE_KEY = "scheduling.volcano.sh/queue-name"
DEFAULT_QUEUE = "default"
# The plan's policy, which a PodGroup of one pod cannot tell apart (for the gang metrics).


IN_PLACE = ("minMember", "minTaskMember", "minResources", "priorityClassName")
RECREATE = ("queue", "networkTopology", "subGroupPolicy")

# Unschedulable-condition reasons that say the gang's pods do not all exist yet (assembly).
ASSEMBLING = ("NotEnoughTasks", "NotEnoughPodsOfTask")
SCHEDULED_PHASES = ("Running", "Completed", "Unknown")


@dataclass(frozen=True)
class VolcanoSettings:
    topology_tiers: Mapping[str, int] = field(default_factory=dict)
    """Topology key -> the HyperNode tier a gang may span at most (`highestTierAllowed`)."""


def parse_tiers(text: str) -> dict[str, int]:
    """`key=tier,key=tier` (the `--volcano-topology-tiers` flag) as a table; ValueError when a
    part is not `key=N` with N >= 0."""
    tiers: dict[str, int] = {}
    for part in str(text).split(","):
        if not part.strip():
            continue
        key, sep, tier = part.strip().rpartition("=")
        tier = tier.strip()
        if not sep or not key.strip() or not (tier.isascii() and tier.isdigit()):
            raise ValueError(part)
        tiers[key.strip()] = int(tier)
    return tiers


parse_tiers.__name__ = "comma-separated list of topology-key=tier"  # argparse's wording


def named_queue(context: Context) -> str | None:
    """The queue the TrainJob names (its label, else its annotation), if any."""
    return context.labels.get(QUEUE_KEY) or context.annotations.get(QUEUE_KEY) or None


def queue_of(context: Context) -> str:
    """The queue a TrainJob's PodGroups go to."""
    return named_queue(context) or DEFAULT_QUEUE


def _per_task(group: GroupPlan) -> bool:
    """Whether the group counts its pods per ReplicatedJob (a gang of several), so that its pods
    carry their ReplicatedJob as Volcano task."""
    return group.policy == "gang" and len(group.replicated_jobs) > 1


# --- rendering -------------------------------------------------------------------------------


def pod_group(
    plan: Plan, group: GroupPlan, context: Context, settings: VolcanoSettings
) -> JsonObject:
    meta = {
        "annotations": {POLICY_ANNOTATION: group.policy},
        **metadata(plan, group.pod_group_name),
    }
    spec: JsonObject = {"minMember": group.min_count if group.policy == "gang" else 1}
    if group.policy == "gang":
        members = {name: pods for name, pods in group.counted if pods > 0}
        if _per_task(group) and members:
            spec["minTaskMember"] = members
        if group.min_resources:
            spec["minResources"] = dict(group.min_resources)
    queue = named_queue(context)
    if queue:  # else left to Volcano's webhook, which fills its default (some versions per
        spec["queue"] = queue  # namespace): a queue of ours would then differ on every pass
    if group.priority_class_name:
        spec["priorityClassName"] = group.priority_class_name
    tier = settings.topology_tiers.get(group.topology_key or "")
    if group.topology_key and tier is not None:
        spec["networkTopology"] = {"mode": "hard", "highestTierAllowed": tier}
    return {"apiVersion": API_VERSION, "kind": POD_GROUP.kind, "metadata": meta, "spec": spec}


# --- drift -----------------------------------------------------------------------------------


def _quantities(value: Any) -> dict[str, Decimal | None]:
    """A ResourceList by value ("2G" is "2000000000"); zero entries are no entries."""
    out: dict[str, Decimal | None] = {}
    for name, quantity in (value if isinstance(value, dict) else {}).items():
        number = parse(quantity)
        if number != 0:
            out[name] = number
    return out


def _normal(key: str, value: Any) -> Any:
    """A spec field as vc-scheduler's write-back leaves it: empty ones dropped, defaults set."""
    if key == "minMember":
        return value or 0
    if key == "minTaskMember":
        return value or {}
    if key == "minResources":
        return _quantities(value)
    if key == "queue":
        return value or DEFAULT_QUEUE
    if key == "networkTopology" and isinstance(value, dict):
        return {"mode": "hard", **value}
    return value or None  # priorityClassName, subGroupPolicy: empty is none


def pod_group_drift(desired: Mapping[str, Any], stored: Mapping[str, Any]) -> Drift:
    if not isinstance(stored.get("spec"), dict):
        return Drift("recreate", reason="the PodGroup has no spec")
    want, have = spec_of(desired), spec_of(stored)
    for key in RECREATE:
        if key == "queue" and key not in want:
            continue  # whichever queue Volcano's webhook chose
        if _normal(key, want.get(key)) != _normal(key, have.get(key)):
            return Drift("recreate", reason=f"spec.{key} differs")
    ops: list[dict[str, Any]] = []
    changed: list[str] = []
    for key in IN_PLACE:
        if _normal(key, want.get(key)) == _normal(key, have.get(key)):
            continue
        changed.append(key)
        path = pointer("spec", key)
        if key not in want:
            ops.append({"op": "remove", "path": path})
        else:
            ops.append({"op": "replace" if key in have else "add", "path": path,
                        "value": want[key]})  # fmt: skip
    if not ops:
        return Drift()
    drift = with_uid_test(stored, ops)
    return Drift("patch", drift.patch, f"{', '.join(changed)} differ")


# --- status -----------------------------------------------------------------------------------


def _conditions(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = obj.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    return [c for c in conditions if isinstance(c, dict)] if isinstance(conditions, list) else []


def pod_group_status(obj: Mapping[str, Any]) -> GangStatus:
    """What vc-scheduler's phase and conditions say of a PodGroup.

    Running, Completed and Unknown (some of an admitted gang's pods cannot be placed again) mean
    the gang was admitted, and it stays so, as native's `PodGroupInitiallyScheduled`. Pending and
    Inqueue wait: an `Unschedulable` condition with reason `NotEnoughResources` is capacity, one
    with `NotEnoughTasks`/`NotEnoughPodsOfTask` is assembly (its pods do not all exist yet).
    """
    meta = obj.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    policy = annotations.get(POLICY_ANNOTATION) if isinstance(annotations, dict) else None
    policy = policy if policy in ("gang", "basic") else "gang"
    status = obj.get("status")
    phase = status.get("phase") if isinstance(status, dict) else None
    conditions = _conditions(obj)
    if phase in SCHEDULED_PHASES:
        at = next(
            (c.get("lastTransitionTime") for c in conditions
             if c.get("type") == "Scheduled" and c.get("status") == "True"),
            None,
        )  # fmt: skip
        return GangStatus(policy, True, "Scheduled", at if isinstance(at, str) else None)
    for cond in conditions:
        if cond.get("type") == "Unschedulable" and cond.get("status") == "True":
            reason = cond.get("reason")
            if reason in ASSEMBLING:
                return GangStatus(policy, False, "NotEvaluated")
            said = cond.get("message")
            said = said if isinstance(said, str) else ""
            if reason == "NotEnoughResources":
                return GangStatus(policy, False, "Unschedulable", message=said)
            return GangStatus(policy, False, "Other", message=said)
    return GangStatus(policy, False, "NotEvaluated")


# --- admission --------------------------------------------------------------------------------


def _key_path(where: str, key: str) -> Path:
    return Path("metadata", f"{where}[{key}]")


def queue_errors(context: Context) -> list[FieldError]:
    """An empty queue name (Trainer refuses it too), or one the PodGroup CRD would refuse."""
    errors: list[FieldError] = []
    for where, values in (("labels", context.labels), ("annotations", context.annotations)):
        if values.get(QUEUE_KEY) == "":
            errors.append(
                fe.required(
                    _key_path(where, QUEUE_KEY),
                    "name the Volcano queue, or remove the key for the default queue",
                )
            )
    queue = queue_of(context)
    if not errors and not is_dns_subdomain(queue):
        where = "labels" if context.labels.get(QUEUE_KEY) else "annotations"
        errors.append(
            fe.invalid(
                _key_path(where, QUEUE_KEY),
                queue,
                "a Volcano queue name is a DNS-1123 subdomain (lower case, digits, '-', '.')",
            )
        )
    return errors


def _short(text: str, limit: int = 30) -> str:
    """A name cut to fit a warning (120 characters at most)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def warnings_of(plan: Plan, context: Context, settings: VolcanoSettings) -> list[str]:
    out: dict[str, None] = {}  # ordered, each once
    label, annotation = context.labels.get(QUEUE_KEY), context.annotations.get(QUEUE_KEY)
    if label and annotation and label != annotation:
        out[f"the {QUEUE_KEY} label and annotation differ: the label's queue is used"] = None
    for g in plan.groups:
        if g.topology_key and g.topology_key not in settings.topology_tiers:
            out[
                f"topology {_short(g.topology_key)!r} is not enforced: no Volcano HyperNode tier "
                "is set for it (--volcano-topology-tiers)"
            ] = None
        if g.resource_claims:
            out["Volcano PodGroups carry no resourceClaims: each pod's own claims apply"] = None
        if g.disruption_mode == "all":
            out["disruptionMode all is not carried: Volcano PodGroups have no disruption mode"] = (
                None
            )
    return list(out)


# --- the backend ------------------------------------------------------------------------------


class VolcanoBackend:
    name: str = "volcano"
    kinds: tuple[Kind, ...] = (POD_GROUP,)

    def __init__(self, settings: VolcanoSettings | None = None) -> None:
        self.settings = settings or VolcanoSettings()

    @property
    def rbac(self) -> tuple[Rule, ...]:
        return (Rule((GROUP,), (POD_GROUP.plural,), OBJECT_VERBS),)

    def render(self, plan: Plan, context: Context, uids: Uids | None = None) -> list[JsonObject]:
        return [pod_group(plan, g, context, self.settings) for g in plan.groups]

    def drift(self, desired: JsonObject, stored: JsonObject) -> Drift:
        return pod_group_drift(desired, stored)

    def pod_patch(self, pod: JsonObject, plan: Plan, group: GroupPlan) -> list[JsonObject]:
        wanted = {GROUP_NAME_ANNOTATION: group.pod_group_name}
        if _per_task(group):
            meta = pod.get("metadata")
            labels = meta.get("labels") if isinstance(meta, dict) else None
            job = labels.get(REPLICATED_JOB_NAME) if isinstance(labels, dict) else None
            if isinstance(job, str):
                wanted[TASK_SPEC_ANNOTATION] = job
        return annotate(pod, wanted)

    def depth(self, kind: Kind, obj: JsonObject) -> int:
        return 0  # flat: one PodGroup per plan group, no parents

    def status(self, kind: Kind, obj: JsonObject) -> GangStatus | None:
        return pod_group_status(obj) if kind == POD_GROUP else None

    def admission_warnings(self, plan: Plan, context: Context) -> list[str]:
        return warnings_of(plan, context, self.settings)

    def admission_errors(
        self, plan: Plan, context: Context, facts: ClusterFacts
    ) -> list[FieldError]:
        if not plan.groups:
            return []
        return queue_errors(context) + priority_class_errors(plan, facts)

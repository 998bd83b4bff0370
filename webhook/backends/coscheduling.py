"""The Coscheduling backend: scheduler-plugins' `scheduling.x-k8s.io/v1alpha1` PodGroup, which
the Coscheduling plugin (a second scheduler, `scheduler-plugins-scheduler`) and Slinky's Slurm
Bridge (`slurm-bridge-scheduler`) both schedule. Nothing makes them automatically: we do.

* One PodGroup per gang of the plan, named as the plan names it: `minMember` = the gang's
  minCount, `minResources` = what those pods request together (`GroupPlan.min_resources`),
  `scheduleTimeoutSeconds` = a setting (60, Trainer's default and the plugin's own
  `permitWaitingTimeSeconds`). `basic` groups get none: pod by pod is what no PodGroup means.
* Pods join with the label `scheduling.x-k8s.io/pod-group: <name>` (same namespace). A pod
  already labelled for another PodGroup is left alone: whoever labelled it decides.
* Topology: the PodGroup has no field for it. For schedulers that place pod by pod with
  kube-scheduler's filters (`affinity_schedulers`), a gang's pods get a required pod affinity on
  the group's label with the topology key: the first pod picks the domain, the rest must follow.
  Slurm Bridge places a gang through Slurm, whose nodes such an affinity could contradict (the
  pods would never bind), so there it is not enforced. Admission says which.
* Drift: `minMember`, `minResources` (compared as quantities) and `scheduleTimeoutSeconds` are
  plain spec fields the scheduler re-reads, so a difference is patched in place; nothing else
  is ours to compare (the CRD defaults nothing; its controller writes status only).
* Status (`status.phase`, written by the scheduler-plugins controller): Running, Finished and
  Failed mean the gang was placed; no phase yet or Pending (fewer than minMember pods exist)
  is NotEvaluated, i.e. assembly; Unknown (part placed, the rest cannot be) is Unschedulable;
  Scheduling (every pod exists, fewer than minMember running: being placed, short of capacity
  or starting, the phase cannot tell) and anything else is Other. No field says when the gang
  started running, so time-to-scheduled is not observed for this backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ..core.errors import FieldError
from ..core.plan import GroupPlan, Plan
from ..core.resources import parse
from .base import (
    OBJECT_VERBS,
    ClusterFacts,
    Context,
    Drift,
    GangStatus,
    JsonObject,
    Kind,
    Rule,
    Uids,
    add_to_map,
    metadata,
    pointer,
    priority_class_errors,
    spec_of,
    with_uid_test,
)

GROUP, VERSION = "scheduling.x-k8s.io", "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
POD_GROUP = Kind(GROUP, VERSION, "podgroups", "PodGroup")
POD_GROUP_LABEL = f"{GROUP}/pod-group"

DEFAULT_SCHEDULE_TIMEOUT = 60
MAX_INT32 = 2**31 - 1
# Pods these schedulers place one by one through kube-scheduler's filters (InterPodAffinity).
AFFINITY_SCHEDULERS = ("scheduler-plugins-scheduler",)
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
SPEC_FIELDS = ("minMember", "minResources", "scheduleTimeoutSeconds")

_SCHEDULED = ("Running", "Finished", "Failed")
_WAITING = {"": "NotEvaluated", "Pending": "NotEvaluated", "Unknown": "Unschedulable"}


# --- rendering -------------------------------------------------------------------------------


def pod_group(plan: Plan, group: GroupPlan, schedule_timeout: int) -> JsonObject:
    """A gang's PodGroup (`schedule_timeout` 0 leaves the scheduler's default)."""
    assert group.min_count is not None
    spec: JsonObject = {"minMember": group.min_count}
    if group.min_resources:
        spec["minResources"] = dict(group.min_resources)
    if schedule_timeout:
        spec["scheduleTimeoutSeconds"] = schedule_timeout
    return {
        "apiVersion": API_VERSION,
        "kind": POD_GROUP.kind,
        "metadata": metadata(plan, group.pod_group_name),
        "spec": spec,
    }


# --- drift -----------------------------------------------------------------------------------


def pod_group_drift(desired: Mapping[str, Any], stored: Mapping[str, Any]) -> Drift:
    want, have = spec_of(desired), stored.get("spec")
    if not isinstance(have, dict):
        op = "replace" if "spec" in stored else "add"
        return _patched(stored, [{"op": op, "path": "/spec", "value": dict(want)}], list(want))
    ops: list[JsonObject] = []
    changed: list[str] = []
    for key in SPEC_FIELDS:
        if _same(key, want.get(key), have.get(key)):
            continue
        changed.append(key)
        path = pointer("spec", key)
        if key not in want:
            ops.append({"op": "remove", "path": path})
        else:
            op = "replace" if key in have else "add"
            ops.append({"op": op, "path": path, "value": want[key]})
    return _patched(stored, ops, changed)


def _patched(stored: Mapping[str, Any], ops: list[JsonObject], changed: list[str]) -> Drift:
    drift = with_uid_test(stored, ops)
    if drift.kind == "none":
        return drift
    return Drift("patch", drift.patch, f"spec.{', spec.'.join(changed)} differs")


def _same(key: str, want: Any, have: Any) -> bool:
    if key == "minResources":
        return _quantities(want) == _quantities(have)
    return bool(want == have and type(want) is type(have))  # True is not 1 here


def _quantities(resources: Any) -> dict[str, Decimal | None] | None:
    """A ResourceList by value ("1000m" is "1"); a value that does not parse stays None, which
    no desired value equals."""
    if resources is None or resources == {}:
        return {}
    if not isinstance(resources, dict):
        return None
    return {str(name): parse(value) for name, value in resources.items()}


# --- pods ------------------------------------------------------------------------------------


def affinity_term(group: GroupPlan) -> JsonObject:
    """All of the group's pods in one domain of its topology key: each needs a pod of its own
    group there (the first one, matching itself, may go anywhere)."""
    assert group.topology_key is not None
    return {
        "labelSelector": {"matchLabels": {POD_GROUP_LABEL: group.pod_group_name}},
        "topologyKey": group.topology_key,
    }


def affinity_ops(pod: Mapping[str, Any], term: JsonObject) -> list[JsonObject]:
    """The operation that adds `term` to the pod's required pod affinity, creating what is
    missing; [] when the pod has the term already, or a value there that is not an object or
    a list (the API server refuses such a pod anyway)."""
    value: Any = [term]
    for key in (REQUIRED, "podAffinity", "affinity"):
        value = {key: value}
    holder: Any = pod.get("spec")
    path: tuple[str, ...] = ("spec",)
    for key in ("affinity", "podAffinity", REQUIRED):
        if not isinstance(holder, dict):
            return []
        value = value[key]
        found = holder.get(key)
        if found is None:  # missing, or null
            op = "replace" if key in holder else "add"
            return [{"op": op, "path": pointer(*path, key), "value": value}]
        holder, path = found, (*path, key)
    if not isinstance(holder, list) or term in holder:
        return []
    return [{"op": "add", "path": pointer(*path, "-"), "value": term}]


def pod_group_label(pod: Mapping[str, Any]) -> Any:
    meta = pod.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return labels.get(POD_GROUP_LABEL) if isinstance(labels, dict) else None


# --- status ----------------------------------------------------------------------------------


def pod_group_status(obj: Mapping[str, Any]) -> GangStatus:
    status = obj.get("status")
    phase = status.get("phase") if isinstance(status, dict) else None
    if phase is None:
        phase = ""
    if not isinstance(phase, str):
        return GangStatus("gang", False, "Other")
    if phase in _SCHEDULED:
        return GangStatus("gang", True, "Scheduled")
    return GangStatus("gang", False, _WAITING.get(phase, "Other"))


# --- the backend -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CoschedulingSettings:
    """`--coscheduling-schedule-timeout` and `--coscheduling-affinity-schedulers`."""

    schedule_timeout: int = DEFAULT_SCHEDULE_TIMEOUT
    affinity_schedulers: frozenset[str] = frozenset(AFFINITY_SCHEDULERS)

    def __post_init__(self) -> None:
        if not 0 <= self.schedule_timeout <= MAX_INT32:
            raise ValueError(
                f"the Coscheduling schedule timeout must be 0 to {MAX_INT32} seconds "
                f"(an int32), not {self.schedule_timeout}"
            )


class CoschedulingBackend:
    name: str = "coscheduling"
    kinds: tuple[Kind, ...] = (POD_GROUP,)

    def __init__(self, settings: CoschedulingSettings | None = None) -> None:
        self.settings = settings or CoschedulingSettings()
        self.schedule_timeout = self.settings.schedule_timeout
        self.affinity_schedulers = self.settings.affinity_schedulers

    @property
    def rbac(self) -> tuple[Rule, ...]:
        return (Rule((GROUP,), (POD_GROUP.plural,), OBJECT_VERBS),)

    def render(self, plan: Plan, context: Context, uids: Uids | None = None) -> list[JsonObject]:
        return [
            pod_group(plan, g, self.schedule_timeout) for g in plan.groups if g.policy == "gang"
        ]

    def drift(self, desired: JsonObject, stored: JsonObject) -> Drift:
        return pod_group_drift(desired, stored)

    def pod_patch(self, pod: JsonObject, plan: Plan, group: GroupPlan) -> list[JsonObject]:
        if group.policy != "gang":
            return []  # no PodGroup: a label naming none would keep the pod from scheduling
        label = pod_group_label(pod)
        if label is not None and label != group.pod_group_name:
            return []  # tied to another PodGroup by whoever labelled it: theirs to decide
        ops = add_to_map(pod, ("metadata", "labels"), POD_GROUP_LABEL, group.pod_group_name)
        if group.topology_key and self.enforces_topology(plan):
            ops += affinity_ops(pod, affinity_term(group))
        return ops

    def enforces_topology(self, plan: Plan) -> bool:
        return plan.scheduler_name in self.affinity_schedulers

    def depth(self, kind: Kind, obj: JsonObject) -> int:
        return 0  # flat: one PodGroup per gang, no parents

    def status(self, kind: Kind, obj: JsonObject) -> GangStatus | None:
        return pod_group_status(obj) if kind == POD_GROUP else None

    def admission_warnings(self, plan: Plan, context: Context) -> list[str]:
        warnings: list[str] = []
        gang_keys = {g.topology_key for g in plan.groups if g.policy == "gang" and g.topology_key}
        basic_keys = {g.topology_key for g in plan.groups if g.policy == "basic" and g.topology_key}
        for key in sorted(k for k in gang_keys if k):
            if self.enforces_topology(plan):
                warnings.append(
                    f"Coscheduling: topology {key} becomes required pod affinity; a gang's "
                    "first pod picks the domain"
                )
            else:
                warnings.append(
                    f"Coscheduling: {plan.scheduler_name} does not enforce topology {key} "
                    "(PodGroups have none)"
                )
        for key in sorted(k for k in basic_keys if k):
            warnings.append(
                f"Coscheduling: topology {key} of a basic group is not enforced (no PodGroup)"
            )
        if any(g.resource_claims for g in plan.groups):
            warnings.append(
                "Coscheduling: the groups' resourceClaims are dropped (PodGroups have none); "
                "claim them in the pod templates"
            )
        if any(g.disruption_mode == "all" for g in plan.groups):
            warnings.append(
                "Coscheduling: disruptionMode all is dropped; pods of a gang are evicted one by one"
            )
        return warnings

    def admission_errors(
        self, plan: Plan, context: Context, facts: ClusterFacts
    ) -> list[FieldError]:
        return priority_class_errors(plan, facts)

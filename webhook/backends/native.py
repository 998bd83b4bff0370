"""The native backend (kube-scheduler with GenericWorkload): one `scheduling.k8s.io` Workload
with a PodGroupTemplate per group, one PodGroup per template (was-api.md sections 1 and 4); pods
name their PodGroup in `spec.schedulingGroup`. Kubernetes 1.37 serves them as `v1beta1`, 1.36 as
`v1alpha2`: discovery picks the newest served (`use_version`), `native_versions.py` knows how
the shapes differ.

Drift (rule 8(f)): a different `gang.minCount` is patched in place (1.37; in 1.36 it is
immutable, so it is a recreate too); values the API server fills
in where the desired object leaves a field unset are not drift; any other difference means
delete and create again. A field that the desired object sets and the stored one lacks was
dropped by the API server because its feature gate is off (topology, claims, disruptionMode,
priorityClassName...): recreating would drop it again, forever, so that is reported instead.

Defaulting (its mutating webhooks): a gang template or PodGroup without `minCount` (sent as 0)
gets the plan's, when a TrainJob controls the object.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s

from ..core.errors import FieldError
from ..core.layout import MAX_TEMPLATES
from ..core.plan import CompositePlan, GroupPlan, Plan
from ..core.trainer import TRAINER_GROUP, TRAINJOB_KIND
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
    metadata,
    pointer,
    priority_class_errors,
    spec_of,
    with_uid_test,
)
from .native_versions import SHAPES, V1BETA1, VERSIONS, Shapes

GROUP, VERSION = "scheduling.k8s.io", "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
WORKLOAD = Kind(GROUP, VERSION, "workloads", "Workload")
POD_GROUP = Kind(GROUP, VERSION, "podgroups", "PodGroup")
# Only multi-level plans need it (gate CompositePodGroup, alpha in 1.37).
COMPOSITE = Kind(GROUP, "v1alpha3", "compositepodgroups", "CompositePodGroup", optional=True)
COMPOSITE_API_VERSION = f"{GROUP}/v1alpha3"
CONDITION = "PodGroupInitiallyScheduled"

# Fields the API server drops, without an error, from a PodGroupTemplate or a PodGroup spec
# while their feature gate is off (1.36: pkg/registry/scheduling/*/strategy.go,
# dropDisabled*Fields). Only to name the gate: which fields were dropped is read from what the
# server stored (`_fields_drift`), so a field gated in a later release is caught too.
GATES = {
    "schedulingConstraints": "TopologyAwareWorkloadScheduling",
    "resourceClaims": "DRAWorkloadResourceClaims",
    "disruptionMode": "WorkloadAwarePreemption",
    "priorityClassName": "WorkloadAwarePreemption",
    "priority": "WorkloadAwarePreemption",
    "preemptionPolicy": "PodGroupPreemptionPolicy",
}
UNKNOWN_GATE = "unknown"
# Filled in by the API server (defaults, the Priority admission plugin, a global-default
# PriorityClass) when left unset.
SERVER_FILLED = ("priority", "priorityClassName", "preemptionPolicy")
_CHILDREN = ("compositePodGroupTemplates", "podGroupTemplates")
# Compared on their own rules, not as plain immutable fields.
_NOT_FIELDS = {
    "name", "schedulingPolicy", "workloadRef", "podGroupTemplateRef",
    "parentCompositePodGroupName", *_CHILDREN,
}  # fmt: skip


@functools.cache
def _serializer() -> k8s.ApiClient:
    return k8s.ApiClient()


def _json(model: Any) -> JsonObject:
    """The wire JSON of a client model (camelCase keys, unset fields left out)."""
    result: JsonObject = _serializer().sanitize_for_serialization(model)  # type: ignore[no-untyped-call]
    return result


# --- rendering -------------------------------------------------------------------------------


def _policy(group: GroupPlan) -> k8s.V1beta1PodGroupSchedulingPolicy:
    if group.policy == "gang":
        assert group.min_count is not None
        gang = k8s.V1beta1GangSchedulingPolicy(min_count=group.min_count)
        return k8s.V1beta1PodGroupSchedulingPolicy(gang=gang)
    return k8s.V1beta1PodGroupSchedulingPolicy(basic={})


def _group_fields(group: GroupPlan) -> dict[str, Any]:
    """The fields a PodGroupTemplate and its PodGroup share; unset ones are left out, so
    server defaults (disruptionMode single, priority) are never mistaken for drift."""
    fields: dict[str, Any] = {"scheduling_policy": _policy(group)}
    if group.topology_key:
        fields["scheduling_constraints"] = k8s.V1beta1PodGroupSchedulingConstraints(
            topology=[k8s.V1beta1TopologyConstraint(key=group.topology_key)]
        )
    if group.disruption_mode == "all":
        fields["disruption_mode"] = k8s.V1beta1DisruptionMode(all={})
    elif group.disruption_mode == "single":
        fields["disruption_mode"] = k8s.V1beta1DisruptionMode(single={})
    if group.resource_claims:
        fields["resource_claims"] = [
            k8s.V1beta1PodGroupResourceClaim(
                name=c.name,
                resource_claim_name=c.resource_claim_name,
                resource_claim_template_name=c.resource_claim_template_name,
            )
            for c in group.resource_claims
        ]
    if group.priority_class_name:
        fields["priority_class_name"] = group.priority_class_name
    return fields


def _composite_fields(composite: CompositePlan, version: str = "v1beta1") -> dict[str, Any]:
    """The fields a CompositePodGroupTemplate (v1beta1, in the Workload) and its
    CompositePodGroup (v1alpha3) share, as the client models of that version."""
    model = _models(version)
    if composite.policy == "gang":
        gang = model["CompositeGangSchedulingPolicy"](min_group_count=composite.min_group_count)
        policy = model["CompositePodGroupSchedulingPolicy"](gang=gang)
    else:
        policy = model["CompositePodGroupSchedulingPolicy"](basic={})
    fields: dict[str, Any] = {"scheduling_policy": policy}
    if composite.topology_key:
        fields["scheduling_constraints"] = model["CompositePodGroupSchedulingConstraints"](
            topology=[model["TopologyConstraint"](key=composite.topology_key)]
        )
    if composite.disruption_mode in ("all", "single"):
        fields["disruption_mode"] = model["CompositeDisruptionMode"](
            **{composite.disruption_mode: {}}
        )
    if composite.priority_class_name:
        fields["priority_class_name"] = composite.priority_class_name
    return fields


def _models(version: str) -> dict[str, Any]:
    prefix = "V1beta1" if version == "v1beta1" else "V1alpha3"
    names = (
        "CompositeGangSchedulingPolicy",
        "CompositePodGroupSchedulingPolicy",
        "CompositePodGroupSchedulingConstraints",
        "CompositeDisruptionMode",
        "TopologyConstraint",
    )
    return {name: getattr(k8s, prefix + name) for name in names}


def _composite_template(
    plan: Plan, composite: CompositePlan
) -> k8s.V1beta1CompositePodGroupTemplate:
    leaves = {g.template_name: g for g in plan.groups}
    nested = {c.template_name: c for c in plan.composites}
    return k8s.V1beta1CompositePodGroupTemplate(
        name=composite.template_name,
        pod_group_templates=[
            k8s.V1beta1PodGroupTemplate(name=name, **_group_fields(leaves[name]))
            for name in composite.children
            if name in leaves
        ]
        or None,
        composite_pod_group_templates=[
            _composite_template(plan, nested[name]) for name in composite.children if name in nested
        ]
        or None,
        **_composite_fields(composite),
    )


def workload(plan: Plan) -> JsonObject:
    controller = k8s.V1beta1TypedLocalObjectReference(
        api_group=TRAINER_GROUP, kind=TRAINJOB_KIND, name=plan.trainjob_name
    )
    if plan.composites:  # a tree: the root's template holds everything
        spec = k8s.V1beta1WorkloadSpec(
            controller_ref=controller,
            composite_pod_group_templates=[_composite_template(plan, plan.composites[0])],
        )
    else:
        spec = k8s.V1beta1WorkloadSpec(
            controller_ref=controller,
            pod_group_templates=[
                k8s.V1beta1PodGroupTemplate(name=g.template_name, **_group_fields(g))
                for g in plan.groups
            ],
        )
    return {
        "apiVersion": API_VERSION,
        "kind": WORKLOAD.kind,
        "metadata": metadata(plan, plan.workload_name),
        "spec": _json(spec),
    }


def composite_pod_group(
    plan: Plan, composite: CompositePlan, workload_uid: str | None = None
) -> JsonObject:
    """A composite's CompositePodGroup (v1alpha3), pointing at its parent's."""
    spec = k8s.V1alpha3CompositePodGroupSpec(
        workload_ref=k8s.V1alpha3WorkloadReference(
            workload_name=plan.workload_name, template_name=composite.template_name
        ),
        parent_composite_pod_group_name=composite.parent_name,
        **_composite_fields(composite, "v1alpha3"),
    )
    return {
        "apiVersion": COMPOSITE_API_VERSION,
        "kind": COMPOSITE.kind,
        "metadata": metadata(plan, composite.name, _workload_owner(plan, workload_uid)),
        "spec": _json(spec),
    }


def _workload_owner(plan: Plan, workload_uid: str | None) -> list[JsonObject]:
    """A second (non-controller) owner: the Workload, once its uid is known."""
    if not workload_uid:
        return []
    return [
        {"apiVersion": API_VERSION, "kind": "Workload", "name": plan.workload_name,
         "uid": workload_uid}
    ]  # fmt: skip


def pod_group(plan: Plan, group: GroupPlan, workload_uid: str | None = None) -> JsonObject:
    """A group's PodGroup; with the Workload's uid, a second (non-controller) owner for it;
    in a tree, pointing at its parent CompositePodGroup."""
    spec = k8s.V1beta1PodGroupSpec(
        workload_ref=k8s.V1beta1WorkloadReference(
            workload_name=plan.workload_name, template_name=group.template_name
        ),
        parent_composite_pod_group_name=group.parent_name,
        **_group_fields(group),
    )
    return {
        "apiVersion": API_VERSION,
        "kind": POD_GROUP.kind,
        "metadata": metadata(plan, group.pod_group_name, _workload_owner(plan, workload_uid)),
        "spec": _json(spec),
    }


# --- drift -----------------------------------------------------------------------------------


def workload_drift(
    desired: Mapping[str, Any], actual: Mapping[str, Any], shapes: Shapes = SHAPES[V1BETA1]
) -> Drift:
    want, have = spec_of(desired), spec_of(actual)
    if want.get("controllerRef") != have.get("controllerRef"):
        return Drift("recreate", reason="spec.controllerRef differs")
    if "compositePodGroupTemplates" in want or "compositePodGroupTemplates" in have:
        # A tree is immutable as a whole: compared part by part, with the flat rules for what
        # the server fills in or drops behind a gate.
        tree = ("compositePodGroupTemplates", "podGroupTemplates")
        return _immutable_drift(
            {k: want.get(k) for k in tree}, {k: have.get(k) for k in tree}, "the tree"
        )
    want_templates = _by_name(want.get("podGroupTemplates"))
    have_templates = _by_name(have.get("podGroupTemplates"))
    if list(want_templates) != list(have_templates):
        names = ", ".join(have_templates) or "none"
        return Drift("recreate", reason=f"the template set differs (stored: {names})")
    ops: list[dict[str, Any]] = []
    dropped: list[tuple[str, str]] = []
    for index, (name, template) in enumerate(want_templates.items()):
        path = f"/spec/podGroupTemplates/{index}"
        drift = _group_drift(template, have_templates[name], f"template {name!r}", shapes)
        if drift.kind == "recreate":
            return drift
        dropped += drift.dropped
        if drift.kind == "patch":
            ops += [
                {"op": "test", "path": f"{path}/name", "value": name},
                {"op": "replace", "path": f"{path}/schedulingPolicy/gang/minCount",
                 "value": _min_count(template)},
            ]  # fmt: skip
    return _result(actual, ops, dropped)


def pod_group_drift(
    desired: Mapping[str, Any], actual: Mapping[str, Any], shapes: Shapes = SHAPES[V1BETA1]
) -> Drift:
    want, have = spec_of(desired), spec_of(actual)
    ref = shapes.pod_group_ref
    if want.get(ref) != have.get(ref):
        return Drift("recreate", reason=f"spec.{ref} differs")
    if want.get("parentCompositePodGroupName") != have.get("parentCompositePodGroupName"):
        return Drift("recreate", reason="spec.parentCompositePodGroupName differs")
    drift = _group_drift(want, have, "the PodGroup", shapes)
    if drift.kind == "recreate":
        return drift
    ops = []
    if drift.kind == "patch":
        ops = [
            {"op": "replace", "path": "/spec/schedulingPolicy/gang/minCount",
             "value": _min_count(want)},
        ]  # fmt: skip
    return _result(actual, ops, list(drift.dropped))


def _fields_drift(
    want: Mapping[str, Any], have: Mapping[str, Any], what: str, default_mode: Any
) -> Drift:
    """The immutable fields of a template or PodGroup spec (its policy and references aside)
    against the stored ones. A field `want` sets and the stored object lacks (absent, or null: a
    Workload template's `schedulingConstraints` has no omitempty; or, for `disruptionMode`, the
    server's default, which a dropped PodGroup mode reads back as) was dropped by the API
    server, since these fields can only be set at create: a feature gate is off, and recreating
    would drop it again, forever. That is learnt from what the server stored, whatever the field;
    `GATES` only names the gate. A field `want` leaves unset is the server's to fill in (its
    defaults, one a later release adds), not drift, unless it is one the service sets and the
    stored value is not a default. Any other difference is."""
    dropped: list[tuple[str, str]] = []
    for key in sorted((set(want) | set(have)) - _NOT_FIELDS):
        wanted, stored = want.get(key), have.get(key)
        if wanted == stored:
            continue
        if stored is None or (
            key == "disruptionMode" and stored == default_mode and wanted is not None
        ):
            # Dropped; a dropped mode reads back as the server's default (defaulted on read).
            if not (key == "disruptionMode" and wanted == default_mode):
                dropped.append((key, GATES.get(key, UNKNOWN_GATE)))
        elif wanted is None and (
            key not in GATES  # a field the service never sets: the server's (a default)
            or key in SERVER_FILLED
            or (key == "disruptionMode" and stored == default_mode)
        ):
            continue
        else:
            return Drift("recreate", reason=f"{what}: {key} differs")
    return Drift(dropped=tuple(dropped))


def _group_drift(
    want: Mapping[str, Any], have: Mapping[str, Any], what: str, shapes: Shapes
) -> Drift:
    """A PodGroupTemplate against a stored one, or a PodGroup spec against a stored one."""
    if set(want.get("schedulingPolicy") or {}) != set(have.get("schedulingPolicy") or {}):
        return Drift("recreate", reason=f"{what}: the scheduling policy kind differs")
    drift = _fields_drift(want, have, what, shapes.default_disruption_mode)
    if drift.kind == "recreate":
        return drift
    changed = _min_count(want) != _min_count(have)
    if changed and not shapes.min_count_mutable:
        # 1.36: only delete and create again changes it (the reconciler holds that while
        # the TrainJob has pods).
        return Drift("recreate", reason=f"{what}: gang.minCount differs (immutable in 1.36)")
    return Drift("patch" if changed else "none", dropped=drift.dropped)


def composite_drift(desired: Mapping[str, Any], actual: Mapping[str, Any]) -> Drift:
    """A CompositePodGroup is immutable: any difference but what the server fills in or drops
    behind a gate recreates it."""
    return _immutable_drift(spec_of(desired), spec_of(actual), "the CompositePodGroup")


def _immutable_drift(want: Mapping[str, Any], have: Mapping[str, Any], what: str) -> Drift:
    """A part of a tree against the stored one: equal, but for a field the server dropped
    (reported, not drift, so nothing loops) and what it fills in where `want` leaves a field
    unset. Children are matched by name, all the way down."""
    if want.get("schedulingPolicy") != have.get("schedulingPolicy"):
        return Drift("recreate", reason=f"{what}: schedulingPolicy differs")
    drift = _fields_drift(want, have, what, {"single": {}})
    if drift.kind == "recreate":
        return drift
    dropped = list(drift.dropped)
    for key in _CHILDREN:
        wanted, stored = _by_name(want.get(key)), _by_name(have.get(key))
        listed = have.get(key)
        if list(wanted) != list(stored) or len(stored) != (
            len(listed) if isinstance(listed, list) else 0
        ):
            return Drift("recreate", reason=f"{what}: its {key} differ")
        for name, child in wanted.items():
            drift = _immutable_drift(child, stored[name], f"template {name!r}")
            if drift.kind == "recreate":
                return drift
            dropped += drift.dropped
    return Drift(dropped=_unique(dropped))


def _unique(dropped: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple(dict.fromkeys(dropped))


def _result(
    actual: Mapping[str, Any], ops: list[dict[str, Any]], dropped: list[tuple[str, str]]
) -> Drift:
    if not ops:
        return Drift(dropped=_unique(dropped))
    drift = with_uid_test(actual, ops)
    return Drift("patch", drift.patch, "gang.minCount differs", _unique(dropped))


def _min_count(group: Mapping[str, Any]) -> Any:
    policy = group.get("schedulingPolicy")
    gang = policy.get("gang") if isinstance(policy, dict) else None
    return gang.get("minCount") if isinstance(gang, dict) else None


def _by_name(templates: Any) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for template in templates if isinstance(templates, list) else []:
        if isinstance(template, dict) and isinstance(template.get("name"), str):
            out[template["name"]] = template
    return out


# --- defaulting (the Workload and PodGroup mutating webhooks) ------------------------------


def lacks_min_count(policy: Any) -> bool:
    """A gang policy without minCount; the API server sends a missing minCount as 0."""
    if not isinstance(policy, dict):
        return False
    gang = policy.get("gang")
    return isinstance(gang, dict) and not gang.get("minCount")


def needs_default(kind: Kind, obj: Mapping[str, Any]) -> bool:
    """Whether a Workload or PodGroup has a gang without minCount (in a Workload the API server
    could accept: one with more templates than it allows is left for it to refuse)."""
    spec = spec_of(obj)
    if kind == POD_GROUP:
        return lacks_min_count(spec.get("schedulingPolicy"))
    templates = spec.get("podGroupTemplates")
    return (
        isinstance(templates, list)
        and len(templates) <= MAX_TEMPLATES
        and any(
            isinstance(t, dict) and lacks_min_count(t.get("schedulingPolicy")) for t in templates
        )
    )


def with_min_counts(kind: Kind, obj: Mapping[str, Any], plan: Plan) -> tuple[JsonObject, list[str]]:
    """A copy of `obj` whose gangs without minCount have the plan's (copied along the changed
    path only, so a diff of the two sees just that); warnings for gangs the plan lacks."""
    out = dict(obj)
    spec = out.get("spec")
    if not isinstance(spec, dict):
        return out, []
    spec = out["spec"] = dict(spec)
    if kind == POD_GROUP:
        if not lacks_min_count(spec.get("schedulingPolicy")):
            return out, []
        meta = out.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        template = _shapes_of(out).template_name(spec)
        group = next((g for g in plan.groups if g.pod_group_name == name), None)
        if group is None and isinstance(template, str):
            group = match_group(plan, template)
        if group is None or group.min_count is None:
            return out, [_unmatched(plan, template or name)]
        spec["schedulingPolicy"] = _with_min_count(spec["schedulingPolicy"], group.min_count)
        return out, []
    warnings: list[str] = []
    templates = spec.get("podGroupTemplates")
    if not isinstance(templates, list):
        return out, warnings
    templates = spec["podGroupTemplates"] = list(templates)
    for i, tmpl in enumerate(templates):
        if not isinstance(tmpl, dict) or not lacks_min_count(tmpl.get("schedulingPolicy")):
            continue
        name = tmpl.get("name")
        group = match_group(plan, name if isinstance(name, str) else "")
        if group is None or group.min_count is None:
            warnings.append(_unmatched(plan, name))
            continue
        templates[i] = {
            **tmpl,
            "schedulingPolicy": _with_min_count(tmpl["schedulingPolicy"], group.min_count),
        }
    return out, warnings


def _shapes_of(obj: Mapping[str, Any]) -> Shapes:
    """The shapes of an object's own version (the defaulting webhook gets either)."""
    version = str(obj.get("apiVersion") or "").rpartition("/")[2]
    return SHAPES.get(version, SHAPES[V1BETA1])


def match_group(plan: Plan, template: str) -> GroupPlan | None:
    """The plan group a template name stands for.

    The plan's own template name first; then a ReplicatedJob name, when exactly one gang holds
    that ReplicatedJob (so a hand-written template `node` means the group of `node`); then the
    only gang of the plan, when there is just one.
    """
    gangs = [g for g in plan.groups if g.policy == "gang"]
    for g in gangs:
        if g.template_name == template:
            return g
    holding = [g for g in gangs if template in g.replicated_jobs]
    if len(holding) == 1:
        return holding[0]
    return gangs[0] if len(gangs) == 1 else None


def _with_min_count(policy: dict[str, Any], min_count: int) -> dict[str, Any]:
    return {**policy, "gang": {**policy["gang"], "minCount": min_count}}


def _unmatched(plan: Plan, template: Any) -> str:
    shown = f'"{template}"' if isinstance(template, str) else "(unnamed)"
    return (
        f"minCount not defaulted: template {shown} matches no gang of TrainJob "
        f'"{plan.trainjob_name}"; set gang.minCount'
    )


# --- status -----------------------------------------------------------------------------------


def pod_group_status(obj: Mapping[str, Any]) -> GangStatus:
    """What kube-scheduler's condition (`PodGroupInitiallyScheduled`; 1.36:
    `PodGroupScheduled`, by the object's apiVersion) says of a PodGroup."""
    condition = _shapes_of(obj).condition
    spec = spec_of(obj)
    policy = spec.get("schedulingPolicy")
    kind = "gang" if isinstance(policy, dict) and "gang" in policy else "basic"
    status = obj.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for cond in conditions if isinstance(conditions, list) else ():
        if not isinstance(cond, dict) or cond.get("type") != condition:
            continue
        if cond.get("status") == "True":
            at = cond.get("lastTransitionTime")
            return GangStatus(kind, True, "Scheduled", at if isinstance(at, str) else None)
        if cond.get("status") == "False":
            reason = cond.get("reason")
            if reason not in ("Unschedulable", "SchedulerError"):
                reason = "Other"  # any other value would be a label value without bound
            said = cond.get("message")
            return GangStatus(
                kind, False, str(reason), message=said if isinstance(said, str) else ""
            )
    return GangStatus(kind, False, "NotEvaluated")


# --- the backend ------------------------------------------------------------------------------


class NativeBackend:
    name: str = "native"
    versions: tuple[str, ...] = VERSIONS  # what discovery may choose from, newest first

    def __init__(self, version: str = V1BETA1) -> None:
        self.use_version(version)

    def use_version(self, version: str) -> None:
        """Speak `version` from now on (discovery's choice: the newest the cluster serves)."""
        self.shapes = SHAPES[version]
        workload, pod_group = (
            Kind(k.group, version, k.plural, k.kind) for k in (WORKLOAD, POD_GROUP)
        )
        # CompositePodGroup stays v1alpha3: a 1.36 cluster does not serve it, so discovery
        # finds it not served and plans that need it are denied there.
        self.kinds: tuple[Kind, ...] = (workload, COMPOSITE, pod_group)
        self.defaulted: tuple[Kind, ...] = (workload, pod_group)  # its mutating webhooks

    @property
    def version(self) -> str:
        return self.shapes.version

    @property
    def rbac(self) -> tuple[Rule, ...]:
        # CompositePodGroups are immutable: drift recreates them, nothing patches them.
        composite_verbs = tuple(v for v in OBJECT_VERBS if v != "patch")
        return (
            Rule((GROUP,), (WORKLOAD.plural, POD_GROUP.plural), OBJECT_VERBS),
            Rule((GROUP,), (COMPOSITE.plural,), composite_verbs),
        )

    def render(self, plan: Plan, context: Context, uids: Uids | None = None) -> list[JsonObject]:
        if not plan.groups:
            return []
        workload_uid = (uids or {}).get((WORKLOAD.kind, plan.workload_name))
        outgoing = self.shapes.outgoing
        return [
            outgoing(workload(plan)),
            *(composite_pod_group(plan, c, workload_uid) for c in plan.composites),
            *(outgoing(pod_group(plan, g, workload_uid)) for g in plan.groups),
        ]

    def drift(self, desired: JsonObject, stored: JsonObject) -> Drift:
        if desired.get("kind") == WORKLOAD.kind:
            return workload_drift(desired, stored, self.shapes)
        if desired.get("kind") == COMPOSITE.kind:
            return composite_drift(desired, stored)
        return pod_group_drift(desired, stored, self.shapes)

    def depth(self, kind: Kind, obj: JsonObject) -> int:
        return 1 if kind == COMPOSITE and spec_of(obj).get("parentCompositePodGroupName") else 0

    def pod_patch(self, pod: JsonObject, plan: Plan, group: GroupPlan) -> list[JsonObject]:
        op = scheduling_group_op(pod, group.pod_group_name)
        return [op] if op is not None else []

    def job_patch(self, job: JsonObject, plan: Plan, group: GroupPlan) -> list[JsonObject]:
        """A Job whose pod template names its PodGroup: the Job controller then makes no gang of
        its own for it (WorkloadWithJob: a Job whose template has `schedulingGroup` is not a
        candidate; KEP-5547: a parent that gangs several Jobs sets it on its child Jobs)."""
        op = scheduling_group_op(job, group.pod_group_name, ("spec", "template"))
        return [op] if op is not None else []

    def status(self, kind: Kind, obj: JsonObject) -> GangStatus | None:
        # The gang signals count groups of pods; a tree's composites are not gangs of pods.
        return pod_group_status(obj) if kind == POD_GROUP else None

    def admission_warnings(self, plan: Plan, context: Context) -> list[str]:
        return []

    def admission_errors(
        self, plan: Plan, context: Context, facts: ClusterFacts
    ) -> list[FieldError]:
        return priority_class_errors(plan, facts)

    def needs_default(self, kind: Kind, obj: Mapping[str, Any]) -> bool:
        return needs_default(kind, obj)

    def default(
        self, kind: Kind, obj: Mapping[str, Any], plan: Plan
    ) -> tuple[JsonObject, list[str]]:
        return with_min_counts(kind, obj, plan)


def scheduling_group_op(
    pod: Mapping[str, Any], pod_group_name: str, at: tuple[str, ...] = ()
) -> JsonObject | None:
    """The one JSON Patch operation that puts a pod (or, `at` a Job's `spec/template`, the pods
    a Job makes) in a PodGroup, what jsonpatch would say; None when it names that group."""
    value = {"podGroupName": pod_group_name}
    holder: Any = pod
    for part in at:
        holder = holder.get(part) if isinstance(holder, dict) else None
    if not isinstance(holder, dict):
        return None  # no template: not an object the API server would take
    spec = holder.get("spec")
    if not isinstance(spec, dict):
        op = "replace" if "spec" in holder else "add"
        return {"op": op, "path": pointer(*at, "spec"), "value": {"schedulingGroup": value}}
    if spec.get("schedulingGroup") == value:
        return None
    op = "replace" if "schedulingGroup" in spec else "add"
    return {"op": op, "path": pointer(*at, "spec", "schedulingGroup"), "value": value}


def scheduling_group_of(pod: Mapping[str, Any], at: tuple[str, ...] = ()) -> str | None:
    """The PodGroup a pod (or a Job's pod template, `at`) names, if any."""
    holder: Any = pod
    for part in (*at, "spec", "schedulingGroup"):
        holder = holder.get(part) if isinstance(holder, dict) else None
    name = holder.get("podGroupName") if isinstance(holder, dict) else None
    return name if isinstance(name, str) else None

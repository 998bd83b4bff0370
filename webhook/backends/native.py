"""The native Kubernetes 1.37 backend: one `scheduling.k8s.io/v1beta1` Workload with a
PodGroupTemplate per group, and one PodGroup per template (was-api.md sections 1 and 4)."""

from __future__ import annotations

import functools
from typing import Any

from kubernetes import client as k8s

from ..core.plan import GroupPlan, Plan
from ..core.trainer import TRAINER_API_VERSION, TRAINER_GROUP
from .base import GangBackend, JsonObject, owner_labels

API_VERSION = "scheduling.k8s.io/v1beta1"


@functools.cache
def _serializer() -> k8s.ApiClient:
    return k8s.ApiClient()


def _json(model: Any) -> JsonObject:
    """The wire JSON of a client model (camelCase keys, unset fields left out)."""
    result: JsonObject = _serializer().sanitize_for_serialization(model)  # type: ignore[no-untyped-call]
    return result


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


def _trainjob_owner(plan: Plan) -> list[k8s.V1OwnerReference]:
    if not plan.trainjob_uid:
        return []  # a plan for a TrainJob not yet stored (e.g. `plan` on a file)
    return [
        k8s.V1OwnerReference(
            api_version=TRAINER_API_VERSION,
            kind="TrainJob",
            name=plan.trainjob_name,
            uid=plan.trainjob_uid,
            controller=True,
            block_owner_deletion=True,
        )
    ]


def workload(plan: Plan) -> JsonObject:
    meta = k8s.V1ObjectMeta(
        name=plan.workload_name,
        namespace=plan.namespace,
        labels=owner_labels(plan),
        owner_references=_trainjob_owner(plan) or None,
    )
    spec = k8s.V1beta1WorkloadSpec(
        controller_ref=k8s.V1beta1TypedLocalObjectReference(
            api_group=TRAINER_GROUP, kind="TrainJob", name=plan.trainjob_name
        ),
        pod_group_templates=[
            k8s.V1beta1PodGroupTemplate(name=g.template_name, **_group_fields(g))
            for g in plan.groups
        ],
    )
    return _json(
        k8s.V1beta1Workload(api_version=API_VERSION, kind="Workload", metadata=meta, spec=spec)
    )


def pod_group(plan: Plan, group: GroupPlan, parent_uid: str | None = None) -> JsonObject:
    owners = _trainjob_owner(plan)
    if parent_uid:
        owners.append(
            k8s.V1OwnerReference(
                api_version=API_VERSION, kind="Workload", name=plan.workload_name, uid=parent_uid
            )
        )
    meta = k8s.V1ObjectMeta(
        name=group.pod_group_name,
        namespace=plan.namespace,
        labels=owner_labels(plan),
        owner_references=owners or None,
    )
    spec = k8s.V1beta1PodGroupSpec(
        workload_ref=k8s.V1beta1WorkloadReference(
            workload_name=plan.workload_name, template_name=group.template_name
        ),
        **_group_fields(group),
    )
    return _json(
        k8s.V1beta1PodGroup(api_version=API_VERSION, kind="PodGroup", metadata=meta, spec=spec)
    )


class NativeBackend(GangBackend):
    name = "native"

    def render(self, plan: Plan, parent_uid: str | None = None) -> list[JsonObject]:
        if not plan.groups:
            return []
        return [workload(plan), *(pod_group(plan, g, parent_uid) for g in plan.groups)]

"""Defaults the mutating webhooks fill in (pure: no I/O).

Each function takes the raw object exactly as the API server sent it and returns a mutated copy,
so the caller can diff the two into a JSON Patch: fields the service does not model are never
touched. Copies are made only along the changed path (copy on write): the input is never modified,
and an object nested ever so deeply costs no recursion. Every function is idempotent: its output,
passed in again, comes back unchanged.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from .layout import MAX_ENTRIES, MAX_TEMPLATES
from .plan import GroupPlan, Plan
from .trainer import TRAINER_GROUP, TRAINJOB_KIND

GANG_DEFAULT: dict[str, Any] = {"gang": {}}


# --- runtimes ----------------------------------------------------------------------------------


def with_default_policies(runtime: Mapping[str, Any]) -> dict[str, Any]:
    """An absent `schedulingPolicy` becomes `gang: {}` at the level that configures groups.

    Level 1 (`spec.scheduling` without `replicatedJobs`): on `spec.scheduling`. Level 2: on each
    entry. Level 3: on each entry's `job`. Shapes that are not objects are left for validation
    to reject, so a broken spec is never made worse.
    """
    out = dict(runtime)
    spec = out.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("scheduling"), dict):
        return out
    scheduling = _own(_own(out, "spec"), "scheduling")
    entries = scheduling.get("replicatedJobs")
    if entries is None:
        if scheduling.get("schedulingPolicy") is None:
            scheduling["schedulingPolicy"] = copy.deepcopy(GANG_DEFAULT)
        return out
    if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
        return out  # validation rejects more entries than a runtime may have
    entries = scheduling["replicatedJobs"] = list(entries)
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        job = entry.get("job")
        if job is None and entry.get("schedulingPolicy") is None:
            entries[i] = {**entry, "schedulingPolicy": copy.deepcopy(GANG_DEFAULT)}
        elif isinstance(job, dict) and job.get("schedulingPolicy") is None:
            entries[i] = {**entry, "job": {**job, "schedulingPolicy": copy.deepcopy(GANG_DEFAULT)}}
    return out


def _own(parent: dict[str, Any], key: str) -> dict[str, Any]:
    """`parent[key]` (a dict), replaced by a shallow copy the caller may change."""
    child = dict(parent[key])
    parent[key] = child
    return child


def _with_min_count(policy: dict[str, Any], min_count: int) -> dict[str, Any]:
    return {**policy, "gang": {**policy["gang"], "minCount": min_count}}


# --- Workloads and PodGroups -------------------------------------------------------------------


def controlling_trainjob(obj: Mapping[str, Any]) -> str | None:
    """The name of the TrainJob that controls a Workload or PodGroup, if one does.

    The controller ownerReference decides; a Workload without one may still name its TrainJob in
    `spec.controllerRef` (how a hand-written Workload says whom it schedules).
    """
    owner = controller_ref(obj)
    if owner is not None:
        if not is_trainjob_ref(owner):
            return None  # controlled by something else: not ours to default
        name = owner.get("name")
        return name if isinstance(name, str) and name else None
    spec = obj.get("spec")
    ref = spec.get("controllerRef") if isinstance(spec, dict) else None
    if (
        isinstance(ref, dict)
        and ref.get("kind") == TRAINJOB_KIND
        and ref.get("apiGroup") == TRAINER_GROUP
        and isinstance(ref.get("name"), str)
        and ref["name"]
    ):
        return str(ref["name"])
    return None


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The uid in a TrainJob controller ownerReference, when there is one."""
    owner = controller_ref(obj)
    uid = owner.get("uid") if owner is not None and is_trainjob_ref(owner) else None
    return uid if isinstance(uid, str) else None


def controller_ref(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The controller ownerReference (at most one per object), if any."""
    meta = obj.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, dict) else None
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, dict) and ref.get("controller") is True:
            return ref
    return None


def is_trainjob_ref(owner: dict[str, Any]) -> bool:
    api_version = owner.get("apiVersion")
    group = api_version.split("/", 1)[0] if isinstance(api_version, str) else None
    return owner.get("kind") == TRAINJOB_KIND and group == TRAINER_GROUP


def lacks_min_count(policy: Any) -> bool:
    """A gang policy without minCount; the API server sends a missing minCount as 0."""
    if not isinstance(policy, dict):
        return False
    gang = policy.get("gang")
    return isinstance(gang, dict) and not gang.get("minCount")


def workload_lacks_min_count(workload: Mapping[str, Any]) -> bool:
    """A gang template without minCount, in a Workload the API server could accept (one with
    more templates than it allows is left for it to refuse)."""
    spec = workload.get("spec")
    templates = spec.get("podGroupTemplates") if isinstance(spec, dict) else None
    return (
        isinstance(templates, list)
        and len(templates) <= MAX_TEMPLATES
        and any(
            isinstance(t, dict) and lacks_min_count(t.get("schedulingPolicy")) for t in templates
        )
    )


def pod_group_lacks_min_count(pod_group: Mapping[str, Any]) -> bool:
    spec = pod_group.get("spec")
    return isinstance(spec, dict) and lacks_min_count(spec.get("schedulingPolicy"))


def with_workload_min_counts(
    workload: Mapping[str, Any], plan: Plan
) -> tuple[dict[str, Any], list[str]]:
    """Each gang template lacking minCount gets its plan group's minCount; warnings for the rest."""
    out = dict(workload)
    warnings: list[str] = []
    spec = out.get("spec")
    templates = spec.get("podGroupTemplates") if isinstance(spec, dict) else None
    if not isinstance(templates, list):
        return out, warnings
    templates = _own(out, "spec")["podGroupTemplates"] = list(templates)
    for i, tmpl in enumerate(templates):
        if not isinstance(tmpl, dict) or not lacks_min_count(tmpl.get("schedulingPolicy")):
            continue
        name = tmpl.get("name")
        group = match_group(plan, name if isinstance(name, str) else "")
        if group is None or group.min_count is None:
            warnings.append(_unmatched(plan, name))
            continue
        policy = _with_min_count(tmpl["schedulingPolicy"], group.min_count)
        templates[i] = {**tmpl, "schedulingPolicy": policy}
    return out, warnings


def with_pod_group_min_count(
    pod_group: Mapping[str, Any], plan: Plan
) -> tuple[dict[str, Any], list[str]]:
    """A gang PodGroup lacking minCount gets its plan group's minCount."""
    out = dict(pod_group)
    if not pod_group_lacks_min_count(out):
        return out, []
    spec = _own(out, "spec")
    meta = out.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    ref = spec.get("workloadRef")
    template = ref.get("templateName") if isinstance(ref, dict) else None
    group = next((g for g in plan.groups if g.pod_group_name == name), None)
    if group is None and isinstance(template, str):
        group = match_group(plan, template)
    if group is None or group.min_count is None:
        return out, [_unmatched(plan, template or name)]
    spec["schedulingPolicy"] = _with_min_count(spec["schedulingPolicy"], group.min_count)
    return out, []


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


def _unmatched(plan: Plan, template: Any) -> str:
    return (
        f"minCount not defaulted: template {_quote(template)} matches no gang of TrainJob "
        f'"{plan.trainjob_name}"; set gang.minCount'
    )


def _quote(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else "(unnamed)"

"""Defaults the mutating webhooks fill in (pure: no I/O).

Each function takes the raw object exactly as the API server sent it and returns a mutated deep
copy, so the caller can diff the two into a JSON Patch: fields the service does not model are never
touched. Every function is idempotent: its output, passed in again, comes back unchanged.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from .plan import GroupPlan, Plan
from .trainer import TRAINER_GROUP

TRAINJOB_KIND = "TrainJob"
GANG_DEFAULT: dict[str, Any] = {"gang": {}}


# --- runtimes ----------------------------------------------------------------------------------


def with_default_policies(runtime: Mapping[str, Any]) -> dict[str, Any]:
    """An absent `schedulingPolicy` becomes `gang: {}` at the level that configures groups.

    Level 1 (`spec.scheduling` without `replicatedJobs`): on `spec.scheduling`. Level 2: on each
    entry. Level 3: on each entry's `job`. Shapes that are not objects are left for validation
    to reject, so a broken spec is never made worse.
    """
    out = copy.deepcopy(dict(runtime))
    spec = out.get("spec")
    scheduling = spec.get("scheduling") if isinstance(spec, dict) else None
    if not isinstance(scheduling, dict):
        return out
    entries = scheduling.get("replicatedJobs")
    if entries is None:
        _default_policy(scheduling)
        return out
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        job = entry.get("job")
        if job is None:
            _default_policy(entry)
        elif isinstance(job, dict):
            _default_policy(job)
    return out


def _default_policy(level: dict[str, Any]) -> None:
    if level.get("schedulingPolicy") is None:
        level["schedulingPolicy"] = copy.deepcopy(GANG_DEFAULT)


# --- Workloads and PodGroups -------------------------------------------------------------------


def controlling_trainjob(obj: Mapping[str, Any]) -> str | None:
    """The name of the TrainJob that controls a Workload or PodGroup, if one does.

    The controller ownerReference decides; a Workload without one may still name its TrainJob in
    `spec.controllerRef` (how a hand-written Workload says whom it schedules).
    """
    meta = obj.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, dict) else None
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, dict) and ref.get("controller") is True:
            api_version = ref.get("apiVersion")
            group = api_version.split("/", 1)[0] if isinstance(api_version, str) else None
            if ref.get("kind") == TRAINJOB_KIND and group == TRAINER_GROUP:
                name = ref.get("name")
                return name if isinstance(name, str) and name else None
            return None  # controlled by something else: not ours to default
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


def lacks_min_count(policy: Any) -> bool:
    """A gang policy without minCount; the API server sends a missing minCount as 0."""
    if not isinstance(policy, dict):
        return False
    gang = policy.get("gang")
    return isinstance(gang, dict) and not gang.get("minCount")


def with_workload_min_counts(
    workload: Mapping[str, Any], plan: Plan
) -> tuple[dict[str, Any], list[str]]:
    """Each gang template lacking minCount gets its plan group's minCount; warnings for the rest."""
    out = copy.deepcopy(dict(workload))
    warnings: list[str] = []
    spec = out.get("spec")
    templates = spec.get("podGroupTemplates") if isinstance(spec, dict) else None
    for tmpl in templates if isinstance(templates, list) else []:
        if not isinstance(tmpl, dict) or not lacks_min_count(tmpl.get("schedulingPolicy")):
            continue
        name = tmpl.get("name")
        group = match_group(plan, name if isinstance(name, str) else "")
        if group is None or group.min_count is None:
            warnings.append(_unmatched(plan, name))
            continue
        tmpl["schedulingPolicy"]["gang"]["minCount"] = group.min_count
    return out, warnings


def with_pod_group_min_count(
    pod_group: Mapping[str, Any], plan: Plan
) -> tuple[dict[str, Any], list[str]]:
    """A gang PodGroup lacking minCount gets its plan group's minCount."""
    out = copy.deepcopy(dict(pod_group))
    spec = out.get("spec")
    if not isinstance(spec, dict) or not lacks_min_count(spec.get("schedulingPolicy")):
        return out, []
    meta = out.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    ref = spec.get("workloadRef")
    template = ref.get("templateName") if isinstance(ref, dict) else None
    group = next((g for g in plan.groups if g.pod_group_name == name), None)
    if group is None and isinstance(template, str):
        group = match_group(plan, template)
    if group is None or group.min_count is None:
        return out, [_unmatched(plan, template or name)]
    spec["schedulingPolicy"]["gang"]["minCount"] = group.min_count
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

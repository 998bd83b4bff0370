"""Defaults the runtime mutating webhooks fill in (pure: no I/O).

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

from .layout import MAX_ENTRIES

GANG_DEFAULT: dict[str, Any] = {"gang": {}}
# On the Job template and the pod template of each ReplicatedJob a runtime puts in a group:
# JobSet copies a ReplicatedJob's Job template labels onto its Jobs, and Trainer and JobSet its
# pod template's onto every pod, so the pod webhook's objectSelector can send only these pods
# (and, while the service is down, hold only these).
GANG_LABEL = "trainjob-scheduling.dev/gang"
GANG_LABEL_VALUE = "true"


# --- runtimes ----------------------------------------------------------------------------------


def with_default_policies(runtime: Mapping[str, Any]) -> dict[str, Any]:
    """An absent `schedulingPolicy` becomes `gang: {}` at the levels that configure groups.

    Level 1 (`spec.scheduling` without `replicatedJobs`): on `spec.scheduling`. Level 2: on each
    entry. Level 3: on each entry's `job`. A multi-level tree: also on `spec.scheduling` when it
    sets fields of its own beside the entries, and on an entry with `job` that does. Shapes
    that are not objects are left for validation to reject, so a broken spec is never made
    worse.
    """
    out = dict(runtime)
    spec = out.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("scheduling"), dict):
        return out
    scheduling = _own(_own(out, "spec"), "scheduling")
    entries = scheduling.get("replicatedJobs")
    # Level 1, or the root of a multi-level tree (TrainJob-level fields beside entries).
    if (entries is None or _configures(scheduling)) and scheduling.get("schedulingPolicy") is None:
        scheduling["schedulingPolicy"] = copy.deepcopy(GANG_DEFAULT)
    if entries is None or not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
        return out  # validation rejects more entries than a runtime may have
    entries = scheduling["replicatedJobs"] = list(entries)
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        job = entry.get("job")
        changed = dict(entry)
        if (job is None or _configures(entry)) and entry.get("schedulingPolicy") is None:
            changed["schedulingPolicy"] = copy.deepcopy(GANG_DEFAULT)  # its group, or composite
        if isinstance(job, dict) and job.get("schedulingPolicy") is None:
            changed["job"] = {**job, "schedulingPolicy": copy.deepcopy(GANG_DEFAULT)}
        if changed != entry:
            entries[i] = changed
    return out


def _configures(settings: Mapping[str, Any]) -> bool:
    """Whether a level sets any of the four group fields (then it is a group of its own)."""
    return any(
        settings.get(k) is not None
        for k in ("schedulingPolicy", "schedulingConstraints", "disruptionMode", "resourceClaims")
    )


def _own(parent: dict[str, Any], key: str) -> dict[str, Any]:
    """`parent[key]` (a dict), replaced by a shallow copy the caller may change."""
    child = dict(parent[key])
    parent[key] = child
    return child


def with_gang_labels(runtime: Mapping[str, Any], grouped: frozenset[str]) -> dict[str, Any]:
    """Each ReplicatedJob in `grouped` (those a group of the runtime's plan holds) labelled
    `GANG_LABEL` on its Job template and its pod template. The label is never taken off: a
    TrainJob frozen while a ReplicatedJob was in a group keeps its gang after the runtime
    changes, and its later Jobs and pods (a JobSet restart, a dependent started late) come
    from the runtime as it is then. A stale label costs only availability while the service is
    down (those pods wait), never a pod run loose. Shapes that are not objects are left
    alone."""
    out = dict(runtime)
    rjs = _at(out, "spec", "template", "spec", "replicatedJobs")
    if not isinstance(rjs, list):
        return out
    changed: dict[int, dict[str, Any]] = {}
    for i, rj in enumerate(rjs):
        if not isinstance(rj, dict) or not isinstance(rj.get("template"), dict):
            continue
        name = rj.get("name")
        if not isinstance(name, str) or name not in grouped:
            continue
        template = rj["template"]
        job_labelled = _labelled(template)
        pod = _at(template, "spec", "template")
        pod_labelled = _labelled(pod) if isinstance(pod, dict) else None
        if job_labelled is None and pod_labelled is None:
            continue
        template = dict(job_labelled or template)
        if pod_labelled is not None:
            template["spec"] = {**template["spec"], "template": pod_labelled}
        changed[i] = {**rj, "template": template}
    if not changed:
        return out
    spec = _own(out, "spec")
    jobset = _own(_own(spec, "template"), "spec")
    jobset["replicatedJobs"] = [changed.get(i, rj) for i, rj in enumerate(rjs)]
    return out


def _labelled(template: dict[str, Any]) -> dict[str, Any] | None:
    """A copy of a (Job or pod) template with the gang label; None when it has it already."""
    meta = template.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        return None
    labels = (meta or {}).get("labels")
    if labels is not None and not isinstance(labels, dict):
        return None
    labels = labels or {}
    if labels.get(GANG_LABEL) == GANG_LABEL_VALUE:
        return None
    new_labels = {**labels, GANG_LABEL: GANG_LABEL_VALUE}
    return {**template, "metadata": {**(meta or {}), "labels": new_labels}}


def _at(obj: Any, *path: str) -> Any:
    for part in path:
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj

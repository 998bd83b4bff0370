"""How a stored Workload or PodGroup differs from the one the plan wants (pure: no I/O).

Rule 8(f): a different `gang.minCount` is patched in place; values the API server fills in where
the desired object leaves a field unset are not drift; any other difference means delete and
create again. A gated field (topology, claims) that the desired object sets and the stored one
lacks was dropped by the API server because its feature gate is off: recreating would drop it
again, forever, so that is reported as a configuration problem instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .defaults import controller_ref, is_trainjob_ref

JsonObject = Mapping[str, Any]
DriftKind = Literal["none", "min-count", "recreate"]

GATED_FIELDS = {
    "schedulingConstraints": "TopologyAwareWorkloadScheduling",
    "resourceClaims": "DRAWorkloadResourceClaims",
}
# Filled in by the API server (defaults, the Priority admission plugin) when left unset.
SERVER_FILLED = ("priority", "priorityClassName", "preemptionPolicy")


@dataclass(frozen=True)
class Drift:
    kind: DriftKind = "none"
    patch: tuple[dict[str, Any], ...] = ()
    """For `min-count`: a JSON Patch that checks the uid, then replaces each minCount."""
    reason: str = ""
    dropped: tuple[str, ...] = field(default=())
    """Gated fields the server dropped (with their gate), reported, never treated as drift."""


def controlled_by(obj: JsonObject, uid: str | None) -> bool:
    """Whether `obj`'s controller ownerReference is the TrainJob with this uid."""
    owner = controller_ref(obj)
    return (
        uid is not None and owner is not None and is_trainjob_ref(owner) and owner.get("uid") == uid
    )


def workload_drift(desired: JsonObject, actual: JsonObject) -> Drift:
    want, have = _spec(desired), _spec(actual)
    if want.get("controllerRef") != have.get("controllerRef"):
        return Drift("recreate", reason="spec.controllerRef differs")
    want_templates = _by_name(want.get("podGroupTemplates"))
    have_list = have.get("podGroupTemplates")
    have_templates = _by_name(have_list)
    if list(want_templates) != list(have_templates):
        names = ", ".join(have_templates) or "none"
        return Drift("recreate", reason=f"the template set differs (stored: {names})")
    ops: list[dict[str, Any]] = []
    dropped: list[str] = []
    for index, (name, template) in enumerate(want_templates.items()):
        path = f"/spec/podGroupTemplates/{index}"
        drift = _group_drift(template, have_templates[name], f"template {name!r}")
        if drift.kind == "recreate":
            return drift
        dropped += drift.dropped
        if drift.kind == "min-count":
            ops += [
                {"op": "test", "path": f"{path}/name", "value": name},
                {"op": "replace", "path": f"{path}/schedulingPolicy/gang/minCount",
                 "value": _min_count(template)},
            ]  # fmt: skip
    return _result(actual, ops, dropped)


def pod_group_drift(desired: JsonObject, actual: JsonObject) -> Drift:
    want, have = _spec(desired), _spec(actual)
    if want.get("workloadRef") != have.get("workloadRef"):
        return Drift("recreate", reason="spec.workloadRef differs")
    drift = _group_drift(want, have, "the PodGroup")
    if drift.kind == "recreate":
        return drift
    ops = []
    if drift.kind == "min-count":
        ops = [
            {"op": "replace", "path": "/spec/schedulingPolicy/gang/minCount",
             "value": _min_count(want)},
        ]  # fmt: skip
    return _result(actual, ops, list(drift.dropped))


def _group_drift(want: JsonObject, have: JsonObject, what: str) -> Drift:
    """A PodGroupTemplate against a stored one, or a PodGroup spec against a stored one."""
    want_policy, have_policy = (
        want.get("schedulingPolicy") or {},
        have.get("schedulingPolicy") or {},
    )
    if set(want_policy) != set(have_policy):
        return Drift("recreate", reason=f"{what}: the scheduling policy kind differs")
    dropped: list[str] = []
    for key, gate in GATED_FIELDS.items():
        if key in want and key not in have:
            dropped.append(f"{key} ({gate})")
        elif want.get(key) != have.get(key):
            return Drift("recreate", reason=f"{what}: {key} differs")
    mode = have.get("disruptionMode")
    if "disruptionMode" in want:
        if want["disruptionMode"] != mode:
            return Drift("recreate", reason=f"{what}: disruptionMode differs")
    elif mode not in (None, {"single": {}}):  # the server's default for an unset mode
        return Drift("recreate", reason=f"{what}: disruptionMode differs")
    for key in SERVER_FILLED:
        if key in want and want[key] != have.get(key):
            return Drift("recreate", reason=f"{what}: {key} differs")
    kind: DriftKind = "min-count" if _min_count(want) != _min_count(have) else "none"
    return Drift(kind, dropped=tuple(dropped))


def _result(actual: JsonObject, ops: list[dict[str, Any]], dropped: list[str]) -> Drift:
    if not ops:
        return Drift(dropped=tuple(dropped))
    # The uid test makes the patch fail rather than touch an object recreated meanwhile.
    uid = {"op": "test", "path": "/metadata/uid", "value": _meta(actual).get("uid")}
    return Drift("min-count", (uid, *ops), "gang.minCount differs", tuple(dropped))


def _min_count(group: JsonObject) -> Any:
    policy = group.get("schedulingPolicy")
    gang = policy.get("gang") if isinstance(policy, dict) else None
    return gang.get("minCount") if isinstance(gang, dict) else None


def _by_name(templates: Any) -> dict[str, JsonObject]:
    out: dict[str, JsonObject] = {}
    for template in templates if isinstance(templates, list) else []:
        if isinstance(template, dict) and isinstance(template.get("name"), str):
            out[template["name"]] = template
    return out


def _spec(obj: JsonObject) -> JsonObject:
    spec = obj.get("spec")
    return spec if isinstance(spec, dict) else {}


def _meta(obj: JsonObject) -> JsonObject:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}

"""The shapes of the native Workload and PodGroup in each `scheduling.k8s.io` version the service
knows: Kubernetes 1.37's `v1beta1` and 1.36's `v1alpha2` (was-api.md 1.7).

The native backend renders in the `v1beta1` shape and `Shapes.outgoing` rewrites that into the
version discovery chose; stored objects are read in their own version through `Shapes`. What
differs in 1.36:

* a PodGroup names its template in `spec.podGroupTemplateRef.workload.{workloadName,
  podGroupTemplateName}` (1.37: `spec.workloadRef.{workloadName, templateName}`);
* `disruptionMode` is a string, `Pod` or `PodGroup` (1.37: `{single: {}}` or `{all: {}}`);
* `gang.minCount` is immutable: a different one means delete and create again;
* no `preemptionPolicy`, no composite templates (CompositePodGroup, `v1alpha3`, is not served);
* kube-scheduler's condition is `PodGroupScheduled` (1.37: `PodGroupInitiallyScheduled`).

Assumptions where was-api.md is silent: 1.36's condition has the same reasons as 1.37's
(`Unschedulable`, `SchedulerError`); its server default for an unset `disruptionMode` is `Pod`
(1.37's default `{single: {}}`); pods name their PodGroup in `spec.schedulingGroup.podGroupName`
in 1.36 as in 1.37.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GROUP = "scheduling.k8s.io"
V1BETA1, V1ALPHA2 = "v1beta1", "v1alpha2"

# 1.37's union members and 1.36's strings for the same modes.
_MODE_STRINGS = {"single": "Pod", "all": "PodGroup"}


@dataclass(frozen=True)
class Shapes:
    """How one version spells what differs between the versions."""

    version: str
    condition: str  # kube-scheduler's PodGroup condition that says the gang is scheduled
    pod_group_ref: str  # the PodGroup's field naming its Workload and template
    default_disruption_mode: Any  # what the server fills in for an unset disruptionMode
    min_count_mutable: bool

    @property
    def api_version(self) -> str:
        return f"{GROUP}/{self.version}"

    def outgoing(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """A Workload or PodGroup rendered in the `v1beta1` shape, in this version's shape."""
        if self.version == V1BETA1:
            return dict(obj)
        out = {**obj, "apiVersion": self.api_version}
        meta = obj.get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("ownerReferences"), list):
            # The second owner, the Workload, is in this version too.
            out["metadata"] = {
                **meta,
                "ownerReferences": [
                    {**o, "apiVersion": self.api_version}
                    if isinstance(o, dict) and o.get("apiVersion") == f"{GROUP}/{V1BETA1}"
                    else o
                    for o in meta["ownerReferences"]
                ],
            }
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            return out
        spec = out["spec"] = _to_v1alpha2(spec)
        templates = spec.get("podGroupTemplates")
        if isinstance(templates, list):
            spec["podGroupTemplates"] = [
                _to_v1alpha2(t) if isinstance(t, dict) else t for t in templates
            ]
        ref = spec.pop("workloadRef", None)
        if isinstance(ref, dict):
            spec["podGroupTemplateRef"] = {
                "workload": {
                    "workloadName": ref.get("workloadName"),
                    "podGroupTemplateName": ref.get("templateName"),
                }
            }
        return out

    def template_name(self, pod_group_spec: Mapping[str, Any]) -> str | None:
        """The template a stored PodGroup names, in this version's field."""
        ref = pod_group_spec.get(self.pod_group_ref)
        if self.version == V1ALPHA2 and isinstance(ref, dict):
            ref = ref.get("workload")
        key = "templateName" if self.version == V1BETA1 else "podGroupTemplateName"
        name = ref.get(key) if isinstance(ref, dict) else None
        return name if isinstance(name, str) else None


def _to_v1alpha2(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A PodGroupTemplate's or PodGroup spec's own fields in 1.36's spelling."""
    out = {k: v for k, v in fields.items() if k != "preemptionPolicy"}  # not in 1.36
    mode = out.get("disruptionMode")
    if isinstance(mode, dict) and len(mode) == 1:
        (member,) = mode
        out["disruptionMode"] = _MODE_STRINGS.get(member, member)
    return out


SHAPES = {
    V1BETA1: Shapes(V1BETA1, "PodGroupInitiallyScheduled", "workloadRef", {"single": {}}, True),
    V1ALPHA2: Shapes(V1ALPHA2, "PodGroupScheduled", "podGroupTemplateRef", "Pod", False),
}
# Newest first: discovery picks the first one the cluster serves.
VERSIONS = (V1BETA1, V1ALPHA2)

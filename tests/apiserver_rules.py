"""What a Kubernetes 1.37 API server accepts for Workload and PodGroup objects.

Two independent checks, written apart from the service's own code so they can catch it out:
* the published OpenAPI schema, strict (`kubernetes-validate`): field names, types, required fields;
* the server's validation rules the schema cannot express (names, list limits, one-of unions), as
  was-api.md section 1 lists them.
"""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate

K8S_VERSION = "1.37.0"
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def schema_errors(obj: dict[str, Any]) -> list[str]:
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{obj['kind']}: {exc.message}"]
    return []


def dns_label(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= 63 and bool(_LABEL.match(v))


def _dns_subdomain(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= 253 and bool(_SUBDOMAIN.match(v))


def _label_key(v: str) -> bool:
    prefix, slash, name = v.rpartition("/")
    if slash and not _dns_subdomain(prefix):
        return False
    return 0 < len(name) <= 63 and bool(_QUALIFIED.match(name))


def _one_of(obj: dict[str, Any] | None, keys: tuple[str, ...]) -> bool:
    return obj is not None and sum(obj.get(k) is not None for k in keys) == 1


def _group_errors(where: str, g: dict[str, Any]) -> list[str]:
    errs = []
    policy = g.get("schedulingPolicy")
    if not _one_of(policy, ("basic", "gang")):
        errs.append(f"{where}.schedulingPolicy: exactly one of basic/gang")
    elif policy and "gang" in policy:
        mc = policy["gang"].get("minCount")
        if not isinstance(mc, int) or not 1 <= mc <= 2**31 - 1:
            errs.append(f"{where}.schedulingPolicy.gang.minCount: must be an int32 >= 1, got {mc}")
    topology = (g.get("schedulingConstraints") or {}).get("topology") or []
    if len(topology) > 1:
        errs.append(f"{where}.schedulingConstraints.topology: at most 1")
    errs += [
        f"{where}.schedulingConstraints.topology.key: {t.get('key')!r}"
        for t in topology
        if not _label_key(t.get("key") or "")
    ]
    claims = g.get("resourceClaims") or []
    if len(claims) > 4:
        errs.append(f"{where}.resourceClaims: at most 4")
    names = [c.get("name") for c in claims]
    if len(set(names)) != len(names) or not all(dns_label(n) for n in names):
        errs.append(f"{where}.resourceClaims: names must be unique DNS labels: {names}")
    for c in claims:
        if not _one_of(c, ("resourceClaimName", "resourceClaimTemplateName")):
            errs.append(f"{where}.resourceClaims: exactly one source: {c}")
    if "disruptionMode" in g and not _one_of(g["disruptionMode"], ("single", "all")):
        errs.append(f"{where}.disruptionMode: exactly one of single/all")
    if "priorityClassName" in g and not _dns_subdomain(g["priorityClassName"]):
        errs.append(f"{where}.priorityClassName: {g['priorityClassName']!r}")
    if "priority" in g:
        errs.append(f"{where}.priority: clients may not set it")
    return errs


def workload_errors(w: dict[str, Any]) -> list[str]:
    errs = schema_errors(w)
    if not _dns_subdomain(w["metadata"].get("name")):
        errs.append(f"Workload name {w['metadata'].get('name')!r}")
    ref = w["spec"].get("controllerRef") or {}
    if "/" in (ref.get("apiGroup") or ""):
        errs.append("controllerRef.apiGroup must not carry a version")
    templates = w["spec"].get("podGroupTemplates") or []
    if not 1 <= len(templates) <= 8:
        errs.append(f"podGroupTemplates: 1..8, got {len(templates)}")
    names = [t.get("name") for t in templates]
    if len(set(names)) != len(names):
        errs.append(f"podGroupTemplates: duplicate names {names}")
    for i, t in enumerate(templates):
        if not dns_label(t.get("name")):
            errs.append(f"podGroupTemplates[{i}].name {t.get('name')!r} is not a DNS label")
        errs += _group_errors(f"podGroupTemplates[{i}]", t)
    return errs


def pod_group_errors(pg: dict[str, Any], workload: dict[str, Any]) -> list[str]:
    errs = schema_errors(pg)
    if not _dns_subdomain(pg["metadata"].get("name")):
        errs.append(f"PodGroup name {pg['metadata'].get('name')!r}")
    if pg["metadata"].get("namespace") != workload["metadata"].get("namespace"):
        errs.append("PodGroup and Workload must share a namespace")
    ref = pg["spec"].get("workloadRef") or {}
    templates = {t["name"]: t for t in workload["spec"].get("podGroupTemplates") or []}
    if ref.get("workloadName") != workload["metadata"]["name"]:
        errs.append(f"workloadRef.workloadName {ref.get('workloadName')!r}")
    template = templates.get(ref.get("templateName"))
    if template is None:
        errs.append(f"workloadRef.templateName {ref.get('templateName')!r} not in the Workload")
    else:
        # The PodGroup copies its template's settings.
        for key in (
            "schedulingPolicy",
            "schedulingConstraints",
            "disruptionMode",
            "resourceClaims",
        ):
            if pg["spec"].get(key) != template.get(key):
                errs.append(f"spec.{key} differs from template {template['name']}")
    errs += _group_errors("spec", pg["spec"])
    return errs


def objects_errors(objects: list[dict[str, Any]]) -> list[str]:
    """All errors of a rendered set: one Workload first, then its PodGroups."""
    if not objects:
        return []
    workload, *pod_groups = objects
    errs = workload_errors(workload)
    for pg in pod_groups:
        errs += pod_group_errors(pg, workload)
    names = [pg["metadata"]["name"] for pg in pod_groups]
    if len(set(names)) != len(names):
        errs.append(f"PodGroup names collide: {names}")
    return errs

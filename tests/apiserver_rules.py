"""What a Kubernetes 1.37 API server accepts for Workload and PodGroup objects.

Two independent checks, written apart from the service's own code so they can catch it out:
* the published OpenAPI schema, strict (`kubernetes-validate`): field names, types, required fields;
* the server's validation rules the schema cannot express (names, list limits, one-of unions), as
  was-api.md section 1 lists them.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
from referencing import Registry, Resource

K8S_VERSION = "1.37.0"
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def schema_errors(obj: dict[str, Any]) -> list[str]:
    """kubernetes-validate's strict check of `obj` against the 1.37 schema of its kind."""
    try:
        _validator(obj["kind"], obj["apiVersion"]).validate(obj)
    except jsonschema.ValidationError as exc:
        return [f"{obj['kind']}: {exc.message}"]
    return []


@functools.cache
def _validator(kind: str, api_version: str) -> jsonschema.Draft202012Validator:
    """kubernetes-validate's own schema files and validator, built once per kind: its
    `validate` reads the whole definitions file again on every call (50 ms an object)."""
    schema_dir = f"v{K8S_VERSION}-local-strict"
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    files = "kubernetes-json-schema/" + schema_dir
    schema = kubernetes_validate.utils.schema_contents(
        f"{files}/{kind.lower()}-{group_version}.json", K8S_VERSION
    )
    definitions = kubernetes_validate.utils.schema_contents(
        f"{files}/_definitions.json", K8S_VERSION
    )
    registry: Registry[Any] = Resource.from_contents(schema) @ Registry()
    registry = Resource.from_contents(definitions) @ registry
    return jsonschema.Draft202012Validator(schema, registry=registry)


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


MAX_TREE_DEPTH = 4  # CompositePodGroup trees (was-api.md 1.5)


def _composite_errors(where: str, c: dict[str, Any]) -> list[str]:
    errs = []
    policy = c.get("schedulingPolicy")
    if not _one_of(policy, ("basic", "gang")):
        errs.append(f"{where}.schedulingPolicy: exactly one of basic/gang")
    elif policy and "gang" in policy:
        count = policy["gang"].get("minGroupCount")
        if not isinstance(count, int) or count < 1:
            errs.append(f"{where}.schedulingPolicy.gang.minGroupCount: >= 1, got {count}")
    topology = (c.get("schedulingConstraints") or {}).get("topology") or []
    if len(topology) > 1:
        errs.append(f"{where}.schedulingConstraints.topology: at most 1")
    if "disruptionMode" in c and not _one_of(c["disruptionMode"], ("single", "all")):
        errs.append(f"{where}.disruptionMode: exactly one of single/all")
    return errs


def _tree_errors(where: str, node: dict[str, Any], depth: int, names: list[str]) -> list[str]:
    """A composite template and everything below it: at least one child list, 8 per list,
    the depth bound, and minGroupCount within the number of child groups."""
    errs = _composite_errors(where, node)
    names.append(str(node.get("name")))
    leaves = node.get("podGroupTemplates") or []
    nested = node.get("compositePodGroupTemplates") or []
    if not leaves and not nested:
        errs.append(f"{where}: a composite needs podGroupTemplates or compositePodGroupTemplates")
    for key, items in (("podGroupTemplates", leaves), ("compositePodGroupTemplates", nested)):
        if len(items) > 8:
            errs.append(f"{where}.{key}: at most 8, got {len(items)}")
    gang = ((node.get("schedulingPolicy") or {}).get("gang") or {}).get("minGroupCount")
    if isinstance(gang, int) and gang > len(leaves) + len(nested):
        errs.append(f"{where}: minGroupCount {gang} > {len(leaves) + len(nested)} children")
    if depth + (1 if leaves else 0) > MAX_TREE_DEPTH:
        errs.append(f"{where}: deeper than {MAX_TREE_DEPTH}")
    for i, leaf in enumerate(leaves):
        names.append(str(leaf.get("name")))
        if not dns_label(leaf.get("name")):
            errs.append(f"{where}.podGroupTemplates[{i}].name {leaf.get('name')!r}")
        errs += _group_errors(f"{where}.podGroupTemplates[{i}]", leaf)
    for i, child in enumerate(nested):
        errs += _tree_errors(f"{where}.compositePodGroupTemplates[{i}]", child, depth + 1, names)
    return errs


def templates_of(w: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every template of a Workload, leaves and composites, by name (flat or a tree)."""
    out: dict[str, dict[str, Any]] = {}

    def walk(node: dict[str, Any]) -> None:
        out[node.get("name", "")] = node
        for leaf in node.get("podGroupTemplates") or []:
            out[leaf.get("name", "")] = leaf
        for child in node.get("compositePodGroupTemplates") or []:
            walk(child)

    for leaf in w["spec"].get("podGroupTemplates") or []:
        out[leaf.get("name", "")] = leaf
    for root in w["spec"].get("compositePodGroupTemplates") or []:
        walk(root)
    return out


def workload_errors(w: dict[str, Any]) -> list[str]:
    errs = schema_errors(w)
    if not _dns_subdomain(w["metadata"].get("name")):
        errs.append(f"Workload name {w['metadata'].get('name')!r}")
    ref = w["spec"].get("controllerRef") or {}
    if "/" in (ref.get("apiGroup") or ""):
        errs.append("controllerRef.apiGroup must not carry a version")
    templates = w["spec"].get("podGroupTemplates") or []
    trees = w["spec"].get("compositePodGroupTemplates") or []
    if bool(templates) == bool(trees):
        errs.append("exactly one of podGroupTemplates and compositePodGroupTemplates")
    if trees:
        names: list[str] = []
        if len(trees) > 8:
            errs.append(f"compositePodGroupTemplates: at most 8, got {len(trees)}")
        for i, root in enumerate(trees):
            errs += _tree_errors(f"compositePodGroupTemplates[{i}]", root, 1, names)
        if len(set(names)) != len(names):
            errs.append(f"template names must be unique in the tree: {names}")
        return errs
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


def composite_pod_group_errors(
    c: dict[str, Any], workload: dict[str, Any], parents: set[str]
) -> list[str]:
    """A CompositePodGroup: its schema, its template in the Workload (copied), its parent."""
    errs = schema_errors(c)
    ref = c["spec"].get("workloadRef") or {}
    template = templates_of(workload).get(str(ref.get("templateName")))
    if ref.get("workloadName") != workload["metadata"]["name"] or template is None:
        errs.append(f"CompositePodGroup {c['metadata']['name']}: workloadRef {ref}")
    elif "compositePodGroupTemplates" not in template and "podGroupTemplates" not in template:
        errs.append(f"CompositePodGroup {c['metadata']['name']} points at a PodGroup template")
    else:
        for key in ("schedulingPolicy", "schedulingConstraints", "disruptionMode"):
            if c["spec"].get(key) != template.get(key):
                errs.append(f"CompositePodGroup {c['metadata']['name']}: {key} differs")
    parent = c["spec"].get("parentCompositePodGroupName")
    if parent is not None and parent not in parents:
        errs.append(f"CompositePodGroup {c['metadata']['name']}: no parent {parent!r}")
    errs += _composite_errors("spec", c["spec"])
    return errs


def pod_group_errors(pg: dict[str, Any], workload: dict[str, Any]) -> list[str]:
    errs = schema_errors(pg)
    if not _dns_subdomain(pg["metadata"].get("name")):
        errs.append(f"PodGroup name {pg['metadata'].get('name')!r}")
    if pg["metadata"].get("namespace") != workload["metadata"].get("namespace"):
        errs.append("PodGroup and Workload must share a namespace")
    ref = pg["spec"].get("workloadRef") or {}
    templates = templates_of(workload)
    if ref.get("workloadName") != workload["metadata"]["name"]:
        errs.append(f"workloadRef.workloadName {ref.get('workloadName')!r}")
    template = templates.get(str(ref.get("templateName")))
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
    """All errors of a rendered set: one Workload first, then its CompositePodGroups (parents
    first) and PodGroups."""
    if not objects:
        return []
    workload, *rest = objects
    errs = workload_errors(workload)
    composites: set[str] = set()
    for c in (o for o in rest if o["kind"] == "CompositePodGroup"):
        errs += composite_pod_group_errors(c, workload, composites)
        composites.add(c["metadata"]["name"])
    pod_groups = [o for o in rest if o["kind"] == "PodGroup"]
    for pg in pod_groups:
        errs += pod_group_errors(pg, workload)
        parent = pg["spec"].get("parentCompositePodGroupName")
        if parent is not None and parent not in composites:
            errs.append(f"PodGroup {pg['metadata']['name']}: no parent {parent!r}")
        if bool(composites) != (parent is not None):
            errs.append(f"PodGroup {pg['metadata']['name']}: in a tree, every leaf has a parent")
    names = [pg["metadata"]["name"] for pg in pod_groups]
    if len(set(names)) != len(names):
        errs.append(f"PodGroup names collide: {names}")
    return errs

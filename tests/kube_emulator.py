"""A Kubernetes API server for the tests: kmock's emulator, made honest about what the real one
does on reads and writes.

kmock's `KubernetesEmulator` keeps objects in memory and serves list, watch, get, create, patch
and delete over real HTTP, simplistically: its lists say `resourceVersion: "..."`, its objects
have none, a watch ignores `resourceVersion` and `timeoutSeconds`, every patch is a merge, PUT is
not served, and no write ever conflicts. `VersionedEmulator` keeps kmock's storage (`k.objects`),
discovery and reactions, and adds the API server's contract.

Reads:

* every write gets the next resourceVersion, stamped on the stored object and on its watch
  event; a list carries the version it is a snapshot of;
* a watch from a resourceVersion replays the events after it (nothing missed, nothing twice);
  one from a version older than the last `compact()` gets an ERROR event with code 410
  (`Expired`), as from the API server's watch cache; a watch without one starts with ADDED
  events for the objects that exist, then follows;
* `timeoutSeconds` ends a watch (a clean end of the stream); `drop_watches()` cuts the
  connections of the open watches, mid-stream.

Writes (refusals carry the API server's `Status`: code, reason, message, details):

* create stamps `uid`, `creationTimestamp` and `generation: 1` and sets the URL's namespace;
  a live name is 409 `AlreadyExists`; a body with a resourceVersion is 400; with `dryRun=All`
  it is checked and answered as it would be stored, and nothing is stored (no version, no
  event);
* PUT replaces the whole object; 404 if it is missing; a custom resource's (TrainJob's) PUT
  must carry a resourceVersion (422 otherwise: no unconditional update);
* PATCH by Content-Type: `merge-patch+json` (RFC 7386), `json-patch+json` (RFC 6902; a failed
  `test` or a bad path is 422 `Invalid`), `strategic-merge-patch+json` treated as a merge patch
  (no patch strategies: a list in the patch replaces the stored list); anything else is 415;
* after a PUT or PATCH, a `resourceVersion` or `uid` that differs from the stored one is 409
  `Conflict` (optimistic concurrency; a uid is a precondition); no write changes the uid, the
  creationTimestamp, the name or the namespace; `generation` grows when anything but metadata
  and status changes; a write that changes nothing stores nothing (no version, no event);
* delete honours DeleteOptions `preconditions` (uid, resourceVersion: 409 on a mismatch); an
  object with finalizers only gets a deletionTimestamp, and goes once a write removes the last;
* once an object is gone, its dependents (an ownerReference with its uid) go too, recursively,
  as the garbage collector does with background propagation; a dependent with another live
  owner only loses the dangling reference, one with finalizers gets a deletionTimestamp and
  waits. `garbage_collection = False` turns this off. DeleteOptions' `propagationPolicy`:
  `Foreground` gives the object a deletionTimestamp and the finalizer `foregroundDeletion`,
  deletes its dependents, and removes it once no dependent with `blockOwnerDeletion: true` is
  left (Terminating ones hold it too); `Orphan` takes its reference off its dependents first;
* a create gives a new uid, so an object deleted and created again under its name is another;
* pods go at once when deleted, as if every kubelet stopped its containers in no time; with
  `pod_grace = True` a pod on a node and not finished stays Terminating for its grace period
  (DeleteOptions' `gracePeriodSeconds`, else its `terminationGracePeriodSeconds`, else 30:
  deletionTimestamp and deletionGracePeriodSeconds set) until `finish_pods()` (the kubelet's
  delete with grace 0) or a delete with `gracePeriodSeconds: 0`; time alone never ends it.

Gang objects, as a 1.37 server with its controllers (shared/reference/real-cluster-notes.md):

* a PodGroup gets the finalizer `scheduling.k8s.io/podgroup-protection` on create; deleted, it
  stays Terminating while any pod of its namespace (a Terminating one too) names it in
  `spec.schedulingGroup.podGroupName`, and loses the finalizer (and goes, unless another holds
  it) once none does, as kube-controller-manager's protection controller does, here at once;
* with `pod_group_defaults = True`, a PodGroup's create fills in `disruptionMode: {single: {}}`,
  `priority: 0` and `preemptionPolicy: PreemptLowerPriority` where unset, as defaulting and
  the Priority admission plugin (no class) do (which fields a real server drops while their
  feature gate is off is make e2e's, against a real one: tests/e2e);
* updates that change an immutable field are 422 `Invalid`, a cause per field worded
  `<field>: Invalid value: <value>: field is immutable`: a PodGroup's spec but
  `schedulingPolicy.gang.minCount`; a Workload's spec but each template's `gang.minCount`
  (templates neither added, removed nor renamed); a CompositePodGroup's whole spec; a pod's
  `spec.schedulingGroup` (the other rules on pod updates are not emulated);
* `emulator(scheduling_version="v1alpha2")` serves the Workloads and PodGroups as 1.36 does
  (`scheduling.k8s.io/v1alpha2`): there `gang.minCount` is immutable too, and PodGroup defaults
  are `disruptionMode: Pod` and `priority: 0` (no preemptionPolicy in 1.36).

Failures for one request are kmock reactions, e.g. `next_requests(k[WATCH, TRAINJOBS], 2) <<
status(500)`: they answer before the emulator's own (fallback) handlers, and, unlike in kmock's
emulator, a write that a reaction answers is not applied (as by an API server that failed it).
kmock names a PATCH `action.UPDATE` but gives a PUT no action: select PUTs by `kmock.method.PUT`.

Field selectors on lists and watches: `metadata.name` and `metadata.namespace` (every resource
serves these two), with `=`, `==` and `!=`, terms joined by commas; any other field is 400
`field label not supported`. That is how a client watches one object by name, the only watch an
RBAC rule with `resourceNames` allows.

Label selectors on lists and watches, in the API's syntax: `k=v`, `k==v`, `k!=v`, `k in (a,b)`,
`k notin (a,b)`, `k`, `!k`, terms joined by commas; a malformed one is 400.

Paged lists: `limit` gives at most that many items, in (namespace, name) order, with
`metadata.continue` (and `remainingItemCount`) when more remain; `continue` resumes after the
last key. Every page carries the first page's resourceVersion (a watch from it then replays
what changed meanwhile); later pages show objects as they are when asked, where the API server
would show its first page's snapshot. A token from before the last `compact()` is 410 Expired,
an unreadable one 400.

A `kubernetes.io/tls` Secret must hold `tls.crt` and `tls.key` (422 otherwise), and a Secret's
`type` cannot change (422), as kube-apiserver validates them.

Status subresources (declared per kind: TrainJob's, as its CRD says `subresources: {status: {}}`):
`.../status` serves GET (the whole object), PUT and PATCH, and a write there changes only
`.status` (and the object's managedFields and resourceVersion); a write to the object itself
keeps the stored status, and a create drops the status it is given. Another subresource of a
declared kind, or any of a kind without one, is 404.

Field management and server-side apply, for the kinds with a CRD here (TrainJob; its schema in
shared/reference/crds gives the list types), as `tests/apiserver_apply.py` computes them:

* every write keeps `metadata.managedFields`, an entry per (manager, Apply or Update,
  subresource) with its `fieldsV1`; the manager of a create, PUT or non-apply PATCH is the
  `fieldManager` parameter, else the User-Agent up to its first `/`;
* PATCH with `application/apply-patch+yaml` applies to an existing object (404 otherwise: no
  create by apply): `fieldManager` is required (422), `force=true` takes fields other managers
  own, without it such a field with another value is 409 `Conflict` with a cause per field;
  `force` on any other write is 422; a TrainJob takes no strategic merge patch (415, as a
  custom resource);
* a status write is checked against the CRD's status schema and list-map keys (conditions: at
  most 8, reason pattern, required fields, unique types): 422 `Invalid`, a cause per field.

Not emulated: field selectors on other fields, dry runs of other writes, a foreground
delete's dependents deleted in the foreground in turn (here in the background), a PodGroup's
status subresource, the protection controller adding its finalizer back to a live PodGroup a
client stripped it from, any controller that sets pod labels (JobSet's
`jobset.sigs.k8s.io/restart-attempt`: tests write them), managedFields on kinds without a CRD
here, apply that creates, the schema of fields other than a custom resource's status (and the
pruning of unknown fields), and the `ancient-changes` bucket for update managers past ten.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import contextlib
import contextvars
import copy
import datetime
import functools
import json
import random
import re
import string
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import jsonschema
import kmock
import yaml
from kmock import KubernetesEmulator, Server
from kubernetes.aio.client import ApiClient, Configuration

from tests import apiserver_apply as ssa
from tests.paths import SHARED

TRAINER = "trainer.kubeflow.org"
VERSION = "v1alpha1"
TRAINJOBS = kmock.resource(TRAINER, VERSION, "trainjobs")
TRAINING_RUNTIMES = kmock.resource(TRAINER, VERSION, "trainingruntimes")
CLUSTER_RUNTIMES = kmock.resource(TRAINER, VERSION, "clustertrainingruntimes")
WORKLOADS = kmock.resource("scheduling.k8s.io", "v1beta1", "workloads")
POD_GROUPS = kmock.resource("scheduling.k8s.io", "v1beta1", "podgroups")
COMPOSITE_POD_GROUPS = kmock.resource("scheduling.k8s.io", "v1alpha3", "compositepodgroups")
# Kubernetes 1.36's shapes of the same kinds (was-api.md 1.7): `emulator(scheduling_version=...)`.
WORKLOADS_V1ALPHA2 = kmock.resource("scheduling.k8s.io", "v1alpha2", "workloads")
POD_GROUPS_V1ALPHA2 = kmock.resource("scheduling.k8s.io", "v1alpha2", "podgroups")
SCHEDULING_RESOURCES = {
    "v1beta1": (WORKLOADS, POD_GROUPS),
    "v1alpha2": (WORKLOADS_V1ALPHA2, POD_GROUPS_V1ALPHA2),
}
_ALL_POD_GROUPS = (POD_GROUPS, POD_GROUPS_V1ALPHA2)
_ALL_WORKLOADS = (WORKLOADS, WORKLOADS_V1ALPHA2)
LEASES = kmock.resource("coordination.k8s.io", "v1", "leases")
EVENTS = kmock.resource("events.k8s.io", "v1", "events")
SECRETS = kmock.resource("", "v1", "secrets")
NODES = kmock.resource("", "v1", "nodes")
PODS = kmock.resource("", "v1", "pods")
KUEUE_WORKLOADS = kmock.resource("kueue.x-k8s.io", "v1beta1", "workloads")
PRIORITY_CLASSES = kmock.resource("scheduling.k8s.io", "v1", "priorityclasses")
MUTATING_CONFIGS = kmock.resource(
    "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations"
)
VALIDATING_CONFIGS = kmock.resource(
    "admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations"
)

# Held by every PodGroup while a pod (even a Terminating one) names it in its schedulingGroup.
POD_GROUP_PROTECTION = "scheduling.k8s.io/podgroup-protection"
# What a foreground delete holds its object with until the blocking dependents are gone.
FOREGROUND_DELETION = "foregroundDeletion"
# Filled in on a PodGroup's create: defaulting, and the Priority admission plugin (no class).
_POD_GROUP_DEFAULTS = {
    POD_GROUPS: {
        "disruptionMode": {"single": {}},
        "priority": 0,
        "preemptionPolicy": "PreemptLowerPriority",
    },
    # 1.36: a string mode, no preemptionPolicy; its default `Pod` is assumed (was-api.md 1.7
    # does not say it).
    POD_GROUPS_V1ALPHA2: {"disruptionMode": "Pod", "priority": 0},
}

LIST = kmock.action.LIST
WATCH = kmock.action.WATCH

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
OPTIMISTIC_LOCK = (
    "the object has been modified; please apply your changes to the latest version and try again"
)

Json = dict[str, Any]
Key = tuple[kmock.resource, str | None, str]  # kmock's object key: resource, namespace, name

ALL_VERBS = {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
Declared = tuple[str, bool] | tuple[str, bool, str]  # kind, namespaced, (subresource)
_TRAINER_KINDS: dict[kmock.resource, Declared] = {
    TRAINJOBS: ("TrainJob", True, "status"),  # the CRD's `subresources: {status: {}}`
    TRAINING_RUNTIMES: ("TrainingRuntime", True),
    CLUSTER_RUNTIMES: ("ClusterTrainingRuntime", False),
}
_SERVICE_KINDS = {  # what the service writes
    LEASES: ("Lease", True),
    EVENTS: ("Event", True),
    SECRETS: ("Secret", True),
    NODES: ("Node", False),  # what feasibility reads (and explain)
    PODS: ("Pod", True),  # what explain reads
    PRIORITY_CLASSES: ("PriorityClass", False),
    MUTATING_CONFIGS: ("MutatingWebhookConfiguration", False),
    VALIDATING_CONFIGS: ("ValidatingWebhookConfiguration", False),
}


# The kinds whose writes keep `metadata.managedFields` and take server-side apply: their CRD
# (in shared/reference/crds), whose schema gives the list types and validates the status.
_CRD_FILES = {TRAINJOBS: "trainer.kubeflow.org_trainjobs.yaml"}


def _declare(emulator: KubernetesEmulator, kinds: Mapping[kmock.resource, Declared]) -> None:
    """Each kind: its name, whether it is namespaced, and (optionally) its subresource."""
    for resource, (kind, namespaced, *subresources) in kinds.items():
        emulator.resources[resource] = kmock.ResourceInfo(
            kind=kind, namespaced=namespaced, verbs=ALL_VERBS, subresources=set(subresources)
        )


def declare_trainer_resources(emulator: KubernetesEmulator) -> None:
    """kmock answers 404 for a resource it does not know: declare Kubeflow Trainer's three."""
    _declare(emulator, _TRAINER_KINDS)


def declare_scheduling_resources(emulator: KubernetesEmulator, version: str = "v1beta1") -> None:
    """scheduling.k8s.io Workloads and PodGroups (discovery lists them once declared): `v1beta1`
    as Kubernetes 1.37 serves them, or `v1alpha2` as 1.36 does."""
    workloads, pod_groups = SCHEDULING_RESOURCES[version]
    _declare(emulator, {workloads: ("Workload", True), pod_groups: ("PodGroup", True)})


def declare_backend_resources(emulator: KubernetesEmulator, names: Iterable[str]) -> None:
    """The kinds of the named gang backends (`coscheduling`, `volcano`, `kai`): their CRDs,
    installed (discovery lists them once declared)."""
    from webhook.backends.registry import all_backends

    kinds = {
        kmock.resource(kind.group, kind.version, kind.plural): (kind.kind, True)
        for backend in all_backends()
        if backend.name in names
        for kind in backend.kinds
    }
    _declare(emulator, kinds)


def declare_composite_resources(emulator: KubernetesEmulator) -> None:
    """scheduling.k8s.io/v1alpha3 CompositePodGroups (the CompositePodGroup gate on)."""
    _declare(emulator, {COMPOSITE_POD_GROUPS: ("CompositePodGroup", True)})


def declare_service_resources(emulator: KubernetesEmulator) -> None:
    """coordination.k8s.io/v1 Leases, events.k8s.io/v1 Events, core/v1 Secrets, Nodes and Pods,
    and the admissionregistration.k8s.io/v1 webhook configurations."""
    _declare(emulator, _SERVICE_KINDS)


def declare_kueue_resources(emulator: KubernetesEmulator) -> None:
    """kueue.x-k8s.io/v1beta1 Workloads (Kueue installed)."""
    _declare(emulator, {KUEUE_WORKLOADS: ("Workload", True)})


# --- refusals, as the API server words them ----------------------------------------------------


@attrs.frozen
class ApiError(kmock.KubernetesError):
    """A refusal, answered with the API server's Status body (kmock's add a traceback)."""


def _qualified(resource: kmock.resource) -> str:
    return f"{resource.plural}.{resource.group}" if resource.group else f"{resource.plural}"


def _details(resource: kmock.resource, name: str) -> Json:
    return {"name": name, "group": resource.group, "kind": resource.plural}


def not_found(resource: kmock.resource, name: str) -> ApiError:
    message = f'{_qualified(resource)} "{name}" not found'
    return ApiError(404, "NotFound", message, _details(resource, name))


def already_exists(resource: kmock.resource, name: str) -> ApiError:
    message = f'{_qualified(resource)} "{name}" already exists'
    return ApiError(409, "AlreadyExists", message, _details(resource, name))


def conflict(resource: kmock.resource, name: str, why: str = OPTIMISTIC_LOCK) -> ApiError:
    message = f'Operation cannot be fulfilled on {_qualified(resource)} "{name}": {why}'
    return ApiError(409, "Conflict", message, _details(resource, name))


def invalid(resource: kmock.resource, name: str, why: str) -> ApiError:
    return ApiError(422, "Invalid", why, _details(resource, name))


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def unknown_resource() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def unsupported_patch(custom: bool) -> ApiError:
    """A custom resource takes no strategic merge patch; a built-in one no apply, here."""
    accepted = f"{JSON_PATCH}, {MERGE_PATCH}, " + (APPLY_PATCH if custom else STRATEGIC_MERGE_PATCH)
    message = "the body of the request was in an unknown format - accepted media types include: "
    return ApiError(415, "UnsupportedMediaType", message + accepted)


def invalid_patch_options(field: str, reason: str, why: str) -> ApiError:
    """PatchOptions the API server refuses (no fieldManager for an apply, force without one)."""
    message = f'PatchOptions.meta.k8s.io "" is invalid: {field}: {why}'
    cause = {"reason": reason, "message": why, "field": field}
    details = {"group": "meta.k8s.io", "kind": "PatchOptions", "causes": [cause]}
    return ApiError(422, "Invalid", message, details)


def invalid_object(resource: kmock.resource, kind: str, name: str, causes: list[Json]) -> ApiError:
    """A custom resource its CRD's schema rejects, a cause per field."""
    texts = [f"{c['field']}: {c['message']}" for c in causes]
    listed = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    qualified = f"{kind}.{resource.group}" if resource.group else kind  # `Pod "x"`, core group
    message = f'{qualified} "{name}" is invalid: {listed}'
    details = {"name": name, "group": resource.group, "kind": kind, "causes": causes}
    return ApiError(422, "Invalid", message, details)


def apply_conflict(conflicts: list[ssa.Conflict]) -> ApiError:
    """409 for an apply that would change fields other managers own (NewApplyConflict)."""
    causes = [
        {
            "reason": "FieldManagerConflict",
            "message": f"conflict with {c.manager.describe()}",
            "field": ssa.pretty(c.path),
        }
        for c in conflicts
    ]
    return ApiError(409, "Conflict", ssa.conflict_message(conflicts), {"causes": causes})


# --- field selectors ----------------------------------------------------------------------------

Selector = Callable[[Json], bool]
_SELECTABLE = ("metadata.name", "metadata.namespace")


def _term(text: str, term: str) -> tuple[str, bool, str]:
    """One `field=value`, `field==value` or `field!=value`: (field, equal, value)."""
    operator = next((op for op in ("!=", "==", "=") if op in term), None)
    if operator is None:
        raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
    field, value = (part.strip() for part in term.split(operator, 1))
    if field not in _SELECTABLE:
        raise bad_request(f"field label not supported: {field}")
    return field, operator != "!=", value


def field_selector(text: str) -> Selector:
    """A `fieldSelector` as kube-apiserver reads it, for the fields every resource serves."""
    terms = [_term(text, t.strip()) for t in text.split(",") if t.strip()]

    def matches(obj: Json) -> bool:
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        assert isinstance(meta, dict)
        for field, equal, value in terms:
            actual = meta.get(field.split(".", 1)[1]) or ""
            if (actual == value) != equal:
                return False
        return True

    return matches


def _label_term(text: str, term: str) -> Selector:
    """One term of a label selector, as k8s.io/apimachinery/pkg/labels parses it."""
    bad = bad_request(f"unable to parse requirement: invalid label selector: '{text}'")
    words = term.split()
    if len(words) >= 3 and words[1] in ("in", "notin"):
        key, listed = words[0], " ".join(words[2:])
        if not (listed.startswith("(") and listed.endswith(")")):
            raise bad
        values = {v.strip() for v in listed[1:-1].split(",") if v.strip()}
        if words[1] == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    for operator in ("!=", "==", "="):
        if operator in term:
            key, value = (part.strip() for part in term.split(operator, 1))
            if not key or " " in key:
                raise bad
            if operator == "!=":
                return lambda labels: labels.get(key) != value
            return lambda labels: labels.get(key) == value
    if term.startswith("!"):
        key = term[1:].strip()
        return lambda labels: key not in labels
    if not term or " " in term:
        raise bad
    return lambda labels: term in labels


def label_selector(text: str) -> Selector:
    """A `labelSelector` (commas inside `in (...)` do not separate terms)."""
    terms, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += char
    terms.append(current.strip())
    checks = [_label_term(text, t) for t in terms if t]

    def matches(obj: Json) -> bool:
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
        labels = meta.get("labels") if isinstance(meta, dict) else None
        found = labels if isinstance(labels, dict) else {}
        return all(check(found) for check in checks)

    return matches


def _selected(request: kmock.Request) -> Selector:
    by_field = field_selector(request.params.get("fieldSelector") or "")
    by_label = label_selector(request.params.get("labelSelector") or "")
    return lambda obj: by_field(obj) and by_label(obj)


def _key_of(obj: Json) -> str:
    meta = _meta(obj)
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def _continue_token(rv: int, after: str) -> str:
    raw = json.dumps({"rv": rv, "start": after}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _page(
    request: kmock.Request, items: list[Json], rv: int, compacted: int
) -> tuple[list[Json], int, str | None, int]:
    """One page of a list: (items, the list's resourceVersion, continue token, remaining)."""
    limit_text = request.params.get("limit") or "0"
    token = request.params.get("continue")
    if not limit_text.isdigit():
        raise bad_request(f"invalid limit: {limit_text}")
    items = sorted(items, key=_key_of)
    if token:
        try:
            state = json.loads(base64.urlsafe_b64decode(token.encode()))
            rv, after = int(state["rv"]), str(state["start"])
        except (ValueError, KeyError, TypeError):
            raise bad_request("continue key is not valid: unreadable") from None
        if rv < compacted:
            message = (
                "The provided continue parameter is too old to display a consistent list "
                "result. You can start a new list without the continue parameter."
            )
            raise ApiError(410, "Expired", message)
        items = [o for o in items if _key_of(o) > after]
    limit = int(limit_text)
    if limit <= 0 or len(items) <= limit:
        return items, rv, None, 0
    page = items[:limit]
    return page, rv, _continue_token(rv, _key_of(page[-1])), len(items) - limit


# --- what a write does to an object ------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def _now(later: int = 0) -> str:
    """A metav1.Time, `later` seconds from now: RFC 3339, UTC, whole seconds."""
    when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=later)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod_group_name(pod: Json) -> str | None:
    """The PodGroup a pod names in `spec.schedulingGroup.podGroupName`, if any."""
    spec = pod.get("spec")
    group = spec.get("schedulingGroup") if isinstance(spec, dict) else None
    name = group.get("podGroupName") if isinstance(group, dict) else None
    return name if isinstance(name, str) else None


def _grace_period(request: kmock.Request, options: Json) -> int | None:
    """DeleteOptions' gracePeriodSeconds, in the body or as a query parameter (None: unset)."""
    value = options.get("gracePeriodSeconds", request.params.get("gracePeriodSeconds"))
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise bad_request(f"invalid gracePeriodSeconds: {value}") from None


def _meta(obj: Json) -> Json:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = obj["metadata"] = {}
    return meta


def _content(obj: Json) -> Json:
    """What `generation` counts changes of: everything but metadata and status."""
    return {key: value for key, value in obj.items() if key not in ("metadata", "status")}


def _owned_by(obj: Json, uid: str) -> bool:
    refs = _meta(obj).get("ownerReferences") or []
    return any(isinstance(ref, dict) and ref.get("uid") == uid for ref in refs)


def _blocks(obj: Json, uid: Any) -> bool:
    """Whether `obj` holds back the foreground delete of its owner `uid`."""
    refs = _meta(obj).get("ownerReferences") or []
    return any(
        isinstance(ref, dict) and ref.get("uid") == uid and ref.get("blockOwnerDeletion") is True
        for ref in refs
    )


def _json_body(request: kmock.Request) -> Any:
    if not request.body:
        return None
    try:
        return json.loads(request.body)
    except ValueError as err:
        raise bad_request(f"the body is not JSON: {err}") from None


def _json_object(request: kmock.Request) -> Json:
    body = _json_body(request)
    if not isinstance(body, dict):
        raise bad_request("the body is not a JSON object")
    return body


def _media_type(request: kmock.Request) -> str:
    for header, value in request.headers.items():
        if header.lower() == "content-type":
            return value.split(";")[0].strip().lower()
    return ""


@dataclass(frozen=True)
class _Event:
    rv: int
    resource: kmock.resource
    namespace: str | None
    event: Json


_SERVING: contextvars.ContextVar[aiohttp.web.BaseRequest] = contextvars.ContextVar("serving")


def serving() -> aiohttp.web.BaseRequest:
    """The aiohttp request the emulator is answering in this task (in a handler or reaction)."""
    return _SERVING.get()


@attrs.define(kw_only=True)
class VersionedEmulator(KubernetesEmulator):
    """kmock's emulator with resourceVersions, resumable watches, 410 Gone, watch timeouts and
    the API server's rules for writes (see the module's docstring)."""

    garbage_collection: bool = True  # delete the dependents of what is deleted, by ownerReferences
    # Pods deleted with a grace period stay Terminating until `finish_pods()` (off: they go at
    # once, as if every kubelet stopped its containers in no time).
    pod_grace: bool = False
    # What a real server fills in on a PodGroup's create (off: stored as sent).
    pod_group_defaults: bool = False

    _rv: int = attrs.field(default=0, init=False)
    _compacted: int = attrs.field(default=0, init=False)
    _watch_cache_at: int | None = attrs.field(default=None, init=False)
    _journal: list[_Event] = attrs.field(factory=list, init=False)
    # Set (and replaced) on every change. An Event rather than a Condition: on Python 3.11,
    # wait_for() cancelling Condition.wait() can lose the lock and wedge the watch handler.
    _changed: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _open_watches: dict[kmock.Request, asyncio.Transport] = attrs.field(factory=dict, init=False)
    _created: set[kmock.Request] = attrs.field(factory=set, init=False)  # to answer with 201
    _store_lock: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)  # read or write

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()  # kmock's fallbacks call the _serve_* methods below
        self.fallback[kmock.method.PUT] << self._serve_replace

    @property
    def resource_version(self) -> int:
        return self._rv

    @property
    def open_watches(self) -> int:
        return len(self._open_watches)

    def changes(self, resource: kmock.resource) -> list[tuple[str, Json]]:
        """Every stored change to `resource` so far, in order: (ADDED/MODIFIED/DELETED, object)."""
        return [
            (entry.event["type"], copy.deepcopy(entry.event["object"]))
            for entry in self._journal
            if entry.resource == resource
        ]

    def compact(self) -> None:
        """Forget the history so far: a watch from any version before now gets 410 Gone."""
        self._compacted = self._rv

    def lag_watch_cache(self, at: int | None) -> None:
        """As after an API server restart: its watch cache has reached only version `at` (None:
        caught up), so a watch from a later version gets "Too large resource version" (at once:
        the API server first waits up to 3 s for its cache)."""
        self._watch_cache_at = at

    def drop_watches(self) -> int:
        """Cut the TCP connections of all open watches (the client sees a broken stream)."""
        dropped = 0
        for transport in list(self._open_watches.values()):
            if not transport.is_closing():
                transport.abort()
                dropped += 1
        return dropped

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # aiohttp's request reaches us only here, kmock's public entry point (a `kmock.Request`
        # keeps it in a private field): `serving()` hands it on, e.g. for a watch's connection.
        token = _SERVING.set(raw_request)
        try:
            return await super().__call__(raw_request)
        finally:
            _SERVING.reset(token)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # kmock's emulator applies a write here, before any reaction answers it; ours happen in
        # the fallbacks, so a reaction that answers a write (an injected 500) leaves no trace.
        response = await kmock.RawHandler._handle(self, request)
        if request in self._created:
            # 201 Created, as kube-apiserver answers (clients read a create's body only with
            # 201); kmock's public API has no payload with a status, so it is set here.
            self._created.discard(request)
            response.set_status(201)
        return response

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if isinstance(exc, ApiError):
            body = status_object(exc.status, exc.reason or "", exc.message or "", exc.details)
            return aiohttp.web.json_response(body, status=exc.status)
        return await super()._render_error(exc)

    # --- reads ---

    def _known(self, request: kmock.Request) -> bool:
        return any(resource == request.resource for resource in self._get_resources())

    def _resource(self, request: kmock.Request) -> kmock.resource:
        if request.resource is None or not self._known(request):
            raise unknown_resource()
        return request.resource

    def _info(self, resource: kmock.resource) -> kmock.ResourceInfo | None:
        """What was declared about `resource`, if anything (a reaction can make it known too)."""
        try:
            return self.resources[resource]
        except KeyError:
            return None

    def _live(self, key: Key) -> Json | None:
        """A copy of the object stored under `key`, if it exists (and is not deleted)."""
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def _current(self, request: kmock.Request) -> list[Json]:
        return [
            copy.deepcopy(obj.raw)
            for (resource, namespace, _), obj in self.objects.items()
            if resource == request.resource
            and not obj.deleted
            and (request.namespace is None or namespace == request.namespace)
        ]

    async def _serve_fetch(self, request: kmock.Request) -> kmock.Payload:
        resource = self._resource(request)
        self._subresource(request, resource)  # `.../status` reads the whole object
        name = request.name or ""
        async with self._store_lock:
            obj = self._live((resource, request.namespace, name))
        if obj is None:
            raise not_found(resource, name)
        return obj

    async def _serve_list(self, request: kmock.Request) -> kmock.Payload:
        resource = self._resource(request)
        selected = _selected(request)
        async with self._store_lock:
            items, rv = [o for o in self._current(request) if selected(o)], self._rv
        items, rv, token, remaining = _page(request, items, rv, self._compacted)
        info = self._info(resource)
        kind = info.kind if info is not None else None
        meta: Json = {"resourceVersion": str(rv)}
        if token:
            meta.update({"continue": token, "remainingItemCount": remaining})
        if _built_in(resource):  # as from a real server, their items come without the two
            for item in items:
                item.pop("apiVersion", None)
                item.pop("kind", None)
        return {
            "apiVersion": f"{resource.group}/{resource.version}".lstrip("/"),
            "kind": f"{kind or 'Object'}List",
            "metadata": meta,
            "items": items,
        }

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[kmock.Payload]:
        selected = _selected(request)  # a bad selector is a 400, before the stream starts
        yield b""  # the headers go out now, as from the API server
        since = request.params.get("resourceVersion", "")
        timeout = request.params.get("timeoutSeconds")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(timeout) if timeout else None
        async with self._store_lock:
            if since in ("", "0"):  # "start at most recent": the objects, then the changes
                initial = [
                    {"type": "ADDED", "object": obj}
                    for obj in self._current(request)
                    if selected(obj)
                ]
                position = len(self._journal)
            elif not since.isdigit() or int(since) < self._compacted:
                yield expired_event(since, self._compacted)
                return
            elif self._watch_cache_at is not None and int(since) > self._watch_cache_at:
                yield too_large_event(since, self._watch_cache_at)
                return
            else:
                initial = []
                position = bisect.bisect_right([e.rv for e in self._journal], int(since))
        for event in initial:
            yield event
        transport = serving().transport
        if transport is not None:
            self._open_watches[request] = transport
        try:
            while transport is not None and not transport.is_closing():
                pending = self._journal[position:]
                position += len(pending)
                for entry in pending:
                    if (
                        entry.resource == request.resource
                        and (request.namespace is None or entry.namespace == request.namespace)
                        and selected(entry.event["object"])
                    ):
                        yield copy.deepcopy(entry.event)
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return  # timeoutSeconds: the API server ends the stream cleanly
                wait = 0.05 if remaining is None else min(0.05, remaining)
                if len(self._journal) == position:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), wait)
        finally:
            self._open_watches.pop(request, None)

    # --- writes: each checks, then stores under the lock, at the next resourceVersion ---

    async def _commit(self, key: Key, kind: str, obj: Json) -> Json:
        """Stores `obj` (or, for DELETED, removes it) and journals the watch event."""
        self._rv += 1
        _meta(obj)["resourceVersion"] = str(self._rv)
        if kind == "DELETED":
            self.objects[key].delete()
        elif key in self.objects:
            self.objects[key].history.append(copy.deepcopy(obj))
        else:
            self.objects[key] = copy.deepcopy(obj)
        event = {"type": kind, "object": copy.deepcopy(obj)}
        self._journal.append(_Event(self._rv, key[0], key[1], event))
        self._changed.set()  # wakes every waiting watch; later waits use a fresh event
        self._changed = asyncio.Event()
        return obj

    async def _serve_create(self, request: kmock.Request) -> kmock.Payload:
        resource = self._resource(request)
        obj = _json_object(request)
        meta = _meta(obj)
        if meta.get("resourceVersion"):
            raise bad_request("resourceVersion should not be set on objects to be created")
        info = self._info(resource)
        namespace = request.namespace or meta.get("namespace") or None
        if request.namespace and meta.get("namespace") not in (None, "", request.namespace):
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        if info is not None and info.namespaced is False:
            if request.namespace:
                raise unknown_resource()  # no namespaced URL for a cluster-scoped resource
            namespace = None
            meta.pop("namespace", None)  # cleared, as the API server does
        name = meta.get("name") or _generated_name(meta.get("generateName"))
        if not name:
            raise invalid(resource, "", "metadata.name: Required value: name or generateName")
        obj.setdefault("apiVersion", f"{resource.group}/{resource.version}".lstrip("/"))
        if info is not None and info.kind:
            obj.setdefault("kind", info.kind)
        for field in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(field, None)
        meta.update(name=name, uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        if namespace:
            meta["namespace"] = namespace
        key = (resource, namespace, name)
        _validate(resource, name, obj, None)
        if resource in _ALL_POD_GROUPS and self.pod_group_defaults:
            spec = obj.setdefault("spec", {})
            for field, default in _POD_GROUP_DEFAULTS[resource].items():
                spec.setdefault(field, copy.deepcopy(default))
        if resource in _ALL_POD_GROUPS:
            # kube-apiserver's PodGroup protection: the finalizer is there from the create on.
            finalizers = list(meta.get("finalizers") or [])
            if POD_GROUP_PROTECTION not in finalizers:
                meta["finalizers"] = [*finalizers, POD_GROUP_PROTECTION]
        if "status" in self._subresources(resource):
            obj.pop("status", None)  # written only through `.../status`
        schema = _schema(resource)
        if schema is not None:
            mine = ssa.Entry(_manager(request), "Update", _api_version(resource), "", _now())
            managers = ssa.decode_managers(meta.get("managedFields"))
            try:
                managers = ssa.updated(managers, mine, {}, _unmanaged(obj), schema)
            except ssa.SchemaError as err:
                raise invalid_object(resource, _kind(resource), name, [_cause(err)]) from None
            meta["managedFields"] = ssa.encode_managers(managers)
        async with self._store_lock:
            if self._live(key) is not None:
                raise already_exists(resource, name)
            if request.params.get("dryRun") == "All":
                created = obj  # checked and answered as it would be stored; nothing stored
            else:
                created = await self._commit(key, "ADDED", obj)
        self._created.add(request)  # answered 201 Created (see _handle)
        return created

    async def _serve_replace(self, request: kmock.Request) -> kmock.Payload:
        """PUT: the body is the whole new object (of `.../status`: its status)."""
        resource = self._resource(request)
        subresource = self._subresource(request, resource)
        if request.name is None:
            raise ApiError(405, "MethodNotAllowed", "PUT is only served for one object")
        obj = _json_object(request)
        body_name = _meta(obj).get("name")
        if body_name not in (None, request.name):
            raise bad_request(
                f"the name of the object ({body_name}) does not match the name on the URL "
                f"({request.name})"
            )
        _no_force(request)
        if resource in _CRD_FILES and not _meta(obj).get("resourceVersion"):
            # A custom resource allows no unconditional update.
            why = "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
            raise invalid(resource, request.name, f'{_qualified(resource)} "{request.name}" is '
                          f"invalid: {why}")  # fmt: skip
        key = (resource, request.namespace, request.name)
        async with self._store_lock:
            stored = self._live(key)
            if stored is None:
                raise not_found(resource, request.name)
            return await self._update(key, stored, obj, subresource, _manager(request))

    async def _serve_update(self, request: kmock.Request) -> kmock.Payload:
        """PATCH, by its Content-Type."""
        resource = self._resource(request)
        subresource = self._subresource(request, resource)
        media_type = _media_type(request)
        custom = resource in _CRD_FILES
        if media_type not in (
            MERGE_PATCH,
            JSON_PATCH,
            APPLY_PATCH if custom else STRATEGIC_MERGE_PATCH,
        ):
            raise unsupported_patch(custom)
        if media_type == APPLY_PATCH:
            return await self._serve_apply(request, resource, subresource)
        _no_force(request)
        name = request.name or ""
        body = _json_body(request)
        key = (resource, request.namespace, name)
        async with self._store_lock:
            stored = self._live(key)
            if stored is None:
                raise not_found(resource, name)
            if media_type == JSON_PATCH:
                patched = _json_patched(resource, name, stored, body)
            elif isinstance(body, dict):
                patched = merge_patch(stored, body)
            else:
                raise bad_request("a merge patch must be a JSON object")
            return await self._update(key, stored, patched, subresource, _manager(request))

    async def _update(
        self, key: Key, stored: Json, new: Json, subresource: str, manager: str
    ) -> Json:
        """The end of every PUT and PATCH: concurrency checks, then what the server keeps."""
        resource, _, name = key
        _validate(resource, name, new, stored)
        _preconditions(resource, name, _meta(new), _meta(stored))
        new = self._kept(resource, stored, new, subresource)
        schema = _schema(resource)
        if schema is not None:
            mine = ssa.Entry(manager, "Update", _api_version(resource), subresource, _now())
            given = _meta(new).get("managedFields") if not subresource else None
            managers = ssa.decode_managers(given or _meta(stored).get("managedFields"))
            try:
                managers = ssa.updated(managers, mine, _unmanaged(stored), _unmanaged(new), schema)
            except ssa.SchemaError as err:
                raise invalid_object(resource, _kind(resource), name, [_cause(err)]) from None
            _meta(new)["managedFields"] = ssa.encode_managers(managers)
        return await self._store(key, stored, new)

    async def _serve_apply(
        self, request: kmock.Request, resource: kmock.resource, subresource: str
    ) -> kmock.Payload:
        """Server-side apply (`application/apply-patch+yaml`) of an existing object: the
        configuration merged in, its fields owned by `fieldManager`, conflicts refused unless
        `force=true`."""
        manager = request.params.get("fieldManager") or ""
        if not manager:
            why = "Required value: is required for apply patch"
            raise invalid_patch_options("fieldManager", "FieldValueRequired", why)
        force = request.params.get("force") == "true"
        name = request.name or ""
        config = self._configuration(request, resource, subresource)
        schema = _schema(resource)
        assert schema is not None  # only custom resources with a CRD take an apply
        key = (resource, request.namespace, name)
        async with self._store_lock:
            stored = self._live(key)
            if stored is None:
                raise not_found(resource, name)  # an apply that creates: not emulated
            _preconditions(resource, name, _meta(config), _meta(stored))
            for field in ("uid", "resourceVersion"):
                _meta(config).pop(field, None)
            mine = ssa.Entry(manager, "Apply", _api_version(resource), subresource, _now())
            managers = ssa.decode_managers(_meta(stored).get("managedFields"))
            live = _unmanaged(stored)
            try:
                new, managers = ssa.applied(managers, mine, live, config, schema, force=force)
            except ssa.ApplyConflict as err:
                raise apply_conflict(err.conflicts) from None
            except ssa.SchemaError as err:
                raise invalid_object(resource, _kind(resource), name, [_cause(err)]) from None
            new = self._kept(resource, stored, new, subresource)
            _meta(new)["managedFields"] = ssa.encode_managers(managers)
            return await self._store(key, stored, new)

    def _configuration(
        self, request: kmock.Request, resource: kmock.resource, subresource: str
    ) -> Json:
        """An apply's body, checked; of `.../status`, only its status counts."""
        try:
            body = json.loads(request.body or b"null")  # JSON is YAML, read faster
        except ValueError:
            try:
                body = yaml.safe_load(request.body or b"")
            except yaml.YAMLError as err:
                raise bad_request(f"error decoding YAML: {err}") from None
        if not isinstance(body, dict):
            raise bad_request("error decoding YAML: the body is not an object")
        expected = _api_version(resource)
        if body.get("apiVersion") != expected:
            raise bad_request(
                "Incorrect version specified in apply patch. Specified patch version: "
                f"{body.get('apiVersion') or ''}, expected: {expected}"
            )
        if body.get("kind") != _kind(resource):
            raise bad_request(f"Object 'Kind' is missing or wrong in '{request.body!r:.100}'")
        meta = _meta(body)
        if meta.get("name") != request.name:
            raise bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                f"({request.name})"
            )
        if meta.get("managedFields"):
            raise bad_request("metadata.managedFields must be nil")
        if subresource == "status":
            kept = {
                k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta
            }
            body = {"apiVersion": expected, "kind": body["kind"], "metadata": kept} | (
                {"status": body["status"]} if "status" in body else {}
            )
        elif "status" in self._subresources(resource):
            body.pop("status", None)  # the status subresource's, not this endpoint's
        return body

    def _kept(self, resource: kmock.resource, stored: Json, new: Json, subresource: str) -> Json:
        """What a write keeps of `new`: the server's own metadata, and, for a kind with a
        status subresource, only the status (written there) or all but it (written here)."""
        meta, old = _meta(new), _meta(stored)
        for field in (
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "resourceVersion",
            "generation",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ):
            if field in old:
                meta[field] = old[field]
            else:
                meta.pop(field, None)
        if "status" not in self._subresources(resource):
            return new
        base, source = (stored, new) if subresource == "status" else (new, stored)
        kept = copy.deepcopy(base)
        if "status" in source:
            kept["status"] = copy.deepcopy(source["status"])
        else:
            kept.pop("status", None)
        if kept.get("status") != stored.get("status"):
            _validate_status(resource, _meta(stored).get("name") or "", kept)
        return kept

    async def _store(self, key: Key, stored: Json, new: Json) -> Json:
        """Stores a write's result: `generation` counts changes to all but metadata and status;
        a write that changes nothing stores nothing."""
        meta, old = _meta(new), _meta(stored)
        if not meta.get("managedFields"):
            meta.pop("managedFields", None)
        changed = _content(new) != _content(stored)
        meta["generation"] = int(old.get("generation") or 1) + (1 if changed else 0)
        if (
            old.get("deletionTimestamp")
            and not meta.get("finalizers")
            and not old.get("deletionGracePeriodSeconds")  # a pod's kubelet has not finished
        ):
            return await self._remove(key, stored)  # the last finalizer is gone: delete for real
        if new == stored:
            return stored  # a no-op: no new version, no event
        return await self._commit(key, "MODIFIED", new)

    def _subresources(self, resource: kmock.resource) -> set[str]:
        info = self._info(resource)
        return set(info.subresources) if info is not None else set()

    def _subresource(self, request: kmock.Request, resource: kmock.resource) -> str:
        """The request's subresource ("" for the object itself): 404 if the kind has none."""
        subresource = request.subresource or ""
        if subresource and subresource not in self._subresources(resource):
            raise unknown_resource()
        return subresource

    async def _serve_delete(self, request: kmock.Request) -> kmock.Payload:
        resource = self._resource(request)
        if self._subresource(request, resource):
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")
        name = request.name or ""
        options = _json_body(request)
        options = options if isinstance(options, dict) else {}
        preconditions = options.get("preconditions")
        grace = _grace_period(request, options)
        policy = options.get("propagationPolicy", request.params.get("propagationPolicy"))
        if policy not in (None, "Background", "Foreground", "Orphan"):
            raise bad_request(f"unsupported propagationPolicy: {policy}")
        key = (resource, request.namespace, name)
        async with self._store_lock:
            stored = self._live(key)
            if stored is None:
                raise not_found(resource, name)
            meta = _meta(stored)
            for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
                wanted = (preconditions or {}).get(field)
                if wanted and wanted != meta.get(field):
                    why = f"Precondition failed: {label} in precondition: {wanted}, "
                    raise conflict(
                        resource, name, why + f"{label} in object meta: {meta.get(field)}"
                    )
            if policy in ("Foreground", "Orphan") and not meta.get("deletionTimestamp"):
                return await self._delete_after_dependents(key, stored, policy)
            return await self._delete(key, stored, grace)

    async def _delete_after_dependents(self, key: Key, stored: Json, policy: str) -> Json:
        """Foreground: the object gets a deletionTimestamp and the finalizer
        `foregroundDeletion`, the garbage collector deletes its dependents, and it goes once
        none with `blockOwnerDeletion: true` is left. Orphan: its dependents lose their
        reference to it, then it is deleted."""
        meta = _meta(stored)
        uid = meta.get("uid")
        if policy == "Orphan" or not self.garbage_collection or not uid:
            if uid and policy == "Orphan":
                await self._orphan(uid)
            return await self._delete(key, stored)
        finalizers = [*(meta.get("finalizers") or []), FOREGROUND_DELETION]
        meta.update(deletionTimestamp=_now(), deletionGracePeriodSeconds=0, finalizers=finalizers)
        marked = await self._commit(key, "MODIFIED", stored)
        await self._collect(uid)
        await self._finish_foreground()
        return marked

    async def _orphan(self, uid: str) -> None:
        for key, obj in list(self.objects.items()):
            if obj.deleted or not _owned_by(obj.raw, uid):
                continue
            orphaned = copy.deepcopy(obj.raw)
            refs = [r for r in _meta(orphaned)["ownerReferences"] if r.get("uid") != uid]
            _meta(orphaned)["ownerReferences"] = refs
            if not refs:
                _meta(orphaned).pop("ownerReferences")
            await self._commit(key, "MODIFIED", orphaned)

    async def _finish_foreground(self) -> None:
        """The garbage collector's end of a foreground delete: an owner none of whose live
        dependents (Terminating ones included) blocks it with `blockOwnerDeletion` loses its
        `foregroundDeletion` finalizer (and goes, unless another holds it)."""
        for key, obj in list(self.objects.items()):
            if obj.deleted:
                continue
            meta = _meta(obj.raw)
            if FOREGROUND_DELETION not in (meta.get("finalizers") or []):
                continue
            uid = meta.get("uid")
            if any(
                not other.deleted and _blocks(other.raw, uid) for other in self.objects.values()
            ):
                continue
            await self._drop_finalizer(key, FOREGROUND_DELETION)

    async def _delete(self, key: Key, stored: Json, grace: int | None = None) -> Json:
        """A delete: at once, or, with finalizers or a pod's grace period, a deletionTimestamp
        first. `grace` is DeleteOptions' gracePeriodSeconds (None: the object's default)."""
        meta = _meta(stored)
        period = self._grace_of(key, stored, grace)
        if meta.get("deletionTimestamp"):
            if key[0] == PODS and period == 0 and meta.get("deletionGracePeriodSeconds"):
                return await self._finish_pod(key, stored)  # a force delete cuts the grace
            return stored  # already on its way out
        if period or meta.get("finalizers"):
            meta.update(deletionTimestamp=_now(period), deletionGracePeriodSeconds=period)
            marked = await self._commit(key, "MODIFIED", stored)
            if key[0] in _ALL_POD_GROUPS:
                await self._protect_pod_groups(key[1])
            return marked
        return await self._remove(key, stored)

    def _grace_of(self, key: Key, obj: Json, grace: int | None) -> int:
        """The seconds a delete leaves the object Terminating before it goes (pods only, and
        only with `pod_grace`): the DeleteOptions', else the pod's
        terminationGracePeriodSeconds (30 by default); 0 for a pod on no node or finished, as
        the API server's pod strategy (CheckGracefulDelete) says."""
        if key[0] != PODS or not self.pod_grace:
            return 0
        spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
        pod_status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
        assert isinstance(spec, dict) and isinstance(pod_status, dict)
        if not spec.get("nodeName") or pod_status.get("phase") in ("Succeeded", "Failed"):
            return 0
        if grace is None:
            default = spec.get("terminationGracePeriodSeconds")
            grace = default if isinstance(default, int) else 30
        return max(grace, 0)

    async def _finish_pod(self, key: Key, stored: Json) -> Json:
        """The kubelet's last word on a Terminating pod (a delete with grace 0): it goes, once
        its finalizers are gone too."""
        meta = _meta(stored)
        meta["deletionGracePeriodSeconds"] = 0
        if meta.get("finalizers"):
            return await self._commit(key, "MODIFIED", stored)
        return await self._remove(key, stored)

    async def finish_pods(self, namespace: str | None = None, name: str | None = None) -> int:
        """As kubelets whose containers have stopped: every Terminating pod (of `namespace`,
        named `name`, if given) in its grace period goes (or waits for its finalizers).
        Returns how many pods were finished."""
        finished = 0
        async with self._store_lock:
            for key, obj in list(self.objects.items()):
                resource, ns, pod = key
                if resource != PODS or obj.deleted:
                    continue
                if namespace not in (None, ns) or name not in (None, pod):
                    continue
                live = self._live(key)
                meta = _meta(live) if live is not None else {}
                if live is not None and meta.get("deletionGracePeriodSeconds"):
                    await self._finish_pod(key, live)
                    finished += 1
        return finished

    async def _remove(self, key: Key, stored: Json) -> Json:
        removed = await self._commit(key, "DELETED", stored)
        uid = _meta(stored).get("uid")
        if self.garbage_collection and uid:
            await self._collect(uid)
        if key[0] == PODS:
            await self._protect_pod_groups(key[1])
        if self._foreground_pending():
            await self._finish_foreground()
        return removed

    def _foreground_pending(self) -> bool:
        return any(
            not obj.deleted and FOREGROUND_DELETION in (_meta(obj.raw).get("finalizers") or [])
            for obj in self.objects.values()
        )

    async def _protect_pod_groups(self, namespace: str | None) -> None:
        """kube-controller-manager's PodGroup protection: a Terminating PodGroup of `namespace`
        loses its finalizer once no pod there (Terminating ones included) names it in
        `spec.schedulingGroup.podGroupName`; then it goes unless another finalizer holds it."""
        named = {
            _pod_group_name(obj.raw)
            for (resource, ns, _), obj in self.objects.items()
            if resource == PODS and ns == namespace and not obj.deleted
        }
        for key, obj in list(self.objects.items()):
            resource, ns, name = key
            if resource not in _ALL_POD_GROUPS or ns != namespace or obj.deleted or name in named:
                continue
            meta = _meta(obj.raw)
            if not meta.get("deletionTimestamp"):
                continue
            if POD_GROUP_PROTECTION not in (meta.get("finalizers") or []):
                continue
            await self._drop_finalizer(key, POD_GROUP_PROTECTION)

    async def _drop_finalizer(self, key: Key, finalizer: str) -> None:
        """A controller's update that removes its finalizer from a Terminating object: the
        object goes if it was the last one (its DELETED event shows the last stored version)."""
        stored = self._live(key)
        assert stored is not None
        others = [f for f in _meta(stored).get("finalizers") or [] if f != finalizer]
        if not others:
            await self._remove(key, stored)
            return
        _meta(stored)["finalizers"] = others
        await self._commit(key, "MODIFIED", stored)

    async def _collect(self, uid: str) -> None:
        """The garbage collector, once the object with `uid` is gone: its dependents go, or, if
        they have another owner that still exists, lose their reference to it."""
        dependents = [
            key for key, obj in self.objects.items() if not obj.deleted and _owned_by(obj.raw, uid)
        ]
        for key in dependents:
            obj = self._live(key)
            if obj is None or not _owned_by(obj, uid):
                continue  # deleted meanwhile, as a dependent of another owner that went
            meta = _meta(obj)
            others = [ref for ref in meta["ownerReferences"] if ref.get("uid") != uid]
            if any(self._exists(ref.get("uid")) for ref in others):
                meta["ownerReferences"] = others
                await self._commit(key, "MODIFIED", obj)
            else:
                await self._delete(key, obj)

    def _exists(self, uid: Any) -> bool:
        return any(
            not obj.deleted and _meta(obj.raw).get("uid") == uid for obj in self.objects.values()
        )


def _validate(resource: kmock.resource, name: str, obj: Json, old: Json | None) -> None:
    """The API server's validation of the Secrets the service writes, and of updates to the
    gang objects' and pods' immutable fields."""
    if old is not None and resource in _IMMUTABLE_SPECS:
        causes = _IMMUTABLE_SPECS[resource](_spec(old), _spec(obj))
        if causes:
            kind = _IMMUTABLE_KINDS[resource]
            raise invalid_object(resource, kind, name, causes)
    if resource != SECRETS:
        return
    kind = obj.get("type") or "Opaque"
    data = obj.get("data") if isinstance(obj.get("data"), dict) else {}
    assert isinstance(data, dict)
    if old is not None and kind != (old.get("type") or "Opaque"):
        why = f'type: Invalid value: "{kind}": field is immutable'
        raise invalid(resource, name, f'Secret "{name}" is invalid: {why}')
    if kind == "kubernetes.io/tls":
        missing = [f"data[{k}]: Required value" for k in ("tls.crt", "tls.key") if k not in data]
        if missing:
            raise invalid(resource, name, f'Secret "{name}" is invalid: ' + ", ".join(missing))


# --- immutable fields, as the API server's update validation words them ------------------------


def _spec(obj: Json) -> Json:
    spec = obj.get("spec")
    return spec if isinstance(spec, dict) else {}


def _immutable(field: str, value: Any) -> Json:
    """apimachinery's ValidateImmutableField: `Invalid value: <value>: field is immutable`."""
    shown = json.dumps(value, separators=(",", ":")) if value is not None else "null"
    message = f"Invalid value: {shown}: field is immutable"
    return {"reason": "FieldValueInvalid", "message": message, "field": field}


def _without_min_count(value: Any) -> Any:
    """`value` with every `gang.minCount` left out: the one field of a gang that may change
    (since 1.37); switching `gang` and `basic` still shows."""
    if isinstance(value, list):
        return [_without_min_count(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: _without_min_count(v) for k, v in value.items()}
    gang = out.get("gang")
    if isinstance(gang, dict) and "minCount" in gang:
        out["gang"] = {k: v for k, v in gang.items() if k != "minCount"}
    return out


def _changed_fields(old: Json, new: Json, where: str, mutable_min_count: bool) -> list[Json]:
    """A cause per field of `where` that differs (but `gang.minCount`, if that may change)."""
    causes = []
    for key in sorted(set(old) | set(new)):
        before, after = old.get(key), new.get(key)
        if mutable_min_count:
            before, after = _without_min_count(before), _without_min_count(after)
        if before != after:
            causes.append(_immutable(f"{where}.{key}", new.get(key)))
    return causes


def _pod_group_update(old: Json, new: Json, mutable_min_count: bool = True) -> list[Json]:
    """PodGroup: every spec field is immutable but `schedulingPolicy.gang.minCount` (that
    too in 1.36: `mutable_min_count=False`)."""
    return _changed_fields(old, new, "spec", mutable_min_count)


def _workload_update(old: Json, new: Json, mutable_min_count: bool = True) -> list[Json]:
    """Workload: templates can be neither added nor removed; in each, every field is immutable
    but `schedulingPolicy.gang.minCount` (that too in 1.36); every other spec field is
    immutable."""
    key = "podGroupTemplates"
    others_old = {k: v for k, v in old.items() if k != key}
    others_new = {k: v for k, v in new.items() if k != key}
    causes = _changed_fields(others_old, others_new, "spec", mutable_min_count)
    before, after = old.get(key) or [], new.get(key) or []
    if [_template_name(t) for t in before] != [_template_name(t) for t in after]:
        return [*causes, _immutable(f"spec.{key}", new.get(key))]
    for index, (was, now) in enumerate(zip(before, after, strict=True)):
        if isinstance(was, dict) and isinstance(now, dict):
            causes += _changed_fields(was, now, f"spec.{key}[{index}]", mutable_min_count)
    return causes


def _template_name(template: Any) -> Any:
    return template.get("name") if isinstance(template, dict) else template


def _composite_update(old: Json, new: Json) -> list[Json]:
    """CompositePodGroup (v1alpha3): every spec field is immutable."""
    return _changed_fields(old, new, "spec", mutable_min_count=False)


def _pod_update(old: Json, new: Json) -> list[Json]:
    """Pod: `spec.schedulingGroup` is set at creation only (the other rules on pod updates,
    which allow little else, are not emulated)."""
    if old.get("schedulingGroup") == new.get("schedulingGroup"):
        return []
    return [_immutable("spec.schedulingGroup", new.get("schedulingGroup"))]


_IMMUTABLE_KINDS = {
    POD_GROUPS: "PodGroup",
    WORKLOADS: "Workload",
    POD_GROUPS_V1ALPHA2: "PodGroup",
    WORKLOADS_V1ALPHA2: "Workload",
    COMPOSITE_POD_GROUPS: "CompositePodGroup",
    PODS: "Pod",
}
_IMMUTABLE_SPECS: dict[kmock.resource, Callable[[Json, Json], list[Json]]] = {
    POD_GROUPS: _pod_group_update,
    WORKLOADS: _workload_update,
    POD_GROUPS_V1ALPHA2: functools.partial(_pod_group_update, mutable_min_count=False),
    WORKLOADS_V1ALPHA2: functools.partial(_workload_update, mutable_min_count=False),
    COMPOSITE_POD_GROUPS: _composite_update,
    PODS: _pod_update,
}


def _preconditions(resource: kmock.resource, name: str, meta: Json, old: Json) -> None:
    """A write's uid and resourceVersion, if set, must be the stored ones (409 otherwise)."""
    if meta.get("uid") and meta["uid"] != old.get("uid"):
        why = f"Precondition failed: UID in precondition: {meta['uid']}, "
        raise conflict(resource, name, why + f"UID in object meta: {old.get('uid')}")
    if meta.get("resourceVersion") and meta["resourceVersion"] != old.get("resourceVersion"):
        raise conflict(resource, name)


def _no_force(request: kmock.Request) -> None:
    if "force" in request.params:
        why = "Forbidden: may not be specified for non-apply patch"
        raise invalid_patch_options("force", "FieldValueForbidden", why)


def _manager(request: kmock.Request) -> str:
    """The write's field manager: `fieldManager`, else the User-Agent up to its first `/`."""
    given = request.params.get("fieldManager")
    if given:
        return given
    agent = next((v for h, v in request.headers.items() if h.lower() == "user-agent"), "")
    return agent.split("/")[0][:128]


def _api_version(resource: kmock.resource) -> str:
    return f"{resource.group}/{resource.version}".lstrip("/")


def _unmanaged(obj: Json) -> Json:
    """`obj` without its managedFields (what field ownership is computed over)."""
    out = copy.deepcopy(obj)
    _meta(out).pop("managedFields", None)
    return out


# --- custom resources: what their CRD says ------------------------------------------------------


def _built_in(resource: kmock.resource) -> bool:
    """Whether Kubernetes itself serves the kind (the core group and `*.k8s.io`, which custom
    resources may not take without an API review), not a CustomResourceDefinition: a real
    server's list of a built-in kind leaves `apiVersion` and `kind` off its items
    (kubernetes/kubernetes#3030), while a custom resource's items keep theirs."""
    group = resource.group or ""
    return group == "" or group.endswith(".k8s.io")


@functools.cache
def _crd(file: str) -> Json:
    path = SHARED / "reference" / "crds" / file
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, if built: 10x faster
    crd: Json = next(d for d in yaml.load_all(path.read_text(), Loader=loader) if d)
    return crd


def _storage_schema(file: str) -> Json:
    version = next(v for v in _crd(file)["spec"]["versions"] if v.get("storage"))
    schema: Json = version["schema"]["openAPIV3Schema"]
    return schema


def _kind(resource: kmock.resource) -> str:
    file = _CRD_FILES.get(resource)
    return str(_crd(file)["spec"]["names"]["kind"]) if file else ""


@functools.cache
def _crd_schema(file: str) -> ssa.Schema:
    return ssa.Schema.of_object(_storage_schema(file))


@functools.cache
def _status_validator(file: str) -> jsonschema.Draft7Validator:
    """The CRD's status schema as JSON Schema (its `x-kubernetes-*` keywords ignored)."""
    status = _storage_schema(file)["properties"]["status"]
    return jsonschema.Draft7Validator({"type": "object", "properties": {"status": status}})


def _schema(resource: kmock.resource) -> ssa.Schema | None:
    """The schema of a kind whose writes keep managedFields (None for the others)."""
    file = _CRD_FILES.get(resource)
    return _crd_schema(file) if file else None


def _validate_status(resource: kmock.resource, name: str, obj: Json) -> None:
    """The CRD's schema on the status a write leaves, and one item per key in each
    `listType=map` list: 422 with a cause per field. (Other fields are not checked here, and
    unknown fields are not pruned.)"""
    file = _CRD_FILES.get(resource)
    if file is None:
        return
    status_only = {"status": obj["status"]} if "status" in obj else {}
    causes = [_schema_cause(e) for e in _status_validator(file).iter_errors(status_only)]
    schema = _crd_schema(file)
    for path, items, list_schema in ssa.iter_lists(obj.get("status"), schema.field("status"),
                                                   "status"):  # fmt: skip
        if list_schema.list_type != "map":
            continue
        seen = set()
        for index, item in enumerate(items):
            keys = {k: item.get(k) for k in list_schema.list_keys} if isinstance(item, dict) else {}
            if _compact(keys) in seen:
                shown = ", ".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in keys.items())
                message = f"Duplicate value: map[string]interface {{}}{{{shown}}}"
                causes.append(
                    {
                        "reason": "FieldValueDuplicate",
                        "message": message,
                        "field": f"{path}[{index}]",
                    }
                )
            seen.add(_compact(keys))
    if causes:
        raise invalid_object(resource, _kind(resource), name, causes)


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _field_path(parts: Iterable[Any]) -> str:
    """`status.conditions[0].reason`, as the API server names a field."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _schema_cause(error: jsonschema.ValidationError) -> Json:
    """One schema violation worded as kube-apiserver words it for a custom resource."""
    field = _field_path(error.absolute_path)
    value: Any = error.instance
    rule: Any = error.validator_value
    shown = json.dumps(value)
    if error.validator == "required":
        missing = re.match(r"'(.+)' is a required property", error.message)
        name = missing.group(1) if missing else "?"
        return {"reason": "FieldValueRequired", "message": "Required value",
                "field": f"{field}.{name}"}  # fmt: skip
    if error.validator == "maxItems":
        why = f"Too many: {len(value)}: must have at most {rule} items"
        return {"reason": "FieldValueTooMany", "message": why, "field": field}
    if error.validator == "enum":
        supported = ", ".join(json.dumps(v) for v in rule)
        why = f"Unsupported value: {shown}: supported values: {supported}"
        return {"reason": "FieldValueNotSupported", "message": why, "field": field}
    if error.validator == "pattern":
        why = f"Invalid value: {shown}: {field} in body should match '{rule}'"
    else:
        why = f"Invalid value: {shown}: {error.message}"
    return {"reason": "FieldValueInvalid", "message": why, "field": field}


def _cause(err: ssa.SchemaError) -> Json:
    return {"reason": "FieldValueInvalid", "message": err.message, "field": err.path.lstrip(".")}


def _generated_name(prefix: Any) -> str | None:
    if not isinstance(prefix, str) or not prefix:
        return None
    return prefix + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))


def _json_patched(resource: kmock.resource, name: str, stored: Json, ops: Any) -> Json:
    if not isinstance(ops, list):
        raise bad_request("a JSON patch must be a JSON array of operations")
    try:
        patched = jsonpatch.apply_patch(stored, ops)
    except jsonpatch.InvalidJsonPatch as err:
        raise bad_request(str(err)) from None
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as err:
        raise invalid(resource, name, str(err)) from None
    if not isinstance(patched, dict):
        raise invalid(resource, name, "the patched object is not a JSON object")
    return patched


# --- responses for kmock reactions --------------------------------------------------------------


def status_object(code: int, reason: str, message: str, details: Json | None = None) -> Json:
    body: Json = {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def expired_event(since: str = "1", oldest: int = 2) -> Json:
    """The watch event the API server sends for a resourceVersion it no longer has."""
    message = f"too old resource version: {since} ({oldest})"
    return {"type": "ERROR", "object": status_object(410, "Expired", message)}


def too_large_event(since: str, current: int, code: int = 504) -> Json:
    """The watch event the API server sends for a resourceVersion its watch cache has not
    reached: a Timeout with the cause ResourceVersionTooLarge (apiserver's
    storage.NewTooLargeResourceVersionError); `code` 500 as when a path loses the 504."""
    message = f"Timeout: Too large resource version: {since}, current: {current}"
    cause = {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
    details = {"causes": [cause], "retryAfterSeconds": 1}
    return {"type": "ERROR", "object": status_object(code, "Timeout", message, details)}


def status(
    code: int, message: str | None = None, reason: str | None = None, details: Json | None = None
) -> ApiError:
    """An HTTP error with a Status body, as the API server answers a failed request: for a
    kmock reaction, which raises it, and the emulator answers it as any of its refusals."""
    reason = reason or ("InternalError" if code >= 500 else "Gone")
    return ApiError(code, reason, message or f"injected {code}", details)


async def broken_stream(request: kmock.Request) -> AsyncIterator[bytes]:
    """A watch whose connection breaks after the headers, before any event."""
    yield b""
    transport = serving().transport
    if transport is not None:
        transport.abort()


def next_requests(view: kmock.View, count: int = 1) -> kmock.View:
    """The next `count` requests `view` will see (kmock slices count from the first ever)."""
    seen = len(view)
    return view[seen : seen + count]


# --- the emulator on a port, a kubeconfig and a client for it -----------------------------------


@contextlib.asynccontextmanager
async def emulator(
    *,
    scheduling: bool = True,
    backends: Iterable[str] = (),
    composites: bool = False,
    scheduling_version: str = "v1beta1",
) -> AsyncIterator[tuple[VersionedEmulator, str]]:
    """A `VersionedEmulator` and its URL, serving Kubeflow Trainer's resources, Leases, Events,
    unless `scheduling=False` scheduling.k8s.io Workloads and PodGroups (in
    `scheduling_version`: `v1beta1` as 1.37, `v1alpha2` as 1.36 with an immutable minCount), with
    `composites` v1alpha3 CompositePodGroups too, and the kinds of the other gang `backends`
    named (their CRDs installed)."""
    async with VersionedEmulator() as k, Server(k) as server:
        declare_trainer_resources(k)
        declare_service_resources(k)
        if scheduling:
            declare_scheduling_resources(k, scheduling_version)
        if composites:
            declare_composite_resources(k)
        declare_backend_resources(k, backends)
        yield k, str(server.url).rstrip("/")


@contextlib.asynccontextmanager
async def plain_emulator() -> AsyncIterator[tuple[KubernetesEmulator, str]]:
    """kmock's own `KubernetesEmulator` as it comes (resources declared) and its URL."""
    async with KubernetesEmulator() as k, Server(k) as server:
        declare_trainer_resources(k)
        yield k, str(server.url).rstrip("/")


def kubeconfig(url: str) -> str:
    """A kubeconfig for a plain-HTTP API server without authentication."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "anonymous", "user": {}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "anonymous"}}],
        "current-context": "emulator",
    }
    return yaml.safe_dump(config)


@contextlib.asynccontextmanager
async def api_client(url: str, user_agent: str | None = None) -> AsyncIterator[ApiClient]:
    """The official async client for the emulator; `user_agent` lets reactions pick its
    requests out, e.g. `k[kmock.headers({"User-Agent": "a"})] << status(500)`."""
    api = ApiClient(configuration=Configuration(host=url))
    if user_agent:
        api.user_agent = user_agent
    try:
        yield api
    finally:
        close: Any = api.close  # untyped in the client
        await close()


async def eventually(check: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    """Waits until `check()` returns something true, polling, and returns it; fails the test
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.01)


# --- requests as a client sends them (each asserts success) -------------------------------------


async def create(k: KubernetesEmulator, resource: kmock.resource, obj: Json) -> Json:
    """POSTs `obj` to the emulator (as a client would), so watches see it; returns it as stored."""
    meta = dict(obj.get("metadata") or {})
    meta.pop("resourceVersion", None)  # the API server refuses a create that sets it
    body = {**obj, "metadata": meta}
    async with k.post(_path(resource, meta.get("namespace")), json=body) as response:
        assert response.status in (200, 201), await response.text()  # kmock's own: 200
        created: Json = await response.json()
        return created


async def get(
    k: KubernetesEmulator, resource: kmock.resource, namespace: str | None, name: str
) -> Json | None:
    """The object as stored, or None if there is none."""
    async with k.get(f"{_path(resource, namespace)}/{name}") as response:
        if response.status == 404:
            return None
        assert response.status == 200, await response.text()
        obj: Json = await response.json()
        return obj


async def replace(k: KubernetesEmulator, resource: kmock.resource, obj: Json) -> Json:
    """PUTs `obj` over the object of its name (its resourceVersion, if set, must be current)."""
    meta = obj["metadata"]
    url = f"{_path(resource, meta.get('namespace'))}/{meta['name']}"
    async with k.put(url, json=obj) as response:
        assert response.status == 200, await response.text()
        replaced: Json = await response.json()
        return replaced


async def patch(
    k: KubernetesEmulator, resource: kmock.resource, namespace: str | None, name: str, body: Any
) -> Json:
    """A merge patch (None deletes a key). For a kind with a status subresource, the body's
    `status` goes to `.../status`, as its controller writes it (the object's own endpoint
    ignores a status), each condition given the fields the CRD requires that it lacks."""
    if not (isinstance(body, dict) and "status" in body and _has_status(k, resource)):
        return await _patch(k, resource, namespace, name, body, MERGE_PATCH)
    rest = {key: value for key, value in body.items() if key != "status"}
    if rest:
        await _patch(k, resource, namespace, name, rest, MERGE_PATCH)
    status = {"status": _with_required_condition_fields(body["status"])}
    return await _patch(k, resource, namespace, f"{name}/status", status, MERGE_PATCH)


def _has_status(k: KubernetesEmulator, resource: kmock.resource) -> bool:
    info = next((i for r, i in k.resources.items() if r == resource), None)
    return isinstance(info, kmock.ResourceInfo) and "status" in info.subresources


def _with_required_condition_fields(status: Any) -> Any:
    """Conditions as a controller writes them: a reason (the type), a message and a
    lastTransitionTime where the test left them out."""
    if not isinstance(status, dict) or not isinstance(status.get("conditions"), list):
        return status
    defaults = {"message": "", "lastTransitionTime": _now()}
    conditions = [
        {"reason": c.get("type"), **defaults, **c} if isinstance(c, dict) else c
        for c in status["conditions"]
    ]
    return {**status, "conditions": conditions}


async def json_patch(
    k: KubernetesEmulator,
    resource: kmock.resource,
    namespace: str | None,
    name: str,
    ops: list[Json],
) -> Json:
    """A JSON patch (RFC 6902): a list of operations."""
    return await _patch(k, resource, namespace, name, ops, JSON_PATCH)


async def delete(
    k: KubernetesEmulator,
    resource: kmock.resource,
    namespace: str | None,
    name: str,
    *,
    preconditions: Json | None = None,
    grace_period_seconds: int | None = None,
    propagation_policy: str | None = None,
) -> None:
    """Deletes, with DeleteOptions `preconditions` (uid, resourceVersion),
    `gracePeriodSeconds` and `propagationPolicy` if given."""
    options = {
        "preconditions": preconditions,
        "gracePeriodSeconds": grace_period_seconds,
        "propagationPolicy": propagation_policy,
    }
    body = {key: value for key, value in options.items() if value is not None} or None
    async with k.delete(f"{_path(resource, namespace)}/{name}", json=body) as response:
        assert response.status == 200, await response.text()


async def recreate(k: KubernetesEmulator, resource: kmock.resource, obj: Json) -> Json:
    """Deletes the object of `obj`'s name and creates `obj` in its place (as someone replacing
    an object whose fields are immutable), again if a controller made its own meanwhile;
    returns it as stored."""
    meta = obj["metadata"]
    url = f"{_path(resource, meta.get('namespace'))}/{meta['name']}"
    body = {**obj, "metadata": {k: v for k, v in meta.items() if k != "resourceVersion"}}
    for _ in range(100):
        async with k.delete(url) as response:
            assert response.status in (200, 404), await response.text()
        async with k.post(_path(resource, meta.get("namespace")), json=body) as response:
            if response.status != 409:
                assert response.status in (200, 201), await response.text()
                created: Json = await response.json()
                return created
        await asyncio.sleep(0.05)
    raise AssertionError(f"{meta['name']}: made again by someone else, every time")


async def _patch(
    k: KubernetesEmulator,
    resource: kmock.resource,
    namespace: str | None,
    name: str,
    body: Any,
    media_type: str,
) -> Json:
    url = f"{_path(resource, namespace)}/{name}"
    headers = {"Content-Type": media_type}
    async with k.patch(url, data=json.dumps(body), headers=headers) as response:
        assert response.status == 200, await response.text()
        patched: Json = await response.json()
        return patched


def _path(resource: kmock.resource, namespace: str | None) -> str:
    ns = f"/namespaces/{namespace}" if namespace else ""
    prefix = f"/apis/{resource.group}" if resource.group else "/api"
    return f"{prefix}/{resource.version}{ns}/{resource.plural}"

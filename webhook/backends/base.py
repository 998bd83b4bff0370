"""The interface every gang backend implements, and what backends share.

A backend is the one place that knows its scheduler's objects: what it renders from a plan, how
a stored object differs from the desired one, which kinds the cache must watch (and the RBAC
they need), how a pod is tied to its group, what its defaulting webhook does, and how its status
reads as gang signals. The core keeps the plan; the reconciler, the pod webhook and the metrics
ask the backend chosen for the TrainJob (`registry.py`) and know no object shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from ..core import errors as fe
from ..core.errors import FieldError, Path
from ..core.plan import GroupPlan, Plan
from ..core.trainer import TRAINER_API_VERSION, TRAINJOB_KIND

JsonObject = dict[str, Any]

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "trainjob-scheduling-webhook"
TRAINJOB_LABEL = "trainer.kubeflow.org/trainjob-name"
PLAN_VERSION_LABEL = "trainjob-scheduling.dev/plan-version"  # absent: version 1


@dataclass(frozen=True)
class Kind:
    """One kind of object a backend makes (always namespaced, beside the TrainJob)."""

    group: str
    # Not part of a kind's identity: the native backend's kinds are served in one of several
    # versions (discovery picks one), and the cache keeps one store per kind whichever it is.
    version: str = field(compare=False)
    plural: str
    kind: str
    optional: bool = False
    """The backend works without it, for the plans that do not need it (it is discovered, and
    watched, on its own)."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version(self) -> str:
        return self.api_version

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}/{self.version}"


@dataclass(frozen=True)
class Rule:
    """An RBAC rule (ClusterRole) a backend needs for its kinds."""

    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]


# What the reconciler does with the objects of every backend: list/watch into the cache, create,
# patch in place (drift), delete (lifecycle, recreate). It never reads one object by name.
OBJECT_VERBS = ("list", "watch", "create", "patch", "delete")

DriftKind = Literal["none", "patch", "recreate"]


@dataclass(frozen=True)
class Drift:
    """How a stored object differs from the desired one."""

    kind: DriftKind = "none"
    patch: tuple[dict[str, Any], ...] = ()
    """For `patch`: a JSON Patch that tests the object's uid first, then changes it in place."""
    reason: str = ""
    dropped: tuple[tuple[str, str], ...] = field(default=())
    """Fields the API server dropped because a feature gate is off, as (field, gate): reported,
    never treated as drift."""


GangStateName = Literal["scheduled", "waiting"]
WAITING_REASONS = ("NotEvaluated", "Unschedulable", "SchedulerError", "Other")


@dataclass(frozen=True)
class GangStatus:
    """A group object's status as gang signals (metrics, `explain`)."""

    policy: str  # gang or basic
    scheduled: bool
    reason: str  # Scheduled, or one of WAITING_REASONS
    scheduled_at: str | None = None  # when it was scheduled (RFC 3339), if the object says
    message: str = ""  # the scheduler's own words for a waiting verdict, if the object has them


@dataclass(frozen=True)
class Context:
    """What a backend may read of the TrainJob besides its plan (queues come from labels)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, trainjob: Mapping[str, Any]) -> Context:
        meta = trainjob.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        labels, annotations = meta.get("labels"), meta.get("annotations")
        return cls(
            {k: v for k, v in labels.items() if isinstance(v, str)}
            if isinstance(labels, dict)
            else {},
            {k: v for k, v in annotations.items() if isinstance(v, str)}
            if isinstance(annotations, dict)
            else {},
        )


Uids = Mapping[tuple[str, str], str]  # (kind, name) of an object already stored -> its uid


@dataclass(frozen=True)
class ClusterFacts:
    """What the cache knows of the cluster that admission may check a plan against."""

    priority_classes: frozenset[str] | None = None
    """The PriorityClasses that exist; None when the cache cannot tell (no cluster yet)."""


class GangBackend(Protocol):
    """Turns a TrainJob's plan into its scheduler's objects and ties its pods to them."""

    name: str
    kinds: tuple[Kind, ...]
    """The kinds it creates, parents first (created in this order, removed in the reverse);
    the first one's group/version is the backend's API."""

    @property
    def rbac(self) -> tuple[Rule, ...]:
        """The ClusterRole rules its objects need (list/watch for the cache, and the writes)."""
        ...

    def render(self, plan: Plan, context: Context, uids: Uids | None = None) -> list[JsonObject]:
        """Every object the plan needs, parents first. `uids` holds the uids of objects already
        stored, so that children can point at their parents."""
        ...

    def drift(self, desired: JsonObject, stored: JsonObject) -> Drift:
        """How `stored` differs from `desired` (same kind and name)."""
        ...

    def pod_patch(self, pod: JsonObject, plan: Plan, group: GroupPlan) -> list[JsonObject]:
        """The JSON Patch operations that tie a new pod to its group (idempotent: [] when the
        pod already is)."""
        ...

    def status(self, kind: Kind, obj: JsonObject) -> GangStatus | None:
        """The gang signals of one of its objects; None for kinds that carry none."""
        ...

    def depth(self, kind: Kind, obj: JsonObject) -> int:
        """How deep in its tree an object is (0 for a root): objects of one kind are created
        shallowest first and removed deepest first."""
        ...

    def admission_warnings(self, plan: Plan, context: Context) -> list[str]:
        """What a person should know at `kubectl apply` of the TrainJob (what a level or the
        topology becomes with this scheduler)."""
        ...

    def admission_errors(
        self, plan: Plan, context: Context, facts: ClusterFacts
    ) -> list[FieldError]:
        """Why the scheduler would never schedule this TrainJob's gang (a denial at `kubectl
        apply`, worded as field errors); [] when nothing is wrong."""
        ...


@runtime_checkable
class Defaulting(Protocol):
    """A backend whose own kinds get defaults from a mutating webhook (the native one)."""

    name: str
    defaulted: tuple[Kind, ...]

    def needs_default(self, kind: Kind, obj: Mapping[str, Any]) -> bool: ...

    def default(
        self, kind: Kind, obj: Mapping[str, Any], plan: Plan
    ) -> tuple[JsonObject, list[str]]: ...


@runtime_checkable
class TiesJobs(Protocol):
    """A backend whose pods name their group in a field a Job's pod template carries too (the
    native one: `spec.schedulingGroup`). Set on a TrainJob's Jobs when they are created, it
    tells the Job controller that a parent gangs them (its own per-Job gangs stand down)."""

    name: str

    def job_patch(self, job: JsonObject, plan: Plan, group: GroupPlan) -> list[JsonObject]: ...


# --- what backends share ---------------------------------------------------------------------


def composite_kind(backend: GangBackend) -> Kind | None:
    """The backend's kind for groups of groups (CompositePodGroup), if it has one."""
    return next((k for k in backend.kinds if k.kind == "CompositePodGroup"), None)


def api_versions(backend: GangBackend) -> str:
    """The group/version of the backend's required kinds as a person reads it where it is not
    served: every version it could use ("scheduling.k8s.io/v1beta1 or v1alpha2": while neither
    is served, the version it holds says nothing of which cluster this is)."""
    kind = backend.kinds[0]
    versions = getattr(backend, "versions", ())  # a backend of several (discovery's Versioned)
    return " or ".join([kind.group_version, *(v for v in versions if v != kind.version)])


def expresses(backend: GangBackend, plan: Plan) -> bool:
    """Whether the backend can make what the plan needs: a tree (levels combined) needs
    CompositePodGroups, which only some backends have."""
    return not plan.composites or composite_kind(backend) is not None


POLICY_ANNOTATION = "trainjob-scheduling.dev/policy"
"""On a PodGroup of a backend where `minMember: 1` could be a basic group or a gang of one."""


def spec_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """An object's spec ({} when it has none, or one that is not a map)."""
    spec = obj.get("spec")
    return spec if isinstance(spec, dict) else {}


def annotate(pod: Mapping[str, Any], wanted: Mapping[str, str]) -> list[JsonObject]:
    """The operations that set each of `wanted` on a pod's annotations; [] when they are set."""
    ops: list[JsonObject] = []
    for key, value in wanted.items():
        step = add_to_map(pod, ("metadata", "annotations"), key, value)
        if step and step[0]["path"] == "/metadata/annotations":
            return [{**step[0], "value": dict(wanted)}]  # no map yet: make it with all of them
        ops += step
    return ops


def owner_labels(plan: Plan) -> dict[str, str]:
    """Labels that mark this service's objects and let a watch select one TrainJob's; from
    plan version 2 on, the version that named them (core/snapshot.py), so that a reader can tell
    which release's rules made a running gang."""
    labels = {MANAGED_BY_LABEL: MANAGED_BY, TRAINJOB_LABEL: plan.trainjob_name}
    if plan.plan_version >= 2:
        labels[PLAN_VERSION_LABEL] = str(plan.plan_version)
    return labels


def is_managed(obj: Mapping[str, Any] | None) -> bool:
    """Whether this service made `obj` (its label says so): the only objects it changes."""
    meta = obj.get("metadata") if obj else None
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return isinstance(labels, dict) and labels.get(MANAGED_BY_LABEL) == MANAGED_BY


def trainjob_owner(plan: Plan) -> list[JsonObject]:
    """The controller ownerReference to the TrainJob (none for a plan of an unstored one)."""
    if not plan.trainjob_uid:
        return []
    return [
        {
            "apiVersion": TRAINER_API_VERSION,
            "kind": TRAINJOB_KIND,
            "name": plan.trainjob_name,
            "uid": plan.trainjob_uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def metadata(plan: Plan, name: str, owners: list[JsonObject] | None = None) -> JsonObject:
    """An object's metadata: its name, the TrainJob's namespace, our labels, its owners."""
    meta: JsonObject = {"labels": owner_labels(plan), "name": name, "namespace": plan.namespace}
    references = trainjob_owner(plan) + (owners or [])
    if references:
        meta["ownerReferences"] = references
    return meta


def with_uid_test(stored: Mapping[str, Any], ops: list[dict[str, Any]]) -> Drift:
    """A patch drift whose first operation fails on an object recreated meanwhile."""
    if not ops:
        return Drift()
    meta = stored.get("metadata")
    uid = meta.get("uid") if isinstance(meta, dict) else None
    return Drift("patch", ({"op": "test", "path": "/metadata/uid", "value": uid}, *ops))


def pointer(*parts: str) -> str:
    """A JSON Pointer (RFC 6901) with each part escaped (`/` in a label key becomes `~1`)."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def add_to_map(
    obj: Mapping[str, Any], parent: tuple[str, ...], key: str, value: str
) -> list[JsonObject]:
    """The operations that set `obj[parent...][key] = value` (a label or an annotation),
    creating the map when it is missing; [] when it already holds that value."""
    at: Any = obj
    for part in parent:
        at = at.get(part) if isinstance(at, dict) else None
    if isinstance(at, dict):
        if at.get(key) == value:
            return []
        op = "replace" if key in at else "add"
        return [{"op": op, "path": pointer(*parent, key), "value": value}]
    holder: Any = obj
    for part in parent[:-1]:
        holder = holder.get(part) if isinstance(holder, dict) else None
    if not isinstance(holder, dict):
        return []  # no metadata at all: not a pod the API server would take
    op = "replace" if parent[-1] in holder else "add"
    return [{"op": op, "path": pointer(*parent), "value": {key: value}}]


def priority_class_errors(plan: Plan, facts: ClusterFacts) -> list[FieldError]:
    """A group whose pods name a PriorityClass that does not exist: its group object (and its
    pods) would be refused, so the gang would never form."""
    known = facts.priority_classes
    if known is None:
        return []
    named = {g.priority_class_name for g in plan.groups if g.priority_class_name}
    missing = sorted(named - known)
    return [
        fe.not_found(
            Path("spec", "runtimeRef", "name"),
            name,
            f"the runtime's pods name PriorityClass {name!r}, which does not exist; create it "
            "or fix the runtime's priorityClassName",
        )
        for name in missing
    ]

"""What one pod needs of a node, and whether a node shape gives it (pure: no I/O).

The rules are kube-scheduler's filters for an empty node: NodeUnschedulable (a cordoned node,
unless the pod tolerates `node.kubernetes.io/unschedulable:NoSchedule`), TaintToleration
(NoSchedule and NoExecute taints), NodeAffinity (the pod's `nodeSelector` and its required
node affinity) and NodeResourcesFit (every requested resource, and the `pods` allocatable).
Whatever else the scheduler checks (pod affinity, spreading, ports, volumes, current usage)
only keeps more pods off a node, so leaving it out never makes a gang look unplaceable.

What a TrainJob's runtime patches (`spec.runtimePatches`) change is taken soundly whichever way
Trainer merges them: their tolerations are added to the template's; their nodeSelector and node
affinity, where given, are used instead of the template's (they hold under both a merge and a
replace). A patch that touches containers or resources makes the pod unjudged.

Sizes a tenant writes are bounded before any work: past them the pod is not judged at all.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from .nodes import UNSCHEDULABLE_TAINT, NodeShape, Taint

MAX_TOLERATIONS = 64
MAX_SELECTOR = 64  # nodeSelector entries
MAX_TERMS = 16  # nodeSelectorTerms
MAX_REQUIREMENTS = 64  # matchExpressions and matchFields of all terms together
MAX_VALUES = 256  # values of one requirement

Exclusion = Literal["cordoned", "tainted", "unselected"]
_CORDON = Taint(UNSCHEDULABLE_TAINT, "", "NoSchedule")


class Unjudged(ValueError):
    """The pod's scheduling fields are beyond what is read, or unreadable: no judgement."""


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str  # Exists, or Equal ("" reads as Equal)
    value: str
    effect: str  # "" tolerates every effect

    def tolerates(self, taint: Taint) -> bool:
        """k8s.io/api/core/v1 Toleration.ToleratesTaint."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.operator in ("", "Equal") and self.value == taint.value


@dataclass(frozen=True)
class Requirement:
    """One matchExpression; `field` for a matchFields entry (only metadata.name exists)."""

    key: str
    operator: str
    values: frozenset[str]
    field: bool = False

    def met(self, labels: Mapping[str, str], dropped: frozenset[str] | None) -> bool:
        if self.field or dropped is None or self.key in dropped:
            return True  # what the shape does not keep is taken as met
        value = labels.get(self.key)
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if op in ("Gt", "Lt"):
            bound = _integer(next(iter(self.values))) if len(self.values) == 1 else None
            number = _integer(value)
            if bound is None or number is None:
                return False
            return number > bound if op == "Gt" else number < bound
        return True  # an operator the API server would refuse: not ours to judge


def _integer(text: str | None) -> int | None:
    if text is None or not text.lstrip("-").isdigit() or len(text) > 20:
        return None
    return int(text)


Term = tuple[Requirement, ...]


@dataclass(frozen=True)
class PodNeeds:
    """What one pod of a ReplicatedJob needs of a node."""

    requests: tuple[tuple[str, Decimal], ...]
    node_selector: tuple[tuple[str, str], ...] = ()
    affinity: tuple[Term, ...] | None = None  # ORed terms of ANDed requirements; None: any
    tolerations: tuple[Toleration, ...] = ()

    @functools.cached_property
    def _hash(self) -> int:
        return hash((self.requests, self.node_selector, self.affinity, self.tolerations))

    def __hash__(self) -> int:  # computed once: a memo key per node shape
        return self._hash

    def excluded(self, shape: NodeShape, dropped: frozenset[str] | None) -> Exclusion | None:
        """Why the scheduler keeps this pod off a node of `shape`; None when it does not."""
        if shape.unschedulable and not self._tolerates(_CORDON):
            return "cordoned"
        if any(not self._tolerates(t) for t in shape.taints if t.key != UNSCHEDULABLE_TAINT):
            return "tainted"
        labels = shape.label_map
        for key, value in self.node_selector:
            if dropped is not None and key not in dropped and labels.get(key) != value:
                return "unselected"
        if self.affinity is not None and not any(
            term and all(r.met(labels, dropped) for r in term) for term in self.affinity
        ):
            return "unselected"  # an empty term matches no node (the API's rule)
        return None

    def per_node(self, shape: NodeShape) -> int:
        """Whole pods a node of `shape` holds (by resources and its `pods` allocatable)."""
        most = int(shape.has("pods"))
        for resource, amount in self.requests:
            if resource == "pods":
                continue
            most = min(most, int(shape.has(resource) // amount))
            if most == 0:
                break
        return most

    def _tolerates(self, taint: Taint) -> bool:
        return any(t.tolerates(taint) for t in self.tolerations)


# --- reading them from a pod spec (and a TrainJob's patches of it) -----------------------------


def needs_of(
    requests: Mapping[str, Decimal], spec: Mapping[str, Any], patches: Iterable[Mapping[str, Any]]
) -> PodNeeds:
    """A pod's needs from its template's spec and the patches a TrainJob applies to it, in
    order; raises Unjudged past the bounds or for tolerations it cannot read."""
    tolerations = _tolerations(spec.get("tolerations"))
    selector = _selector(spec.get("nodeSelector"))
    affinity = _affinity(spec.get("affinity"))
    for patch in patches:
        if any(k in patch for k in ("containers", "initContainers", "overhead", "resources")):
            raise Unjudged("a runtime patch changes its containers")
        tolerations += _tolerations(patch.get("tolerations"))
        if len(tolerations) > MAX_TOLERATIONS:
            raise Unjudged(f"more than {MAX_TOLERATIONS} tolerations")
        if patch.get("nodeSelector") is not None:
            selector = _selector(patch.get("nodeSelector"))
        if isinstance(patch.get("affinity"), dict) and "nodeAffinity" in patch["affinity"]:
            affinity = _affinity(patch.get("affinity"))
    return PodNeeds(
        tuple(sorted((k, v) for k, v in requests.items() if v > 0)),
        selector,
        affinity,
        tuple(dict.fromkeys(tolerations)),
    )


def _tolerations(found: Any) -> tuple[Toleration, ...]:
    if found is None:
        return ()
    if not isinstance(found, list):
        raise Unjudged("its tolerations are not a list")
    if len(found) > MAX_TOLERATIONS:
        raise Unjudged(f"more than {MAX_TOLERATIONS} tolerations")
    out = []
    for t in found:
        if not isinstance(t, dict):
            raise Unjudged("a toleration is not an object")
        fields = [t.get(k, "") for k in ("key", "operator", "value", "effect")]
        texts = [f for f in fields if isinstance(f, str) or f is None]
        if len(texts) != len(fields):
            raise Unjudged("a toleration field is not a string")
        key, operator, value, effect = (f or "" for f in texts)
        out.append(Toleration(key, operator, value, effect))
    return tuple(out)


def _selector(found: Any) -> tuple[tuple[str, str], ...]:
    """A nodeSelector; anything unreadable in it is left out (fewer constraints)."""
    if not isinstance(found, dict):
        return ()
    if len(found) > MAX_SELECTOR:
        raise Unjudged(f"more than {MAX_SELECTOR} nodeSelector entries")
    pairs = ((k, v) for k, v in found.items() if isinstance(k, str) and isinstance(v, str))
    return tuple(sorted(pairs))


def _affinity(found: Any) -> tuple[Term, ...] | None:
    """The required node affinity's terms; None when there is none or it cannot be read (no
    constraint is then assumed)."""
    node = found.get("nodeAffinity") if isinstance(found, dict) else None
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") if node else None
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    if not isinstance(terms, list) or not terms:
        return None
    if len(terms) > MAX_TERMS:
        raise Unjudged(f"more than {MAX_TERMS} nodeSelectorTerms")
    out: list[Term] = []
    total = 0
    for term in terms:
        if not isinstance(term, dict):
            return None
        reqs: list[Requirement] = []
        for key, is_field in (("matchExpressions", False), ("matchFields", True)):
            listed = term.get(key)
            for expr in listed if isinstance(listed, list) else ():
                total += 1
                if total > MAX_REQUIREMENTS:
                    raise Unjudged(f"more than {MAX_REQUIREMENTS} node affinity requirements")
                req = _requirement(expr, is_field)
                if req is None:
                    return None
                reqs.append(req)
        out.append(tuple(reqs))
    return tuple(out)


def _requirement(expr: Any, is_field: bool) -> Requirement | None:
    if not isinstance(expr, dict):
        return None
    key, operator, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
    if not isinstance(key, str) or not isinstance(operator, str) or not isinstance(values, list):
        return None
    if len(values) > MAX_VALUES:
        raise Unjudged(f"more than {MAX_VALUES} values in a node affinity requirement")
    return Requirement(key, operator, frozenset(v for v in values if isinstance(v, str)), is_field)

"""The cluster's nodes as feasibility needs them, kept small (pure: no I/O).

A Node object is large (images, conditions, addresses, ...); whether a gang could ever fit
needs only a node's labels, allocatable resources, taints and whether it is cordoned. Nodes
alike in those (a node pool, a rack of one instance type) share one `NodeShape`, and the
summary counts nodes per shape: a review reads the shapes (hundreds), never every node, and
the memory per node is its name and a reference.

Left out of a shape, so that identical nodes stay identical:
* `kubernetes.io/hostname` and any label whose value is the node's own name (unique to each
  node); requirements on such keys are judged as met (`dropped_keys`), which can only make a
  gang look more placeable, never less;
* the taints the node lifecycle controller sets while a condition lasts (not-ready,
  unreachable, memory/disk/PID pressure, network-unavailable, uninitialized): like current
  usage, they pass, and "could ever fit" ignores them;
* PreferNoSchedule taints, which never keep a pod off a node.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from . import resources

HOSTNAME = "kubernetes.io/hostname"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
TRANSIENT_TAINTS = frozenset(
    {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/pid-pressure",
        "node.kubernetes.io/network-unavailable",
        "node.cloudprovider.kubernetes.io/uninitialized",
    }
)
KEPT_EFFECTS = ("NoSchedule", "NoExecute")
MAX_DROPPED_KEYS = 256  # distinct per-node label keys remembered (beyond: see `dropped_all`)

EventType = Literal["ADDED", "MODIFIED", "DELETED"]


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class NodeShape:
    """What a node offers a pod: every node with the same shape offers the same."""

    labels: tuple[tuple[str, str], ...]
    allocatable: tuple[tuple[str, Decimal], ...]
    taints: tuple[Taint, ...]
    unschedulable: bool

    @functools.cached_property
    def label_map(self) -> Mapping[str, str]:
        return dict(self.labels)

    @functools.cached_property
    def resource_map(self) -> Mapping[str, Decimal]:
        return dict(self.allocatable)

    def label(self, key: str) -> str | None:
        return self.label_map.get(key)

    @functools.cached_property
    def _hash(self) -> int:
        return hash((self.labels, self.allocatable, self.taints, self.unschedulable))

    def __hash__(self) -> int:  # computed once: shapes are dict keys on every review
        return self._hash

    def has(self, resource: str) -> Decimal:
        """Allocatable `resource` (0 when the node has none)."""
        return self.resource_map.get(resource, Decimal(0))


def _text(value: Any) -> str | None:
    return sys.intern(value) if isinstance(value, str) else None


class ShapeReader:
    """Reads node objects into shapes, parsing each distinct quantity once."""

    def __init__(self) -> None:
        self._quantities: dict[str, Decimal | None] = {}
        self.dropped_keys: set[str] = {HOSTNAME}
        self.dropped_all = False
        """More distinct per-node label keys than remembered: every key counts as dropped."""

    def _quantity(self, value: Any) -> Decimal | None:
        if not isinstance(value, str | int):
            return None
        text = str(value)
        if text not in self._quantities:
            if len(self._quantities) >= 4096:
                self._quantities.clear()
            self._quantities[text] = resources.parse(text)
        return self._quantities[text]

    def read(self, raw: Mapping[str, Any]) -> tuple[str, NodeShape] | None:
        """(name, shape) of a node object (a full one or a `trim`med one); None if nameless."""
        meta = raw.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            return None
        labels: list[tuple[str, str]] = []
        found = meta.get("labels")
        for key, value in found.items() if isinstance(found, dict) else ():
            if not isinstance(key, str) or not isinstance(value, str):
                continue
            if key == HOSTNAME or value == name:
                self._drop(key)
                continue
            labels.append((sys.intern(key), sys.intern(value)))
        spec = raw.get("spec")
        spec = spec if isinstance(spec, dict) else {}
        status = raw.get("status")
        status = status if isinstance(status, dict) else {}
        offered = status.get("allocatable")
        if not isinstance(offered, dict) or not offered:
            offered = status.get("capacity")  # not reported yet: capacity is an upper bound
        allocatable: list[tuple[str, Decimal]] = []
        for resource, value in offered.items() if isinstance(offered, dict) else ():
            number = self._quantity(value)
            if isinstance(resource, str) and number is not None and number > 0:
                allocatable.append((sys.intern(resource), number))
        return name, NodeShape(
            tuple(sorted(labels)),
            tuple(sorted(allocatable)),
            tuple(sorted(_taints(spec.get("taints")), key=lambda t: (t.key, t.value, t.effect))),
            spec.get("unschedulable") is True,
        )

    def _drop(self, key: str) -> None:
        if key in self.dropped_keys:
            return
        if len(self.dropped_keys) >= MAX_DROPPED_KEYS:
            self.dropped_all = True
            return
        self.dropped_keys.add(sys.intern(key))


def _taints(found: Any) -> Iterator[Taint]:
    for taint in found if isinstance(found, list) else ():
        if not isinstance(taint, dict):
            continue
        key, effect = _text(taint.get("key")), _text(taint.get("effect"))
        if key is None or effect not in KEPT_EFFECTS or key in TRANSIENT_TAINTS:
            continue
        yield Taint(key, _text(taint.get("value")) or "", effect or "")


def trim(raw: dict[str, Any]) -> dict[str, Any]:
    """The parts of a node object a shape is read from (what a paged list keeps meanwhile)."""
    meta = raw.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    spec = raw.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    status = raw.get("status")
    status = status if isinstance(status, dict) else {}
    kept_meta = {k: meta[k] for k in ("name", "labels", "resourceVersion") if k in meta}
    kept_spec = {k: spec[k] for k in ("taints", "unschedulable") if k in spec}
    kept_status = {k: status[k] for k in ("allocatable", "capacity") if k in status}
    return {"metadata": kept_meta, "spec": kept_spec, "status": kept_status}


class NodeSummary:
    """Every node's shape and the node count per shape, kept up to date by the Node watch (it
    is the informer's store: `replace` for a list, `apply` for an event). `version` changes
    exactly when some node's shape does, so judgements can be reused until it does."""

    resource = "nodes"

    def __init__(self) -> None:
        self.synced = False
        self.watched: tuple[str, ...] | None = None
        self.version = 0
        self.reader = ShapeReader()
        self._node_shapes: dict[str, NodeShape] = {}
        self._counts: dict[NodeShape, int] = {}
        self._canonical: dict[NodeShape, NodeShape] = {}
        self._listeners: list[Callable[[NodeShape, int], None]] = []

    def subscribe(self, listener: Callable[[NodeShape, int], None]) -> None:
        """Told of every change in a shape's node count: (shape, +1 or -1)."""
        self._listeners.append(listener)

    def __len__(self) -> int:
        return len(self._node_shapes)

    @property
    def shapes(self) -> Mapping[NodeShape, int]:
        """Distinct node shapes and how many nodes have each."""
        return self._counts

    @property
    def dropped_keys(self) -> frozenset[str] | None:
        """Label keys left out of shapes (None: too many to remember; treat every key so)."""
        reader = self.reader
        return None if reader.dropped_all else frozenset(reader.dropped_keys)

    def trim(self, raw: dict[str, Any]) -> dict[str, Any]:
        return trim(raw)

    def replace(self, items: Iterable[dict[str, Any]], namespace: str | None = None) -> None:
        """A fresh list: the summary becomes exactly these nodes."""
        fresh: dict[str, NodeShape] = {}
        for raw in items:
            read = self.reader.read(raw)
            if read is not None:
                fresh[read[0]] = read[1]
        for name in [n for n in self._node_shapes if n not in fresh]:
            self._set(name, None)
        for name, shape in fresh.items():
            self._set(name, shape)
        self.synced = True

    def apply(self, event: EventType, raw: dict[str, Any]) -> None:
        read = self.reader.read(raw)
        if read is None:
            return
        self._set(read[0], None if event == "DELETED" else read[1])

    def forget(self) -> None:
        self.replace([])
        self.synced = False

    def _set(self, name: str, shape: NodeShape | None) -> None:
        old = self._node_shapes.get(name)
        if old == shape:
            return
        if old is not None:
            left = self._counts[old] - 1
            if left:
                self._counts[old] = left
            else:
                del self._counts[old]
                del self._canonical[old]
        if shape is None:
            del self._node_shapes[name]
        else:
            shape = self._canonical.setdefault(shape, shape)
            self._counts[shape] = self._counts.get(shape, 0) + 1
            self._node_shapes[name] = shape
        self.version += 1
        for listener in self._listeners:
            if old is not None:
                listener(old, -1)
            if shape is not None:
                listener(shape, 1)


def summary_of(nodes: Iterable[dict[str, Any]]) -> NodeSummary:
    """A summary of a fixed set of node objects (`plan --nodes`, `explain`)."""
    summary = NodeSummary()
    summary.replace(nodes)
    return summary

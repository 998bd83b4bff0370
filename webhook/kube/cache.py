"""The in-process cache of TrainJobs and runtimes, fed by watches (see `informer.py`).

The admission handlers read only from here, never from the API server, so a review costs dict
lookups. Derived values (a parsed and checked runtime, a TrainJob's plan) are memoised on the
cache entry they came from: an update replaces the entry, and with it the memo.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..core.fields import parse
from ..core.plan import Plan, PlanningError, build_plan
from ..core.snapshot import from_text, snapshot_of
from ..core.trainer import CLUSTER_RUNTIME_KIND, NAMESPACED_RUNTIME_KIND, Runtime, TrainJob
from ..core.validation import CheckedRuntime, check_stored_runtime

Key = tuple[str, str]  # (namespace or "", name)
EventType = Literal["ADDED", "MODIFIED", "DELETED"]
# Told of every change after the store has it: (event, the object before or None, after or None).
Listener = Callable[[EventType, dict[str, Any] | None, dict[str, Any] | None], None]


class Entry:
    """One cached object plus whatever was derived from it."""

    __slots__ = ("memo", "memo_key", "raw")

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw
        self.memo: Any = None
        self.memo_key: Any = None


def key_of(raw: Mapping[str, Any]) -> Key | None:
    meta = raw.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        return None
    ns = meta.get("namespace")
    return (ns if isinstance(ns, str) else "", meta["name"])


class Store:
    """The objects of one resource, as the last list and the watch events since have them."""

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self.synced = False
        self._entries: dict[Key, Entry] = {}
        self._listeners: list[Listener] = []
        self.watched: tuple[str, ...] | None = None  # namespaces listed one by one, if so
        self._listed: set[str | None] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, namespace: str, name: str) -> Entry | None:
        return self._entries.get((namespace, name))

    def items(self) -> Iterable[tuple[Key, Entry]]:
        """A snapshot of the entries (safe to iterate while the store changes)."""
        return list(self._entries.items())

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def replace(self, items: Iterable[dict[str, Any]], namespace: str | None = None) -> None:
        """A fresh list: the store becomes exactly these objects (keeping unchanged entries);
        with `namespace`, only that namespace's part of the store (one informer per watched
        namespace). Listeners hear of what the list changed, as if by watch events."""
        fresh: dict[Key, Entry] = (
            {k: e for k, e in self._entries.items() if k[0] != namespace} if namespace else {}
        )
        changes: list[tuple[EventType, dict[str, Any] | None, dict[str, Any] | None]] = []
        for raw in items:
            key = key_of(raw)
            if key is None:
                continue
            old = self._entries.get(key)
            if old is not None and _same(old.raw, raw):
                fresh[key] = old
                continue
            fresh[key] = Entry(raw)
            changes.append(("ADDED" if old is None else "MODIFIED", old.raw if old else None, raw))
        changes += [("DELETED", e.raw, None) for k, e in self._entries.items() if k not in fresh]
        self._entries = fresh
        self._listed.add(namespace)
        self.synced = self.watched is None or all(ns in self._listed for ns in self.watched)
        for change in changes:
            self._tell(*change)

    def forget(self) -> None:
        """Empty and not synced (its watch stopped); listeners hear of each removal."""
        self.replace([])
        self.synced = False
        self._listed.clear()

    def apply(self, event: EventType, raw: dict[str, Any]) -> None:
        key = key_of(raw)
        if key is None:
            return
        if event == "DELETED":
            gone = self._entries.pop(key, None)
            self._tell(event, gone.raw if gone else raw, None)
        else:
            old = self._entries.get(key)
            self._entries[key] = Entry(raw)
            self._tell(event, old.raw if old else None, raw)

    def _tell(
        self, event: EventType, old: dict[str, Any] | None, new: dict[str, Any] | None
    ) -> None:
        for listener in self._listeners:
            listener(event, old, new)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal objects; one nested past Python's recursion limit (the API server stores up to
    its own limit) counts as changed rather than failing the list."""
    try:
        return a == b
    except RecursionError:
        return False


@dataclass(frozen=True)
class PlanLookup:
    """A TrainJob's plan as the cache sees it; `state` says why there is none."""

    state: Literal["ok", "no-trainjob", "no-runtime", "no-scheduling", "invalid"]
    plan: Plan | None = None
    detail: str = ""


# Whether scheduling.k8s.io/v1beta1 serves workloads and podgroups (discovery says).
GangApi = Literal["unknown", "served", "not-served"]


class Cache:
    """TrainJobs, TrainingRuntimes and ClusterTrainingRuntimes (the webhooks and the reconciler
    read them), and the Workloads and PodGroups the reconciler writes.

    `connected` is False when the service runs without a cluster: the stores stay empty and
    count as synced, so the webhooks still answer (and say they know nothing).
    """

    def __init__(self, connected: bool) -> None:
        self.connected = connected
        self.trainjobs = Store("trainjobs")
        self.training_runtimes = Store("trainingruntimes")
        self.cluster_runtimes = Store("clustertrainingruntimes")
        self.workloads = Store("workloads")
        self.pod_groups = Store("podgroups")
        self.gang_api: GangApi = "unknown"
        self._snapshots: dict[str, CheckedRuntime] = {}
        if not connected:
            for store in (*self.stores, *self.scheduling_stores):
                store.synced = True

    @property
    def stores(self) -> tuple[Store, ...]:
        """The stores the webhooks need synced before they are ready."""
        return (self.trainjobs, self.training_runtimes, self.cluster_runtimes)

    @property
    def scheduling_stores(self) -> tuple[Store, ...]:
        """The reconciler's own objects; watched only while the API serves them."""
        return (self.workloads, self.pod_groups)

    @property
    def synced(self) -> bool:
        return all(store.synced for store in self.stores)

    def knows_runtimes(self, kind: str) -> bool:
        """Whether a runtime of this kind missing from the cache is missing from the cluster."""
        if not self.connected:
            return False
        return (self._runtime_store(kind) or self.cluster_runtimes).synced

    def runtime(self, kind: str | None, namespace: str, name: str) -> CheckedRuntime | None:
        """A runtime, checked once per version; `kind` as in a TrainJob's runtimeRef."""
        entry = self._runtime_entry(kind, namespace, name)
        return None if entry is None else _checked_runtime(entry)

    def plan_for(self, namespace: str, name: str) -> PlanLookup:
        """The plan of TrainJob namespace/name: under the runtime snapshot the reconciler froze
        into it (`core/snapshot.py`), else under its runtime's current version."""
        entry = self.trainjobs.get(namespace, name)
        if entry is None:
            detail = f'no TrainJob "{namespace}/{name}" in the cache'
            return PlanLookup("no-trainjob", detail=detail)
        frozen = snapshot_of(entry.raw)
        runtime_entry = None
        if frozen is None:
            kind, runtime_name = _runtime_ref(entry.raw)
            runtime_entry = self._runtime_entry(kind, namespace, runtime_name)
            if runtime_entry is None:
                return PlanLookup("no-runtime", detail=f'no {kind} "{runtime_name}" in the cache')
        runtime_memo = frozen if frozen is not None else runtime_entry
        if entry.memo_key is runtime_memo:  # planned before against this very runtime version
            memo: PlanLookup = entry.memo
            return memo
        if runtime_entry is not None:
            checked: CheckedRuntime | None = _checked_runtime(runtime_entry)
        else:
            assert frozen is not None
            checked = self.snapshot_runtime(frozen)
        if checked is None:
            return PlanLookup("invalid", detail="the runtime snapshot does not parse")
        trainjob, _ = parse(TrainJob, entry.raw)
        if trainjob is None:
            lookup = PlanLookup("invalid", detail=f'TrainJob "{namespace}/{name}" does not parse')
        else:
            try:
                plan = build_plan(trainjob, checked)
                lookup = (
                    PlanLookup("ok", plan)
                    if plan
                    else PlanLookup("no-scheduling", detail="the runtime has no spec.scheduling")
                )
            except PlanningError as err:
                lookup = PlanLookup("invalid", detail=str(err.errors[0]))
        entry.memo, entry.memo_key = lookup, runtime_memo
        return lookup

    def snapshot_runtime(self, text: str) -> CheckedRuntime | None:
        """A frozen runtime, checked once per distinct snapshot (TrainJobs of one runtime
        version share the text)."""
        checked = self._snapshots.get(text)
        if checked is None:
            runtime = from_text(text)
            if runtime is None:
                return None
            checked = check_stored_runtime(runtime)
            if len(self._snapshots) >= 1024:
                self._snapshots.pop(next(iter(self._snapshots)))
            self._snapshots[text] = checked
        return checked

    def _runtime_store(self, kind: str | None) -> Store | None:
        if kind in (None, "", CLUSTER_RUNTIME_KIND):
            return self.cluster_runtimes
        return self.training_runtimes if kind == NAMESPACED_RUNTIME_KIND else None

    def _runtime_entry(self, kind: str | None, namespace: str, name: str) -> Entry | None:
        store = self._runtime_store(kind)
        if store is None:
            return None
        return store.get(namespace if store is self.training_runtimes else "", name)


def _checked_runtime(entry: Entry) -> CheckedRuntime:
    if entry.memo is None:
        entry.memo = check_stored_runtime(parse(Runtime, entry.raw)[0] or Runtime())
    checked: CheckedRuntime = entry.memo
    return checked


def _runtime_ref(raw: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, defaulted as the CRD does; name) read from the raw TrainJob: the pod path must not
    parse a TrainJob it has planned before."""
    spec = raw.get("spec")
    ref = spec.get("runtimeRef") if isinstance(spec, dict) else None
    if not isinstance(ref, dict):
        return CLUSTER_RUNTIME_KIND, ""
    kind, name = ref.get("kind"), ref.get("name")
    return (kind if isinstance(kind, str) and kind else CLUSTER_RUNTIME_KIND), (
        name if isinstance(name, str) else ""
    )

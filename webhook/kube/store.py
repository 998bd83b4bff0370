"""A store of one resource's objects as the last list and the watch events since have them,
telling its listeners of every change (`informer.py` fills it)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, Protocol

Key = tuple[str, str]  # (namespace or "", name)
# Written by `kubectl apply` (client-side): the whole object again, as JSON. No reader of the
# cache needs it, nor managedFields (server-side apply's bookkeeping, often larger than the spec).
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
EventType = Literal["ADDED", "MODIFIED", "DELETED"]
# Told of every change after the store has it: (event, the object before or None, after or None).
Listener = Callable[[EventType, dict[str, Any] | None, dict[str, Any] | None], None]


class Sink(Protocol):
    """What an informer fills: a `Store`, or a summary that keeps less (the Nodes')."""

    resource: str

    def __len__(self) -> int: ...

    def trim(self, raw: dict[str, Any]) -> dict[str, Any]:
        """What of a listed object to keep until the whole list is in."""
        ...

    def replace(self, items: Iterable[dict[str, Any]], namespace: str | None = None) -> None: ...

    def apply(self, event: EventType, raw: dict[str, Any]) -> None: ...


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

    def trim(self, raw: dict[str, Any]) -> dict[str, Any]:
        return without_bookkeeping(raw)  # every other field may matter to a store's readers

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
        for item in items:
            raw = self.trim(item)  # (the informer's items are trimmed already: a no-op then)
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
        raw = self.trim(raw)
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


def without_bookkeeping(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` without `metadata.managedFields` and the last-applied annotation: a shallow copy
    when it has either (the caller's object is never changed), else `raw` itself. Nothing the
    service reads of a cached object is in them: the status writer applies its condition
    server-side with `force`, so it never reads who manages what."""
    meta = raw.get("metadata")
    if not isinstance(meta, dict):
        return raw
    annotations = meta.get("annotations")
    applied = isinstance(annotations, dict) and LAST_APPLIED in annotations
    if not applied and "managedFields" not in meta:
        return raw
    meta = {k: v for k, v in meta.items() if k != "managedFields"}
    if applied:
        assert isinstance(annotations, dict)
        meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    return {**raw, "metadata": meta}


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal objects; one nested past Python's recursion limit (the API server stores up to
    its own limit) counts as changed rather than failing the list."""
    try:
        return a == b
    except RecursionError:
        return False

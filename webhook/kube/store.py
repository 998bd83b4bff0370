"""A store of one resource's objects as the last list and the watch events since have them,
telling its listeners of every change (`informer.py` fills it)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, Protocol, runtime_checkable

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


@runtime_checkable
class Relisting(Protocol):
    """A sink that takes a list page by page (`Store`): a relist never holds a second copy of
    what it lists beside the store, only the page at hand."""

    def relist(self, namespace: str | None = None) -> Listing: ...


class Listing:
    """One list of a store's objects (or of one namespace's), applied as its pages come: each
    object is in the store, and its listeners told (ADDED, MODIFIED), as soon as its page is;
    `done` removes what the list did not have (DELETED) and counts the store (or namespace) as
    listed. A list given up part way (an error: the informer lists again) leaves the objects of
    its pages, each as fresh as the watch would have made it, and removes nothing."""

    def __init__(self, store: Store, namespace: str | None, mark: int) -> None:
        self.store = store
        self.namespace = namespace
        self.mark = mark
        self.count = 0

    def add(self, items: Iterable[dict[str, Any]]) -> None:
        for item in items:
            self.count += self.store._listed_one(item, self.mark)

    def done(self) -> None:
        self.store._end_list(self.namespace, self.mark)


class Entry:
    """One cached object plus whatever was derived from it."""

    __slots__ = ("listed", "memo", "memo_key", "raw")

    def __init__(self, raw: dict[str, Any], listed: int = 0) -> None:
        self.raw = raw
        self.memo: Any = None
        self.memo_key: Any = None
        self.listed = listed  # the last list that had it (`Listing.mark`; 0: a watch event)


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
        self._lists = 0  # lists begun (each marks the entries it has)

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
        listing = self.relist(namespace)
        listing.add(items)
        listing.done()

    def relist(self, namespace: str | None = None) -> Listing:
        """A list to apply page by page (see `Listing`); `replace` in steps."""
        self._lists += 1
        return Listing(self, namespace, self._lists)

    def _listed_one(self, item: dict[str, Any], mark: int) -> int:
        """One listed object into the store (1), or nothing (0: it has no name)."""
        raw = self.trim(item)
        key = key_of(raw)
        if key is None:
            return 0
        old = self._entries.get(key)
        if old is not None and _same(old.raw, raw):
            old.listed = mark  # unchanged: its entry, and what is memoised on it, stay
            return 1
        self._entries[key] = Entry(raw, mark)
        self._tell("ADDED" if old is None else "MODIFIED", old.raw if old else None, raw)
        return 1

    def _end_list(self, namespace: str | None, mark: int) -> None:
        gone = [
            key
            for key, entry in self._entries.items()
            if entry.listed != mark and (namespace is None or key[0] == namespace)
        ]
        removed = [self._entries.pop(key) for key in gone]
        self._listed.add(namespace)
        self.synced = self.watched is None or all(ns in self._listed for ns in self.watched)
        for entry in removed:
            self._tell("DELETED", entry.raw, None)

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

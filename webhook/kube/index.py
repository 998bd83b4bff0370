"""A gang backend's objects by the TrainJob that controls them, kept current from a store.

The reconciler asks "which of these does TrainJob <uid> control?" on every pass, and the pod
webhook whether another controller made any of them; scanning the store would make each cost
O(objects in the cluster).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..core.ownership import controller_uid
from .store import EventType, Key, Store, key_of


class OwnerIndex:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._by_owner: defaultdict[str, set[Key]] = defaultdict(set)
        for _, entry in store.items():
            self._add(entry.raw)
        store.subscribe(self._changed)

    def owned_by(self, uid: str | None) -> list[dict[str, Any]]:
        """The stored objects whose controller is the TrainJob with this uid."""
        if uid is None:
            return []
        found = []
        for namespace, name in self._by_owner.get(uid, ()):
            entry = self.store.get(namespace, name)
            if entry is not None:
                found.append(entry.raw)
        return found

    def _changed(
        self, event: EventType, old: dict[str, Any] | None, new: dict[str, Any] | None
    ) -> None:
        if old is not None:
            self._remove(old)
        if new is not None:
            self._add(new)

    def _add(self, raw: dict[str, Any]) -> None:
        uid, key = controller_uid(raw), key_of(raw)
        if uid is not None and key is not None:
            self._by_owner[uid].add(key)

    def _remove(self, raw: dict[str, Any]) -> None:
        uid, key = controller_uid(raw), key_of(raw)
        if uid is None or key is None:
            return
        keys = self._by_owner.get(uid)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_owner[uid]

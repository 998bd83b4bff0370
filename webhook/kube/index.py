"""A gang backend's objects by the TrainJob that controls them, kept current from a store.

The reconciler asks "which of these does TrainJob <uid> control?" on every pass, and the pod
webhook whether another controller made any of them; scanning the store would make each cost
O(objects in the cluster). The second question is asked for every pod, and the answer is nearly
always "none": the objects this service did not make are kept apart, so it is one lookup.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..backends.base import is_managed
from ..core.ownership import controller_uid
from .store import EventType, Key, Store, key_of


class OwnerIndex:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._by_owner: defaultdict[str, set[Key]] = defaultdict(set)
        self._foreign_by_owner: defaultdict[str, set[Key]] = defaultdict(set)  # not made by us
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

    def foreign_of(self, uid: str | None) -> dict[str, Any] | None:
        """A stored object whose controller is the TrainJob with this uid but which this
        service did not make (`is_managed`), if there is one."""
        if uid is None:
            return None
        for namespace, name in self._foreign_by_owner.get(uid, ()):
            entry = self.store.get(namespace, name)
            if entry is not None and not is_managed(entry.raw):  # as a scan would judge it
                return entry.raw
        return None

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
            if not is_managed(raw):
                self._foreign_by_owner[uid].add(key)

    def _remove(self, raw: dict[str, Any]) -> None:
        uid, key = controller_uid(raw), key_of(raw)
        if uid is None or key is None:
            return
        for by_owner in (self._by_owner, self._foreign_by_owner):
            keys = by_owner.get(uid)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del by_owner[uid]

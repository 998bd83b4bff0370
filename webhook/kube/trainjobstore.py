"""The store of TrainJobs: each kept as `core/kept.py` says (the fields its readers read; a
finished one as a tombstone), minus the bookkeeping every store drops.

Tombstones are many (a cluster keeps far more finished TrainJobs than it runs) and alike: the
TrainJobs of one runtime and size have the same spec, annotations (the snapshot) and status
(`Complete`, and `Finished` said). Those parts are kept once and shared by every tombstone that
has them alike, so a tombstone costs little more than its name, uid and resourceVersion. A
shared part is never changed in place (no reader of the cache changes what it reads); a later
event for the TrainJob brings new parts.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..core.kept import finished, kept_trainjob
from .store import Store, without_bookkeeping

SHARED_PARTS = 4096  # distinct parts remembered; past it the oldest is forgotten (not unshared)


class TrainJobStore(Store):
    def __init__(self, resource: str) -> None:
        super().__init__(resource)
        self._parts: dict[bytes, dict[str, Any]] = {}

    def trim(self, raw: dict[str, Any]) -> dict[str, Any]:
        # Trimmed per event: a later event that un-finished a TrainJob would make it whole again.
        whole = without_bookkeeping(raw)
        kept = kept_trainjob(whole)
        if kept is whole or not finished(kept):  # (one the parser refuses is kept as it is)
            return kept
        for part in ("spec", "status"):
            if isinstance(kept.get(part), dict):
                kept[part] = self._shared(kept[part])
        meta = kept["metadata"]
        if isinstance(meta.get("annotations"), dict):
            meta["annotations"] = self._shared(meta["annotations"])
        return kept

    def _shared(self, part: dict[str, Any]) -> dict[str, Any]:
        """The one copy of a part equal to `part` (`part` itself when it is the first)."""
        try:
            key = orjson.dumps(part, option=orjson.OPT_SORT_KEYS)
        except (TypeError, orjson.JSONEncodeError):  # nested past orjson's limit: kept apart
            return part
        found = self._parts.get(key)
        if found is not None:
            return found
        if len(self._parts) >= SHARED_PARTS:
            del self._parts[next(iter(self._parts))]
        self._parts[key] = part
        return part

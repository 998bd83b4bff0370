"""The store of TrainJobs: each kept as `core/kept.py` says (the fields its readers read; a
finished one as a tombstone), minus the bookkeeping every store drops."""

from __future__ import annotations

from typing import Any

from ..core.kept import kept_trainjob
from .store import Store, without_bookkeeping


class TrainJobStore(Store):
    def trim(self, raw: dict[str, Any]) -> dict[str, Any]:
        # Trimmed per event: a later event that un-finished a TrainJob would make it whole again.
        return kept_trainjob(without_bookkeeping(raw))

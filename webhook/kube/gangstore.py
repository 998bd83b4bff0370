"""The store of a gang backend's objects: whole only when they can matter to a TrainJob.

A cluster may hold thousands of Workloads and PodGroups that are neither this service's nor a
TrainJob's: Kueue's, KAI's podgrouper's, Volcano's, a Job's own (1.38's per-Job gangs). The
service needs to know only that such an object exists under a name (the reconciler leaves a
name taken by someone else alone and says so; the pod webhook will not tie a pod to it), so
of those it keeps a stub: name, namespace, uid, labels, owners, deletion. Objects this service
made (its label) or that a TrainJob controls (owner reference, or a Workload's
`spec.controllerRef`) are kept whole, minus their bookkeeping, as every store keeps them.
"""

from __future__ import annotations

from typing import Any

from ..backends.base import is_managed
from ..core.ownership import controlling_trainjob
from .store import Store, without_bookkeeping

# What a stub keeps of `metadata`: enough to tell whose the object is and whether it is going.
STUB_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "labels",
    "ownerReferences",
    "deletionTimestamp",
)


def stub_unless_relevant(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` (without bookkeeping) if this service made it or a TrainJob controls it; else a
    stub of it."""
    raw = without_bookkeeping(raw)
    if is_managed(raw) or controlling_trainjob(raw) is not None:
        return raw
    meta = raw.get("metadata")
    if not isinstance(meta, dict):
        return raw
    stub_meta = {k: meta[k] for k in STUB_METADATA if k in meta}
    stub: dict[str, Any] = {"metadata": stub_meta}
    for key in ("apiVersion", "kind"):
        if key in raw:
            stub[key] = raw[key]
    return stub


class GangStore(Store):
    def trim(self, raw: dict[str, Any]) -> dict[str, Any]:
        return stub_unless_relevant(raw)

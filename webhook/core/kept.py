"""What the watch cache keeps of a stored TrainJob (pure: no I/O; issue 27 part 4).

A TrainJob as the API server stores it carries much the service never reads: the trainer's
image, command and environment, Trainer's `status.jobsStatus` and its other conditions, owner
references, finalizers. The cache keeps only the fields below: every one has a reader.

- metadata: name, namespace, uid (events, plan names, ownership), resourceVersion and
  generation (the status writer's condition), creationTimestamp (the reconciler's grace for a
  predecessor's pods), deletionTimestamp (nothing is made for a TrainJob being deleted), labels
  and annotations (the runtime snapshot; the gang backends read their queue and topology keys
  from any of them, `backends.base.Context`);
- spec: runtimeRef, trainer.numNodes and trainer.resourcesPerNode, runtimePatches (a
  scheduler, and the placement fields feasibility reads), suspend and managedBy (`lifecycle`):
  what `trainer.TrainJob` types, so what planning, checking and feasibility read;
- status: the conditions read, GangScheduling (the status writer's) and Complete/Failed
  (`lifecycle.is_finished`); Trainer's others (Created, Suspended, ...) are not read.

A finished TrainJob (Complete or Failed) has no gang, so nothing reads its labels or its
annotations but the snapshot, and the cache memoises no plan for it (`kube/cache.py`): it is
kept as a tombstone of the same fields less those. Its planning spec stays: the reconciler's
pass over a finished TrainJob still plans it from its snapshot (an invalid plan is said, not
released) and may freeze one (it owns objects but has none), and must decide as it did.

A new reader of another field must add it here: tests/test_kept.py plans every sample TrainJob
whole and kept and fails when they differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import limits
from .condition import CONDITION_TYPE
from .lifecycle import FINISHED_CONDITIONS
from .snapshot import SNAPSHOT_ANNOTATION

Json = dict[str, Any]

KEPT_TOP = ("apiVersion", "kind", "metadata", "spec", "status")
KEPT_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "labels",
    "annotations",
)
KEPT_SPEC = ("runtimeRef", "trainer", "suspend", "managedBy", "runtimePatches")
KEPT_TRAINER = ("numNodes", "resourcesPerNode")
READ_CONDITIONS = frozenset((*FINISHED_CONDITIONS, CONDITION_TYPE))
# A tombstone's metadata: no labels, and of the annotations only the snapshot.
TOMBSTONE_METADATA = tuple(k for k in KEPT_METADATA if k not in ("labels", "annotations"))


def finished(raw: Mapping[str, Any]) -> bool:
    """`lifecycle.is_finished` of a stored TrainJob, read from its JSON (no parse)."""
    status = raw.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    return any(
        isinstance(c, dict) and c.get("type") in FINISHED_CONDITIONS and c.get("status") == "True"
        for c in (conditions if isinstance(conditions, list) else ())
    )


def kept_trainjob(raw: Json) -> Json:
    """What the cache keeps of a stored TrainJob: the fields above, or a tombstone of a finished
    one. A new object (the caller's is never changed); the caller's own when its shape is one the
    parser refuses (too deep, lists too long), so it is refused as before."""
    if not isinstance(raw.get("metadata"), dict) or limits.shape_errors(
        raw, limits.trainjob_list_errors
    ):
        return raw
    tombstone = finished(raw)
    out: Json = {k: raw[k] for k in KEPT_TOP if k in raw}
    out["metadata"] = _metadata(raw["metadata"], tombstone)
    if isinstance(spec := raw.get("spec"), dict):
        out["spec"] = _spec(spec)
    if isinstance(status := raw.get("status"), dict):
        out["status"] = _status(status)
    return out


def _metadata(meta: Json, tombstone: bool) -> Json:
    if not tombstone:
        return {k: meta[k] for k in KEPT_METADATA if k in meta}
    out = {k: meta[k] for k in TOMBSTONE_METADATA if k in meta}
    annotations = meta.get("annotations")
    if isinstance(annotations, dict) and SNAPSHOT_ANNOTATION in annotations:
        out["annotations"] = {SNAPSHOT_ANNOTATION: annotations[SNAPSHOT_ANNOTATION]}
    elif annotations is not None and not isinstance(annotations, dict):
        out["annotations"] = annotations  # malformed: kept, so the parser refuses it as before
    return out


def _spec(spec: Json) -> Json:
    out = {k: spec[k] for k in KEPT_SPEC if k in spec}
    trainer = out.get("trainer")
    if isinstance(trainer, dict):
        out["trainer"] = {k: trainer[k] for k in KEPT_TRAINER if k in trainer}
    return out


def _status(status: Json) -> Json:
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        return {} if conditions is None else {"conditions": conditions}
    return {"conditions": [c for c in conditions if _read(c)]}


def _read(condition: Any) -> bool:
    """Kept unless it is a well-formed condition of a type no reader reads (a malformed one is
    kept, so that a TrainJob the parser refuses whole is refused kept too)."""
    if not isinstance(condition, dict):
        return True
    kind, status = condition.get("type"), condition.get("status")
    return not (isinstance(kind, str) and isinstance(status, str)) or kind in READ_CONDITIONS

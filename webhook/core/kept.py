"""What the watch cache keeps of a stored TrainJob (pure: no I/O; issue 27 part 4, issue 37).

A TrainJob as the API server stores it carries much the service never reads: the trainer's
image, command and environment, Trainer's `status.jobsStatus` and its other conditions, owner
references, finalizers. The cache keeps only the fields below: every one has a reader.

- apiVersion and kind (an Event's `regarding`);
- metadata: name, namespace, uid (events, plan names, ownership), resourceVersion and
  generation (the status writer's condition; plan names from version 3), creationTimestamp
  (the reconciler's grace for a predecessor's pods), deletionTimestamp (nothing is made for a
  TrainJob being deleted), labels and annotations (the runtime snapshot; the gang backends read
  their queue and topology keys from any of them, `backends.base.Context`);
- spec: runtimeRef, trainer.numNodes and trainer.resourcesPerNode, runtimePatches (a
  scheduler, and the placement fields feasibility reads), suspend and managedBy (`lifecycle`):
  what `trainer.TrainJob` types, so what planning, checking and feasibility read;
- status: the conditions read: GangScheduling whole (the status writer's own, which it compares
  and carries over), Complete and Failed by type and status (`lifecycle.is_finished`); Trainer's
  others (Created, Suspended, ...) are not read.

The runtime snapshot's text is interned: the TrainJobs of one runtime version share one copy;
so are the strings every TrainJob repeats (apiVersion, kind, its namespace, managedBy, the
conditions' type and status).

A finished TrainJob (Complete or Failed) has no gang and never gets one again, and a cluster
keeps many more of them than it runs (issue 37: 70,000 finished beside 10,000 running), so it
is kept as a **tombstone**: what answers for it and nothing more.

- Its identity (name, namespace, uid), resourceVersion and generation (the status writer's one
  `Finished` write; Events), deletionTimestamp.
- The snapshot, shared: it is what tells the pod webhook a frozen gang (its pods are held,
  `TrainJobFinished`) from a frozen "no gang" (its pods are admitted), and the reconciler
  what to release.
- Of the spec, what decides whether the reconciler's pass releases its gang: runtimeRef (a
  TrainJob never frozen: whether its runtime schedules), numNodes, suspend and managedBy
  (`lifecycle`). Planning from these fails only where planning from the whole would (a
  dropped resourcesPerNode or runtimePatches can only remove an error): a finished TrainJob
  whose gang was made is always released. One whose plan was invalid (it never had a gang)
  is now said `Finished` rather than still `InvalidScheduling`.
- Of its GangScheduling condition, once it says `Finished`, only what the status writer
  compares (status, reason, message: `condition.unchanged`); before that, the whole of it,
  which the one write of `Finished` carries over.

No labels, no other annotation, no resources, no runtime patches, no creationTimestamp: the
store shares the parts many tombstones have alike (`kube/trainjobstore.py`), and the cache
memoises no plan for them (`kube/cache.py`).

An object whose shape the parser refuses (nested too deep, lists too long) is kept as it is,
so it is refused as before rather than read from what is left of it.

A new reader of another field must add it here: tests/test_kept.py plans every sample TrainJob
whole and kept and fails when they differ.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from . import limits
from .condition import CONDITION_TYPE, FINISHED
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
FINISHED_CONDITION_FIELDS = ("type", "status")  # all `lifecycle.is_finished` reads of one
# A tombstone's metadata: no labels, no creationTimestamp, of the annotations only the snapshot.
TOMBSTONE_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "deletionTimestamp",
    "annotations",
)
TOMBSTONE_SPEC = ("runtimeRef", "trainer", "suspend", "managedBy")
TOMBSTONE_TRAINER = ("numNodes",)
# What the status writer compares of a condition that already says Finished.
SAID_FIELDS = ("type", "status", "reason", "message")


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
    out: Json = {k: _interned(raw[k]) for k in KEPT_TOP if k in raw}
    out["metadata"] = _metadata(raw["metadata"], tombstone)
    if isinstance(spec := raw.get("spec"), dict):
        out["spec"] = _spec(spec, tombstone)
    if isinstance(status := raw.get("status"), dict):
        out["status"] = _status(status, tombstone)
    return out


def _metadata(meta: Json, tombstone: bool) -> Json:
    out = {k: meta[k] for k in (TOMBSTONE_METADATA if tombstone else KEPT_METADATA) if k in meta}
    if isinstance(namespace := out.get("namespace"), str):
        out["namespace"] = sys.intern(namespace)  # and the store's keys with it
    annotations = meta.get("annotations")
    if not isinstance(annotations, dict):
        if annotations is not None:
            out["annotations"] = annotations  # malformed: kept, so the parser refuses it as before
        return out
    text = annotations.get(SNAPSHOT_ANNOTATION)
    if tombstone:
        annotations = {SNAPSHOT_ANNOTATION: text} if SNAPSHOT_ANNOTATION in annotations else None
    if isinstance(text, str):  # one copy for every TrainJob frozen from the same runtime
        annotations = {**(annotations or {}), SNAPSHOT_ANNOTATION: sys.intern(text)}
    if annotations is not None:
        out["annotations"] = annotations
    else:
        out.pop("annotations", None)
    return out


def _spec(spec: Json, tombstone: bool) -> Json:
    out = {k: spec[k] for k in (TOMBSTONE_SPEC if tombstone else KEPT_SPEC) if k in spec}
    trainer = out.get("trainer")
    if isinstance(trainer, dict):
        fields = TOMBSTONE_TRAINER if tombstone else KEPT_TRAINER
        out["trainer"] = {k: trainer[k] for k in fields if k in trainer}
    if isinstance(managed_by := out.get("managedBy"), str):  # Trainer sets it on every one
        out["managedBy"] = sys.intern(managed_by)
    return out


def _status(status: Json, tombstone: bool) -> Json:
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        return {} if conditions is None else {"conditions": conditions}
    return {"conditions": [read for c in conditions if (read := _read(c, tombstone)) is not None]}


def _read(condition: Any, tombstone: bool) -> Any:
    """What is read of a condition: None for a well-formed one of a type no reader reads; a
    malformed one is kept as it is, so that a TrainJob the parser refuses whole is refused kept
    too."""
    if not isinstance(condition, dict):
        return condition
    kind, status = condition.get("type"), condition.get("status")
    if not (isinstance(kind, str) and isinstance(status, str)):
        return condition
    if kind in FINISHED_CONDITIONS:
        return {k: sys.intern(condition[k]) for k in FINISHED_CONDITION_FIELDS}
    if kind != CONDITION_TYPE:
        return None
    if tombstone and condition.get("reason") == FINISHED:  # said, for good: nothing to carry
        return {k: _interned(condition[k]) for k in SAID_FIELDS if k in condition}
    return {k: _interned(v) if k in ("type", "status") else v for k, v in condition.items()}


def _interned(value: Any) -> Any:
    return sys.intern(value) if isinstance(value, str) else value

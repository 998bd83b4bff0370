"""A TrainJob's runtime, frozen when the TrainJob is first reconciled (pure: no I/O).

KEP-3015 means runtime edits to affect only TrainJobs created afterwards. So the reconciler
writes what the planner reads of the runtime into an annotation on the TrainJob, once, and
everything later (the reconciler and the pod webhook alike) plans from that annotation.

The snapshot is versioned, so that a new release never re-plans a TrainJob that is already
running (its pods point at names the old release computed):

- version 1, written by releases before plan versions existed: the bare runtime JSON. Planned
  with the names those releases gave (no incarnation in them).
- version 2: `{"planVersion": 2, "runtime": {...}}`. Names carry the TrainJob's uid (a TrainJob
  re-applied under the same name never meets its predecessor's Terminating objects) and a
  JobSet restart's PodGroups carry the restart attempt (each restart is a gang of its own).
  `"runtime": null` freezes "no gang": the TrainJob started without one, so it never gets one
  mid-flight, whatever its runtime says later.
- version 3: the same shape; names also carry the run: the TrainJob's `metadata.generation`
  once it is past 1. Its spec changes only while it is suspended (suspend and resume,
  Kueue's runtimePatches), so each run after a resume has a generation, and a gang, of its
  own: a resumed gang never waits for its predecessor's PodGroups, which stay Terminating as
  long as the old pods' grace period.

The snapshot keeps only the fields the typed models declare, and no annotations: a runtime's
containers, commands and `last-applied-configuration` would only make the TrainJob heavier.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel

from .fields import parse
from .trainer import ObjectMeta, Runtime

SNAPSHOT_ANNOTATION = "trainjob-scheduling.dev/runtime-snapshot"
PLAN_VERSION = 3  # what this release writes; see the module docstring for each version
LEGACY_PLAN_VERSION = 1
_DROPPED_META = frozenset({"annotations", "uid", "generation"})


@dataclass(frozen=True)
class Frozen:
    """A snapshot read back: the plan version it was written for, and the runtime (None when
    "no gang" was frozen)."""

    version: int
    runtime: Runtime | None


def snapshot(runtime: Runtime | None) -> str:
    """The annotation value this release writes for `runtime` (None: freeze "no gang")."""
    frozen = None if runtime is None else _declared(runtime)
    return orjson.dumps({"planVersion": PLAN_VERSION, "runtime": frozen}).decode()


def from_annotations(annotations: Mapping[str, Any] | None) -> Frozen | None:
    """The snapshot in a TrainJob's annotations; None when there is none (or it is not
    readable: then the reconciler takes a fresh snapshot rather than guessing)."""
    text = (annotations or {}).get(SNAPSHOT_ANNOTATION)
    return from_text(text) if isinstance(text, str) else None


def from_text(text: str) -> Frozen | None:
    """The snapshot in an annotation's value; None when it is not readable (or is of a plan
    version newer than this release knows: planning it with older rules would guess)."""
    try:
        raw = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(raw, dict):
        return None
    if "planVersion" not in raw:  # version 1: the bare runtime
        runtime = parse(Runtime, raw)[0]
        return Frozen(LEGACY_PLAN_VERSION, runtime) if runtime is not None else None
    version, body = raw.get("planVersion"), raw.get("runtime")
    if type(version) is not int or not LEGACY_PLAN_VERSION < version <= PLAN_VERSION:
        return None
    if body is None:
        return Frozen(version, None)
    runtime = parse(Runtime, body)[0] if isinstance(body, dict) else None
    return Frozen(version, runtime) if runtime is not None else None


def newer_version(text: str) -> int | None:
    """The plan version of a snapshot a newer release wrote (one this release cannot read; a
    rollback leaves them): whatever it froze is left alone. None for any other snapshot."""
    try:
        raw = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    version = raw.get("planVersion") if isinstance(raw, dict) else None
    return version if type(version) is int and version > PLAN_VERSION else None


def snapshot_of(trainjob_raw: Mapping[str, Any]) -> str | None:
    """The raw annotation value on a stored TrainJob, if any."""
    meta = trainjob_raw.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    value = annotations.get(SNAPSHOT_ANNOTATION) if isinstance(annotations, dict) else None
    return value if isinstance(value, str) else None


def _declared(value: Any) -> Any:
    if isinstance(value, BaseModel):
        out: dict[str, Any] = {}
        for name, info in type(value).model_fields.items():
            if name not in value.model_fields_set:
                continue
            if isinstance(value, ObjectMeta) and name in _DROPPED_META:
                continue
            item = getattr(value, name)
            if item is not None:
                out[info.alias or name] = _declared(item)
        return out
    if isinstance(value, list):
        return [_declared(v) for v in value]
    if isinstance(value, dict):
        return {k: _declared(v) for k, v in value.items()}
    return value

"""A TrainJob's runtime, frozen when the TrainJob is first reconciled (pure: no I/O).

KEP-3015 means runtime edits to affect only TrainJobs created afterwards. So the reconciler
writes what the planner reads of the runtime into an annotation on the TrainJob, once, and
everything later (the reconciler and the pod webhook alike) plans from that annotation.

The snapshot keeps only the fields the typed models declare, and no annotations: a runtime's
containers, commands and `last-applied-configuration` would only make the TrainJob heavier.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from pydantic import BaseModel

from .fields import parse
from .trainer import ObjectMeta, Runtime

SNAPSHOT_ANNOTATION = "trainjob-scheduling.dev/runtime-snapshot"
_DROPPED_META = frozenset({"annotations", "uid"})


def snapshot(runtime: Runtime) -> str:
    """The annotation value for `runtime`: compact JSON of the declared fields that are set."""
    return orjson.dumps(_declared(runtime)).decode()


def from_annotations(annotations: Mapping[str, Any] | None) -> Runtime | None:
    """The runtime frozen in a TrainJob's annotations; None when there is none (or it is not
    readable: then the reconciler takes a fresh snapshot rather than guessing)."""
    text = (annotations or {}).get(SNAPSHOT_ANNOTATION)
    return from_text(text) if isinstance(text, str) else None


def from_text(text: str) -> Runtime | None:
    """The runtime in a snapshot annotation's value; None when it is not readable."""
    try:
        raw = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return parse(Runtime, raw)[0] if isinstance(raw, dict) else None


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

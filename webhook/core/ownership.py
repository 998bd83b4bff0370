"""Which TrainJob controls an object, read from its ownerReferences (pure: no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .trainer import TRAINER_GROUP, TRAINJOB_KIND


def controlling_trainjob(obj: Mapping[str, Any]) -> str | None:
    """The name of the TrainJob that controls a Workload or PodGroup, if one does.

    The controller ownerReference decides; a Workload without one may still name its TrainJob in
    `spec.controllerRef` (how a hand-written Workload says whom it schedules).
    """
    owner = controller_ref(obj)
    if owner is not None:
        if not is_trainjob_ref(owner):
            return None  # controlled by something else: not ours to default
        name = owner.get("name")
        return name if isinstance(name, str) and name else None
    spec = obj.get("spec")
    ref = spec.get("controllerRef") if isinstance(spec, dict) else None
    if (
        isinstance(ref, dict)
        and ref.get("kind") == TRAINJOB_KIND
        and ref.get("apiGroup") == TRAINER_GROUP
        and isinstance(ref.get("name"), str)
        and ref["name"]
    ):
        return str(ref["name"])
    return None


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The uid in a TrainJob controller ownerReference, when there is one."""
    owner = controller_ref(obj)
    uid = owner.get("uid") if owner is not None and is_trainjob_ref(owner) else None
    return uid if isinstance(uid, str) else None


def controller_ref(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The controller ownerReference (at most one per object), if any."""
    meta = obj.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, dict) else None
    for ref in refs if isinstance(refs, list) else []:
        if isinstance(ref, dict) and ref.get("controller") is True:
            return ref
    return None


def is_trainjob_ref(owner: dict[str, Any]) -> bool:
    api_version = owner.get("apiVersion")
    group = api_version.split("/", 1)[0] if isinstance(api_version, str) else None
    return owner.get("kind") == TRAINJOB_KIND and group == TRAINER_GROUP


def controlled_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    """Whether `obj`'s controller ownerReference is the TrainJob with this uid."""
    owner = controller_ref(obj)
    return (
        uid is not None and owner is not None and is_trainjob_ref(owner) and owner.get("uid") == uid
    )

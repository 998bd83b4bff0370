"""Only the service writes a TrainJob's frozen runtime snapshot (pure: no I/O).

The reconciler and the pod webhook build a TrainJob's gang from the snapshot annotation
(`core/snapshot.py`), not from the runtime as it is now. The annotation sits on the tenant's own
object, so without this check anyone who may edit the TrainJob could write a different runtime
there (another gang policy, no topology, other minCount arithmetic, a priority) and have the
privileged reconciler build it: a confused deputy. The TrainJob webhook therefore denies any
request that sets, changes or removes the annotation unless the API server says it comes from
the service's own identity (`request.userInfo.username`, which the requester cannot choose),
or it is, on CREATE, exactly a snapshot the service freezes into that TrainJob: its TrainJob
mutating webhook freezes the runtime when the TrainJob is created, in the requester's own request
(which snapshots count is the handler's to say, `admission/handlers.py`).
"""

from __future__ import annotations

from collections.abc import Collection

from ..core.errors import Path
from ..core.snapshot import SNAPSHOT_ANNOTATION
from .review import Decision, Review

SNAPSHOT_FIELD = str(Path("metadata", "annotations").key(SNAPSHOT_ANNOTATION))
_VERBS = {"set": "set", "changed": "change", "removed": "remove"}


def _snapshot(obj: dict[str, object] | None) -> str | None:
    meta = obj.get("metadata") if obj is not None else None
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    value = annotations.get(SNAPSHOT_ANNOTATION) if isinstance(annotations, dict) else None
    # A non-string value is refused by the API server's own validation; treated as present.
    return None if value is None else value if isinstance(value, str) else repr(value)


def snapshot_change(review: Review) -> str | None:
    """How the request touches the snapshot: "set" (on CREATE, or added by an UPDATE),
    "changed", "removed", or None when it leaves it as stored."""
    if review.operation not in ("CREATE", "UPDATE") or review.sub_resource:
        return None  # DELETE, CONNECT; /status ignores metadata changes of a custom resource
    new = _snapshot(review.object)
    old = _snapshot(review.old_object) if review.operation == "UPDATE" else None
    if new == old:
        return None
    if old is None:
        return "set"
    return "removed" if new is None else "changed"


def guard_snapshot(review: Review, writer: str, accepted: Collection[str] = ()) -> Decision | None:
    """A 403 when the request sets, changes or removes the snapshot and its requester is not
    `writer` (the service's own username; empty: no one may), unless it sets on CREATE exactly
    one of `accepted`, the snapshots the service freezes into that TrainJob (its mutating
    webhook froze one in this request; a requester who wrote the same text asked for nothing
    else). None: nothing to deny."""
    change = snapshot_change(review)
    if change is None or (writer and review.username == writer):
        return None
    if change == "set" and review.operation == "CREATE" and _snapshot(review.object) in accepted:
        return None
    qualified = f"{review.resource}.{review.group}" if review.group else review.resource
    name = review.object_name
    who = review.username or "an unauthenticated requester"
    only = f"only the trainjob-scheduling service ({writer})" if writer else "no one"
    detail = (
        f"{who} may not {_VERBS[change]} the frozen runtime snapshot: "
        f"{only} writes it, once, from the TrainJob's runtime; remove the annotation from the "
        "request (to change the gang, change the runtime and create a new TrainJob)"
    )
    body = f"Forbidden: {detail}"
    return Decision(
        allowed=False,
        code=403,
        reason="Forbidden",
        message=f'{qualified} "{name}" is forbidden: {SNAPSHOT_FIELD}: {body}',
        details={
            "name": name,
            "group": review.group,
            "kind": review.resource,
            "causes": [{"reason": "FieldValueForbidden", "message": body, "field": SNAPSHOT_FIELD}],
        },
        note=f"runtime snapshot {change} by {who}: denied",
    )

"""A pod's AdmissionReview, read for the few fields the pod webhook uses.

Every pod of every TrainJob comes through the pod webhook, and a pod's review is mostly what the
webhook never reads (containers, volumes, env, managed fields): decoding all of it into Python
objects was the largest single cost of a pod review. msgspec decodes the envelope and, of the
pod, only its name, namespace, labels, annotations and the spec fields a backend's tie may read,
skipping the rest without building it (about half the cost of decoding it all). Anything but
the usual shape (a field of another type, a CREATE with an old object, deep nesting, not JSON) is
read again by the general `review.parse`, so a strange body gets the answer it always got. One
difference stays: msgspec does not look inside what it skips, so a body that is invalid only
there (bytes that are not UTF-8, a number past a float's range in, say, a container's env) is
answered as if it were valid, where the general parser says 400. The API server never sends
such a body; a client that does only gets its own answer.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .review import API_VERSION, KIND, Review, parse

UNSET = msgspec.UNSET


class _Meta(msgspec.Struct, rename="camel"):
    name: Any = UNSET
    generate_name: Any = UNSET
    namespace: Any = UNSET
    labels: Any = UNSET
    annotations: Any = UNSET


class _Spec(msgspec.Struct, rename="camel"):
    scheduling_group: Any = UNSET
    scheduler_name: Any = UNSET
    affinity: Any = UNSET


class _Pod(msgspec.Struct):
    metadata: _Meta | msgspec.UnsetType = UNSET
    spec: _Spec | msgspec.UnsetType = UNSET


class _Request(msgspec.Struct, rename="camel"):
    uid: Any = UNSET
    kind: Any = UNSET
    resource: Any = UNSET
    sub_resource: Any = UNSET
    name: Any = UNSET
    namespace: Any = UNSET
    operation: Any = UNSET
    user_info: Any = UNSET
    object: _Pod | msgspec.UnsetType | None = UNSET
    old_object: Any = None
    dry_run: Any = UNSET


class _Envelope(msgspec.Struct, rename="camel"):
    kind: Any = UNSET
    api_version: Any = UNSET
    request: _Request | msgspec.UnsetType = UNSET


_DECODER = msgspec.json.Decoder(_Envelope)


def _names(struct: type[msgspec.Struct]) -> tuple[tuple[str, str], ...]:
    return tuple((f.name, f.encode_name) for f in msgspec.structs.fields(struct))


_NAMES = {_Meta: _names(_Meta), _Spec: _names(_Spec)}


def _present(struct: _Meta | _Spec) -> dict[str, Any]:
    """The fields the JSON had, under their JSON names."""
    return {
        json_name: value
        for name, json_name in _NAMES[type(struct)]
        if (value := getattr(struct, name)) is not UNSET
    }


def _str(doc: Any, key: str) -> str:
    value = doc.get(key) if isinstance(doc, dict) else None
    return value if isinstance(value, str) else ""


def fast_parse(body: bytes) -> Review | None:
    """The review of a pod CREATE in its usual shape; None for anything else."""
    try:
        doc = _DECODER.decode(body)
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return None
    req = doc.request
    if doc.kind != KIND or doc.api_version != API_VERSION or isinstance(req, msgspec.UnsetType):
        return None
    pod = req.object
    if (
        not isinstance(req.uid, str)
        or not req.uid
        or not isinstance(req.kind, dict)
        or not isinstance(req.resource, dict)
        or req.operation != "CREATE"
        or not isinstance(pod, _Pod)
        or req.old_object is not None
    ):
        return None
    obj: dict[str, Any] = {}
    if not isinstance(pod.metadata, msgspec.UnsetType):
        obj["metadata"] = _present(pod.metadata)
    if not isinstance(pod.spec, msgspec.UnsetType):
        obj["spec"] = _present(pod.spec)
    return Review(
        uid=req.uid,
        group=_str(req.kind, "group"),
        version=_str(req.kind, "version"),
        kind=_str(req.kind, "kind"),
        resource=_str(req.resource, "resource"),
        sub_resource=req.sub_resource if isinstance(req.sub_resource, str) else "",
        name=req.name if isinstance(req.name, str) else "",
        namespace=req.namespace if isinstance(req.namespace, str) else "",
        operation=req.operation,
        username=_str(req.user_info, "username"),
        object=obj,
        old_object=None,
        dry_run=req.dry_run is True,
    )


def parse_pod_review(body: bytes) -> Review:
    """`review.parse`, fast for the usual pod CREATE."""
    fast = fast_parse(body)
    return fast if fast is not None else parse(body)

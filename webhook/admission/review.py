"""The AdmissionReview `admission.k8s.io/v1` envelope: parse a request, encode a response.

Parsing is strict about the envelope and lenient about the object: anything the handlers rely on
is checked here once, so a hostile body fails with a message instead of deep in a handler.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import orjson

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
MAX_WARNING = 120  # the reference's limit: longer ones may be cut by the API server or clients
MAX_WARNINGS = 12  # the API server keeps about 4 KB of warnings per request; a hostile object
# could produce thousands (one per unknown field)


class BadReview(ValueError):
    """The body is not an AdmissionReview this service can answer; `uid` if one was readable."""

    def __init__(self, message: str, uid: str | None = None) -> None:
        super().__init__(message)
        self.uid = uid


@dataclass(slots=True)
class Review:
    uid: str
    group: str
    version: str
    kind: str
    resource: str
    sub_resource: str
    name: str
    namespace: str
    operation: str
    username: str
    object: dict[str, Any] | None
    old_object: dict[str, Any] | None
    dry_run: bool

    @property
    def target(self) -> dict[str, Any] | None:
        """The object the request is about: the new one, or the stored one on DELETE."""
        return self.object if self.object is not None else self.old_object

    @property
    def object_name(self) -> str:
        """`name`, else the object's name, else its generateName (pods of a Job controller)."""
        if self.name:
            return self.name
        meta = (self.target or {}).get("metadata")
        if isinstance(meta, dict):
            for key in ("name", "generateName"):
                value = meta.get(key)
                if isinstance(value, str) and value:
                    return value
        return ""


@dataclass(slots=True)
class Decision:
    allowed: bool = True
    patch: list[dict[str, Any]] | None = None
    warnings: list[str] = field(default_factory=list)
    code: int = 200
    reason: str = ""
    message: str = ""
    details: dict[str, Any] | None = None
    note: str = ""  # for the log line only
    untied: str = ""
    """A TrainJob pod of a ganged runtime held (denied: the Job controller retries) or admitted
    without its group: why, as the reason label of the pods' held/untied counters."""
    regrouped: bool = False
    """A ganged TrainJob's pod that named another group (the Job controller's own gang) and is
    tied to its gang instead."""


def parse(body: bytes) -> Review:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise BadReview(f"body is not JSON: {err}") from None
    if not isinstance(doc, dict):
        raise BadReview("body is not a JSON object")
    if doc.get("kind") != KIND or doc.get("apiVersion") != API_VERSION:
        raise BadReview(
            f"expected kind {KIND} apiVersion {API_VERSION}, got kind {_show(doc.get('kind'))} "
            f"apiVersion {_show(doc.get('apiVersion'))}"
        )
    req = doc.get("request")
    if not isinstance(req, dict):
        raise BadReview("request is missing or not an object")
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid is missing or not a string")
    kind = _dict(req, "kind", uid)
    resource = _dict(req, "resource", uid)
    operation = req.get("operation")
    if not isinstance(operation, str) or operation not in OPERATIONS:
        raise BadReview(
            f"request.operation {_show(operation)} is not CREATE, UPDATE, DELETE or CONNECT", uid
        )
    obj = _object(req, "object", uid)
    old = _object(req, "oldObject", uid)
    if operation in ("CREATE", "UPDATE") and obj is None:
        raise BadReview(f"request.object is missing on {operation}", uid)
    if operation == "UPDATE" and old is None:
        raise BadReview("request.oldObject is missing on UPDATE", uid)
    user = req.get("userInfo")
    name, namespace, sub_resource = req.get("name"), req.get("namespace"), req.get("subResource")
    group, version, kind_name = kind.get("group"), kind.get("version"), kind.get("kind")
    plural = resource.get("resource")
    username = user.get("username") if isinstance(user, dict) else None
    # Every review of every pod comes through here: the strings are checked inline.
    return Review(
        uid=uid,
        group=group if type(group) is str else "",
        version=version if type(version) is str else "",
        kind=kind_name if type(kind_name) is str else "",
        resource=plural if type(plural) is str else "",
        sub_resource=sub_resource if type(sub_resource) is str else "",
        name=name if type(name) is str else "",
        namespace=namespace if type(namespace) is str else "",
        operation=operation,
        username=username if type(username) is str else "",
        object=obj,
        old_object=old,
        dry_run=req.get("dryRun", False) is True,
    )


def _show(value: Any) -> str:
    """A short rendering of a value the client sent, safe for any value (no deep repr)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return f"a JSON {'object' if isinstance(value, dict) else 'array'}"


def _dict(req: dict[str, Any], key: str, uid: str) -> dict[str, Any]:
    value = req.get(key)
    if not isinstance(value, dict):
        raise BadReview(f"request.{key} is missing or not an object", uid)
    return value


def _object(req: dict[str, Any], key: str, uid: str) -> dict[str, Any] | None:
    value = req.get(key)
    if value is not None and not isinstance(value, dict):
        raise BadReview(f"request.{key} is not an object", uid)
    return value


# --- responses ---------------------------------------------------------------------------------


def encode(uid: str, decision: Decision) -> tuple[bytes, int]:
    """The response body, and the size of the JSON Patch in it (0 without one)."""
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    patch = orjson.dumps(decision.patch) if decision.patch else b""
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(patch).decode()
    if not decision.allowed:
        status: dict[str, Any] = {
            "code": decision.code,
            "reason": decision.reason,
            "message": decision.message,
        }
        if decision.details is not None:
            status["details"] = decision.details
        response["status"] = status
    if decision.warnings:
        response["warnings"] = shown_warnings(decision.warnings)
    body = orjson.dumps({"apiVersion": API_VERSION, "kind": KIND, "response": response})
    return body, len(patch)


def shown_warnings(warnings: list[str]) -> list[str]:
    """The warnings an answer carries: each cut to MAX_WARNING characters, at most MAX_WARNINGS
    of them (the last one then says how many were left out)."""
    if len(warnings) > MAX_WARNINGS:
        more = len(warnings) - MAX_WARNINGS + 1
        warnings = [*warnings[: MAX_WARNINGS - 1], f"{more} more warnings not shown"]
    return [_cap(w) for w in warnings]


def _cap(warning: str) -> str:
    return warning if len(warning) <= MAX_WARNING else warning[: MAX_WARNING - 3] + "..."


def errored(code: int, message: str) -> Decision:
    """controller-runtime's `admission.Errored`: the review is not one this webhook can judge."""
    reason = "BadRequest" if code == 400 else "InternalError"
    return Decision(allowed=False, code=code, reason=reason, message=message)

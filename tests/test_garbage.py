"""Garbage in, no traceback out.

Thousands of malformed and hostile requests go to the real server over HTTPS: random bytes,
random JSON, the 54 captured AdmissionReviews mutated (keys deleted, values of the wrong type,
bad envelopes, huge or odd strings, deep nesting, NaN and other bad tokens, duplicate keys,
trailing garbage, broken UTF-8), odd methods and paths, oversized and slow bodies. Every answer
must be a 200 AdmissionReview or a small JSON error (400, 404, 405, 408, 413), never a 500 or a
traceback; the process's memory stays bounded; and a valid review is still answered afterwards.

The inputs that once crashed the server (an operation that is a list, a value nested 1000 deep
in the envelope or in a mutated object) are pinned by the tests at the end of the file.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import jsonpatch
import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from webhook.admission.routes import WEBHOOKS
from webhook.server.app import Limits

from .harness import (
    RunningServer,
    fixture,
    fixture_cache,
    fixture_names,
    make_certs,
    running_server,
    server_process,
    webhook_path,
)
from .timing import STALL, fastest

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
WEBHOOK_PATHS: tuple[str, ...] = tuple(w.path for w in WEBHOOKS)
BOGUS_PATHS = (
    "/",
    "/mutate",
    "/healthz",
    "/readyz",
    "/metrics",
    "/validate--v1-pod",  # there is no pod validation webhook
    "/mutate-trainer-kubeflow-org-v1alpha1-trainjob",  # nor a TrainJob mutation webhook
    "/MUTATE--v1-pod",
    "/mutate--v1-pod/extra",
    "/mutate--v1-podx",
    "/%2e%2e/%2e%2e/etc/passwd",
    "/mutate%00--v1-pod",
)
ODD_METHODS = ("GET", "PUT", "DELETE", "PATCH", "OPTIONS")
ALLOWED_STATUSES = frozenset({200, 400, 404, 405, 408, 413})
PATCH_OPS = frozenset({"add", "remove", "replace", "move", "copy", "test"})
MAX_WARNING = 256

FUZZ_LIMIT = 512 * 1024  # small enough that the huge-string mutations cross it
SMALL_LIMIT = 1024
SLOW_TIMEOUT = 0.5
PROCESS_LIMIT = 1024 * 1024
VALID_FIXTURE = "clustertrainingruntime-create-level1.mutate.json"

Key = str | int
JsonPath = tuple[Key, ...]


# --- what the server must answer --------------------------------------------------------------


@dataclass(frozen=True)
class Garbage:
    """One request: method, path, body bytes, and whether the body goes chunked."""

    method: str
    path: str
    body: bytes
    chunked: bool = False


def answerable_uid(body: bytes) -> str | None:
    """The uid a review response must echo, or None when the body only deserves a plain 400.

    The envelope rules of the issue: JSON, an object, kind AdmissionReview, apiVersion
    admission.k8s.io/v1, an object `request` with a non-empty string `uid`.
    """
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("kind") != KIND or doc.get("apiVersion") != API_VERSION:
        return None
    req = doc.get("request")
    if not isinstance(req, dict):
        return None
    uid = req.get("uid")
    return uid if isinstance(uid, str) and uid else None


def send(client: httpx.Client, g: Garbage) -> httpx.Response:
    content: bytes | Iterator[bytes] = iter_chunks(g.body) if g.chunked else g.body
    headers = {"content-type": "application/json"}
    return client.request(g.method, g.path, content=content, headers=headers)


def iter_chunks(body: bytes, size: int = 16 * 1024) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


def check_answer(resp: httpx.Response, g: Garbage, limit: int) -> None:
    """What every answer must be, given the request that got it."""
    status = resp.status_code
    assert status != 500, f"500 for {g.method} {g.path}: {resp.text[:500]}"
    assert status in ALLOWED_STATUSES, (status, resp.text[:500])
    assert b"Traceback" not in resp.content, resp.text[:2000]
    assert resp.headers.get("content-type", "").startswith("application/json"), resp.headers
    data = orjson.loads(resp.content)  # JSON, whatever the status
    if g.path not in WEBHOOK_PATHS:
        assert status == 404, (g.path, status, data)
        assert router_error(data) == "Not Found", data
        return
    if g.method != "POST":
        assert status == 405, (g.method, status, data)
        assert router_error(data) == "Method Not Allowed", data
        assert "POST" in resp.headers.get("allow", ""), resp.headers
        return
    if len(g.body) > limit:
        assert status == 413, (len(g.body), status, data)
        check_error(data)
        return
    uid = answerable_uid(g.body)
    if uid is None:
        assert status == 400, (status, data, g.body[:300])
        check_error(data)
        return
    assert status == 200, (status, data)
    check_review(data, uid, g.body)


def router_error(data: Any) -> str:
    """A 404 or 405 message from the router: {"error": ...} (or FastAPI's {"detail": ...})."""
    assert isinstance(data, dict) and len(data) == 1, data
    message = data.get("error", data.get("detail"))
    assert isinstance(message, str), data
    return message


def check_error(data: Any) -> None:
    assert isinstance(data, dict) and set(data) == {"error"}, data
    assert isinstance(data["error"], str) and data["error"], data
    assert "Traceback" not in data["error"], data


def check_review(data: Any, uid: str, body: bytes | None = None) -> dict[str, Any]:
    """A well-formed AdmissionReview response echoing `uid`; returns the `response`."""
    assert isinstance(data, dict), data
    assert data.get("apiVersion") == API_VERSION, data
    assert data.get("kind") == KIND, data
    response = data.get("response")
    assert isinstance(response, dict), data
    assert set(response) <= {"uid", "allowed", "patchType", "patch", "status", "warnings"}, data
    assert response.get("uid") == uid, (response.get("uid"), uid)
    assert isinstance(response.get("allowed"), bool), response
    if not response["allowed"]:
        status = response.get("status")
        assert isinstance(status, dict), response
        assert isinstance(status.get("code"), int), response
        assert isinstance(status.get("message"), str) and status["message"], response
        assert status["code"] != 500, f"a handler crashed: {status['message']}"
    warnings = response.get("warnings", [])
    assert isinstance(warnings, list), response
    assert all(isinstance(w, str) and len(w) <= MAX_WARNING for w in warnings), warnings
    if "patch" in response:
        assert response.get("patchType") == "JSONPatch", response
        ops = orjson.loads(base64.b64decode(response["patch"], validate=True))
        assert isinstance(ops, list) and ops, ops
        for op in ops:
            assert isinstance(op, dict) and op.get("op") in PATCH_OPS, op
            assert isinstance(op.get("path"), str), op
        if body is not None:  # the patch must apply to the object it was made for
            obj = orjson.loads(body)["request"].get("object")
            jsonpatch.apply_patch(obj, ops, in_place=True)  # no deep copy of deep objects
    return response


# --- server-side errors, read from the log records of the in-thread server ---------------------


class ErrorRecords(logging.Handler):
    """Collects ERROR records (a handler crash, an ASGI exception) from every logger."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.records: list[logging.LogRecord] = []
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._guard:
            self.records.append(record)

    def take(self) -> list[str]:
        with self._guard:
            taken, self.records = self.records, []
        return [f"{r.name}: {r.getMessage()} {r.exc_info[1] if r.exc_info else ''}" for r in taken]


@pytest.fixture(scope="module")
def error_records() -> Iterator[ErrorRecords]:
    handler = ErrorRecords()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


@pytest.fixture(scope="module")
def fuzz_server(
    tmp_path_factory: pytest.TempPathFactory, error_records: ErrorRecords
) -> Iterator[RunningServer]:
    cert_dir = tmp_path_factory.mktemp("garbage-certs")
    with running_server(fixture_cache(), cert_dir, limits=Limits(max_body_bytes=FUZZ_LIMIT)) as s:
        yield s


@pytest.fixture(scope="module")
def fuzz_client(fuzz_server: RunningServer) -> Iterator[httpx.Client]:
    with fuzz_server.client() as client:
        yield client


@pytest.fixture(scope="module")
def small_server(
    tmp_path_factory: pytest.TempPathFactory, error_records: ErrorRecords
) -> Iterator[RunningServer]:
    cert_dir = tmp_path_factory.mktemp("garbage-small-certs")
    limits = Limits(max_body_bytes=SMALL_LIMIT, body_timeout=SLOW_TIMEOUT)
    with running_server(fixture_cache(), cert_dir, limits=limits) as s:
        yield s


# --- the inputs ---------------------------------------------------------------------------------

REVIEW_NAMES: list[str] = fixture_names()
REVIEW_BYTES: dict[str, bytes] = {name: orjson.dumps(fixture(name)) for name in REVIEW_NAMES}


def natural_path(name: str) -> str | None:
    """The webhook a captured review was sent to, if this service has it."""
    verb = name.rsplit(".", 2)[-2]
    path = webhook_path(orjson.loads(REVIEW_BYTES[name]), verb)
    return path if path in WEBHOOK_PATHS else None


INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)  # what orjson can write
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    INT64,
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=12,
)
SHALLOW_LISTS = st.lists(SCALARS, min_size=0, max_size=3)
SHALLOW_DICTS = st.dictionaries(st.text(max_size=8), SCALARS, max_size=3)
BY_TYPE: dict[str, st.SearchStrategy[Any]] = {
    "null": st.none(),
    "bool": st.booleans(),
    "number": INT64 | st.floats(allow_nan=False, allow_infinity=False),
    "string": st.text(max_size=20),
    "array": SHALLOW_LISTS | st.lists(JSON_VALUES, max_size=3),
    "object": SHALLOW_DICTS | st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=3),
}

NASTY_STRINGS = (
    "",
    " ",
    "\u0000",
    "\u202e",  # right-to-left override
    "\ufeff",
    "A\u0301\u0301\u0301",
    "\U0001d54f\U0001f600",
    "\uffff\U0010ffff",
    "../../etc/passwd",
    "%s%n%x",
    "${jndi:ldap://x/a}",
    "' OR 1=1 --",
    "<script>alert(1)</script>",
    "\\",
    '"',
    "null",
    "@@raw-0@@",  # looks like this file's own placeholders: must stay a plain string
)
UNICODE_TEXT = st.text(
    alphabet=st.characters(min_codepoint=0x80, exclude_categories=["Cs"]), min_size=1, max_size=30
)

# Raw tokens put where a JSON value goes (the placeholders of `Mutant`).
BAD_TOKENS = (
    b"NaN",
    b"-NaN",
    b"Infinity",
    b"-Infinity",
    b"1e400",
    b"-1e400",
    b"01",
    b"+1",
    b".5",
    b"1.",
    b"0x10",
    b"undefined",
    b"'single'",
    b'"\\ud800"',  # lone surrogate escapes
    b'"\\udc00\\ud800"',
    b'"\\x41"',
    b'"\\u12"',
    b'"a\nb"',
    b'"\t"',
    b"tru",
    b"nul",
    b"[1,]",
    b'{"a":1,}',
    b"{,}",
    b'{"a" 1}',
    b"{1:2}",
    b'"\xff\xfe"',  # not UTF-8
    b'"\xc3\x28"',
    b'"\xed\xa0\x80"',  # an encoded surrogate
    b'"\xc0\xaf"',  # overlong
    b'"\xf4\x90\x80\x80"',  # above U+10FFFF
    b"//c\n1",
    b"/*c*/1",
    b"",
    b"1 2",
    b'"unterminated',
    # valid, but odd
    b"-0",
    b"1E+2",
    b"1e308",
    b"123456789012345678901234567890",
    b"18446744073709551615",
    b"-9223372036854775809",
    b'"\\u0000"',
    b'"\\ud83d\\ude00"',
    b'"\\/"',
)
# Nesting depths: shallow, deep enough to break any recursion over the object (Python's limit is
# 1000 frames), at orjson's 1024-level limit, and past it (a parse error).
DEEP_DEPTHS = (2, 20, 100, 250, 600, 1000, 1025, 5000, 100_000)


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def walk(value: Any, prefix: JsonPath = ()) -> Iterator[JsonPath]:
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from walk(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from walk(child, (*prefix, index))


def get_at(doc: Any, path: JsonPath) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def set_at(doc: Any, path: JsonPath, value: Any) -> Any:
    """`doc` with the value at `path` replaced (the new root when `path` is the root)."""
    if not path:
        return value
    get_at(doc, path[:-1])[path[-1]] = value
    return doc


def draw_path(draw: st.DrawFn, doc: Any, root: bool = True) -> JsonPath | None:
    """A path into `doc`: first a depth (so the envelope is hit as often as the object), then a
    node at that depth."""
    by_depth: dict[int, list[JsonPath]] = {}
    for path in walk(doc):
        if path or root:
            by_depth.setdefault(len(path), []).append(path)
    if not by_depth:
        return None
    depth = draw(st.sampled_from(sorted(by_depth)))
    return draw(st.sampled_from(by_depth[depth]))


@dataclass
class Mutant:
    """A review being mutated; `raws` are byte tokens spliced in where placeholders stand."""

    doc: Any
    raws: list[bytes] = field(default_factory=list)

    def raw(self, token: bytes) -> str:
        self.raws.append(token)
        return f"@@raw-{len(self.raws) - 1}@@"

    def request(self) -> dict[str, Any] | None:
        req = self.doc.get("request") if isinstance(self.doc, dict) else None
        return req if isinstance(req, dict) else None

    def encode(self) -> bytes:
        body = orjson.dumps(self.doc)
        for index, token in enumerate(self.raws):
            body = body.replace(f'"@@raw-{index}@@"'.encode(), token)
        return body


OTHER_KIND = {
    kind: st.sampled_from([k for k in BY_TYPE if k != kind]).flatmap(BY_TYPE.__getitem__)
    for kind in BY_TYPE
}
WRONG_ENVELOPE = {
    "apiVersion": st.sampled_from(
        ["admission.k8s.io/v1beta1", "admission.k8s.io/v2", "v1", "", " " + API_VERSION]
    )
    | JSON_VALUES,
    "kind": st.sampled_from(["AdmissionReviewList", "admissionreview", "Pod", "", KIND + " "])
    | JSON_VALUES,
}
NOT_OBJECTS: st.SearchStrategy[Any] = (
    st.sampled_from([[], "{}", "request", 0, None, True]) | SCALARS | SHALLOW_LISTS
)
ODD_UIDS = st.one_of(
    INT64,
    st.sampled_from(["", None, True, 1.5]),
    SHALLOW_LISTS,
    SHALLOW_DICTS,
    UNICODE_TEXT,
    st.sampled_from(NASTY_STRINGS[1:]),
    st.sampled_from([1_000, 100_000, 300_000]).map(lambda n: "u" * n),
)
ODD_OPERATIONS = (
    st.sampled_from(["create", "PATCH", "", "DELETE ", "CREATE\u0000", "CONNECTED", "UPDATE\n"])
    | SCALARS
    | st.sampled_from([[], ["CREATE"], {}, {"CREATE": True}])
)
HUGE_STRINGS = st.builds(
    lambda char, n: char * n,
    st.sampled_from(["x", "\u00e9", "\U0001f600", "\u0000", "\\", '"']),
    st.sampled_from([10_000, 100_000, 300_000, 600_000]),
)
ODD_STRINGS = st.sampled_from(NASTY_STRINGS) | UNICODE_TEXT
UNICODE_TARGETS: tuple[JsonPath, ...] = (
    ("request", "uid"),
    ("request", "name"),
    ("request", "namespace"),
    ("request", "userInfo", "username"),
    ("request", "object", "metadata", "name"),
    ("request", "object", "metadata", "namespace"),
    ("request", "kind", "kind"),
)
ODD_LABELS = (
    st.dictionaries(
        st.sampled_from(["jobset.sigs.k8s.io/jobset-name", "jobset.sigs.k8s.io/replicatedjob-name"])
        | UNICODE_TEXT,
        SCALARS | SHALLOW_LISTS | ODD_STRINGS,
        max_size=3,
    )
    | JSON_VALUES
)


def m_delete(draw: st.DrawFn, m: Mutant) -> None:
    """Delete a random key (or list item) at a random depth."""
    path = draw_path(draw, m.doc, root=False)
    if path is not None:
        del get_at(m.doc, path[:-1])[path[-1]]


def m_retype(draw: st.DrawFn, m: Mutant) -> None:
    """Replace a random value with a random JSON value of another type."""
    path = draw_path(draw, m.doc)
    assert path is not None
    m.doc = set_at(m.doc, path, draw(OTHER_KIND[kind_of(get_at(m.doc, path))]))


def m_envelope(draw: st.DrawFn, m: Mutant) -> None:
    """A wrong or missing apiVersion or kind."""
    if isinstance(m.doc, dict):
        key = draw(st.sampled_from(sorted(WRONG_ENVELOPE)))
        if draw(st.booleans()):
            m.doc.pop(key, None)
        else:
            m.doc[key] = draw(WRONG_ENVELOPE[key])


def m_request(draw: st.DrawFn, m: Mutant) -> None:
    """`request` not an object (a list holding it, a string, null, ...)."""
    if isinstance(m.doc, dict):
        req = m.doc.get("request")
        m.doc["request"] = [req] if draw(st.booleans()) else draw(NOT_OBJECTS)


def m_object(draw: st.DrawFn, m: Mutant) -> None:
    """`object` or `oldObject` a list (holding it), a string, a number."""
    req = m.request()
    if req is not None:
        key = draw(st.sampled_from(["object", "oldObject"]))
        req[key] = [req.get(key)] if draw(st.booleans()) else draw(NOT_OBJECTS)


def m_uid(draw: st.DrawFn, m: Mutant) -> None:
    """`uid` an int, empty, null, a list, unicode, huge."""
    req = m.request()
    if req is not None:
        req["uid"] = draw(ODD_UIDS)


def m_operation(draw: st.DrawFn, m: Mutant) -> None:
    """An unknown operation, of any JSON type."""
    req = m.request()
    if req is not None:
        req["operation"] = draw(ODD_OPERATIONS)


def m_huge(draw: st.DrawFn, m: Mutant) -> None:
    """A huge string value (or key), some of them over the body limit."""
    path = draw_path(draw, m.doc)
    assert path is not None
    text = draw(HUGE_STRINGS)
    parent = get_at(m.doc, path)
    if isinstance(parent, dict) and draw(st.booleans()):
        parent[text] = 1
    else:
        m.doc = set_at(m.doc, path, text)


def m_unicode(draw: st.DrawFn, m: Mutant) -> None:
    """Odd unicode in a string that matters (uid, names, labels) or anywhere."""
    present = [p for p in UNICODE_TARGETS if _has(m.doc, p)]
    any_path = draw_path(draw, m.doc)
    assert any_path is not None
    path = draw(st.sampled_from([*present, any_path]))
    m.doc = set_at(m.doc, path, draw(ODD_STRINGS))


def _has(doc: Any, path: JsonPath) -> bool:
    try:
        get_at(doc, path)
    except (KeyError, IndexError, TypeError):
        return False
    return True


def m_labels(draw: st.DrawFn, m: Mutant) -> None:
    """Odd labels and annotations: wrong types, odd keys (handlers read the JobSet labels)."""
    req = m.request()
    obj = req.get("object") if req is not None else None
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(meta, dict):
        key = draw(st.sampled_from(["labels", "annotations", "ownerReferences", "generateName"]))
        meta[key] = draw(ODD_LABELS)


def m_deep(draw: st.DrawFn, m: Mutant) -> None:
    """Deeply nested arrays or objects, closed or not, somewhere in the review."""
    path = draw_path(draw, m.doc)
    assert path is not None
    depth = draw(st.sampled_from(DEEP_DEPTHS))
    if draw(st.booleans()):
        opener, leaf, closer = b"[", b"", b"]"
    else:
        opener, leaf, closer = b'{"a":', b"0", b"}"
    closed = draw(st.integers(0, 5)) > 0
    m.doc = set_at(m.doc, path, m.raw(opener * depth + leaf + (closer * depth if closed else b"")))


def m_token(draw: st.DrawFn, m: Mutant) -> None:
    """A bad (or odd but valid) JSON token in place of a value."""
    path = draw_path(draw, m.doc)
    assert path is not None
    m.doc = set_at(m.doc, path, m.raw(draw(st.sampled_from(BAD_TOKENS))))


# Numbers a tenant controls that the core's work could grow with: counts at int32 and int64
# extremes (orjson writes up to 2**64 - 1; beyond that the API server sends floats).
EXTREME_INTS = st.sampled_from(
    [0, -1, 2**31 - 1, 2**31, -(2**31), 2**63 - 1, -(2**63), 2**64 - 1, 1e23, 2.0]
)
# Fields the core reads, relative to the request's object ("*": every item of a list there).
CORE_FIELDS: tuple[JsonPath, ...] = (
    ("spec", "template", "spec", "replicatedJobs", "*", "replicas"),
    ("spec", "template", "spec", "replicatedJobs", "*", "template", "spec", "parallelism"),
    ("spec", "template", "spec", "replicatedJobs", "*", "dependsOn"),
    ("spec", "template", "spec", "replicatedJobs", "*", "name"),
    ("spec", "mlPolicy", "numNodes"),
    ("spec", "scheduling"),
    ("spec", "scheduling", "replicatedJobs", "*", "targetReplicatedJobs"),
    ("spec", "scheduling", "replicatedJobs", "*", "job"),
    ("spec", "scheduling", "replicatedJobs", "*", "schedulingPolicy"),
    ("spec", "trainer", "numNodes"),
    ("spec", "runtimeRef", "name"),
    ("metadata", "labels"),
    ("spec", "podGroupTemplates", "*", "schedulingPolicy", "gang", "minCount"),
    ("spec", "schedulingPolicy", "gang", "minCount"),
)


def core_paths(obj: Any) -> list[JsonPath]:
    """The CORE_FIELDS that can be set in `obj` (their parent exists), '*' resolved."""
    found: list[JsonPath] = []
    for pattern in CORE_FIELDS:
        prefixes: list[JsonPath] = [()]
        for key in pattern[:-1]:
            step: list[JsonPath] = []
            for prefix in prefixes:
                value = get_at(obj, prefix)
                if key == "*" and isinstance(value, list):
                    step += [(*prefix, i) for i in range(len(value))]
                elif isinstance(value, dict) and isinstance(value.get(key), dict | list):
                    step.append((*prefix, key))
            prefixes = step
        found += [
            (*prefix, pattern[-1]) for prefix in prefixes if isinstance(get_at(obj, prefix), dict)
        ]
    return found


def m_count(draw: st.DrawFn, m: Mutant) -> None:
    """A count the core reads (replicas, parallelism, numNodes, minCount) at an extreme."""
    req = m.request()
    obj = req.get("object") if req is not None else None
    paths = core_paths(obj) if isinstance(obj, dict) else []
    if paths:
        path = draw(st.sampled_from(paths))
        get_at(obj, path[:-1])[path[-1]] = draw(EXTREME_INTS)


def m_deep_field(draw: st.DrawFn, m: Mutant) -> None:
    """Deep nesting in a field the core reads, at a depth that fits orjson's limit."""
    req = m.request()
    obj = req.get("object") if req is not None else None
    paths = core_paths(obj) if isinstance(obj, dict) else []
    if paths:
        path = draw(st.sampled_from(paths))
        depth = draw(st.sampled_from([63, 64, 65, 300, 1000]))
        get_at(obj, path[:-1])[path[-1]] = m.raw(b'{"a":' * depth + b"1" + b"}" * depth)


MUTATIONS: tuple[Callable[[st.DrawFn, Mutant], None], ...] = (
    m_delete,
    m_delete,
    m_retype,
    m_retype,
    m_envelope,
    m_request,
    m_object,
    m_uid,
    m_operation,
    m_huge,
    m_unicode,
    m_labels,
    m_deep,
    m_token,
    m_count,
    m_count,
    m_deep_field,
)


def r_duplicate_key(draw: st.DrawFn, body: bytes) -> bytes:
    """A duplicate top-level or uid key, before (the original wins) or after (it loses)."""
    value = orjson.dumps(draw(JSON_VALUES))
    if draw(st.booleans()):
        return body.replace(b'"uid":', b'"uid":' + value + b',"uid":', 1)
    key = draw(st.sampled_from([b"request", b"kind", b"apiVersion", b"response"]))
    pair = b'"' + key + b'":' + value
    if body.startswith(b"{") and body.endswith(b"}"):
        if draw(st.booleans()):
            return b"{" + pair + b"," + body[1:]
        return body[:-1] + b"," + pair + b"}"
    return body


def r_trailing(draw: st.DrawFn, body: bytes) -> bytes:
    tail = draw(
        st.sampled_from([b"x", b"\x00", b"{}", b"]", b",", b"\xff", b" \n\t", b"\r\n\r\n"])
        | st.binary(min_size=1, max_size=10)
    )
    return body + tail


def r_truncate(draw: st.DrawFn, body: bytes) -> bytes:
    return body[: draw(st.integers(0, max(len(body) - 1, 0)))]


def r_bad_bytes(draw: st.DrawFn, body: bytes) -> bytes:
    """Bytes that are not UTF-8 (or NULs) spliced in at a random offset."""
    at = draw(st.integers(0, len(body)))
    bad = draw(
        st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x00", b"\x80"])
    )
    return body[:at] + bad + body[at:]


def r_reencode(draw: st.DrawFn, body: bytes) -> bytes:
    """A BOM, UTF-16, or leading whitespace (valid)."""
    how = draw(st.sampled_from(["bom", "utf16", "space"]))
    if how == "bom":
        return b"\xef\xbb\xbf" + body
    if how == "space":
        return b" \n\t\r" + body
    try:
        return body.decode("utf-8").encode("utf-16")
    except UnicodeDecodeError:
        return body


RAW_MUTATIONS: tuple[Callable[[st.DrawFn, bytes], bytes], ...] = (
    r_duplicate_key,
    r_trailing,
    r_truncate,
    r_bad_bytes,
    r_reencode,
)


@st.composite
def mutated_reviews(draw: st.DrawFn) -> Garbage:
    """A captured review with 1-3 structural mutations, maybe a byte-level one, to its webhook
    (mostly) or to another."""
    name = draw(st.sampled_from(REVIEW_NAMES))
    m = Mutant(orjson.loads(REVIEW_BYTES[name]))
    for mutation in draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=3)):
        mutation(draw, m)
    body = m.encode()
    if draw(st.integers(0, 3)) == 0:
        body = draw(st.sampled_from(RAW_MUTATIONS))(draw, body)
    natural = natural_path(name)
    if natural is None or draw(st.integers(0, 4)) == 0:
        path = draw(st.sampled_from(WEBHOOK_PATHS))
    else:
        path = natural
    return Garbage("POST", path, body, chunked=draw(st.integers(0, 4)) == 0)


@st.composite
def random_bodies(draw: st.DrawFn) -> Garbage:
    """Random bytes, random JSON, random JSON in (or near) an AdmissionReview envelope."""
    how = draw(st.sampled_from(["bytes", "prefixed", "json", "envelope", "empty"]))
    if how == "bytes":
        body = draw(st.binary(max_size=4096))
    elif how == "prefixed":
        prefix = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":'
        body = prefix + draw(st.binary(max_size=512))
    elif how == "json":
        body = orjson.dumps(draw(JSON_VALUES))
    elif how == "envelope":
        request = draw(
            st.fixed_dictionaries(
                {"uid": st.text(min_size=1, max_size=8) | SCALARS},
                optional={
                    "kind": JSON_VALUES,
                    "resource": JSON_VALUES,
                    "operation": st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"])
                    | SCALARS,
                    "object": JSON_VALUES,
                    "oldObject": JSON_VALUES,
                    "subResource": JSON_VALUES,
                    "dryRun": JSON_VALUES,
                    "userInfo": JSON_VALUES,
                },
            )
            | JSON_VALUES
        )
        body = orjson.dumps({"apiVersion": API_VERSION, "kind": KIND, "request": request})
    else:
        body = b""
    path = draw(st.sampled_from(WEBHOOK_PATHS))
    return Garbage("POST", path, body, chunked=draw(st.booleans()))


@st.composite
def odd_requests(draw: st.DrawFn) -> Garbage:
    """Any method to any path, webhook or bogus, with a valid review or garbage as the body."""
    path = draw(st.sampled_from(WEBHOOK_PATHS + BOGUS_PATHS))
    method = draw(st.sampled_from(("POST", *ODD_METHODS)))
    name = draw(st.sampled_from(REVIEW_NAMES))
    body = draw(st.sampled_from([REVIEW_BYTES[name], b"", b"{}", b"garbage"]))
    return Garbage(method, path, body)


def garbage() -> st.SearchStrategy[Garbage]:
    """The mix for the memory test: mostly mutated reviews."""
    return st.one_of(mutated_reviews(), mutated_reviews(), random_bodies(), odd_requests())


def fuzz(
    strategy: st.SearchStrategy[Garbage], examples: int, run: Callable[[Garbage], None]
) -> None:
    """Runs `run` on `examples` generated requests (no shrinking: a failure names its input)."""

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.large_base_example,
        ],
    )
    @given(strategy)
    def inner(g: Garbage) -> None:
        run(g)

    inner()


# --- valid reviews still answered ---------------------------------------------------------------


def check_valid_review(client: httpx.Client) -> dict[str, Any]:
    review = fixture(VALID_FIXTURE)
    path = webhook_path(review, "mutate")
    assert path == "/mutate-trainer-kubeflow-org-v1alpha1-clustertrainingruntime"
    resp = client.post(path, content=orjson.dumps(review))
    assert resp.status_code == 200, resp.text
    response = check_review(resp.json(), review["request"]["uid"], orjson.dumps(review))
    assert response["allowed"] is True, response
    return response


# --- 1. hypothesis against the in-thread server ---------------------------------------------


def fuzz_against(
    client: httpx.Client, errors: ErrorRecords, strategy: st.SearchStrategy[Garbage], n: int
) -> Counter[str]:
    """Sends `n` generated requests, checking each answer and the server's error log; then a
    valid review. Counts the outcomes ("200 allowed", "200 denied 400", "413", ...)."""
    outcomes: Counter[str] = Counter()
    errors.take()

    def run(g: Garbage) -> None:
        resp = send(client, g)
        check_answer(resp, g, FUZZ_LIMIT)
        logged = errors.take()
        assert not logged, f"the server logged errors for {g.body[:300]!r}: {logged}"
        outcome = str(resp.status_code)
        if resp.status_code == 200:
            response = resp.json()["response"]
            allowed = response["allowed"]
            outcome += " allowed" if allowed else f" denied {response['status']['code']}"
        outcomes[outcome] += 1

    fuzz(strategy, n, run)
    check_valid_review(client)
    assert not errors.take()
    print(f"\n{sum(outcomes.values())} requests: {dict(outcomes.most_common())}")
    return outcomes


def test_random_bodies(fuzz_client: httpx.Client, error_records: ErrorRecords) -> None:
    outcomes = fuzz_against(fuzz_client, error_records, random_bodies(), 400)
    assert outcomes["400"] and outcomes["200 denied 400"], outcomes


def test_mutated_reviews(fuzz_client: httpx.Client, error_records: ErrorRecords) -> None:
    outcomes = fuzz_against(fuzz_client, error_records, mutated_reviews(), 1000)
    assert outcomes["400"] and outcomes["413"] and outcomes["200 denied 400"], outcomes
    assert outcomes["200 allowed"], outcomes  # some mutations leave a review the handlers judge


def test_methods_and_paths(fuzz_client: httpx.Client, error_records: ErrorRecords) -> None:
    outcomes = fuzz_against(fuzz_client, error_records, odd_requests(), 250)
    # Which reviews reach a handler intact is up to the draw; 404s and 405s always come up.
    assert outcomes["404"] and outcomes["405"], outcomes


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[" * 100_000,
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        b"[" * 1025 + b"]" * 1025,
        b"\xff\xfe\x00\x00",
        b"NaN",
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":NaN}}',
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"a"}}x',
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":7}}',
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":[]}',
        b"\x00" * 1000,
    ],
    ids=lambda body: repr(body[:24]),
)
def test_named_hostile_bodies(
    fuzz_client: httpx.Client, error_records: ErrorRecords, body: bytes
) -> None:
    """The issue's named cases, each on every webhook path: all plain 400s."""
    error_records.take()
    for path in WEBHOOK_PATHS:
        g = Garbage("POST", path, body)
        resp = send(fuzz_client, g)
        check_answer(resp, g, FUZZ_LIMIT)
        assert resp.status_code == 400, resp.text
    assert not error_records.take()


def test_uid_but_bad_contents_is_a_denied_review(fuzz_client: httpx.Client) -> None:
    """A readable uid with unreadable contents: HTTP 200, allowed false, status.code 400."""
    review = fixture(VALID_FIXTURE)
    review["request"]["uid"] = "\u00fcid-\U0001f600"
    review["request"]["operation"] = "PATCH"
    path = webhook_path(review, "mutate")
    resp = fuzz_client.post(path, content=orjson.dumps(review))
    assert resp.status_code == 200, resp.text
    response = check_review(resp.json(), "\u00fcid-\U0001f600")
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert "PATCH" in response["status"]["message"]


# --- 2. oversized and slow bodies -----------------------------------------------------------


def padded_review(size: int) -> bytes:
    """A valid review of exactly `size` bytes (padding in a field nobody reads)."""
    review = fixture(VALID_FIXTURE)
    review["request"]["padding"] = ""
    bare = len(orjson.dumps(review))
    assert size >= bare, (size, bare)
    review["request"]["padding"] = "x" * (size - bare)
    body = orjson.dumps(review)
    assert len(body) == size
    return body


def small_body(size: int) -> bytes:
    """A JSON body of exactly `size` bytes (the fixtures are bigger than SMALL_LIMIT)."""
    head = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"'
    return head + b"u" * (size - len(head) - 3) + b'"}}'


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_oversized_body_is_413(
    small_server: RunningServer, error_records: ErrorRecords, chunked: bool
) -> None:
    path = WEBHOOK_PATHS[1]
    error_records.take()
    with small_server.client() as client:
        for size in (SMALL_LIMIT + 1, 4 * SMALL_LIMIT, 200 * SMALL_LIMIT):
            g = Garbage("POST", path, b"[" + b" " * (size - 2) + b"]", chunked=chunked)
            resp = send(client, g)
            assert resp.status_code == 413, (size, resp.text)
            check_answer(resp, g, SMALL_LIMIT)
            assert str(SMALL_LIMIT) in resp.json()["error"]
        # At the limit: read, and answered on what it says (a review with a uid: 200).
        g = Garbage("POST", path, small_body(SMALL_LIMIT), chunked=chunked)
        resp = send(client, g)
        assert resp.status_code == 200, resp.text
        check_answer(resp, g, SMALL_LIMIT)
        # The connection was kept and the server still answers.
        g = Garbage("POST", path, small_body(200), chunked=chunked)
        check_answer(send(client, g), g, SMALL_LIMIT)
    assert not error_records.take()


def tls_socket(server: RunningServer) -> ssl.SSLSocket:
    port = urlsplit(server.url).port
    assert port is not None
    context = ssl.create_default_context(cafile=str(server.ca_file))
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return context.wrap_socket(sock, server_hostname="localhost")


def read_response(sock: ssl.SSLSocket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response: {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, headers, rest[:length]


def request_head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def test_declared_oversized_body_is_413_without_reading_it(tmp_path: Path) -> None:
    """Content-Length over the limit is refused at once: no waiting for the body (which would
    take the body timeout, 3 * STALL)."""
    limits = Limits(max_body_bytes=SMALL_LIMIT, body_timeout=3 * STALL)
    with (
        running_server(fixture_cache(), tmp_path / "certs", limits=limits) as patient,
        contextlib.closing(tls_socket(patient)) as sock,
    ):
        start = time.monotonic()
        sock.sendall(request_head(WEBHOOK_PATHS[0], 10 * 1024 * 1024))
        status, headers, body = read_response(sock)
        elapsed = time.monotonic() - start
    assert status == 413, body
    assert headers["content-type"] == "application/json"
    check_error(orjson.loads(body))
    assert elapsed < STALL, elapsed


def test_slow_body_is_408_and_others_are_answered_meanwhile(
    small_server: RunningServer, error_records: ErrorRecords
) -> None:
    error_records.take()
    path = WEBHOOK_PATHS[0]
    with small_server.client() as client, contextlib.ExitStack() as stack:
        g = Garbage("POST", path, small_body(300))
        check_answer(send(client, g), g, SMALL_LIMIT)  # the connection is warm

        def five_answers() -> None:
            for _ in range(5):
                check_answer(send(client, g), g, SMALL_LIMIT)

        baseline = fastest(five_answers)
        slow = [stack.enter_context(contextlib.closing(tls_socket(small_server))) for _ in range(3)]
        start = time.monotonic()
        for sock in slow:
            sock.sendall(request_head(path, 1000) + b'{"apiVersion"')
        # While three bodies hang, others are answered as fast as without them (had they waited
        # for the hanging bodies, each would take the body timeout, 0.5 s).
        meanwhile = fastest(five_answers, 1)
        assert meanwhile < 0.25 + 10 * baseline, (meanwhile, baseline)
        for sock in slow:
            status, headers, body = read_response(sock)
            elapsed = time.monotonic() - start
            assert status == 408, body
            assert headers["content-type"] == "application/json"
            check_error(orjson.loads(body))
            assert SLOW_TIMEOUT <= elapsed < STALL, elapsed
        check_answer(send(client, g), g, SMALL_LIMIT)
    assert not error_records.take()


def test_broken_http_is_refused_and_the_server_goes_on(
    small_server: RunningServer, error_records: ErrorRecords
) -> None:
    """Garbage below the body (request line, headers): uvicorn's own plain-text 400 and a closed
    connection, not a traceback; the server answers the next request."""
    error_records.take()
    path = WEBHOOK_PATHS[0].encode()
    broken = [
        b"GARBAGE\r\n\r\n",
        b"\x16\x03\x01\x00\xff\r\n\r\n",
        b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n"
        b"\r\n{}",
        b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ]
    with small_server.client() as client:
        for raw in broken:
            with contextlib.closing(tls_socket(small_server)) as sock:
                sock.sendall(raw)
                status, _, body = read_response(sock)
            assert status == 400, (raw, status, body)
            assert b"Traceback" not in body, body
            g = Garbage("POST", WEBHOOK_PATHS[0], small_body(100))
            check_answer(send(client, g), g, SMALL_LIMIT)
    assert not error_records.take()


# --- 3-5. memory, a valid review afterwards, and the log, from a real process ---------------

MEMORY_DISTINCT = 1000  # generated requests, each sent MEMORY_REQUESTS / MEMORY_DISTINCT times
MEMORY_REQUESTS = 3000
MEMORY_WARMUP = 300
MEMORY_BOUND_KIB = 40 * 1024


def test_memory_bounded_and_logged(tmp_path: Path) -> None:
    """~3000 garbage requests to `python -m webhook serve`: RSS stays flat after a warm-up, a
    valid review is answered afterwards, and the log has a line per request and no traceback."""
    pool: list[Garbage] = []
    fuzz(garbage(), MEMORY_DISTINCT, pool.append)
    requests = [pool[i % len(pool)] for i in range(MEMORY_REQUESTS)]  # rounds over the pool
    cert_dir = tmp_path / "certs"
    ca = make_certs(cert_dir)
    statuses: dict[int, int] = {}
    rss: dict[str, int] = {}
    with server_process(cert_dir, "--max-body-bytes", str(PROCESS_LIMIT)) as proc:
        verify = ssl.create_default_context(cafile=str(ca))
        with httpx.Client(base_url=proc.url, verify=verify, timeout=10) as client:
            check_valid_review(client)
            rss["start"] = proc.rss_kib()
            for sent, g in enumerate(requests, 1):
                resp = send(client, g)
                try:
                    check_answer(resp, g, PROCESS_LIMIT)
                except AssertionError as err:
                    raise AssertionError(f"request {sent}: {g!r:.3000}") from err
                statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
                if sent == MEMORY_WARMUP:
                    rss["warm"] = proc.rss_kib()
            rss["end"] = proc.rss_kib()
            check_valid_review(client)
        assert proc.process.poll() is None, "the server died"
    # The process has exited: its log is complete.
    growth = rss["end"] - rss["warm"]
    print(
        f"\n{len(requests)} garbage requests ({len(pool)} distinct), statuses "
        f"{dict(sorted(statuses.items()))}; RSS KiB: start {rss['start']}, after "
        f"{MEMORY_WARMUP} {rss['warm']}, end {rss['end']}, growth after warm-up {growth} "
        f"({growth / 1024:.1f} MiB)"
    )
    assert len(pool) >= MEMORY_DISTINCT * 9 // 10, len(pool)
    assert growth < MEMORY_BOUND_KIB, rss

    text = proc.log_file.read_text()
    assert "Traceback" not in text, text[text.index("Traceback") - 2000 :][:4000]
    lines = proc.log_lines()
    crashed = [line for line in lines if line["msg"] == "handler failed"]
    assert not crashed, crashed[:3]
    errors = [line for line in lines if line["level"] in ("error", "critical")]
    assert not errors, errors[:3]
    reviews = [line for line in lines if line["msg"] == "admission review"]
    rejected = [line for line in lines if line["msg"] == "request rejected"]
    by_webhook = [line for line in rejected if "webhook" in line]
    by_router = [line for line in rejected if "webhook" not in line]
    # A line per review answered, a line per plain error from a webhook; 404s and 405s come
    # from the router, which logs them too (or, before it did, not at all).
    assert len(reviews) == statuses.get(200, 0) + 2, len(reviews)  # + the two valid reviews
    assert len(by_webhook) == statuses.get(400, 0) + statuses.get(413, 0), len(by_webhook)
    assert len(by_router) in (0, statuses.get(404, 0) + statuses.get(405, 0)), len(by_router)
    assert {line["status"] for line in by_webhook} <= {400, 413}
    assert {line["status"] for line in by_router} <= {404, 405}
    assert all(isinstance(line["error"], str) and line["error"] for line in by_webhook)
    assert all(line["uid"] and line["decision"] in ("allowed", "denied") for line in reviews)
    print(
        f"log: {len(reviews)} 'admission review', {len(by_webhook)} + {len(by_router)} "
        "'request rejected' (webhook + router) lines"
    )


# --- inputs that once crashed the server (found by the fuzzing above) -------------------------


def deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("operation", [b"{}", b"[]", b'["CREATE"]'])
def test_operation_of_any_json_type(
    fuzz_client: httpx.Client, error_records: ErrorRecords, operation: bytes
) -> None:
    error_records.take()
    body = (
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":'
        b'{"uid":"u-1","kind":{},"resource":{},"operation":' + operation + b"}}"
    )
    g = Garbage("POST", "/mutate--v1-pod", body)
    resp = send(fuzz_client, g)
    logged = error_records.take()
    check_answer(resp, g, FUZZ_LIMIT)
    assert not logged, logged
    assert resp.json()["response"]["status"]["code"] == 400


@pytest.mark.parametrize("field", [b"kind", b"apiVersion"])
def test_deep_value_in_the_envelope(
    fuzz_client: httpx.Client, error_records: ErrorRecords, field: bytes
) -> None:
    error_records.take()
    body = b'{"' + field + b'":' + deep(1000) + b"}"
    g = Garbage("POST", "/mutate--v1-pod", body)
    resp = send(fuzz_client, g)
    logged = error_records.take()
    check_answer(resp, g, FUZZ_LIMIT)
    assert not logged, logged


@pytest.mark.parametrize(
    "name",
    [
        "clustertrainingruntime-create-level1.mutate.json",
        "trainingruntime-create.mutate.json",
        "workload-create-gang-without-mincount-patched.mutate.json",
    ],
)
def test_deep_object_in_a_mutation(
    fuzz_client: httpx.Client, error_records: ErrorRecords, name: str
) -> None:
    error_records.take()
    review = fixture(name)
    review["request"]["object"]["spec"]["deep"] = "@@deep@@"
    body = orjson.dumps(review).replace(b'"@@deep@@"', deep(600))
    g = Garbage("POST", webhook_path(review, "mutate"), body)
    resp = send(fuzz_client, g)
    logged = error_records.take()
    check_answer(resp, g, FUZZ_LIMIT)
    assert not logged, logged

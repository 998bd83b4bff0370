"""Raw requests through the official client's own request path (`param_serialize` + `call_api`,
as its generated methods do: authentication, TLS and retries are the client's), for what its
typed APIs would cost too much to import (`CoreV1Api`: 1.5 s of CPU) or cannot address
(`CustomObjectsApi` only knows `/apis/<group>`, not the core group's `/api/v1`)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import orjson
from kubernetes.aio.client import ApiClient
from kubernetes.aio.client.exceptions import ApiException

Json = dict[str, Any]


def collection(group: str, version: str, plural: str, namespace: str | None = None) -> str:
    """The URL path of a resource's collection (in a namespace, or cluster-wide)."""
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    scope = f"/namespaces/{quote(namespace, safe='')}" if namespace else ""
    return f"{prefix}{scope}/{plural}"


async def request(
    api: ApiClient,
    method: str,
    path: str,
    *,
    query: list[tuple[str, Any]] | None = None,
    timeout: float = 10.0,
) -> Any:  # the raw (aiohttp) response: the caller reads and releases it
    serialize: Any = api.param_serialize  # untyped in the client
    params = await serialize(
        method=method,
        resource_path=path,
        query_params=query or [],
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
    )
    call: Any = api.call_api
    response = await call(*params, _preload_content=False, _request_timeout=timeout)
    return response.response


def status_message(err: ApiException) -> str:
    """The `message` of the Status an API error carries ("" when it carries none)."""
    try:
        status = orjson.loads(err.body) if isinstance(err.body, str | bytes) and err.body else {}
    except orjson.JSONDecodeError:
        return ""
    message = status.get("message") if isinstance(status, dict) else None
    return message if isinstance(message, str) else ""


async def body_of(response: Any) -> bytes:
    """The body of a raw (aiohttp) response, read and the connection released; an ApiException
    (the status, and the start of the body) unless it is a 2xx."""
    try:
        body: bytes = await response.read()
    finally:
        response.release()
    if not 200 <= response.status < 300:
        text = body[:500].decode(errors="replace")
        raise ApiException(status=response.status, reason=response.reason, body=text)
    return body


async def json_of(response: Any) -> Json:
    """The body of a raw response as a JSON object; an ApiException unless it is a 2xx."""
    obj = orjson.loads(await body_of(response))
    if not isinstance(obj, dict):
        raise ValueError("the answer is not a JSON object")
    return obj


async def get_json(
    api: ApiClient, path: str, query: list[tuple[str, Any]] | None = None, timeout: float = 10.0
) -> Json:
    return await json_of(await request(api, "GET", path, query=query, timeout=timeout))


def items_of(listing: Json) -> list[Json]:
    """A list's items, each with its `apiVersion` and `kind`. A real API server leaves them off
    the items of a built-in kind's list (kubernetes/kubernetes#3030; a custom resource's items
    carry them), and readers tell a version's shapes by `apiVersion` (1.36's PodGroup condition
    is not 1.37's), as a watch event's object carries it."""
    items = listing.get("items")
    version, kind = listing.get("apiVersion"), listing.get("kind")
    item_kind = kind.removesuffix("List") if isinstance(kind, str) else None
    out: list[Json] = []
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        if "apiVersion" not in item and isinstance(version, str):
            item["apiVersion"] = version
        if "kind" not in item and item_kind:
            item["kind"] = item_kind
        out.append(item)
    return out

"""What a refused request means: the namespace is gone (or going), or a rule is missing.

The API server says the same thing again until someone acts (a rule granted, a namespace created
again, a namespace taken out of `--watch-namespaces`), so a refusal is said once and retried
slowly, never in a loop (`informer.py`), or, for an Event, not retried at all (`events.py`).

* `namespace-gone`: a 404 whose Status names the namespace (`namespaces "x" not found`), or a
  403 with the cause `NamespaceTerminating` (`unable to create new content in namespace x
  because it is being terminated`), as the NamespaceLifecycle admission plugin words it;
* `forbidden`: any other 403. RBAC says the same of a missing rule and of a namespace deleted
  with its Role and RoleBinding (the chart grants each watched namespace a Role of its own), so
  a namespaced informer asks the namespace itself to tell them apart (`namespace_state`).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal
from urllib.parse import quote

import orjson
from kubernetes.aio.client import ApiClient
from kubernetes.aio.client.exceptions import ApiException

from . import rest

Refusal = Literal["namespace-gone", "forbidden"]
NAMESPACE_GONE: Refusal = "namespace-gone"
FORBIDDEN: Refusal = "forbidden"
REFUSALS: tuple[Refusal, ...] = (NAMESPACE_GONE, FORBIDDEN)
TERMINATING_CAUSE = "NamespaceTerminating"
NamespaceState = Literal["gone", "terminating", "active", "unknown"]


def status_of(err: ApiException) -> dict[str, Any]:
    """The Status an API error carries ({} when its body is not one)."""
    try:
        status = orjson.loads(err.body) if isinstance(err.body, str | bytes) and err.body else {}
    except orjson.JSONDecodeError:
        return {}
    return status if isinstance(status, dict) else {}


def refusal_of(err: ApiException, namespace: str | None) -> Refusal | None:
    """How `err`, the answer to a request in `namespace` (None: cluster-wide), refuses it; None
    when it is not a refusal (a 5xx, a 404 of a resource not served, ...)."""
    if err.status not in (403, 404):
        return None
    status = status_of(err)
    if err.status == 403:
        return NAMESPACE_GONE if _terminating(status, err) else FORBIDDEN
    return NAMESPACE_GONE if namespace and names_namespace(status, namespace) else None


def names_namespace(status: dict[str, Any], namespace: str) -> bool:
    """Whether a NotFound Status is about the namespace itself."""
    details = status.get("details")
    if isinstance(details, dict) and details.get("kind") == "namespaces":
        return details.get("name") == namespace
    return status.get("message") == f'namespaces "{namespace}" not found'


def _terminating(status: dict[str, Any], err: ApiException) -> bool:
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    if any(
        isinstance(c, dict) and c.get("reason") == TERMINATING_CAUSE
        for c in (causes if isinstance(causes, list) else [])[:16]
    ):
        return True
    # The body may be cut short (rest.body_of keeps its start): the message comes first.
    text = status.get("message") or (err.body if isinstance(err.body, str) else "")
    return isinstance(text, str) and "because it is being terminated" in text


async def namespace_state(api: ApiClient, namespace: str, timeout: float = 10.0) -> NamespaceState:
    """Whether `namespace` exists, asked of the API server: "unknown" when it will not say (the
    service may not get namespaces: the chart does not grant it) or cannot be asked now."""
    try:
        path = rest.collection("", "v1", "namespaces") + f"/{quote(namespace, safe='')}"
        found = await rest.get_json(api, path, timeout=timeout)
    except asyncio.CancelledError:
        raise
    except ApiException as err:
        gone = err.status == 404 and names_namespace(status_of(err), namespace)
        return "gone" if gone else "unknown"
    except Exception:  # a dropped connection, a timeout: the next retry asks again
        return "unknown"
    meta, status = found.get("metadata"), found.get("status")
    deleting = isinstance(meta, dict) and bool(meta.get("deletionTimestamp"))
    phase = status.get("phase") if isinstance(status, dict) else None
    return "terminating" if deleting or phase == "Terminating" else "active"

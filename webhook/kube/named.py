"""Single objects by name through the official client: the certificate Secret and the two webhook
configurations. Get, create, replace (with the resourceVersion read), JSON Patch, and a watch of
just that object.

The watch asks for `fieldSelector=metadata.name=<name>`: an RBAC rule with `resourceNames` allows
list and watch only so. It starts from a GET (the `get` verb, so no `list` is needed) and resumes
from the last resourceVersion seen; 410 Gone, or a stream that ends before the object was ever
seen, means GET again. Objects are plain dicts, the API's JSON.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kubernetes.aio.client import ApiClient
from kubernetes.aio.client.exceptions import ApiException

from .informer import MIN_WATCH_SECONDS, Backoff, _event
from .rest import json_of

log = logging.getLogger("webhook.named")

Json = dict[str, Any]
SECRETS = "secrets"
MUTATING = "mutatingwebhookconfigurations"
VALIDATING = "validatingwebhookconfigurations"
JSON_PATCH = "application/json-patch+json"


@dataclass(frozen=True)
class Ref:
    resource: str  # SECRETS, MUTATING or VALIDATING
    name: str
    namespace: str | None = None  # only for Secrets

    def __str__(self) -> str:
        where = f' in namespace "{self.namespace}"' if self.namespace else ""
        return f'{self.resource} "{self.name}"{where}'

    @property
    def group(self) -> str:
        return "" if self.resource == SECRETS else "admissionregistration.k8s.io"


def secret(ref: Ref, data: dict[str, str], resource_version: str | None = None) -> Json:
    """A kubernetes.io/tls Secret holding `data` (base64), labelled as this service's."""
    meta: Json = {
        "name": ref.name,
        "namespace": ref.namespace,
        "labels": {"app.kubernetes.io/managed-by": "trainjob-scheduling-webhook"},
    }
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "kubernetes.io/tls",
        "data": data,
    }


class Named:
    """Requests for one object, each with a timeout, through the client's own request path
    (`param_serialize` + `call_api`, as its generated methods do: authentication, TLS and
    retries are the client's). Not `CoreV1Api` itself: importing it costs 1.5 s of CPU."""

    def __init__(self, api: ApiClient, timeout: float = 10.0) -> None:
        self.api = api
        self.timeout = timeout

    def _path(self, ref: Ref, *, one: bool = True) -> str:
        if ref.resource == SECRETS:
            path = f"/api/v1/namespaces/{ref.namespace}/secrets"
        else:
            path = f"/apis/admissionregistration.k8s.io/v1/{ref.resource}"
        return f"{path}/{ref.name}" if one else path

    async def _request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, Any]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Any:  # the raw (aiohttp) response
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        serialize: Any = self.api.param_serialize  # untyped in the client
        params = await serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        call: Any = self.api.call_api
        response = await call(
            *params, _preload_content=False, _request_timeout=timeout or self.timeout
        )
        return response.response

    async def get(self, ref: Ref) -> Json | None:
        """The object, or None when there is none (404)."""
        try:
            return await json_of(await self._request("GET", self._path(ref)))
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    async def create(self, ref: Ref, body: Json) -> Json:
        return await json_of(await self._request("POST", self._path(ref, one=False), body=body))

    async def replace(self, ref: Ref, body: Json) -> Json:
        """A PUT; with the resourceVersion in `body`, 409 if the object changed since."""
        return await json_of(await self._request("PUT", self._path(ref), body=body))

    async def json_patch(self, ref: Ref, ops: list[Json]) -> Json:
        response = await self._request("PATCH", self._path(ref), body=ops, content_type=JSON_PATCH)
        return await json_of(response)

    async def watch(self, ref: Ref, resource_version: str | None, timeout_seconds: int) -> Any:
        """The raw response of a watch of just this object: a stream of JSON lines."""
        query: list[tuple[str, Any]] = [
            ("fieldSelector", f"metadata.name={ref.name}"),
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", timeout_seconds),
        ]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        # The request's own timeout outlasts the watch's, or long watches would be cut short.
        path = self._path(ref, one=False)
        return await self._request("GET", path, query=query, timeout=timeout_seconds + 30)


# Told what the object is now (None: there is none), after every change.
Changed = Callable[[Json | None], None]
# Told of a failed request (the verb and the error); None once a request succeeds again.
Failed = Callable[[str, Exception | None], None]


class NamedWatch:
    """Follows one object for as long as it runs: `on_change` hears every state it reaches."""

    def __init__(
        self,
        named: Named,
        ref: Ref,
        on_change: Changed,
        on_error: Failed,
        *,
        watch_timeout: int = 300,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.named = named
        self.ref = ref
        self.on_change = on_change
        self.on_error = on_error
        self.watch_timeout = watch_timeout
        self.backoff = backoff or Backoff(initial=1.0, maximum=60.0)
        self.sleep = sleep
        self.clock = clock
        self.object: Json | None = None
        self.loaded = False  # the first GET has answered
        self._rv: str | None = None

    def _set(self, obj: Json | None) -> None:
        self.object = obj
        meta = obj.get("metadata") if obj is not None else None
        if isinstance(meta, dict) and isinstance(meta.get("resourceVersion"), str):
            self._rv = meta["resourceVersion"]
        self.on_change(obj)

    def seen(self, obj: Json | None) -> None:
        """An answer to our own write (or a fresher read): newer than the watch may have yet."""
        self.object = obj

    async def run(self) -> None:
        while True:
            verb = "get"
            try:
                if self._rv is None:
                    self._set(await self.named.get(self.ref))
                    self.loaded = True
                verb = "watch"
                started = self.clock()
                events = await self._watch()
                self.on_error(verb, None)
                if events == 0 and self.clock() - started < MIN_WATCH_SECONDS:
                    raise ValueError("the watch ended at once without events")
                if self.object is None:
                    self._rv = None  # nothing to resume from: GET again
            except asyncio.CancelledError:
                raise
            except ApiException as err:
                if err.status == 410:
                    self._rv = None
                    continue
                await self._failed(verb, err)
            except Exception as err:  # dropped connections, timeouts, garbage on the stream
                await self._failed(verb, err)

    async def _watch(self) -> int:
        response = await self.named.watch(self.ref, self._rv, self.watch_timeout)
        events = 0
        try:
            if response.status != 200:
                body = (await response.read())[:500].decode(errors="replace")
                raise ApiException(status=response.status, reason=response.reason, body=body)
            self.on_error("watch", None)  # the watch is allowed and running
            self.backoff.reset()
            async for line in response.content:
                if not line.strip():
                    continue
                event = _event(line)
                events += 1
                obj = event.get("object")
                if not isinstance(obj, dict):
                    continue
                if event.get("type") in ("ADDED", "MODIFIED"):
                    self._set(obj)
                elif event.get("type") == "DELETED":
                    self._set(None)
                    self._rv = obj.get("metadata", {}).get("resourceVersion") or self._rv
                elif event.get("type") == "BOOKMARK":
                    rv = obj.get("metadata", {}).get("resourceVersion")
                    self._rv = rv if isinstance(rv, str) else self._rv
        finally:
            response.release()
        return events

    async def _failed(self, verb: str, err: Exception) -> None:
        self.on_error(verb, err)
        await self.sleep(self.backoff.next_delay())

"""A Kubernetes API server for the cache's tests: kmock's emulator, plus what informers rely on.

kmock's `KubernetesEmulator` keeps objects in memory and serves list, watch, create, merge-patch
and delete over real HTTP, but its lists say `resourceVersion: "..."`, its objects have none,
and a watch ignores `resourceVersion` and `timeoutSeconds` (it replays every object as ADDED,
then follows live events forever). `VersionedEmulator` adds the API server's contract that
list+watch depends on:

* every create, update and delete gets the next resourceVersion, stamped on the stored object
  and on its watch event; a list carries the version it is a snapshot of;
* a watch from a resourceVersion replays the events after it (nothing missed, nothing twice);
  one from a version older than the last `compact()` gets an ERROR event with code 410
  (`Expired`), as from the API server's watch cache; a watch without one starts with ADDED
  events for the objects that exist, then follows;
* `timeoutSeconds` ends a watch (a clean end of the stream);
* `drop_watches()` cuts the connections of the open watches, mid-stream.

Failures for one request are kmock reactions, e.g. `next_requests(k[WATCH, TRAINJOBS], 2) <<
status(500)`: they answer before the emulator's own (fallback) handlers.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import copy
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import attrs
import kmock
import yaml
from kmock import KubernetesEmulator, Server
from kmock._internal.aiobus import Bus  # not exported by kmock 0.8, though the emulator uses it
from kmock._internal.rendering import Response  # ditto: a status with a body, for reactions

TRAINER = "trainer.kubeflow.org"
VERSION = "v1alpha1"
TRAINJOBS = kmock.resource(TRAINER, VERSION, "trainjobs")
TRAINING_RUNTIMES = kmock.resource(TRAINER, VERSION, "trainingruntimes")
CLUSTER_RUNTIMES = kmock.resource(TRAINER, VERSION, "clustertrainingruntimes")

LIST = kmock.action.LIST
WATCH = kmock.action.WATCH

_KINDS = {
    TRAINJOBS: ("TrainJob", True),
    TRAINING_RUNTIMES: ("TrainingRuntime", True),
    CLUSTER_RUNTIMES: ("ClusterTrainingRuntime", False),
}


def declare_trainer_resources(emulator: KubernetesEmulator) -> None:
    """kmock answers 404 for a resource it does not know: declare Kubeflow Trainer's three."""
    for resource, (kind, namespaced) in _KINDS.items():
        emulator.resources[resource] = kmock.ResourceInfo(
            kind=kind, namespaced=namespaced, verbs={"list", "watch", "get", "create", "patch"}
        )


@dataclass(frozen=True)
class _Event:
    rv: int
    resource: kmock.resource
    namespace: str | None
    event: dict[str, Any]


class _JournalBus(Bus[Any]):
    """The per-resource bus the base emulator announces changes on; stamps and journals them."""

    def __init__(self, emulator: VersionedEmulator, resource: kmock.resource) -> None:
        super().__init__()
        self.emulator = emulator
        self.resource = resource

    async def put(self, *items: Any) -> None:
        for item in items:
            self.emulator._record(self.resource, item)
        async with self.emulator._changed:
            self.emulator._changed.notify_all()
        await super().put(*items)


class _JournalBuses(dict[kmock.resource, Bus[Any]]):
    def __init__(self, emulator: VersionedEmulator) -> None:
        super().__init__()
        self.emulator = emulator

    def __missing__(self, resource: kmock.resource) -> Bus[Any]:
        bus = self[resource] = _JournalBus(self.emulator, resource)
        return bus


@attrs.define(kw_only=True)
class VersionedEmulator(KubernetesEmulator):
    """kmock's emulator with resourceVersions, resumable watches, 410 Gone and watch timeouts."""

    _rv: int = attrs.field(default=0, init=False)
    _compacted: int = attrs.field(default=0, init=False)
    _journal: list[_Event] = attrs.field(factory=list, init=False)
    _changed: asyncio.Condition = attrs.field(factory=asyncio.Condition, init=False)
    _open_watches: set[kmock.Request] = attrs.field(factory=set, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._buses = _JournalBuses(self)

    @property
    def resource_version(self) -> int:
        return self._rv

    @property
    def open_watches(self) -> int:
        return len(self._open_watches)

    def compact(self) -> None:
        """Forget the history so far: a watch from any version before now gets 410 Gone."""
        self._compacted = self._rv

    def drop_watches(self) -> int:
        """Cut the TCP connections of all open watches (the client sees a broken stream)."""
        dropped = 0
        for request in list(self._open_watches):
            raw = request._raw_request
            transport = raw.transport if raw is not None else None
            if transport is not None and not transport.is_closing():
                transport.abort()
                dropped += 1
        return dropped

    def _record(self, resource: kmock.resource, event: dict[str, Any]) -> None:
        # Called by the base emulator under its lock, once per change, in order.
        self._rv += 1
        obj = event.get("object")
        if isinstance(obj, dict):
            obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
            namespace = obj["metadata"].get("namespace")
        else:
            namespace = None
        self._journal.append(_Event(self._rv, resource, namespace, copy.deepcopy(event)))

    def _current(self, request: kmock.Request) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(obj.raw)
            for (resource, namespace, _), obj in self.objects.items()
            if resource == request.resource
            and not obj.deleted
            and (request.namespace is None or namespace == request.namespace)
        ]

    def _known(self, request: kmock.Request) -> bool:
        return any(resource == request.resource for resource in self._get_resources())

    async def _serve_list(self, request: kmock.Request) -> kmock.Payload:
        if not self._known(request):
            raise kmock.KubernetesResourceNotFoundError()
        assert request.resource is not None
        async with self._lock:
            items, rv = self._current(request), self._rv
        info = self.resources[request.resource]
        return {
            "apiVersion": f"{request.resource.group}/{request.resource.version}",
            "kind": f"{info.kind or 'Object'}List",
            "metadata": {"resourceVersion": str(rv)},
            "items": items,
        }

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[kmock.Payload]:
        yield b""  # the headers go out now, as from the API server
        since = request.params.get("resourceVersion", "")
        timeout = request.params.get("timeoutSeconds")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(timeout) if timeout else None
        async with self._lock:
            if since in ("", "0"):  # "start at most recent": the objects, then the changes
                initial = [{"type": "ADDED", "object": obj} for obj in self._current(request)]
                position = len(self._journal)
            elif not since.isdigit() or int(since) < self._compacted:
                yield expired_event(since, self._compacted)
                return
            else:
                initial = []
                position = bisect.bisect_right([e.rv for e in self._journal], int(since))
        for event in initial:
            yield event
        raw = request._raw_request
        transport = raw.transport if raw is not None else None
        self._open_watches.add(request)
        try:
            while transport is not None and not transport.is_closing():
                pending = self._journal[position:]
                position += len(pending)
                for entry in pending:
                    if entry.resource == request.resource and (
                        request.namespace is None or entry.namespace == request.namespace
                    ):
                        yield copy.deepcopy(entry.event)
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return  # timeoutSeconds: the API server ends the stream cleanly
                wait = 0.05 if remaining is None else min(0.05, remaining)
                async with self._changed:
                    if len(self._journal) == position:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._changed.wait(), wait)
        finally:
            self._open_watches.discard(request)


# --- responses for kmock reactions --------------------------------------------------------------


def status_object(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


def expired_event(since: str = "1", oldest: int = 2) -> dict[str, Any]:
    """The watch event the API server sends for a resourceVersion it no longer has."""
    message = f"too old resource version: {since} ({oldest})"
    return {"type": "ERROR", "object": status_object(410, "Expired", message)}


def status(code: int) -> Response:
    """An HTTP error with a Status body, as the API server answers a failed request."""
    body = status_object(code, "InternalError" if code >= 500 else "Gone", f"injected {code}")
    return Response(status=code, payload=body)


async def broken_stream(request: kmock.Request) -> AsyncIterator[bytes]:
    """A watch whose connection breaks after the headers, before any event."""
    yield b""
    raw = request._raw_request
    if raw is not None and raw.transport is not None:
        raw.transport.abort()


def next_requests(view: kmock.View, count: int = 1) -> kmock.View:
    """The next `count` requests `view` will see (kmock slices count from the first ever)."""
    seen = len(view)
    return view[seen : seen + count]


# --- the emulator on a port, and a kubeconfig for it --------------------------------------------


@contextlib.asynccontextmanager
async def emulator() -> AsyncIterator[tuple[VersionedEmulator, str]]:
    """A `VersionedEmulator` (with Kubeflow Trainer's resources declared) and its URL."""
    async with VersionedEmulator() as k, Server(k) as server:
        declare_trainer_resources(k)
        yield k, str(server.url).rstrip("/")


@contextlib.asynccontextmanager
async def plain_emulator() -> AsyncIterator[tuple[KubernetesEmulator, str]]:
    """kmock's own `KubernetesEmulator` as it comes (resources declared) and its URL."""
    async with KubernetesEmulator() as k, Server(k) as server:
        declare_trainer_resources(k)
        yield k, str(server.url).rstrip("/")


def kubeconfig(url: str) -> str:
    """A kubeconfig for a plain-HTTP API server without authentication."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "anonymous", "user": {}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "anonymous"}}],
        "current-context": "emulator",
    }
    return yaml.safe_dump(config)


async def create(k: KubernetesEmulator, resource: kmock.resource, obj: dict[str, Any]) -> None:
    """POSTs `obj` to the emulator (as a client would), so watches see it."""
    meta = dict(obj.get("metadata") or {})
    meta.pop("resourceVersion", None)  # the API server refuses a create that sets it
    body = {**obj, "metadata": meta}
    namespace = meta.get("namespace")
    async with k.post(_path(resource, namespace), json=body) as response:
        assert response.status == 200, await response.text()


async def patch(
    k: KubernetesEmulator, resource: kmock.resource, namespace: str | None, name: str, body: Any
) -> None:
    """A merge patch (None deletes a key)."""
    async with k.patch(f"{_path(resource, namespace)}/{name}", json=body) as response:
        assert response.status == 200, await response.text()


async def delete(
    k: KubernetesEmulator, resource: kmock.resource, namespace: str | None, name: str
) -> None:
    async with k.delete(f"{_path(resource, namespace)}/{name}") as response:
        assert response.status == 200, await response.text()


def _path(resource: kmock.resource, namespace: str | None) -> str:
    ns = f"/namespaces/{namespace}" if namespace else ""
    return f"/apis/{resource.group}/{resource.version}{ns}/{resource.plural}"

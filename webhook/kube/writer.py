"""The reconciler's writes to the API server: the only place it talks to it.

Every call goes through a client-side rate limit (QPS with a burst, as client-go's) and has a
timeout, so a slow API server costs a retry, never a stuck worker. Errors are the client's
`ApiException` (HTTP status in `.status`) or `asyncio.TimeoutError`/connection errors.

Two lanes (`WriteLanes`), gang objects first: the writes that make or fix a gang (creates, JSON
patches and deletes of Workloads and PodGroups, and the runtime snapshot on the TrainJob, which
the gang waits for) have their own budget; the writes that only report (the GangScheduling
condition, Events) have another, and wait while a gang write is waiting or under way. Until a
PodGroup exists kube-scheduler holds its pods: a burst of new TrainJobs gets its gangs before
it is told about them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kubernetes.aio.client import ApiClient, CustomObjectsApi

from ..backends.base import Kind
from ..core.condition import FIELD_MANAGER
from ..core.snapshot import SNAPSHOT_ANNOTATION
from ..core.trainer import TRAINER_API_VERSION, TRAINJOB_KIND
from .client import TRAINJOBS
from .rest import body_of

JsonObject = dict[str, Any]


class TokenBucket:
    """`qps` requests a second on average, up to `burst` at once; `acquire` waits its turn."""

    def __init__(
        self,
        qps: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self.clock = clock
        self.sleep = sleep
        self._tokens = float(self.burst)
        self._last = clock()

    async def acquire(self) -> None:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
        self._last = now
        self._tokens -= 1  # reserve now, so concurrent callers queue up behind each other
        if self._tokens < 0:
            await self.sleep(-self._tokens / self.qps)


# A reporting write waits for the gang lane at most this long: a steady stream of new gangs
# delays the conditions and Events, it never stops them.
MAX_REPORT_DEFER = 10.0
SETTLE_TURNS = 3


class WriteLanes:
    """Two budgets, gang objects first. `gang_write` holds a gang write's place (waiting for its
    token, then under way); `report_turn` lets a reporting write go once no gang write holds one
    (or after `max_defer` seconds), then takes a token from the reporting budget. The budgets
    are apart, so what reports never spends what a burst of gangs needs."""

    def __init__(
        self,
        gang: TokenBucket,
        report: TokenBucket,
        max_defer: float = MAX_REPORT_DEFER,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.gang = gang
        self.report = report
        self.max_defer = max_defer
        self.sleep = sleep
        self.gang_busy = 0  # gang writes waiting for a token or under way
        self._gang_idle = asyncio.Event()
        self._gang_idle.set()

    @contextlib.asynccontextmanager
    async def gang_write(self) -> AsyncIterator[None]:
        self.gang_busy += 1
        self._gang_idle.clear()
        try:
            await self.gang.acquire()
            yield
        finally:
            self.gang_busy -= 1
            if not self.gang_busy:
                self._gang_idle.set()

    async def report_turn(self) -> None:
        deferred = asyncio.ensure_future(self.sleep(self.max_defer))
        try:
            await self._settle()
            while self.gang_busy and not deferred.done():
                idle = asyncio.ensure_future(self._gang_idle.wait())
                try:
                    await asyncio.wait((idle, deferred), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    idle.cancel()
                await self._settle()
        finally:
            deferred.cancel()
        await self.report.acquire()

    @staticmethod
    async def _settle() -> None:
        """A few turns of the event loop: a worker between two passes holds no gang write, and
        starts its next pass's first one within two turns (one `sleep(0)`, then the queue)."""
        for _ in range(SETTLE_TURNS):
            await asyncio.sleep(0)


@dataclass(frozen=True)
class WriterSettings:
    qps: float = 20.0  # reporting writes: conditions and Events
    burst: int = 30
    gang_qps: float = 100.0  # gang objects and the runtime snapshot
    gang_burst: int = 200
    timeout: float = 10.0

    def lanes(self) -> WriteLanes:
        return WriteLanes(
            TokenBucket(self.gang_qps, self.gang_burst), TokenBucket(self.qps, self.burst)
        )


class ApiWriter:
    def __init__(
        self,
        api: ApiClient,
        settings: WriterSettings = WriterSettings(),
        lanes: WriteLanes | None = None,
    ) -> None:
        self.objects = CustomObjectsApi(api)
        self.settings = settings
        self.lanes = lanes or settings.lanes()

    async def create(self, r: Kind, obj: JsonObject) -> JsonObject:
        ns = obj["metadata"]["namespace"]
        created: JsonObject = await self._gang(
            self.objects.create_namespaced_custom_object, r.group, r.version, ns, r.plural, obj
        )
        return created

    async def delete(self, r: Kind, namespace: str, name: str, uid: str | None) -> None:
        """Deletes with a uid precondition, so a newer object of the same name is never hit;
        background propagation, as the garbage collector would."""
        body: JsonObject = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        await self._gang(
            self.objects.delete_namespaced_custom_object,
            r.group, r.version, namespace, r.plural, name, body=body,
        )  # fmt: skip

    async def json_patch(
        self, r: Kind, namespace: str, name: str, ops: list[JsonObject]
    ) -> JsonObject:
        patched: JsonObject = await self._gang(
            self.objects.patch_namespaced_custom_object,
            r.group, r.version, namespace, r.plural, name, ops,
            _content_type="application/json-patch+json",
        )  # fmt: skip
        return patched

    async def snapshot_runtime(
        self, namespace: str, name: str, uid: str, value: str, resource_version: str | None
    ) -> None:
        """Writes the runtime snapshot annotation on a TrainJob with a merge patch (other
        annotations stay). Preconditions: the uid keeps it off a TrainJob recreated under the
        same name (the API server refuses to change a uid: 422 Invalid; 404 if the name is gone),
        and the resourceVersion the writer decided from (409 Conflict if the TrainJob changed
        since: two briefly overlapping leaders never overwrite each other's snapshot)."""
        await self._patch_snapshot(namespace, name, uid, value, resource_version)

    async def remove_snapshot(
        self, namespace: str, name: str, uid: str, resource_version: str | None
    ) -> None:
        """Removes the runtime snapshot annotation (a merge patch setting it to null), under the
        same preconditions: from a TrainJob that must have none (one MultiKueue dispatches)."""
        await self._patch_snapshot(namespace, name, uid, None, resource_version)

    async def _patch_snapshot(
        self, namespace: str, name: str, uid: str, value: str | None, resource_version: str | None
    ) -> None:
        r = TRAINJOBS
        meta: JsonObject = {"uid": uid, "annotations": {SNAPSHOT_ANNOTATION: value}}
        if resource_version:
            meta["resourceVersion"] = resource_version
        # The answer (the whole TrainJob, snapshot and all) is read but not decoded: nothing
        # reads it; an error status still raises ApiException.
        response = await self._gang(
            self.objects.patch_namespaced_custom_object_without_preload_content,
            r.group, r.version, namespace, r.plural, name, {"metadata": meta},
            _content_type="application/merge-patch+json",
        )  # fmt: skip
        await body_of(response)

    async def apply_condition(self, namespace: str, name: str, condition: JsonObject) -> None:
        """Server-side applies one condition to a TrainJob's status subresource under the
        service's own field manager: the API server merges `conditions` by `type`, so the
        Trainer controller's stay as they are. `force`: a merge patch from Trainer's stale cache
        can take this condition's fields over, and without it the apply would answer 409."""
        r = TRAINJOBS
        body = {
            "apiVersion": TRAINER_API_VERSION,
            "kind": TRAINJOB_KIND,
            "metadata": {"name": name, "namespace": namespace},
            "status": {"conditions": [condition]},
        }
        await self.lanes.report_turn()
        response = await self._call(
            self.objects.patch_namespaced_custom_object_status_without_preload_content,
            r.group, r.version, namespace, r.plural, name, body,
            field_manager=FIELD_MANAGER, force=True,
            _content_type="application/apply-patch+yaml",
        )  # fmt: skip
        await body_of(response)

    async def _gang(self, method: Callable[..., Awaitable[Any]], *args: Any, **kw: Any) -> Any:
        """A write that makes or fixes a gang: the gang lane, held until the answer is in."""
        async with self.lanes.gang_write():
            return await self._call(method, *args, **kw)

    async def _call(self, method: Callable[..., Awaitable[Any]], *args: Any, **kw: Any) -> Any:
        # The client's own (aiohttp) timeout covers the whole request; wait_for would risk
        # swallowing a cancellation on Python 3.11.
        return await method(*args, _request_timeout=self.settings.timeout, **kw)

"""The reconciler's writes to the API server: the only place it talks to it.

Every call goes through a client-side rate limit (QPS with a burst, as client-go's) and has a
timeout, so a slow API server costs a retry, never a stuck worker. Errors are the client's
`ApiException` (HTTP status in `.status`) or `asyncio.TimeoutError`/connection errors.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
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


@dataclass(frozen=True)
class WriterSettings:
    qps: float = 20.0
    burst: int = 30
    timeout: float = 10.0


class ApiWriter:
    def __init__(
        self,
        api: ApiClient,
        settings: WriterSettings = WriterSettings(),
        bucket: TokenBucket | None = None,
    ) -> None:
        self.objects = CustomObjectsApi(api)
        self.settings = settings
        self.bucket = bucket or TokenBucket(settings.qps, settings.burst)

    async def create(self, r: Kind, obj: JsonObject) -> JsonObject:
        ns = obj["metadata"]["namespace"]
        created: JsonObject = await self._call(
            self.objects.create_namespaced_custom_object, r.group, r.version, ns, r.plural, obj
        )
        return created

    async def delete(self, r: Kind, namespace: str, name: str, uid: str | None) -> None:
        """Deletes with a uid precondition, so a newer object of the same name is never hit;
        background propagation, as the garbage collector would."""
        body: JsonObject = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        await self._call(
            self.objects.delete_namespaced_custom_object,
            r.group, r.version, namespace, r.plural, name, body=body,
        )  # fmt: skip

    async def json_patch(
        self, r: Kind, namespace: str, name: str, ops: list[JsonObject]
    ) -> JsonObject:
        patched: JsonObject = await self._call(
            self.objects.patch_namespaced_custom_object,
            r.group, r.version, namespace, r.plural, name, ops,
            _content_type="application/json-patch+json",
        )  # fmt: skip
        return patched

    async def snapshot_runtime(self, namespace: str, name: str, uid: str, value: str) -> None:
        """Writes the runtime snapshot annotation on a TrainJob with a merge patch (other
        annotations stay). The uid in the patch keeps it off a TrainJob recreated under the same
        name: the API server refuses to change a uid (422 Invalid; 404 if the name is gone)."""
        r = TRAINJOBS
        body = {"metadata": {"uid": uid, "annotations": {SNAPSHOT_ANNOTATION: value}}}
        # The answer (the whole TrainJob, snapshot and all) is read but not decoded: nothing
        # reads it; an error status still raises ApiException.
        response = await self._call(
            self.objects.patch_namespaced_custom_object_without_preload_content,
            r.group, r.version, namespace, r.plural, name, body,
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
        response = await self._call(
            self.objects.patch_namespaced_custom_object_status_without_preload_content,
            r.group, r.version, namespace, r.plural, name, body,
            field_manager=FIELD_MANAGER, force=True,
            _content_type="application/apply-patch+yaml",
        )  # fmt: skip
        await body_of(response)

    async def _call(self, method: Callable[..., Awaitable[Any]], *args: Any, **kw: Any) -> Any:
        await self.bucket.acquire()
        # The client's own (aiohttp) timeout covers the whole request; wait_for would risk
        # swallowing a cancellation on Python 3.11.
        return await method(*args, _request_timeout=self.settings.timeout, **kw)

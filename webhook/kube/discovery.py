"""Is gang scheduling available? Discovery of `scheduling.k8s.io/v1beta1`, at start and then
every `period` seconds, and the Workload and PodGroup watches that only run while it is.

With GenericWorkload off (or an older cluster), the API server does not serve the group and
silently drops `pod.spec.schedulingGroup` (was-api.md 1.6): the reconciler then creates nothing
and the pod webhook injects nothing, while the webhooks stay ready for everything else.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from kubernetes.aio.client import ApiClient

from .cache import Cache, GangApi
from .client import POD_GROUPS, WORKLOADS
from .informer import Informer

log = logging.getLogger("webhook.discovery")

GROUP_VERSION = f"{WORKLOADS.group}/{WORKLOADS.version}"
NEEDED = frozenset({WORKLOADS.plural, POD_GROUPS.plural})


async def gang_api_state(api: ApiClient, timeout: float = 10.0) -> GangApi:
    """What discovery says now; "unknown" when the API server cannot be asked."""
    try:
        # As the client's get_api_resources(), but without its trailing slash: the canonical
        # discovery path, which every API server (and the test emulator) serves.
        param = await api.param_serialize(
            method="GET",
            resource_path=f"/apis/{GROUP_VERSION}",
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        result: Any = await api.call_api(*param, _preload_content=False, _request_timeout=timeout)
        response = result.response
        try:
            body = await response.read()
            status = response.status
        finally:
            response.release()
    except asyncio.CancelledError:
        raise
    except Exception as err:
        log.warning("discovery failed", extra={"fields": {"error": f"{type(err).__name__}: {err}"}})
        return "unknown"
    if status == 404:
        return "not-served"
    if status != 200:
        log.warning("discovery failed", extra={"fields": {"error": f"HTTP {status}"}})
        return "unknown"
    try:
        resources = orjson.loads(body).get("resources") or []
        served = {r.get("name") for r in resources if isinstance(r, dict)}
    except (orjson.JSONDecodeError, AttributeError):
        return "unknown"
    return "served" if served >= NEEDED else "not-served"


class GangApiWatch:
    """Keeps `cache.gang_api` current and the scheduling informers running while it is served."""

    def __init__(
        self,
        api: ApiClient,
        cache: Cache,
        make_informers: Callable[[], list[Informer]],
        *,
        period: float = 60.0,
        on_change: Callable[[GangApi], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.api = api
        self.cache = cache
        self.make_informers = make_informers
        self.period = period
        self.on_change = on_change
        self.sleep = sleep
        self._watches: list[asyncio.Task[None]] = []

    async def run(self) -> None:
        try:
            while True:
                state = await gang_api_state(self.api)
                if state != "unknown" and state != self.cache.gang_api:
                    await self._became(state)
                await self.sleep(self.period)
        finally:
            await self._stop_watches()

    async def _became(self, state: GangApi) -> None:
        self.cache.gang_api = state
        if state == "served":
            log.info(f"{GROUP_VERSION} workloads and podgroups are served: gang scheduling on")
            self._watches = [asyncio.create_task(i.run()) for i in self.make_informers()]
        else:
            log.error(
                f"{GROUP_VERSION} workloads/podgroups are not served (is the GenericWorkload "
                "feature gate on, with --runtime-config=scheduling.k8s.io/v1beta1=true?): gang "
                "scheduling is unavailable; no Workloads or PodGroups are made and pods get no "
                "schedulingGroup"
            )
            await self._stop_watches()
        if self.on_change:
            self.on_change(state)

    async def _stop_watches(self) -> None:
        for task in self._watches:
            task.cancel()
        await asyncio.gather(*self._watches, return_exceptions=True)
        self._watches = []
        for store in self.cache.scheduling_stores:
            store.forget()

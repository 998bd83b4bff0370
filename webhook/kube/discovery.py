"""Which gang backends' APIs the cluster serves: discovery of each backend's group/version, at
start and then every `period` seconds, and the watches of its kinds, which run only while it is.

With GenericWorkload off (or an older cluster), the API server does not serve
`scheduling.k8s.io/v1beta1` and silently drops `pod.spec.schedulingGroup` (was-api.md 1.6); a
scheduler whose CRDs are not installed has no PodGroup kind to create. Either way the reconciler
creates nothing for that backend and the pod webhook ties no pod to it, while the webhooks stay
ready for everything else. Each change is logged once, not on every check.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from kubernetes.aio.client import ApiClient

from ..backends.base import GangBackend
from .cache import Cache, GangApi
from .informer import Informer

log = logging.getLogger("webhook.discovery")

# Why a backend's API may be missing, for the error line.
HINTS = {
    "native": "is the GenericWorkload feature gate on, with "
    "--runtime-config=scheduling.k8s.io/v1beta1=true?",
    "coscheduling": "is scheduler-plugins (its PodGroup CRD) installed?",
    "volcano": "is Volcano (its PodGroup CRD) installed?",
    "kai": "is the KAI Scheduler (its PodGroup CRD) installed?",
}


async def api_state(
    api: ApiClient, group_version: str, needed: frozenset[str], timeout: float = 10.0
) -> GangApi:
    """What discovery says of one group/version now; "unknown" when it cannot be asked."""
    try:
        # As the client's get_api_resources(), but without its trailing slash: the canonical
        # discovery path, which every API server (and the test emulator) serves.
        param = await api.param_serialize(
            method="GET",
            resource_path=f"/apis/{group_version}",
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
        log.warning(
            "discovery failed",
            extra={"fields": {"api": group_version, "error": f"{type(err).__name__}: {err}"}},
        )
        return "unknown"
    if status == 404:
        return "not-served"
    if status != 200:
        log.warning(
            "discovery failed", extra={"fields": {"api": group_version, "error": f"HTTP {status}"}}
        )
        return "unknown"
    try:
        resources = orjson.loads(body).get("resources") or []
        served = {r.get("name") for r in resources if isinstance(r, dict)}
    except (orjson.JSONDecodeError, AttributeError):
        return "unknown"
    return "served" if served >= needed else "not-served"


class BackendApiWatch:
    """Keeps `cache.apis` current and each backend's informers running while it is served."""

    def __init__(
        self,
        api: ApiClient,
        cache: Cache,
        make_informers: Callable[[GangBackend], list[Informer]],
        *,
        period: float = 60.0,
        on_change: Callable[[GangBackend, GangApi], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.api = api
        self.cache = cache
        self.make_informers = make_informers
        self.period = period
        self.on_change = on_change
        self.sleep = sleep
        self._watches: dict[str, list[asyncio.Task[None]]] = {}

    async def run(self) -> None:
        try:
            while True:
                for backend in self.cache.backends.backends:
                    kinds = backend.kinds
                    state = await api_state(
                        self.api, kinds[0].group_version, frozenset(k.plural for k in kinds)
                    )
                    if state != "unknown" and state != self.cache.api(backend):
                        await self._became(backend, state)
                await self.sleep(self.period)
        finally:
            for backend in self.cache.backends.backends:
                await self._stop_watches(backend)

    async def _became(self, backend: GangBackend, state: GangApi) -> None:
        self.cache.apis[backend.name] = state
        version = backend.kinds[0].group_version
        kinds = "/".join(k.plural for k in backend.kinds)
        if state == "served":
            log.info(f"{version} {kinds} are served: the {backend.name} gang backend is on")
            self._watches[backend.name] = [
                asyncio.create_task(i.run()) for i in self.make_informers(backend)
            ]
        else:
            hint = HINTS.get(backend.name, "is its CRD installed?")
            log.error(
                f"{version} {kinds} are not served ({hint}): {backend.name} gang scheduling is "
                "unavailable; TrainJobs whose pods name its scheduler get no gang objects and "
                "their pods are not tied to one"
            )
            await self._stop_watches(backend)
        if self.on_change:
            self.on_change(backend, state)

    async def _stop_watches(self, backend: GangBackend) -> None:
        tasks = self._watches.pop(backend.name, [])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for store in self.cache.backend_stores(backend):
            store.forget()

"""Which gang backends' APIs the cluster serves: discovery of each backend's group/version, at
start and then every `period` seconds, and the watches of its kinds, which run only while it is.

With GenericWorkload off (or an older cluster), the API server does not serve
`scheduling.k8s.io/v1beta1` and silently drops `pod.spec.schedulingGroup` (was-api.md 1.6); a
scheduler whose CRDs are not installed has no PodGroup kind to create. Either way the reconciler
creates nothing for that backend and the pod webhook ties no pod to it, while the webhooks stay
ready for everything else. Each change is logged once, not on every check.

A backend whose kinds are served in several versions (the native one: `v1beta1` on 1.37,
`v1alpha2` on 1.36) speaks the newest the cluster serves; when that changes (a cluster
upgraded), its watches start again in the new version.

A group/version discovery cannot ask (a 403, a 503 of an aggregated API, no connection) is said
once, when it starts failing, and once more when it answers again: checked every `period`, it
would otherwise be a warning a minute for as long as it lasts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

import orjson
from kubernetes.aio.client import ApiClient

from ..backends.base import GangBackend, Kind, api_versions
from .cache import Cache, GangApi
from .informer import Informer

log = logging.getLogger("webhook.discovery")


# Told of a group/version discovery could not ask, and why; None: logged as a warning each time.
Failed = Callable[[str, str], None]


@runtime_checkable
class Versioned(Protocol):
    """A backend whose required kinds are served in one of several versions of their group."""

    name: str
    kinds: tuple[Kind, ...]
    versions: tuple[str, ...]  # newest first

    @property
    def version(self) -> str: ...

    def use_version(self, version: str) -> None: ...


async def newest_served(
    api: ApiClient,
    backend: Versioned,
    failed: Failed | None = None,
    answered: Callable[[str, GangApi], None] | None = None,
) -> str | None:
    """The newest of a `Versioned` backend's versions serving all its required kinds; None when
    none is, or discovery cannot tell whether a newer one is (then nothing should change)."""
    required = [k for k in backend.kinds if not k.optional]
    needed = frozenset(k.plural for k in required)
    for version in backend.versions:
        group_version = f"{required[0].group}/{version}"
        state = await api_state(api, group_version, needed, failed=failed)
        if answered:
            answered(group_version, state)
        if state == "unknown":
            return None
        if state == "served":
            return version
    return None


# Why a backend's API may be missing, for the error line.
HINTS = {
    "native": "is the GenericWorkload feature gate on, with "
    "--runtime-config=scheduling.k8s.io/v1beta1=true (1.37) or "
    "scheduling.k8s.io/v1alpha2=true (1.36)?",
    "coscheduling": "is scheduler-plugins (its PodGroup CRD) installed?",
    "volcano": "is Volcano (its PodGroup CRD) installed?",
    "kai": "is the KAI Scheduler (its PodGroup CRD) installed?",
}


def _warn(group_version: str, error: str) -> None:
    log.warning("discovery failed", extra={"fields": {"api": group_version, "error": error}})


async def api_state(
    api: ApiClient,
    group_version: str,
    needed: frozenset[str],
    timeout: float = 10.0,
    failed: Failed | None = None,
) -> GangApi:
    """What discovery says of one group/version now; "unknown" when it cannot be asked (then
    `failed` is told why)."""
    failed = failed or _warn
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
        failed(group_version, f"{type(err).__name__}: {err}")
        return "unknown"
    if status == 404:
        return "not-served"
    if status != 200:
        failed(group_version, f"HTTP {status}")
        return "unknown"
    try:
        resources = orjson.loads(body).get("resources") or []
        served = {r.get("name") for r in resources if isinstance(r, dict)}
    except (orjson.JSONDecodeError, AttributeError):
        return "unknown"
    return "served" if served >= needed else "not-served"


class BackendApiWatch:
    """Keeps `cache.apis` (and each optional kind's state) current, and the informers of every
    kind running while its API is served (and its backend's is)."""

    def __init__(
        self,
        api: ApiClient,
        cache: Cache,
        make_informers: Callable[[Kind], list[Informer]],
        *,
        period: float = 60.0,
        on_change: Callable[[GangBackend, GangApi], None] | None = None,
        after_check: Callable[[GangBackend], Awaitable[None]] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.api = api
        self.cache = cache
        self.make_informers = make_informers
        self.period = period
        self.on_change = on_change
        # Told after each check of a backend (the topology probe, `constraints.py`).
        self.after_check = after_check
        self.sleep = sleep
        self._watches: dict[Kind, list[asyncio.Task[None]]] = {}
        self._failing: dict[str, str] = {}  # group/version -> why discovery cannot ask it

    async def run(self) -> None:
        try:
            while True:
                for backend in self.cache.backends.backends:
                    await self._check(backend)
                    if self.after_check is not None:
                        await self.after_check(backend)
                await self.sleep(self.period)
        finally:
            for kind in list(self._watches):
                await self._stop(kind)

    def _failed(self, group_version: str, error: str) -> None:
        """Said once while it lasts (again if the error changes), at debug on every check."""
        said = self._failing.get(group_version)
        self._failing[group_version] = error
        fields = {"api": group_version, "error": error}
        if said == error:
            log.debug("discovery failed", extra={"fields": fields})
            return
        log.warning(
            "discovery failed: retried every check, said again only when it answers",
            extra={"fields": {**fields, "period_seconds": self.period}},
        )

    def _answered(self, group_version: str, state: GangApi) -> None:
        if state != "unknown" and self._failing.pop(group_version, None) is not None:
            log.info("discovery answers again", extra={"fields": {"api": group_version}})

    async def _state(self, group_version: str, needed: frozenset[str]) -> GangApi:
        state = await api_state(self.api, group_version, needed, failed=self._failed)
        self._answered(group_version, state)
        return state

    async def _check(self, backend: GangBackend) -> None:
        await self._choose_version(backend)
        states: dict[str, GangApi] = {}
        for version in dict.fromkeys(k.group_version for k in backend.kinds):
            kinds = [k for k in backend.kinds if k.group_version == version]
            states[version] = await self._state(version, frozenset(k.plural for k in kinds))
        required = [states[k.group_version] for k in backend.kinds if not k.optional]
        state: GangApi = (
            "not-served"
            if "not-served" in required
            else "unknown"
            if "unknown" in required
            else "served"
        )
        if state != "unknown" and state != self.cache.api(backend):
            self.cache.apis[backend.name] = state
            self._report(backend, state)
            if self.on_change:
                self.on_change(backend, state)
        for kind in backend.kinds:
            if kind.optional and states[kind.group_version] != "unknown":
                known = self.cache.kind_states.get(kind)
                self.cache.kind_states[kind] = states[kind.group_version]
                if known != states[kind.group_version]:
                    served = states[kind.group_version] == "served"
                    log.info(
                        f"{kind.group_version} {kind.plural} are "
                        f"{'served' if served else 'not served'}: {backend.name} plans that "
                        f"need {kind.kind}s are {'possible' if served else 'denied'}"
                    )
                    if served and self.on_change:
                        # Turned on later: the TrainJobs that waited for it are looked at again.
                        self.on_change(backend, self.cache.api(backend))
            wanted = self.cache.api(backend) == "served" and self.cache.kind_served(kind)
            if wanted and kind not in self._watches:
                self._watches[kind] = [
                    asyncio.create_task(i.run()) for i in self.make_informers(kind)
                ]
            elif not wanted and kind in self._watches:
                await self._stop(kind)

    async def _choose_version(self, backend: GangBackend) -> None:
        """Switch a `Versioned` backend to the newest version of its required kinds the
        cluster serves; kept as it is while none is (or discovery cannot tell)."""
        if not isinstance(backend, Versioned):
            return
        version = await newest_served(
            self.api, backend, failed=self._failed, answered=self._answered
        )
        if version is None or version == backend.version:
            return
        required = [k for k in backend.kinds if not k.optional]
        log.info(
            f"{required[0].group}/{version} is the newest scheduling API served: the "
            f"{backend.name} gang backend uses it (was {backend.version})"
        )
        for kind in required:  # the cache holds the old version's objects: watch again
            await self._stop(kind)
        backend.use_version(version)
        if self.on_change and self.cache.api(backend) == "served":
            self.on_change(backend, "served")  # look at every TrainJob again in the new shapes

    def _report(self, backend: GangBackend, state: GangApi) -> None:
        version = backend.kinds[0].group_version
        kinds = "/".join(k.plural for k in backend.kinds if not k.optional)
        if state == "served":
            log.info(f"{version} {kinds} are served: the {backend.name} gang backend is on")
            return
        hint = HINTS.get(backend.name, "is its CRD installed?")
        # The Workload API is what the service is for; another scheduler's missing CRDs are
        # what most clusters look like (a TrainJob that names it hears so at apply and in an
        # Event), so not an error.
        report = log.error if backend.name == "native" else log.info
        report(
            f"{api_versions(backend)} {kinds} are not served ({hint}): {backend.name} gang "
            "scheduling is unavailable; TrainJobs whose pods name its scheduler get no gang "
            "objects, and their pods are held until it is served"
        )

    async def _stop(self, kind: Kind) -> None:
        tasks = self._watches.pop(kind, [])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.cache.store(kind).forget()

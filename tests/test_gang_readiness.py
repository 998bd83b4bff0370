"""A replica answers pod reviews only once it knows the gang objects: `/readyz` waits, at start,
for discovery and for the list of every gang kind discovery found served. A kind that is not
served (no Volcano CRDs) waits for nothing; a kind served later (its CRD installed while the
replica runs) does not take a ready replica out of its Service.

Against the emulator over real HTTP: discovery, informers and the readiness checks wired as
`serve` wires them, in this process; then `serve` itself as a process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import pytest
from kubernetes.aio.client import ApiClient, Configuration

from webhook.kube.cache import Cache
from webhook.kube.client import informers, kind_informers
from webhook.kube.discovery import BackendApiWatch
from webhook.server.app import Readiness
from webhook.server.run import GangReadiness

from .kube_emulator import LIST, POD_GROUPS, declare_backend_resources, emulator, eventually
from .kube_emulator import status as failed
from .test_informer import readyz, serving
from .timing import STALL

NATIVE_POD_GROUPS = "cache:podgroups.scheduling.k8s.io"
VOLCANO_POD_GROUPS = kmock.resource("scheduling.volcano.sh", "v1beta1", "podgroups")


@contextlib.asynccontextmanager
async def replica(url: str) -> AsyncIterator[tuple[Cache, Readiness]]:
    """The watches, discovery and the gang readiness checks, as `serve` wires them."""
    api = ApiClient(configuration=Configuration(host=url))
    cache = Cache(connected=True)
    cache.jobsets.replace([])  # listed, none: restart attempt 0
    readiness = Readiness(GangReadiness(cache).checks())
    assert readiness.failing() == ["discovery"]  # nothing said yet: not a gang kind is known
    watch = BackendApiWatch(api, cache, lambda kind: kind_informers(api, cache, kind), period=0.1)
    jobs = [*(i.run() for i in informers(api, cache)), watch.run()]
    tasks = [asyncio.create_task(job) for job in jobs]
    try:
        yield cache, readiness
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        close: Any = api.close  # untyped in the client
        await close()


@pytest.mark.asyncio
async def test_not_ready_until_the_served_gang_kinds_have_listed() -> None:
    listing_fails = asyncio.Event()
    listing_fails.set()
    async with emulator() as (k, url):
        k[LIST, POD_GROUPS, listing_fails] << failed(500)
        async with replica(url) as (cache, readiness):
            await eventually(lambda: len(k[LIST, POD_GROUPS]) >= 2, "the PodGroup list retried")
            assert cache.discovered()
            # The Workloads listed; the other backends' kinds are not served: not waited for.
            assert readiness.failing() == [NATIVE_POD_GROUPS]
            assert {cache.api(b) for b in ("coscheduling", "volcano", "kai")} == {"not-served"}
            listing_fails.clear()
            await eventually(lambda: readiness.failing() == [], "ready", timeout=STALL)


@pytest.mark.asyncio
async def test_a_kind_served_later_keeps_a_ready_replica_ready() -> None:
    """Only a replica starting after the CRD is installed waits for its list."""
    listing_fails = asyncio.Event()
    listing_fails.set()
    async with emulator() as (k, url), replica(url) as (cache, readiness):
        await eventually(lambda: readiness.failing() == [], "ready")
        assert cache.api("volcano") == "not-served"
        # Volcano's CRD installed (a reaction on a kind makes kmock's discovery list it too).
        k[LIST, VOLCANO_POD_GROUPS, listing_fails] << failed(500)
        declare_backend_resources(k, ["volcano"])
        await eventually(lambda: cache.api("volcano") == "served", "Volcano discovered")
        await eventually(lambda: len(k[LIST, VOLCANO_POD_GROUPS]) >= 2, "its list retried")
        volcano = cache.backends.named("volcano")
        assert volcano is not None and not cache.backend_ready(volcano)
        assert readiness.failing() == []
        async with replica(url) as (_, starting):
            waits = ["cache:podgroups.scheduling.volcano.sh"]
            await eventually(lambda: starting.failing() == waits, "a new replica waits")
            listing_fails.clear()
            await eventually(lambda: starting.failing() == [], "ready", timeout=STALL)


@pytest.mark.asyncio
async def test_serve_is_not_ready_until_the_podgroups_have_listed(tmp_path: Path) -> None:
    listing_fails = asyncio.Event()
    listing_fails.set()
    async with emulator() as (k, url):
        k[LIST, POD_GROUPS, listing_fails] << failed(500)
        async with serving(tmp_path, url) as (proc, client):
            await eventually(lambda: len(k[LIST, POD_GROUPS]) >= 2, "the PodGroup list retried")

            async def failing() -> list[str]:
                answer = await readyz(client, proc)
                return [] if answer.status_code == 200 else list(answer.json()["failing"])

            deadline = asyncio.get_running_loop().time() + STALL
            while (now := await failing()) != [NATIVE_POD_GROUPS]:  # the other stores listed
                assert asyncio.get_running_loop().time() < deadline, now
                await asyncio.sleep(0.05)
            listing_fails.clear()
            while await failing():
                assert asyncio.get_running_loop().time() < deadline + STALL, await failing()
                await asyncio.sleep(0.05)

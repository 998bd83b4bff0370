"""Gang objects first (issue 29): the writes that make gangs go before the writes that report.

Over HTTP against the API emulator: a burst of TrainJobs under a tiny gang budget gets every
gang write (runtime snapshot, Workload, PodGroup) before any condition or Event, in the order
the emulator saw the requests; a condition write that fails is tried again. `WriteLanes` alone:
a reporting write waits while a gang write holds the lane, and at most `max_defer`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
from kubernetes.aio.client import ApiClient, Configuration

from tests.harness import served
from tests.kube_emulator import (
    CLUSTER_RUNTIMES,
    TRAINJOBS,
    VersionedEmulator,
    create,
    emulator,
    eventually,
    next_requests,
    status,
)
from tests.test_reconciler import cluster_runtime, trainjob
from webhook.backends.native import COMPOSITE
from webhook.core import condition as cond
from webhook.kube.cache import Cache
from webhook.kube.client import backend_informers, informers, pod_informers
from webhook.kube.events import EventRecorder
from webhook.kube.gangpods import GangPods
from webhook.kube.writer import ApiWriter, TokenBucket, WriteLanes, WriterSettings
from webhook.reconcile.reconciler import CONTROLLER, Reconciler, ReconcilerSettings
from webhook.reconcile.status import StatusWriter

pytestmark = pytest.mark.asyncio
BURST = 6
# A tiny gang budget (one write at a time, 20 a second): the burst's gang writes queue up,
# while the reporting budget could take every condition and Event at once.
TINY = WriterSettings(qps=1000.0, burst=1000, gang_qps=20.0, gang_burst=1)


@contextlib.asynccontextmanager
async def service(k: VersionedEmulator, url: str, settings: WriterSettings) -> AsyncIterator[None]:
    """The reconciler with its status writer and Events, as `serve` wires them."""
    api = ApiClient(configuration=Configuration(host=url))
    cache = Cache(connected=True)
    cache.jobsets.replace([])  # listed, none: restart attempt 0
    cache.kind_states[COMPOSITE] = "not-served"
    served(cache, "native")
    native = cache.backends.named("native")
    assert native is not None
    pods = GangPods()
    watches = informers(api, cache) + pod_informers(api, pods)
    watches += backend_informers(api, cache, native)
    writer = ApiWriter(api, settings)
    events = EventRecorder(api, CONTROLLER, "test", dedupe_for=0.0, gate=writer.lanes.report_turn)
    status_writer = StatusWriter(cache, writer, events, pods)
    reconciler = Reconciler(
        cache, writer, events, ReconcilerSettings(workers=2), status=status_writer
    )
    tasks = [asyncio.create_task(w.run()) for w in watches]
    tasks += [asyncio.create_task(events.run()), asyncio.create_task(reconciler.run())]
    try:
        await eventually(lambda: reconciler.queue is not None, "the reconciler running")
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        close: Any = api.close
        await close()


def lane_of(request: kmock.Request) -> str | None:
    """The write's lane as the emulator saw it: gang, condition, event; None for the rest."""
    resource = request.resource
    if resource is None or request.method not in (kmock.method.POST, kmock.method.PATCH,
                                                  kmock.method.DELETE):  # fmt: skip
        return None
    plural = str(resource.plural)
    if plural == "trainjobs" and request.method == kmock.method.PATCH:
        return "condition" if request.subresource == "status" else "gang"  # or the snapshot
    if plural in ("workloads", "podgroups"):
        return "gang"
    return "event" if plural == "events" else None


def conditions_written(k: VersionedEmulator) -> int:
    found = 0
    for key, obj in list(k.objects.items()):
        if key[0] == TRAINJOBS and not obj.deleted and cond.stored_condition(obj.raw):
            found += 1
    return found


async def test_a_burst_makes_every_gang_before_it_reports() -> None:
    async with emulator() as (k, url), service(k, url, TINY):
        await create(k, CLUSTER_RUNTIMES, cluster_runtime())
        await asyncio.gather(*(create(k, TRAINJOBS, trainjob(f"job-{i}")) for i in range(BURST)))
        await eventually(lambda: conditions_written(k) == BURST, "every condition", 30)
        lanes = [lane for request in list(k) if (lane := lane_of(request)) is not None]
    assert lanes.count("gang") == 3 * BURST  # snapshot, Workload, PodGroup each
    first_report = min(lanes.index("condition"), lanes.index("event"))
    assert lanes[:first_report] == ["gang"] * (3 * BURST), lanes


async def test_a_condition_write_that_fails_is_tried_again() -> None:
    async with emulator() as (k, url):
        statuses = k[kmock.method.PATCH, TRAINJOBS, kmock.subresource("status")]
        next_requests(statuses, 1) << status(500, "etcdserver: request timed out")
        async with service(k, url, WriterSettings()):
            await create(k, CLUSTER_RUNTIMES, cluster_runtime())
            await create(k, TRAINJOBS, trainjob())
            await eventually(lambda: conditions_written(k) == 1, "the condition", 30)
        assert len(statuses) == 2


class Sleeps:
    """An injected sleep that returns only when told."""

    def __init__(self) -> None:
        self.waiting: list[asyncio.Future[None]] = []

    async def __call__(self, seconds: float) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append(done)
        await done

    def wake(self) -> None:
        for done in self.waiting:
            if not done.done():
                done.set_result(None)


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_report_waits_while_a_gang_write_holds_the_lane() -> None:
    lanes = WriteLanes(TokenBucket(100.0, 10), TokenBucket(100.0, 10), sleep=Sleeps())
    held = asyncio.Event()
    release = asyncio.Event()

    async def gang() -> None:
        async with lanes.gang_write():
            held.set()
            await release.wait()

    writing = asyncio.create_task(gang())
    await held.wait()
    reporting = asyncio.create_task(lanes.report_turn())
    await turns()
    assert not reporting.done()
    release.set()
    await writing
    await asyncio.wait_for(reporting, 10)
    assert lanes.gang_busy == 0


async def test_a_report_waits_for_the_gang_lane_at_most_max_defer() -> None:
    sleeps = Sleeps()
    lanes = WriteLanes(TokenBucket(100.0, 10), TokenBucket(100.0, 10), sleep=sleeps)
    release = asyncio.Event()

    async def gang() -> None:
        async with lanes.gang_write():
            await release.wait()

    writing = asyncio.create_task(gang())
    await turns()
    reporting = asyncio.create_task(lanes.report_turn())
    await turns()
    assert not reporting.done()
    sleeps.wake()  # max_defer has passed, the gang write still under way
    await asyncio.wait_for(reporting, 10)
    assert lanes.gang_busy == 1
    release.set()
    await writing

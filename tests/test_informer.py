"""The cache's informers against a Kubernetes API emulator (kmock) over real HTTP; then the whole
service pointed at the emulator with a kubeconfig, as it runs in production.

The emulator is `tests.kube_emulator.VersionedEmulator`: kmock's in-memory API server plus real
resourceVersions, watches that resume from one, 410 Gone for a compacted one and watch timeouts.
Failures are kmock reactions on the next watch or list requests.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import kmock
import pytest
from kubernetes.aio.client.exceptions import ApiException

from tests.harness import (
    ServerProcess,
    fixture,
    held_because,
    make_certs,
    server_process,
    webhook_path,
)
from tests.kube_emulator import (
    CLUSTER_RUNTIMES,
    LIST,
    NODES,
    PRIORITY_CLASSES,
    TRAINING_RUNTIMES,
    TRAINJOBS,
    WATCH,
    VersionedEmulator,
    api_client,
    broken_stream,
    create,
    delete,
    emulator,
    eventually,
    expired_event,
    kubeconfig,
    next_requests,
    patch,
    plain_emulator,
    status,
    status_object,
    too_large_event,
)
from tests.nodes import node
from tests.timing import STALL
from webhook.core.naming import workload_name
from webhook.core.nodes import NodeSummary
from webhook.core.plan import pod_group_for_labels
from webhook.core.snapshot import SNAPSHOT_ANNOTATION, snapshot
from webhook.core.trainer import Runtime
from webhook.kube import client as kube_client
from webhook.kube.cache import Cache, Store
from webhook.kube.informer import (
    TRANSIENT_RETRIES,
    TRANSIENT_SECONDS,
    Informer,
    Resource,
    too_large_resource_version,
)


def pod_group_of(trainjob_obj: dict[str, Any]) -> str:
    """The Workload/PodGroup name of a level-1 TrainJob this release froze (plan version 2:
    qualified by its uid; test_plan.py)."""
    meta = trainjob_obj["metadata"]
    return workload_name(meta["namespace"], meta["name"], meta["uid"])


def frozen_by_reconciler(cache: Cache) -> str:
    """The snapshot annotation the reconciler writes for a TrainJob of torch-distributed: the
    runtime as this cache holds it."""
    checked = cache.runtime("ClusterTrainingRuntime", "team-a", "torch-distributed")
    assert checked is not None
    return snapshot(checked.runtime)


RESOURCES: dict[str, tuple[Resource, kmock.resource]] = {
    "trainjobs": (kube_client.TRAINJOBS, TRAINJOBS),
    "clustertrainingruntimes": (kube_client.CLUSTER_RUNTIMES, CLUSTER_RUNTIMES),
}


def trainjob(namespace: str = "team-a", name: str = "my-job") -> dict[str, Any]:
    obj: dict[str, Any] = copy.deepcopy(
        fixture("trainjob-create.validate.json")["request"]["object"]
    )
    obj["metadata"].update(namespace=namespace, name=name)
    return obj


def cluster_runtime(name: str = "torch-distributed") -> dict[str, Any]:
    review = fixture("clustertrainingruntime-update-server-side-apply.validate.json")
    obj: dict[str, Any] = copy.deepcopy(review["request"]["object"])
    obj["metadata"]["name"] = name
    return obj


def make(kind: str, namespace: str, name: str) -> dict[str, Any]:
    return trainjob(namespace, name) if kind == "trainjobs" else cluster_runtime(name)


@contextlib.asynccontextmanager
async def running(*informers: Informer) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(i.run()) for i in informers]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:  # run() only ever ends by cancellation
            assert isinstance(result, asyncio.CancelledError), result


def keys(store: Store) -> set[tuple[str, str]]:
    return set(store._entries)


class FakeSleep:
    """The informer's `sleep`: records each backoff delay; waits only for `gate`, if closed."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await self.gate.wait()


# --- 1. list, then watch ------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "kmock-plain"])
@pytest.mark.parametrize("kind", ["trainjobs", "clustertrainingruntimes"])
async def test_list_fills_the_store_and_the_watch_follows_changes(
    kind: str, versioned: bool
) -> None:
    resource, res = RESOURCES[kind]
    cluster_scoped = kind == "clustertrainingruntimes"
    ns_a, ns_b = ("", "") if cluster_scoped else ("team-a", "team-b")
    start = emulator if versioned else plain_emulator
    async with start() as (k, url), api_client(url) as api:
        await create(k, res, make(kind, ns_a, "first"))
        await create(k, res, make(kind, ns_b, "second"))  # another namespace: listed across all
        store = Store(kind)
        informer = Informer(api, resource, store)
        assert not store.synced
        async with running(informer):
            await eventually(lambda: store.synced, "the store synced")
            assert keys(store) == {(ns_a, "first"), (ns_b, "second")}
            assert len(k[LIST, res]) == 1

            await create(k, res, make(kind, ns_b, "third"))
            await eventually(lambda: store.get(ns_b, "third") is not None, "created one added")
            entry = store.get(ns_b, "third")
            assert entry is not None and entry.raw["spec"] == make(kind, ns_b, "third")["spec"]

            await patch(k, res, ns_a or None, "first", {"metadata": {"labels": {"edited": "yes"}}})

            def edited() -> bool:
                entry = store.get(ns_a, "first")
                labels = entry.raw["metadata"].get("labels", {}) if entry is not None else {}
                return bool(labels.get("edited") == "yes")

            await eventually(edited, "modified one updated")

            await delete(k, res, ns_b or None, "second")
            await eventually(lambda: store.get(ns_b, "second") is None, "deleted one removed")
            assert keys(store) == {(ns_a, "first"), (ns_b, "third")}
            assert (informer.restarts, len(k[LIST, res]), len(k[WATCH, res])) == (0, 1, 1)
            if isinstance(k, VersionedEmulator):  # resumes from the server's latest version
                assert informer.resource_version == str(k.resource_version)


@pytest.mark.asyncio
async def test_a_watch_that_times_out_resumes_without_listing_again() -> None:
    async with emulator() as (k, url), api_client(url) as api:
        store = Store("trainjobs")
        informer = Informer(api, kube_client.TRAINJOBS, store, watch_timeout=1)
        async with running(informer):
            await eventually(lambda: store.synced, "the store synced")
            listed_at = informer.resource_version
            await create(k, TRAINJOBS, trainjob())
            await eventually(lambda: len(k[WATCH, TRAINJOBS]) >= 2, "a second watch", 3)
            await create(k, TRAINJOBS, trainjob("team-b"))
            await eventually(lambda: len(store) == 2, "both TrainJobs in the store")
            watches = list(k[WATCH, TRAINJOBS])
            assert watches[0].params["resourceVersion"] == listed_at
            assert int(watches[1].params["resourceVersion"]) > int(listed_at or 0)
            assert (informer.restarts, len(k[LIST, TRAINJOBS])) == (0, 1)


@pytest.mark.asyncio
async def test_nodes_are_listed_in_pages_into_the_summary_and_followed() -> None:
    async with emulator() as (k, url), api_client(url) as api:
        for i in range(5):
            await create(k, NODES, node(f"n-{i}", zone="zone-a", gpus=8))
        cache = Cache(connected=True)
        cache.jobsets.replace([])  # listed, none: restart attempt 0
        informer = kube_client.node_informer(api, cache)
        informer.page_size = 2  # 500 in the service: 3 pages here
        async with running(informer):
            await eventually(lambda: cache.nodes.synced, "the nodes listed")
            assert len(cache.nodes) == 5 and list(cache.nodes.shapes.values()) == [5]
            lists = [r.params.get("limit") for r in k[LIST, NODES]]
            assert lists == ["2", "2", "2"]
            version = cache.nodes.version
            await patch(k, NODES, None, "n-0", {"spec": {"unschedulable": True}})
            await eventually(lambda: cache.nodes.version > version, "the cordon seen")
            assert sorted(cache.nodes.shapes.values()) == [1, 4]
            await delete(k, NODES, None, "n-1")
            await eventually(lambda: len(cache.nodes) == 4, "the deletion seen")
            assert isinstance(cache.nodes, NodeSummary) and informer.restarts == 0


# --- 2. 410 Gone: list again --------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("gone", ["compacted", "error-event", "http-410"])
async def test_410_gone_lists_again_and_drops_what_was_deleted_meanwhile(gone: str) -> None:
    async with emulator() as (k, url), api_client(url) as api:
        await create(k, TRAINJOBS, trainjob("team-a", "stays"))
        await create(k, TRAINJOBS, trainjob("team-b", "goes"))
        store, sleep = Store("trainjobs"), FakeSleep()
        informer = Informer(api, kube_client.TRAINJOBS, store, sleep=sleep)
        async with running(informer):
            await eventually(lambda: store.synced and k.open_watches == 1, "synced, watching")
            assert keys(store) == {("team-a", "stays"), ("team-b", "goes")}

            sleep.gate.clear()  # the watch goes down and stays down until the gate opens
            assert k.drop_watches() == 1
            await eventually(lambda: len(sleep.delays) == 1, "the informer backing off")
            down_at = informer.resource_version
            await delete(k, TRAINJOBS, "team-b", "goes")
            await create(k, TRAINJOBS, trainjob("team-c", "new"))
            if gone == "compacted":  # the server no longer has the history since `down_at`
                k.compact()
            elif gone == "error-event":
                next_requests(k[WATCH, TRAINJOBS]) << expired_event()
            else:
                next_requests(k[WATCH, TRAINJOBS]) << status(410)
            sleep.gate.set()

            await eventually(lambda: len(k[LIST, TRAINJOBS]) == 2, "a second list")
            await eventually(lambda: k.open_watches == 1, "watching again")
            assert keys(store) == {("team-a", "stays"), ("team-c", "new")}
            resumed, *_ = list(k[WATCH, TRAINJOBS])[1:]
            assert resumed.params["resourceVersion"] == down_at  # what got the 410
            assert informer.resource_version == str(k.resource_version)
            assert informer.restarts == 1  # the dropped connection; a 410 relists at once
            assert len(sleep.delays) == 1


# --- 3. other failures: back off, resume --------------------------------------------------------


FAULTS: dict[str, kmock.Payload] = {
    "http-500": status(500),
    "error-event-500": {"type": "ERROR", "object": status_object(500, "InternalError", "boom")},
    "broken-stream": broken_stream,
}


@pytest.mark.asyncio
@pytest.mark.parametrize("fault", list(FAULTS))
async def test_failing_watches_back_off_with_growing_delays_and_converge(fault: str) -> None:
    async with emulator() as (k, url), api_client(url) as api:
        await create(k, TRAINJOBS, trainjob("team-a", "edited"))
        await create(k, TRAINJOBS, trainjob("team-a", "deleted"))
        next_requests(k[WATCH, TRAINJOBS], 4) << FAULTS[fault]
        store, sleep = Store("trainjobs"), FakeSleep()
        sleep.gate.clear()
        informer = Informer(api, kube_client.TRAINJOBS, store, sleep=sleep)
        async with running(informer):
            await eventually(lambda: len(sleep.delays) == 1, "the first watch failed")
            assert store.synced and len(store) == 2  # the list worked
            # Changes while the watch is failing: the watch must catch up on them later.
            await patch(k, TRAINJOBS, "team-a", "edited", {"spec": {"suspend": True}})
            await delete(k, TRAINJOBS, "team-a", "deleted")
            await create(k, TRAINJOBS, trainjob("team-b", "created"))
            sleep.gate.set()

            await eventually(lambda: k.open_watches == 1, "a watch that works")
            await eventually(
                lambda: len(store) == 2 and store.get("team-b", "created") is not None,
                "the store converged",
            )
            entry = store.get("team-a", "edited")
            assert entry is not None and entry.raw["spec"]["suspend"] is True
            assert store.get("team-a", "deleted") is None

            assert informer.restarts == 4
            assert len(sleep.delays) == 4
            for attempt, delay in enumerate(sleep.delays):  # full jitter in [ceiling/2, ceiling]
                ceiling = 0.5 * 2**attempt
                assert ceiling / 2 <= delay <= ceiling, (attempt, delay)
            assert sleep.delays == sorted(sleep.delays)
            assert len(set(sleep.delays)) == 4
            # Resumed from the listed version: no list again, nothing missed.
            assert (len(k[LIST, TRAINJOBS]), len(k[WATCH, TRAINJOBS])) == (1, 5)


@pytest.mark.asyncio
async def test_a_watch_answered_by_an_http_error_without_a_body_backs_off() -> None:
    async with emulator() as (k, url), api_client(url) as api:
        k[WATCH, TRAINJOBS] << 503  # every watch: HTTP 503, empty body
        store, sleep = Store("trainjobs"), FakeSleep()
        informer = Informer(api, kube_client.TRAINJOBS, store, sleep=sleep)
        async with running(informer):
            await eventually(lambda: len(k[WATCH, TRAINJOBS]) >= 5, "five watch attempts")
            assert informer.restarts >= 4
            assert len(sleep.delays) >= 4


@pytest.mark.asyncio
async def test_a_watch_that_ends_at_once_without_events_backs_off() -> None:
    """A server (or proxy) that closes every watch at once with a 200 must not cause a hot loop."""
    async with emulator() as (k, url), api_client(url) as api:
        k[WATCH, TRAINJOBS] << 200 << b""  # every watch: HTTP 200, empty body
        store, sleep = Store("trainjobs"), FakeSleep()
        informer = Informer(api, kube_client.TRAINJOBS, store, sleep=sleep)
        async with running(informer):
            await eventually(lambda: len(sleep.delays) >= 3, "three backoffs")
            assert informer.restarts >= 3
            assert sleep.delays[:3] == sorted(sleep.delays[:3])
            assert len(k[WATCH, TRAINJOBS]) <= len(sleep.delays) + 1


@pytest.mark.asyncio
async def test_a_failing_list_is_retried_and_the_store_synced_only_when_it_works() -> None:
    async with emulator() as (k, url), api_client(url) as api:
        await create(k, TRAINJOBS, trainjob())
        next_requests(k[LIST, TRAINJOBS], 3) << status(500)
        store, sleep = Store("trainjobs"), FakeSleep()
        informer = Informer(api, kube_client.TRAINJOBS, store, sleep=sleep)
        async with running(informer):
            await eventually(lambda: store.synced, "the store synced")
            assert keys(store) == {("team-a", "my-job")}
            assert (informer.restarts, len(sleep.delays), len(k[LIST, TRAINJOBS])) == (3, 3, 4)
            assert sleep.delays == sorted(sleep.delays)


# --- "Too large resource version": routine after an API server restart, quiet unless it lasts --


def informer_log(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [
        (r.levelno, str(getattr(r, "fields", {}).get("error", "")))
        for r in caplog.records
        if r.name == "webhook.informer" and r.levelno >= logging.DEBUG and "retrying" in r.msg
    ]


@pytest.mark.asyncio
@pytest.mark.parametrize("failures", [2, TRANSIENT_RETRIES + 1])
async def test_a_watch_cache_behind_the_listed_version_is_retried_quietly_unless_it_persists(
    failures: int, caplog: pytest.LogCaptureFixture
) -> None:
    """After an API server restart its watch cache may lag the version a list (read from etcd)
    returned: the watch is answered "Too large resource version" until the cache catches up.
    Retried with backoff, at debug; a warning only from the TRANSIENT_RETRIES-th in a row."""
    caplog.set_level(logging.DEBUG, logger="webhook.informer")
    async with emulator() as (k, url), api_client(url) as api:
        await create(k, TRAINJOBS, trainjob("team-a", "first"))
        await create(k, TRAINJOBS, trainjob("team-b", "second"))
        k.lag_watch_cache(k.resource_version - 1)  # the newest write is not in the cache yet
        delays: list[float] = []

        async def sleep(delay: float) -> None:
            delays.append(delay)
            if len(delays) == failures:
                k.lag_watch_cache(None)  # caught up

        store = Store("trainjobs")
        informer = Informer(api, kube_client.TRAINJOBS, store, sleep=sleep)
        async with running(informer):
            await eventually(lambda: k.open_watches == 1, "watching once the cache caught up")
            await create(k, TRAINJOBS, trainjob("team-c", "third"))
            await eventually(lambda: store.get("team-c", "third") is not None, "recovered")
            assert keys(store) == {("team-a", "first"), ("team-b", "second"), ("team-c", "third")}
            # Resumed from the listed version each time: nothing listed again, nothing missed.
            assert (len(k[LIST, TRAINJOBS]), len(k[WATCH, TRAINJOBS])) == (1, failures + 1)
            assert informer.restarts == failures and delays == sorted(delays)
        said = informer_log(caplog)
        assert len(said) == failures
        assert all("Too large resource version" in error for _, error in said)
        quiet = min(failures, TRANSIENT_RETRIES - 1)
        assert [level for level, _ in said] == [logging.DEBUG] * quiet + [logging.WARNING] * (
            failures - quiet
        )


@pytest.mark.asyncio
async def test_a_watch_cache_behind_for_long_is_a_warning_even_in_few_retries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Persisting means a few failures in a row or TRANSIENT_SECONDS since the first; a failure
    of another kind, or a watch that works, starts the count again."""
    caplog.set_level(logging.DEBUG, logger="webhook.informer")
    now = [0.0]
    too_large = too_large_event("9", 8)["object"]
    faults: list[kmock.Payload] = [
        too_large_event("9", 8),
        too_large_event("9", 8, code=500),  # as the API server sent it through a lossy path
        {"type": "ERROR", "object": status_object(500, "InternalError", "boom")},
        too_large_event("9", 8),
        status(504, too_large["message"], too_large["reason"], too_large["details"]),  # as HTTP
    ]
    async with emulator() as (k, url), api_client(url) as api:
        for i, fault in enumerate(faults):  # the first five watches, in this order
            k[WATCH, TRAINJOBS][i : i + 1] << fault
        delays: list[float] = []

        async def sleep(delay: float) -> None:
            delays.append(delay)
            now[0] += {1: 1, 4: TRANSIENT_SECONDS}.get(len(delays), 0.0)

        store = Store("trainjobs")
        informer = Informer(api, kube_client.TRAINJOBS, store, sleep=sleep, clock=lambda: now[0])
        async with running(informer):
            await eventually(lambda: k.open_watches == 1, "watching after the faults")
    levels = [level for level, _ in informer_log(caplog)]
    # too large (quiet), too large as 500 (quiet, 1 s on), boom (warning, the count restarts),
    # too large (quiet), too large again TRANSIENT_SECONDS later (a warning).
    assert levels == [logging.DEBUG, logging.DEBUG, logging.WARNING, logging.DEBUG, logging.WARNING]


def test_too_large_resource_version_is_told_as_client_go_tells_it() -> None:
    def err(code: int, status: dict[str, Any] | None, reason: str = "") -> ApiException:
        return ApiException(status=code, reason=reason, body=json.dumps(status) if status else None)

    event = too_large_event("9", 8)["object"]
    assert too_large_resource_version(err(504, event))
    old = status_object(504, "Timeout", "Timeout: Too large resource version: 9, current: 8")
    assert too_large_resource_version(err(504, old))  # before 1.18.6: the message alone
    assert not too_large_resource_version(err(500, status_object(500, "InternalError", "boom")))
    assert not too_large_resource_version(err(504, None, "Gateway Timeout"))
    assert not too_large_resource_version(ApiException(status=500, reason="x", body="{not json"))


# --- 4. the cache's plans, fed by the informers -------------------------------------------------


@pytest.mark.asyncio
async def test_plan_for_follows_the_runtime_and_trainjob_in_the_cluster() -> None:
    pod = fixture("pod-create-by-job-controller.mutate.json")["request"]["object"]
    async with emulator() as (k, url), api_client(url) as api:
        cache = Cache(connected=True)
        cache.jobsets.replace([])  # listed, none: restart attempt 0
        async with running(*kube_client.informers(api, cache)):
            await eventually(lambda: cache.synced, "all three stores synced")
            assert cache.plan_for("team-a", "my-job").state == "no-trainjob"

            def state() -> str:
                return cache.plan_for("team-a", "my-job").state

            # Before the reconciler froze the runtime into it: no plan, and why follows the
            # runtime (its pods are held while it would gang them).
            await create(k, CLUSTER_RUNTIMES, cluster_runtime())
            created = await create(k, TRAINJOBS, trainjob())
            await eventually(lambda: state() == "unfrozen", "not frozen yet")
            unscheduled = {"spec": {"scheduling": None}}
            await patch(k, CLUSTER_RUNTIMES, None, "torch-distributed", unscheduled)
            await eventually(lambda: state() == "no-scheduling", "no plan")
            scheduling = cluster_runtime()["spec"]["scheduling"]
            await patch(
                k, CLUSTER_RUNTIMES, None, "torch-distributed", {"spec": {"scheduling": scheduling}}
            )
            await eventually(lambda: state() == "unfrozen", "scheduling again, not frozen")

            # The reconciler freezes it: planned from the snapshot, named by its uid.
            frozen = {
                "metadata": {"annotations": {SNAPSHOT_ANNOTATION: frozen_by_reconciler(cache)}}
            }
            await patch(k, TRAINJOBS, "team-a", "my-job", frozen)
            await eventually(lambda: state() == "ok", "a plan")
            lookup = cache.plan_for("team-a", "my-job")
            assert lookup.plan is not None
            assert lookup.plan.pod_group_for("node", 0) == pod_group_of(created)
            labels = pod["metadata"]["labels"]
            assert pod_group_for_labels(lookup.plan, labels) == pod_group_of(created)
            assert cache.plan_for("team-a", "my-job") is lookup  # memoised

            # Runtime edits affect TrainJobs created afterwards only (KEP-3015): a frozen one
            # keeps its plan when its runtime loses spec.scheduling or goes.
            await patch(k, CLUSTER_RUNTIMES, None, "torch-distributed", unscheduled)
            await eventually(
                lambda: (
                    (r := cache.cluster_runtimes.get("", "torch-distributed")) is not None
                    and r.raw["spec"].get("scheduling") is None
                ),
                "the runtime change in the cache",
            )
            assert cache.plan_for("team-a", "my-job") is lookup
            await delete(k, CLUSTER_RUNTIMES, None, "torch-distributed")
            await eventually(lambda: not len(cache.cluster_runtimes), "the runtime gone")
            assert cache.plan_for("team-a", "my-job") is lookup

            # The snapshot annotation changed (here to a frozen "no gang"): read again.
            no_gang = {"metadata": {"annotations": {SNAPSHOT_ANNOTATION: snapshot(None)}}}
            await patch(k, TRAINJOBS, "team-a", "my-job", no_gang)
            await eventually(lambda: state() == "frozen-no-gang", "frozen without a gang")
            assert len(k[LIST, TRAINING_RUNTIMES]) == 1  # the third informer listed, too


# --- 5 and 6. the service as a process, with --kubeconfig ---------------------------------------


def patch_ops(answer: dict[str, Any]) -> list[dict[str, Any]]:
    encoded = answer["response"].get("patch")
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(encoded)) if encoded else []
    return ops


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path, url: str, *extra: str, reconcile: bool = False
) -> AsyncIterator[tuple[ServerProcess, httpx.AsyncClient]]:
    """`python -m webhook serve --kubeconfig` against the emulator, and an HTTPS client for it.

    Waiting happens here, asynchronously: the emulator runs on this test's event loop.
    """
    config = tmp_path / "kubeconfig"
    config.write_text(kubeconfig(url))
    cert_dir = tmp_path / "certs"
    cert_dir.mkdir()
    ca_file = make_certs(cert_dir)
    # The reconciler off by default: these tests count the API requests the webhooks make (none).
    args = ("--kubeconfig", str(config), f"--reconcile={str(reconcile).lower()}", *extra)
    with server_process(cert_dir, *args, wait=False) as proc:
        verify = ssl.create_default_context(cafile=str(ca_file))
        async with httpx.AsyncClient(base_url=proc.url, verify=verify, timeout=10) as client:
            deadline = time.monotonic() + 20
            while True:
                assert proc.process.poll() is None, proc.log_file.read_text()
                with contextlib.suppress(httpx.HTTPError):
                    await client.get(f"{proc.health_url}/healthz")
                    break
                assert time.monotonic() < deadline, proc.log_file.read_text()
                await asyncio.sleep(0.05)
            try:
                yield proc, client
            finally:
                # Stop it here, waiting asynchronously: the emulator on this loop must keep
                # answering while the service shuts down (it releases its Lease on the way).
                await client.aclose()  # no idle keep-alive connection to wait for
                proc.process.terminate()
                deadline = time.monotonic() + 30
                while proc.process.poll() is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)


async def readyz(client: httpx.AsyncClient, proc: ServerProcess) -> httpx.Response:
    return await client.get(f"{proc.health_url}/readyz")


def test_owner_index_tells_which_of_a_trainjobs_objects_another_controller_made() -> None:
    """The pod webhook asks this for every pod: the answer follows the store's changes (a label
    taken off or put back, a delete) without scanning what the TrainJob owns."""
    from webhook.backends.base import MANAGED_BY, MANAGED_BY_LABEL
    from webhook.kube.index import OwnerIndex

    def gang(name: str, managed: bool, uid: str = "tj-uid") -> dict[str, Any]:
        labels = {MANAGED_BY_LABEL: MANAGED_BY} if managed else {"team": "a"}
        owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                 "name": "tj", "uid": uid, "controller": True}  # fmt: skip
        return {"metadata": {"name": name, "namespace": "ns", "labels": labels,
                             "ownerReferences": [owner]}}  # fmt: skip

    store = Store("podgroups")
    store.apply("ADDED", gang("ours", managed=True))
    store.apply("ADDED", gang("early", managed=False, uid="uid-0"))
    index = OwnerIndex(store)  # built from what the store holds, then kept current
    assert index.foreign_of("tj-uid") is None and index.foreign_of(None) is None
    assert [o["metadata"]["name"] for o in index.owned_by("tj-uid")] == ["ours"]
    assert (index.foreign_of("uid-0") or {})["metadata"]["name"] == "early"
    store.apply("MODIFIED", gang("early", managed=False, uid="uid-9"))  # another controller uid
    assert index.foreign_of("uid-0") is None and index.owned_by("uid-0") == []
    assert (index.foreign_of("uid-9") or {})["metadata"]["name"] == "early"

    store.apply("ADDED", gang("theirs", managed=False))
    assert (index.foreign_of("tj-uid") or {})["metadata"]["name"] == "theirs"
    assert index.foreign_of("another-uid") is None
    store.apply("MODIFIED", gang("theirs", managed=True))  # adopted: our label put on
    assert index.foreign_of("tj-uid") is None
    store.apply("MODIFIED", gang("ours", managed=False))  # our label taken off
    assert (index.foreign_of("tj-uid") or {})["metadata"]["name"] == "ours"
    store.apply("DELETED", gang("ours", managed=False))
    assert index.foreign_of("tj-uid") is None
    assert [o["metadata"]["name"] for o in index.owned_by("tj-uid")] == ["theirs"]
    store.replace([gang("other", managed=False, uid="uid-2")])  # a relist
    assert index.foreign_of("tj-uid") is None and index.owned_by("tj-uid") == []
    assert (index.foreign_of("uid-2") or {})["metadata"]["name"] == "other"
    store.forget()  # the watch stopped: nothing is known, and no owner is left behind
    assert index.foreign_of("uid-2") is None
    assert not index._by_owner and not index._foreign_by_owner  # private: no key leaks


@pytest.mark.asyncio
async def test_served_pod_reviews_read_the_watched_cache_and_never_the_api(tmp_path: Path) -> None:
    review = fixture("pod-create-by-job-controller.mutate.json")
    path = webhook_path(review, "mutate")
    async with emulator() as (k, url), serving(tmp_path, url) as (proc, client):
        await eventually_async(lambda: readyz(client, proc), 200, "/readyz 200 (caches synced)")
        for res in (TRAINJOBS, TRAINING_RUNTIMES, CLUSTER_RUNTIMES):
            assert len(k[LIST, res]) == 1, res
        # PriorityClasses are not needed for readiness: their first list may come later.
        await eventually(lambda: len(k[LIST, PRIORITY_CLASSES]) == 1, "PriorityClasses listed")

        await create(k, CLUSTER_RUNTIMES, cluster_runtime())
        # Frozen as the reconciler (not running here) would have frozen it.
        tj = trainjob()
        frozen = snapshot(Runtime.model_validate(cluster_runtime()))
        tj["metadata"]["annotations"] = {
            **tj["metadata"].get("annotations", {}),
            SNAPSHOT_ANNOTATION: frozen,
        }
        created = await create(k, TRAINJOBS, tj)
        expected = {"podGroupName": pod_group_of(created)}
        deadline = time.monotonic() + STALL
        while True:  # until the watches delivered both objects to the service
            answer = (await client.post(path, json=review)).json()
            assert answer["response"]["uid"] == review["request"]["uid"]
            ops = patch_ops(answer)
            if ops:
                break
            # Until then held (its TrainJob exists but is not in the cache yet), never loose.
            assert held_because(answer["response"]), answer
            assert time.monotonic() < deadline, answer
            await asyncio.sleep(0.05)
        assert answer["response"]["allowed"] is True
        assert ops == [{"op": "add", "path": "/spec/schedulingGroup", "value": expected}]

        before = len(list(k))
        for _ in range(50):
            answer = (await client.post(path, json=review)).json()
            assert patch_ops(answer) == ops
        await asyncio.sleep(0.2)  # a request the reviews had caused would have arrived by now
        assert len(list(k)) == before, [str(r.url) for r in list(k)[before:]]
        assert (await readyz(client, proc)).status_code == 200


@pytest.mark.asyncio
async def test_readyz_stays_503_while_a_list_fails_but_reviews_are_answered(tmp_path: Path) -> None:
    review = fixture("pod-create-by-job-controller.mutate.json")
    failing = asyncio.Event()
    failing.set()
    async with emulator() as (k, url):
        k[LIST, TRAINJOBS, failing] << status(500)
        async with serving(tmp_path, url) as (proc, client):
            await eventually(lambda: len(k[LIST, TRAINJOBS]) >= 3, "the list retried", timeout=20)
            others = (TRAINING_RUNTIMES, CLUSTER_RUNTIMES)
            await eventually(lambda: all(len(k[WATCH, r]) == 1 for r in others), "others watched")
            answer = await readyz(client, proc)
            assert answer.status_code == 503
            assert answer.json() == {"status": "not ready", "failing": ["cache:trainjobs"]}

            # A JobSet pod whose TrainJob the cache cannot hold yet: the API server is asked.
            # No TrainJob my-job: someone else's JobSet, let through untouched.
            response = (await client.post(webhook_path(review, "mutate"), json=review)).json()
            assert response["response"]["allowed"] is True
            assert "patch" not in response["response"]
            assert "warnings" not in response["response"]
            assert len(k[kmock.action.FETCH, TRAINJOBS]) == 1
            # A TrainJob that exists: its pod is held until the cache has it.
            await create(k, TRAINJOBS, trainjob(name="other-job"))
            other = copy.deepcopy(review)
            other["request"]["object"]["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] = (
                "other-job"
            )
            response = (await client.post(webhook_path(other, "mutate"), json=other)).json()
            assert held_because(response["response"]) == (
                'TrainJob "other-job" is not in this replica\'s cache yet; its Job creates it '
                "again shortly (trainjob-scheduling)"
            )
            assert len(k[kmock.action.FETCH, TRAINJOBS]) == 2
            runtime_review = fixture("clustertrainingruntime-create-level2.validate.json")
            response = (
                await client.post(webhook_path(runtime_review, "validate"), json=runtime_review)
            ).json()
            assert response["response"]["uid"] == runtime_review["request"]["uid"]
            assert response["response"]["allowed"] is True
            assert (await readyz(client, proc)).status_code == 503

            failing.clear()  # the API server recovers: the next retry lists, the service is ready
            await eventually_async(lambda: readyz(client, proc), 200, "/readyz 200", timeout=STALL)


async def eventually_async(
    get: Callable[[], Awaitable[httpx.Response]], status_code: int, what: str, timeout: float = 20.0
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            response = await get()
            if response.status_code == status_code:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.05)

"""The reconciler against an API server over HTTP (the kmock emulator with real resourceVersions,
uids, JSON Patch, conflicts and owner-reference garbage collection; tests/kube_emulator.py).

Each test runs the real chain: informers fill the cache, the reconciler's workers write through
`ApiWriter`, the watches bring the results back. Assertions read the emulator's stored objects.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import kmock
import pytest
from kubernetes.aio.client import ApiClient, Configuration

from tests.harness import fixture, webhook_path
from tests.kube_emulator import (
    CLUSTER_RUNTIMES,
    EVENTS,
    LEASES,
    POD_GROUPS,
    TRAINJOBS,
    WORKLOADS,
    VersionedEmulator,
    create,
    delete,
    emulator,
    eventually,
    next_requests,
    patch,
    status,
)
from tests.test_informer import serving
from webhook.backends.native import COMPOSITE, WORKLOAD
from webhook.core import naming
from webhook.core.snapshot import SNAPSHOT_ANNOTATION
from webhook.kube.cache import Cache
from webhook.kube.client import backend_informers, informers
from webhook.kube.events import EventRecorder
from webhook.kube.leader import LeaderElector, LeaseSettings
from webhook.kube.writer import ApiWriter, WriterSettings
from webhook.reconcile.reconciler import CONTROLLER, Reconciler, ReconcilerSettings

pytestmark = pytest.mark.asyncio

NS, NAME = "team-a", "my-job"
LEGACY_WORKLOAD = "my-job-f438be8c51"  # plan version 1 (was-api.md section 4)


def gang(k: VersionedEmulator) -> str:
    """The level-1 gang's name (the Workload, its template and PodGroup) of the stored
    TrainJob's run: plan version 3 qualifies it by its uid and, after a resume, its
    generation."""
    return naming.workload_name(NS, NAME, incarnation(stored(k, TRAINJOBS, NAME)))


def incarnation(trainjob: dict[str, Any] | None) -> str:
    """What qualifies a TrainJob's gang names at plan version 3 (core/plan.py)."""
    assert trainjob is not None
    generation = trainjob["metadata"].get("generation") or 1
    return uid(trainjob) + (f"/run/{generation}" if generation > 1 else "")


CREATE, UPDATE, DELETE = kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE


def cluster_runtime(name: str = "torch-distributed") -> dict[str, Any]:
    """Level 1: one gang of every pod, zone topology, disruptionMode all."""
    review = fixture("clustertrainingruntime-update-server-side-apply.validate.json")
    obj: dict[str, Any] = copy.deepcopy(review["request"]["object"])
    obj["metadata"] = {"name": name}
    return obj


def trainjob(name: str = NAME, *, suspend: bool = False) -> dict[str, Any]:
    """numNodes 100 on torch-distributed."""
    obj: dict[str, Any] = copy.deepcopy(
        fixture("trainjob-create.validate.json")["request"]["object"]
    )
    obj["metadata"] = {"name": name, "namespace": NS}
    obj["spec"]["suspend"] = suspend
    obj.pop("status", None)
    return obj


@dataclass
class World:
    """One replica's worth of reconciler: its own client, cache, watches and workers."""

    k: VersionedEmulator
    url: str
    settings: ReconcilerSettings = field(
        default_factory=lambda: ReconcilerSettings(workers=2, conflict_retry=0.2, wait_retry=0.05)
    )
    writer_timeout: float = 10.0
    identity: str = "test-replica"
    lease: LeaseSettings | None = None  # set: reconcile only while holding this Lease
    served: tuple[str, ...] = ("native",)  # the gang backends whose APIs discovery found
    composites: bool = False  # and whether it found CompositePodGroups
    cache: Cache = field(init=False)
    reconciler: Reconciler = field(init=False)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self, *, reconcile: bool = True) -> World:
        self.api = ApiClient(configuration=Configuration(host=self.url))
        self.api.user_agent = self.identity  # lets a reaction pick this replica's requests
        self.cache = Cache(connected=True)
        self.cache.jobsets.replace([])  # listed, none: restart attempt 0
        self.cache.kind_states[COMPOSITE] = "served" if self.composites else "not-served"
        watches = informers(self.api, self.cache)
        for backend in self.cache.backends.backends:
            if backend.name in self.served:
                self.cache.apis[backend.name] = "served"
                watches += backend_informers(self.api, self.cache, backend)
        self.events = EventRecorder(self.api, CONTROLLER, self.identity, dedupe_for=0.0)
        writer = ApiWriter(self.api, WriterSettings(timeout=self.writer_timeout))
        self.reconciler = Reconciler(self.cache, writer, self.events, self.settings)
        self.tasks = [asyncio.create_task(i.run()) for i in watches]
        self.tasks.append(asyncio.create_task(self.events.run()))
        if reconcile and self.lease is not None:
            self.elector = LeaderElector(self.api, self.lease)
            self.tasks.append(asyncio.create_task(self.elector.run(self.reconciler.run)))
        elif reconcile:
            self.tasks.append(asyncio.create_task(self.reconciler.run()))
        return self

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        close: Any = self.api.close
        await close()


@contextlib.asynccontextmanager
async def world(**kw: Any) -> AsyncIterator[World]:
    """The emulator (with the CRDs of the `served` backends other than native) and a World."""
    others = [b for b in kw.get("served", ()) if b != "native"]
    async with emulator(backends=others, composites=kw.get("composites", False)) as (k, url):
        w = await World(k, url, **kw).start()
        try:
            yield w
        finally:
            await w.stop()


def stored(k: VersionedEmulator, resource: kmock.resource, name: str) -> dict[str, Any] | None:
    """What the emulator holds now (read directly: the test's view, not a client's)."""
    for (r, ns, n), obj in list(k.objects.items()):
        if (r, ns, n) == (resource, NS, name) and not obj.deleted:
            raw: dict[str, Any] = obj.raw
            return raw
    return None


def objects(k: VersionedEmulator, resource: kmock.resource) -> list[dict[str, Any]]:
    return [
        obj.raw for (r, _, _), obj in list(k.objects.items()) if r == resource and not obj.deleted
    ]


def events(k: VersionedEmulator, reason: str) -> list[dict[str, Any]]:
    return [e for e in objects(k, EVENTS) if e.get("reason") == reason]


def writes(k: VersionedEmulator) -> int:
    """Every create, update/patch and delete of Workloads and PodGroups so far."""
    return sum(
        len(k[action, r]) for action in (CREATE, UPDATE, DELETE) for r in (WORKLOADS, POD_GROUPS)
    )


def uid(obj: dict[str, Any] | None) -> str:
    assert obj is not None
    return str(obj["metadata"]["uid"])


async def converged(
    k: VersionedEmulator, min_count: int = 100
) -> tuple[dict[str, Any], dict[str, Any]]:
    def both() -> Any:
        wl, pg = stored(k, WORKLOADS, gang(k)), stored(k, POD_GROUPS, gang(k))
        if wl is None or pg is None:
            return None
        if pg["spec"]["schedulingPolicy"]["gang"]["minCount"] != min_count:
            return None
        return wl, pg

    result: tuple[dict[str, Any], dict[str, Any]] = await eventually(both, "Workload and PodGroup")
    return result


async def a_trainjob_with_its_gang(
    k: VersionedEmulator,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The level-1 runtime and a TrainJob on it, once the reconciler has made their objects."""
    await create(k, CLUSTER_RUNTIMES, cluster_runtime())
    await create(k, TRAINJOBS, trainjob())
    return await converged(k)


async def shrink_min_count(k: VersionedEmulator) -> None:
    """Someone edits the PodGroup's minCount (to 3)."""
    body = {"spec": {"schedulingPolicy": {"gang": {"minCount": 3}}}}
    await patch(k, POD_GROUPS, NS, gang(k), body)


async def quiet(k: VersionedEmulator, seconds: float = 0.5) -> int:
    """Waits until no Workload/PodGroup write happened for `seconds`; returns the write count."""
    last, since = writes(k), time.monotonic()
    while time.monotonic() - since < seconds:
        await asyncio.sleep(0.05)
        now = writes(k)
        if now != last:
            last, since = now, time.monotonic()
    return last


# --- create --------------------------------------------------------------------------------------


async def test_a_trainjob_gets_its_workload_and_podgroup_from_the_plan() -> None:
    async with world() as w:
        wl, pg = await a_trainjob_with_its_gang(w.k)
        tj = stored(w.k, TRAINJOBS, NAME)
        assert tj is not None
        owner = {
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": NAME,
            "uid": uid(tj), "controller": True, "blockOwnerDeletion": True,
        }  # fmt: skip
        assert wl["metadata"]["ownerReferences"] == [owner]
        assert wl["spec"]["controllerRef"] == {
            "apiGroup": "trainer.kubeflow.org", "kind": "TrainJob", "name": NAME,
        }  # fmt: skip
        [template] = wl["spec"]["podGroupTemplates"]
        assert template == {
            "name": gang(w.k),
            "schedulingPolicy": {"gang": {"minCount": 100}},
            "schedulingConstraints": {"topology": [{"key": "topology.kubernetes.io/zone"}]},
            "disruptionMode": {"all": {}},
        }
        assert pg["metadata"]["ownerReferences"][0] == owner
        assert pg["metadata"]["ownerReferences"][1]["uid"] == uid(wl)
        assert pg["spec"]["workloadRef"] == {"workloadName": gang(w.k), "templateName": gang(w.k)}
        assert SNAPSHOT_ANNOTATION in tj["metadata"]["annotations"]
        # One Event for the pass that made both (not one per object).
        await eventually(lambda: events(w.k, "Created"), "a Created event")
        (event,) = events(w.k, "Created")
        assert event["note"] == f"created Workload {gang(w.k)!r}; created PodGroup {gang(w.k)!r}"
        assert event["regarding"]["uid"] == uid(tj)
        assert event["reportingController"] == CONTROLLER and event["type"] == "Normal"


async def test_a_second_pass_changes_nothing() -> None:
    async with world() as w:
        wl, pg = await a_trainjob_with_its_gang(w.k)
        before = await quiet(w.k)
        assert before == 2  # one create each, nothing else
        await patch(w.k, TRAINJOBS, NS, NAME, {"metadata": {"labels": {"touched": "yes"}}})
        w.reconciler.resync()
        assert await quiet(w.k) == before
        name = gang(w.k)
        assert (uid(stored(w.k, WORKLOADS, name)), uid(stored(w.k, POD_GROUPS, name))) == (
            uid(wl), uid(pg),
        )  # fmt: skip


async def test_a_trainjob_without_its_runtime_waits_for_it() -> None:
    async with world() as w:
        await create(w.k, TRAINJOBS, trainjob())
        await eventually(lambda: events(w.k, "RuntimeNotFound"), "a RuntimeNotFound event")
        assert writes(w.k) == 0
        await create(w.k, CLUSTER_RUNTIMES, cluster_runtime())
        await converged(w.k)


# --- lifecycle -----------------------------------------------------------------------------------


async def test_suspend_deletes_and_resume_recreates() -> None:
    async with world() as w:
        wl, _ = await a_trainjob_with_its_gang(w.k)
        await patch(w.k, TRAINJOBS, NS, NAME, {"spec": {"suspend": True}})
        await eventually(
            lambda: (
                not stored(w.k, WORKLOADS, gang(w.k)) and not stored(w.k, POD_GROUPS, gang(w.k))
            ),
            "both deleted on suspend",
        )
        await eventually(lambda: events(w.k, "Deleted"), "Deleted events")
        await patch(w.k, TRAINJOBS, NS, NAME, {"spec": {"suspend": False}})
        again, _ = await converged(w.k)
        assert uid(again) != uid(wl)


async def test_a_trainjob_created_suspended_gets_nothing_until_resumed() -> None:
    async with world() as w:
        await create(w.k, CLUSTER_RUNTIMES, cluster_runtime())
        await create(w.k, TRAINJOBS, trainjob(suspend=True))
        tj = await eventually(
            lambda: (
                (t := stored(w.k, TRAINJOBS, NAME))
                and SNAPSHOT_ANNOTATION in (t["metadata"].get("annotations") or {})
                and t
            ),
            "the runtime snapshot, taken at once even while suspended",
        )
        assert tj and await quiet(w.k, 0.3) == 0
        await patch(w.k, TRAINJOBS, NS, NAME, {"spec": {"suspend": False}})
        await converged(w.k)


@pytest.mark.parametrize("condition", ["Complete", "Failed"])
async def test_a_finished_trainjob_releases_its_gang(condition: str) -> None:
    async with world() as w:
        await a_trainjob_with_its_gang(w.k)
        finished = {"status": {"conditions": [{"type": condition, "status": "True"}]}}
        await patch(w.k, TRAINJOBS, NS, NAME, finished)
        await eventually(
            lambda: (
                not stored(w.k, WORKLOADS, gang(w.k)) and not stored(w.k, POD_GROUPS, gang(w.k))
            ),
            "both deleted when finished",
        )
        assert await quiet(w.k) == 4  # two creates, two deletes: nothing made again


async def test_deleting_the_trainjob_leaves_cleanup_to_garbage_collection() -> None:
    async with world() as w:
        await a_trainjob_with_its_gang(w.k)
        await delete(w.k, TRAINJOBS, NS, NAME)
        await eventually(
            lambda: not objects(w.k, WORKLOADS) and not objects(w.k, POD_GROUPS),
            "the garbage collector removes what the TrainJob owned",
        )
        assert len(w.k[DELETE, WORKLOADS]) == 0  # the reconciler did not delete them itself
        # Nor recreated them: the collector's deletions may arrive before the TrainJob's own
        # DELETED event, and the reconciler waits a moment (gc_grace) before it looks again.
        assert await quiet(w.k, 2.5) == 2
        assert not objects(w.k, WORKLOADS) and not objects(w.k, POD_GROUPS)


async def test_objects_deleted_by_someone_else_come_back_only_if_the_trainjob_stays() -> None:
    async with world() as w:
        await a_trainjob_with_its_gang(w.k)
        # As the garbage collector does once the TrainJob is gone, but with the TrainJob here.
        await delete(w.k, POD_GROUPS, NS, gang(w.k))
        await delete(w.k, WORKLOADS, NS, gang(w.k))
        await asyncio.sleep(0.5)
        assert not objects(w.k, WORKLOADS)  # not at once: its TrainJob may be going too
        await converged(w.k)  # after gc_grace: the TrainJob is still here, so they return

        await delete(w.k, POD_GROUPS, NS, gang(w.k))
        await delete(w.k, WORKLOADS, NS, gang(w.k))
        await asyncio.sleep(0.5)
        await delete(w.k, TRAINJOBS, NS, NAME)  # its DELETED event came late
        await asyncio.sleep(2.5)
        assert not objects(w.k, WORKLOADS) and not objects(w.k, POD_GROUPS)
        assert len(w.k[CREATE, WORKLOADS]) == 2  # the first and the one after gc_grace


# --- drift ---------------------------------------------------------------------------------------


async def test_a_changed_min_count_is_patched_back_in_place() -> None:
    async with world() as w:
        wl, pg = await a_trainjob_with_its_gang(w.k)
        await shrink_min_count(w.k)
        await eventually(
            lambda: (
                (p := stored(w.k, POD_GROUPS, gang(w.k)))
                and p["spec"]["schedulingPolicy"]["gang"]["minCount"] == 100
            ),
            "minCount restored",
        )
        assert uid(stored(w.k, POD_GROUPS, gang(w.k))) == uid(pg)  # the same object
        assert uid(stored(w.k, WORKLOADS, gang(w.k))) == uid(wl)
        await eventually(lambda: events(w.k, "Updated"), "an Updated event")


async def test_server_defaults_are_not_drift() -> None:
    async with world() as w:
        # What defaulting and the Priority admission plugin add to a PodGroup on its create
        # (a real server refuses to add them later: they are immutable).
        w.k.pod_group_defaults = True
        _, pg = await a_trainjob_with_its_gang(w.k)
        assert pg["spec"]["priority"] == 0
        assert pg["spec"]["preemptionPolicy"] == "PreemptLowerPriority"
        assert await quiet(w.k) == 2  # the two creates: nothing patched or recreated
        assert uid(stored(w.k, POD_GROUPS, gang(w.k))) == uid(pg)


async def test_any_other_drift_deletes_and_recreates() -> None:
    """A stored PodGroup that differs on an immutable field (as one an earlier plan made: a real
    server refuses to change it in place) goes, Workload too, and both are made again, while
    no pod names it."""
    async with emulator() as (k, url):
        first = await World(k, url).start()
        try:
            wl, pg = await a_trainjob_with_its_gang(k)
        finally:
            await first.stop()
        drifted = copy.deepcopy(pg)
        drifted["spec"]["schedulingConstraints"] = {"topology": [{"key": "example.com/rack"}]}
        await delete(k, POD_GROUPS, NS, gang(k))
        old = await create(k, POD_GROUPS, drifted)
        w = await World(k, url).start()
        try:

            def recreated() -> Any:
                p = stored(w.k, POD_GROUPS, gang(w.k))
                return (
                    p
                    and uid(p) != uid(old)
                    and p["spec"]["schedulingConstraints"]["topology"][0]["key"]
                    == "topology.kubernetes.io/zone"
                )

            await eventually(recreated, "the PodGroup recreated as planned")
            await converged(w.k)
            assert uid(stored(w.k, WORKLOADS, gang(w.k))) != uid(wl)  # rule 8(f): both go
            await quiet(w.k)
            assert len(objects(w.k, WORKLOADS)) == 1 and len(objects(w.k, POD_GROUPS)) == 1
        finally:
            await w.stop()


# --- ownership -----------------------------------------------------------------------------------


async def test_a_foreign_object_with_our_name_is_left_alone_and_reported() -> None:
    async with world() as w:
        w.cache.apis["native"] = "not-served"  # until the foreign object is there
        await create(w.k, CLUSTER_RUNTIMES, cluster_runtime())
        await create(w.k, TRAINJOBS, trainjob())
        name = gang(w.k)
        foreign = {
            "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"podGroupTemplates": [{"name": "x", "schedulingPolicy": {"basic": {}}}]},
        }  # fmt: skip
        await create(w.k, WORKLOADS, foreign)
        before = stored(w.k, WORKLOADS, name)
        await eventually(lambda: w.cache.store(WORKLOAD).get(NS, name), "the foreign one cached")
        w.cache.apis["native"] = "served"
        w.reconciler.resync()
        conflict = (await eventually(lambda: events(w.k, "Conflict"), "a Conflict event"))[0]
        assert conflict["type"] == "Warning" and name in conflict["note"]
        await asyncio.sleep(0.5)  # several conflict retries
        assert stored(w.k, WORKLOADS, name) == before  # untouched
        assert not objects(w.k, POD_GROUPS)
        assert len(w.k[UPDATE, WORKLOADS]) == 0 and len(w.k[DELETE, WORKLOADS]) == 0
        await delete(w.k, WORKLOADS, NS, name)  # the owner of the foreign one gives way
        wl, _ = await converged(w.k)
        assert uid(wl) != uid(before)


# --- API failures --------------------------------------------------------------------------------


async def test_server_errors_are_retried_and_nothing_is_duplicated() -> None:
    async with world() as w:
        next_requests(w.k[CREATE, WORKLOADS], 2) << status(500)
        next_requests(w.k[CREATE, POD_GROUPS], 1) << status(500)
        await a_trainjob_with_its_gang(w.k)
        await quiet(w.k)
        assert len(objects(w.k, WORKLOADS)) == 1 and len(objects(w.k, POD_GROUPS)) == 1


async def test_conflicts_and_timeouts_are_retried() -> None:
    async with world(writer_timeout=0.3) as w:

        async def slow(request: kmock.Request) -> NoReturn:
            await asyncio.sleep(2)
            raise status(500)

        next_requests(w.k[CREATE, POD_GROUPS], 1) << slow
        await a_trainjob_with_its_gang(w.k)
        await shrink_min_count(w.k)
        next_requests(w.k[UPDATE, POD_GROUPS], 1) << status(409)
        await converged(w.k, 100)
        await quiet(w.k)
        assert len(objects(w.k, POD_GROUPS)) == 1


async def test_dropped_watches_and_410_gone_lose_nothing() -> None:
    async with world() as w:
        await create(w.k, CLUSTER_RUNTIMES, cluster_runtime())
        await eventually(lambda: w.k.open_watches >= 5, "all watches open")
        w.k.drop_watches()
        await create(w.k, TRAINJOBS, trainjob())
        await converged(w.k)
        w.k.compact()
        w.k.drop_watches()  # they resume from a compacted version: 410, list again
        await patch(w.k, TRAINJOBS, NS, NAME, {"spec": {"suspend": True}})
        await eventually(lambda: not objects(w.k, WORKLOADS), "deleted after the relist")


async def test_a_restart_midway_converges_to_the_same_objects() -> None:
    async with emulator() as (k, url):
        first = await World(k, url).start()
        next_requests(k[CREATE, POD_GROUPS], 1) << status(500)
        await create(k, CLUSTER_RUNTIMES, cluster_runtime())
        await create(k, TRAINJOBS, trainjob())
        wl = await eventually(lambda: stored(k, WORKLOADS, gang(k)), "the Workload")
        await first.stop()  # gone midway: maybe before its PodGroup, maybe after a failed try
        second = await World(k, url).start()
        try:
            await converged(k)
            await quiet(k)
            assert uid(stored(k, WORKLOADS, gang(k))) == uid(wl)
            assert len(objects(k, WORKLOADS)) == 1 and len(objects(k, POD_GROUPS)) == 1
        finally:
            await second.stop()


# --- runtime edits -------------------------------------------------------------------------------


async def test_a_runtime_edit_changes_only_trainjobs_created_afterwards() -> None:
    async with world() as w:
        wl, _ = await a_trainjob_with_its_gang(w.k)
        before = await quiet(w.k)
        rack = {"topology": [{"key": "example.com/rack"}]}
        await patch(w.k, CLUSTER_RUNTIMES, None, "torch-distributed",
                    {"spec": {"scheduling": {"schedulingConstraints": rack}}})  # fmt: skip
        await create(w.k, TRAINJOBS, trainjob("later-job"))
        later = await eventually(
            lambda: [
                x for x in objects(w.k, WORKLOADS) if x["metadata"]["name"].startswith("later-job")
            ],
            "the later TrainJob's Workload",
        )
        assert later[0]["spec"]["podGroupTemplates"][0]["schedulingConstraints"] == rack
        await quiet(w.k)
        old = stored(w.k, WORKLOADS, gang(w.k))
        assert old is not None and uid(old) == uid(wl)
        assert old["spec"]["podGroupTemplates"][0]["schedulingConstraints"]["topology"][0][
            "key"
        ] == ("topology.kubernetes.io/zone")
        assert writes(w.k) == before + 2  # the later TrainJob's two creates, nothing else


# --- high availability ---------------------------------------------------------------------------


def replica_writes(k: VersionedEmulator, identity: str) -> int:
    """Workload/PodGroup writes (and snapshot patches) sent by one replica."""
    by: Any = kmock.headers({"User-Agent": identity})
    resources = (WORKLOADS, POD_GROUPS, TRAINJOBS)
    return sum(len(k[a, r, by]) for a in (CREATE, UPDATE, DELETE) for r in resources)


def lease_holder(
    k: VersionedEmulator, namespace: str = "default", lease: str = "reconciler"
) -> str | None:
    for (r, ns, name), obj in list(k.objects.items()):
        if r == LEASES and (ns, name) == (namespace, lease) and not obj.deleted:
            holder: str | None = obj.raw.get("spec", {}).get("holderIdentity")
            return holder
    return None


async def test_two_replicas_only_the_leader_writes_and_the_other_takes_over() -> None:
    async with emulator() as (k, url):

        def replica(identity: str) -> World:
            lease = LeaseSettings("default", "reconciler", identity, 1.0, 0.6, 0.1)
            return World(k, url, identity=identity, lease=lease)

        a = await replica("replica-a").start()
        await eventually(lambda: lease_holder(k) == "replica-a", "replica-a leads")
        b = await replica("replica-b").start()
        try:
            await create(k, CLUSTER_RUNTIMES, cluster_runtime())
            await create(k, TRAINJOBS, trainjob())
            await converged(k)
            await quiet(k)
            assert replica_writes(k, "replica-a") == 3  # the snapshot, the Workload, the PodGroup
            assert replica_writes(k, "replica-b") == 0
            assert lease_holder(k) == "replica-a"

            # The leader dies: its connection to the API server is gone, it releases nothing.
            k[kmock.headers({"User-Agent": "replica-a"})] << status(503)
            await eventually(lambda: lease_holder(k) == "replica-b", "replica-b takes over", 10)
            assert a.reconciler.queue is None  # past its renew deadline, replica-a stopped
            await create(k, TRAINJOBS, trainjob("second-job"))
            await patch(k, TRAINJOBS, NS, NAME, {"spec": {"suspend": True}})

            def only_the_second_job() -> bool:
                names = [w["metadata"]["name"] for w in objects(k, WORKLOADS)]
                pod_groups = objects(k, POD_GROUPS)
                return len(names) == len(pod_groups) == 1 and names[0].startswith("second-job")

            await eventually(only_the_second_job, "replica-b converged: suspended job's gone")
            await quiet(k)
            assert replica_writes(k, "replica-b") == 5  # delete 2, snapshot + 2 creates
            assert len(objects(k, WORKLOADS)) == 1 and len(objects(k, POD_GROUPS)) == 1
        finally:
            await b.stop()
            await a.stop()


# --- one process ---------------------------------------------------------------------------------


async def test_serve_runs_webhooks_and_the_leader_elected_reconciler_in_one_process(
    tmp_path: Path,
) -> None:
    review = fixture("pod-create-by-job-controller.mutate.json")
    async with (
        emulator() as (k, url),
        serving(tmp_path, url, "--namespace", "trainjob-system", reconcile=True) as (_, client),
    ):
        await create(k, CLUSTER_RUNTIMES, cluster_runtime())
        await create(k, TRAINJOBS, trainjob())
        await converged(k)
        assert lease_holder(k, "trainjob-system", "trainjob-scheduling-webhook")
        tj = stored(k, TRAINJOBS, NAME)
        assert tj is not None and SNAPSHOT_ANNOTATION in tj["metadata"]["annotations"]
        # The pod webhook plans from the same snapshot: the pod joins the PodGroup just made.
        answer = (await client.post(webhook_path(review, "mutate"), json=review)).json()
        ops = json.loads(base64.b64decode(answer["response"]["patch"]))
        assert ops == [
            {"op": "add", "path": "/spec/schedulingGroup", "value": {"podGroupName": gang(k)}}
        ]
        await patch(k, TRAINJOBS, NS, NAME, {"spec": {"suspend": True}})
        await eventually(lambda: not objects(k, WORKLOADS), "deleted on suspend")


async def test_without_the_scheduling_api_nothing_is_made_and_the_webhooks_stay_ready(
    tmp_path: Path,
) -> None:
    async with (
        emulator(scheduling=False) as (k, url),
        serving(tmp_path, url, reconcile=True) as (
            proc,
            client,
        ),
    ):
        await create(k, CLUSTER_RUNTIMES, cluster_runtime())
        await create(k, TRAINJOBS, trainjob())

        def unavailable_logged() -> bool:
            return any(
                line.get("logger") == "webhook.discovery" and line["level"] == "error"
                for line in proc.log_lines()
            )

        await eventually(unavailable_logged, "a log line: gang scheduling unavailable")
        await asyncio.sleep(0.5)  # time enough for a reconciler to act, had it wanted to
        ready = await client.get(f"{proc.health_url}/readyz")
        assert ready.status_code == 200
        review = fixture("pod-create-by-job-controller.mutate.json")
        answer = (await client.post(webhook_path(review, "mutate"), json=review)).json()
        # Its pods are held (the API server would drop a schedulingGroup silently), not let
        # through loose; the runtime is frozen, so the gang is made once the API is served.
        held = answer["response"]
        assert held["allowed"] is False and held["status"]["code"] == 403, held
        assert "scheduling.k8s.io/v1beta1 or v1alpha2 is not served" in held["status"]["message"]
        await eventually(lambda: tj_annotated(k), "the runtime frozen")
        for resource in (WORKLOADS, POD_GROUPS):
            assert len(k[CREATE, resource]) == 0, resource
        # One Event says why the TrainJob has no gang (and no more on later passes).
        (event,) = objects(k, EVENTS)
        assert event["reason"] == "GangBackendUnavailable", event
        assert "scheduling.k8s.io/v1beta1" in event["note"], event


def tj_annotated(k: VersionedEmulator) -> bool:
    tj = stored(k, TRAINJOBS, NAME)
    return tj is not None and SNAPSHOT_ANNOTATION in (tj["metadata"].get("annotations") or {})


async def test_writes_whose_answers_nobody_reads_still_fail_as_the_api_server_says() -> None:
    """The snapshot patch and the Events are not decoded, but a refusal is still an ApiException
    with the API server's status (the reconciler's 404/409/422 handling depends on it)."""
    from kubernetes.aio.client.exceptions import ApiException

    async with world() as w:
        writer = ApiWriter(w.api)
        with pytest.raises(ApiException) as gone:
            await writer.snapshot_runtime(NS, "no-such-trainjob", "uid-1", "{}", None)
        assert gone.value.status == 404 and "not found" in str(gone.value.body)
        await create(w.k, TRAINJOBS, trainjob())
        tj = await eventually(lambda: stored(w.k, TRAINJOBS, NAME), "the TrainJob")
        with pytest.raises(ApiException) as other:  # a uid the stored TrainJob does not have
            await writer.snapshot_runtime(NS, NAME, "another-uid", "{}", None)
        assert other.value.status in (409, 422)
        await writer.snapshot_runtime(NS, NAME, uid(tj), "{}", tj["metadata"]["resourceVersion"])
        after = stored(w.k, TRAINJOBS, NAME)
        assert after is not None and after["metadata"]["annotations"][SNAPSHOT_ANNOTATION] == "{}"

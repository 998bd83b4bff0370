"""The GangScheduling condition over HTTP: the reconciler, its status writer and the pod watch
against the API emulator (server-side apply on `trainjobs/status`, field managers, `listType=map`
conditions; tests/kube_emulator.py). Each test drives the situation the way a cluster does
(the scheduler writes the PodGroup's status, JobSet's pods come and go, the Trainer controller
writes its own status with a merge patch) and reads what is stored."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
from kubernetes.aio.client import ApiClient, Configuration

from tests.builders import parsed, runtime, torch_node
from tests.builders import trainjob as builders_trainjob
from tests.kube_emulator import (
    CLUSTER_RUNTIMES,
    NODES,
    POD_GROUPS,
    PODS,
    TRAINJOBS,
    WORKLOADS,
    VersionedEmulator,
    create,
    delete,
    emulator,
    eventually,
    get,
    next_requests,
    patch,
    status,
)
from tests.nodes import nodes
from tests.test_backends import hand_made_workload
from tests.test_reconciler import (
    NAME,
    NS,
    cluster_runtime,
    events,
    gang,
    lease_holder,
    stored,
    trainjob,
)
from webhook.backends.native import COMPOSITE, POD_GROUP, WORKLOAD
from webhook.core import condition as cond
from webhook.core.plan import JOB_INDEX, JOBSET_NAME, REPLICATED_JOB_NAME, build_plan
from webhook.kube.cache import Cache
from webhook.kube.client import backend_informers, informers, node_informer, pod_informers
from webhook.kube.events import EventRecorder
from webhook.kube.gangpods import GangPods, JobKey, JobPods
from webhook.kube.leader import LeaderElector, LeaseSettings
from webhook.kube.writer import ApiWriter
from webhook.metrics.registry import Metrics
from webhook.reconcile import status as status_module
from webhook.reconcile.reconciler import CONTROLLER, Reconciler, ReconcilerSettings
from webhook.reconcile.status import Outcome, StatusWriter

pytestmark = pytest.mark.asyncio
NUM_NODES = 4  # the TrainJob's numNodes: one gang of 4 pods


class Service:
    """One leader's reconciler with its status writer and pod watch, on its own client."""

    def __init__(
        self,
        k: VersionedEmulator,
        url: str,
        *,
        served: bool = True,
        identity: str = "test",
        lease: LeaseSettings | None = None,
    ) -> None:
        self.k = k
        self.api = ApiClient(configuration=Configuration(host=url))
        self.api.user_agent = identity  # lets a test pick this replica's requests
        self.cache = Cache(connected=True)
        self.cache.jobsets.replace([])  # listed, none: restart attempt 0
        self.cache.kind_states[COMPOSITE] = "not-served"
        self.cache.apis["native"] = "served" if served else "not-served"
        self.metrics = Metrics()
        self.pods = GangPods()
        watches = informers(self.api, self.cache) + pod_informers(self.api, self.pods)
        watches.append(node_informer(self.api, self.cache))
        native = self.cache.backends.named("native")
        assert native is not None
        watches += backend_informers(self.api, self.cache, native)
        self.events = EventRecorder(self.api, CONTROLLER, "test", dedupe_for=0.0)
        writer = ApiWriter(self.api)
        self.status = StatusWriter(self.cache, writer, self.events, self.pods, metrics=self.metrics)
        settings = ReconcilerSettings(workers=2, conflict_retry=0.2, wait_retry=0.05)
        self.reconciler = Reconciler(
            self.cache, writer, self.events, settings, metrics=self.metrics, status=self.status
        )
        self.tasks = [asyncio.create_task(i.run()) for i in watches]
        self.tasks.append(asyncio.create_task(self.events.run()))
        if lease is None:
            self.tasks.append(asyncio.create_task(self.reconciler.run()))
        else:
            elector = LeaderElector(self.api, lease)
            self.tasks.append(asyncio.create_task(elector.run(self.reconciler.run)))

    def writes(self) -> float:
        """Condition applies so far (the writer counts each one the API server took)."""
        return sum(
            s.value
            for m in self.metrics.registry.collect()
            if m.name == "trainjob_scheduling_status_writes"
            for s in m.samples
            if s.name.endswith("_total")
        )

    def sample(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return value or 0.0

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        close: Any = self.api.close
        await close()


@contextlib.asynccontextmanager
async def service(*, served: bool = True) -> AsyncIterator[Service]:
    async with emulator() as (k, url):
        s = Service(k, url, served=served)
        try:
            yield s
        finally:
            await s.stop()


def the_trainjob(k: VersionedEmulator) -> dict[str, Any]:
    tj = stored(k, TRAINJOBS, NAME)
    assert tj is not None
    return tj


def current(k: VersionedEmulator) -> dict[str, Any]:
    found = the_condition(k)
    assert found is not None
    return found


def the_condition(k: VersionedEmulator) -> dict[str, Any] | None:
    tj = stored(k, TRAINJOBS, NAME)
    return dict(found) if tj and (found := cond.stored_condition(tj)) else None


async def condition_is(k: VersionedEmulator, reason: str, status: str = "False") -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        found = the_condition(k)
        ok = found is not None and found["reason"] == reason and found["status"] == status
        return found if ok else None

    found: dict[str, Any] = await eventually(check, f"GangScheduling={status} {reason}")
    return found


async def settled(s: Service, seconds: float = 0.5) -> float:
    """Waits until no condition was written for `seconds`; returns the write count."""
    last, since = s.writes(), time.monotonic()
    while time.monotonic() - since < seconds:
        await asyncio.sleep(0.05)
        if s.writes() != last:
            last, since = s.writes(), time.monotonic()
    return last


def small_trainjob(**kw: Any) -> dict[str, Any]:
    tj = trainjob(**kw)
    tj["spec"]["trainer"]["numNodes"] = NUM_NODES
    return tj


async def with_its_gang(s: Service) -> str:
    """The runtime and a 4-node TrainJob; returns its PodGroup's name once made."""
    await create(s.k, CLUSTER_RUNTIMES, cluster_runtime())
    await create(s.k, TRAINJOBS, small_trainjob())

    def made() -> str | None:
        groups = [o for (r, _, _), o in list(s.k.objects.items()) if r == POD_GROUPS]
        return str(groups[0].raw["metadata"]["name"]) if groups else None

    name: str = await eventually(made, "the PodGroup")
    return name


async def a_scheduled_gang(s: Service) -> str:
    """The runtime, the TrainJob, its 4 pods (tied, bound) and the scheduler's word that the
    gang is scheduled; returns its PodGroup's name."""
    group = await with_its_gang(s)
    for i in range(NUM_NODES):
        await create(s.k, PODS, pod(i))
    await scheduler_says(s, group, "True", "Scheduled", "")
    return group


async def scheduler_says(s: Service, group: str, status: str, reason: str, message: str) -> None:
    condition = {
        "type": "PodGroupInitiallyScheduled",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-12-02T10:00:00Z",
    }
    await patch(s.k, POD_GROUPS, NS, group, {"status": {"conditions": [condition]}})


def pod(
    index: int, *, bound: bool = True, phase: str = "Running", tied: bool = True
) -> dict[str, Any]:
    """One of JobSet's pods; tied as the pod webhook ties it (the status writer reads only
    whether it has a schedulingGroup, not which)."""
    labels = {JOBSET_NAME: NAME, REPLICATED_JOB_NAME: "node", JOB_INDEX: "0"}
    spec: dict[str, Any] = {"containers": [{"name": "node", "image": "torch"}]}
    if tied:
        spec["schedulingGroup"] = {"podGroupName": f"{NAME}-its-gang"}
    if bound:
        spec["nodeName"] = f"gpu-{index}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{NAME}-node-0-{index}-x", "namespace": NS, "labels": labels},
        "spec": spec,
        "status": {"phase": phase},
    }


async def test_a_new_trainjob_waits_for_the_scheduler_and_a_second_pass_writes_nothing() -> None:
    async with service() as s:
        await with_its_gang(s)
        found = await condition_is(s.k, cond.WAITING_FOR_SCHEDULER)
        assert found["observedGeneration"] == the_trainjob(s.k)["metadata"]["generation"]
        written = await settled(s)
        assert written == 1  # one write for a new TrainJob
        s.reconciler.resync()  # every TrainJob again: the condition says the same
        assert await settled(s) == written
        managers = [m["manager"] for m in the_trainjob(s.k)["metadata"]["managedFields"]]
        assert cond.FIELD_MANAGER in managers
        # The pod watch asks for JobSet's pods only, in pages.
        reads = list(s.k[kmock.method.GET, PODS])
        assert reads and all(r.params.get("labelSelector") == JOBSET_NAME for r in reads)
        assert any(r.params.get("limit") == "500" for r in reads)


async def test_unschedulable_is_waiting_for_capacity_with_the_schedulers_words() -> None:
    async with service() as s:
        group = await with_its_gang(s)
        said = "0/8 nodes are available: 8 Insufficient nvidia.com/gpu."
        await scheduler_says(s, group, "False", "Unschedulable", said)
        found = await condition_is(s.k, cond.WAITING_FOR_CAPACITY)
        assert said in found["message"] and group in found["message"]


async def test_scheduled_then_degraded_then_back(monkeypatch: pytest.MonkeyPatch) -> None:
    # Long enough that the check "not at once" below holds on a loaded machine.
    monkeypatch.setattr(status_module, "RECOUNT_AFTER", 4.0)
    async with service() as s:
        group = await a_scheduled_gang(s)
        scheduled = await condition_is(s.k, cond.SCHEDULED, "True")
        assert scheduled["message"] == f"gang {group} is scheduled"
        # A node fails: its pod is gone.
        await delete(s.k, PODS, NS, f"{NAME}-node-0-3-x")
        found = await condition_is(s.k, cond.DEGRADED)
        assert f"gang {group} has 3 of the {NUM_NODES} live pods" in found["message"]
        await eventually(lambda: events(s.k, "GangDegraded"), "a GangDegraded Event")
        assert s.sample("trainjob_scheduling_gangs_degraded") == 1
        assert s.sample("trainjob_scheduling_gang_degradations_total", namespace=NS) == 1
        # Another pod lost: the count is written again, but not at once (each write wakes
        # Trainer's worker): once RECOUNT_AFTER has passed since the last write.
        written = await settled(s)
        await delete(s.k, PODS, NS, f"{NAME}-node-0-2-x")
        await asyncio.sleep(0.3)
        assert s.writes() == written and "has 3 of" in current(s.k)["message"]
        found = await condition_is(s.k, cond.DEGRADED)
        recount = await eventually(
            lambda: "has 2 of" in current(s.k)["message"], "the new count", timeout=20
        )
        # The writer counts a write once its answer is read, after the emulator stored it.
        assert recount and await settled(s) == written + 1
        assert current(s.k)["lastTransitionTime"] == found["lastTransitionTime"]
        await create(s.k, PODS, pod(2))
        # JobSet recreates it; it is bound again.
        await create(s.k, PODS, pod(3, bound=False, phase="Pending"))
        await asyncio.sleep(0.3)
        assert current(s.k)["reason"] == cond.DEGRADED  # not back until it is bound
        await patch(s.k, PODS, NS, f"{NAME}-node-0-3-x", {"spec": {"nodeName": "gpu-9"}})
        await condition_is(s.k, cond.SCHEDULED, "True")
        assert s.sample("trainjob_scheduling_gangs_degraded") == 0
        assert len(events(s.k, "GangDegraded")) == 1


async def test_untied_pods_of_a_gang_are_said_counted_and_cleared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pod of the gang with no schedulingGroup (it escaped the webhook): the gang may wait
    for it for ever; the condition says PodsUntied with how many, the gauge counts the
    TrainJob, and both go once the pod is gone."""
    monkeypatch.setattr(status_module, "RECOUNT_AFTER", 4.0)
    async with service() as s:
        group = await a_scheduled_gang(s)
        await condition_is(s.k, cond.SCHEDULED, "True")
        assert s.sample("trainjob_scheduling_gangs_with_untied_pods") == 0
        await create(s.k, PODS, pod(4, bound=False, phase="Pending", tied=False))
        found = await condition_is(s.k, cond.PODS_UNTIED)
        assert found["message"].startswith("1 pending or running pod has no spec.schedulingGroup")
        assert f"gang {group} counts only the pods that reference it" in found["message"]
        assert s.sample("trainjob_scheduling_gangs_with_untied_pods") == 1
        # A second one: the count is written again, not at once (the Degraded rate).
        written = await settled(s)
        await create(s.k, PODS, pod(5, tied=False))
        await asyncio.sleep(0.3)
        assert s.writes() == written and current(s.k)["message"].startswith("1 pending")
        await eventually(
            lambda: current(s.k)["message"].startswith("2 pending or running pods have"),
            "the new count",
            timeout=20,
        )
        # Gone (deleted, or finished: a finished pod holds nothing): the gang is whole again.
        await delete(s.k, PODS, NS, f"{NAME}-node-0-4-x")
        await patch(s.k, PODS, NS, f"{NAME}-node-0-5-x", {"status": {"phase": "Succeeded"}})
        await condition_is(s.k, cond.SCHEDULED, "True")
        assert s.sample("trainjob_scheduling_gangs_with_untied_pods") == 0
        assert not events(s.k, "GangDegraded")


async def test_a_suspended_trainjob_is_suspended_never_degraded() -> None:
    async with service() as s:
        await a_scheduled_gang(s)
        await condition_is(s.k, cond.SCHEDULED, "True")
        await patch(s.k, TRAINJOBS, NS, NAME, {"spec": {"suspend": True}})
        for i in range(NUM_NODES):  # JobSet deletes the pods of a suspended job
            await delete(s.k, PODS, NS, f"{NAME}-node-0-{i}-x")
        await condition_is(s.k, cond.SUSPENDED)
        await settled(s)
        assert current(s.k)["reason"] == cond.SUSPENDED
        assert not events(s.k, "GangDegraded")


async def test_a_finished_trainjob_says_so() -> None:
    async with service() as s:
        await with_its_gang(s)
        await condition_is(s.k, cond.WAITING_FOR_SCHEDULER)
        complete = {"type": "Complete", "status": "True", "reason": "Done", "message": "done"}
        tj = the_trainjob(s.k)
        kept = tj["status"]["conditions"]  # Trainer's merge patch: its cached list plus its own
        await patch(s.k, TRAINJOBS, NS, NAME, {"status": {"conditions": [*kept, complete]}})
        await condition_is(s.k, cond.FINISHED)
        types = [c["type"] for c in the_trainjob(s.k)["status"]["conditions"]]
        assert sorted(types) == ["Complete", cond.CONDITION_TYPE]


async def test_a_condition_dropped_by_a_stale_merge_patch_is_applied_again() -> None:
    """Trainer's `Status().Patch(MergeFrom(prev))` from a cache without our condition replaces
    the whole list: ours is gone, theirs stays; the service applies ours again, and theirs is
    kept."""
    async with service() as s:
        await with_its_gang(s)
        await condition_is(s.k, cond.WAITING_FOR_SCHEDULER)
        before = await settled(s)
        theirs = {"type": "Suspended", "status": "False", "reason": "Resumed", "message": "m"}
        await patch(s.k, TRAINJOBS, NS, NAME, {"status": {"conditions": [theirs]}})
        assert the_condition(s.k) is None  # dropped
        await condition_is(s.k, cond.WAITING_FOR_SCHEDULER)
        assert await settled(s) == before + 1
        types = [c["type"] for c in the_trainjob(s.k)["status"]["conditions"]]
        assert sorted(types) == [cond.CONDITION_TYPE, "Suspended"]
        # A revert of ours to something else is put right too.
        reverted = {**current(s.k), "reason": "Scheduled", "status": "True"}
        await patch(s.k, TRAINJOBS, NS, NAME, {"status": {"conditions": [theirs, reverted]}})
        await condition_is(s.k, cond.WAITING_FOR_SCHEDULER)


async def test_a_trainjob_whose_runtime_has_no_scheduling_is_never_written() -> None:
    async with service() as s:
        runtime = cluster_runtime()
        runtime["spec"].pop("scheduling", None)
        await create(s.k, CLUSTER_RUNTIMES, runtime)
        await create(s.k, TRAINJOBS, small_trainjob())
        await asyncio.sleep(0.5)
        s.reconciler.resync()
        assert await settled(s) == 0
        assert the_condition(s.k) is None


async def test_an_invalid_runtime_says_so() -> None:
    async with service() as s:
        runtime = cluster_runtime()
        runtime["spec"]["scheduling"]["schedulingConstraints"]["topology"] = [
            {"key": "not a label key!"}
        ]
        await create(s.k, CLUSTER_RUNTIMES, runtime)
        await create(s.k, TRAINJOBS, small_trainjob())
        found = await condition_is(s.k, cond.INVALID_RUNTIME)
        assert "invalid" in found["message"]


async def test_a_scheduler_error_is_said() -> None:
    async with service() as s:
        group = await with_its_gang(s)
        await scheduler_says(s, group, "False", "SchedulerError", "plugin Foo failed")
        found = await condition_is(s.k, cond.SCHEDULER_ERROR)
        assert "plugin Foo failed" in found["message"]


async def test_the_runtime_deleted_after_it_was_said_invalid_is_not_found() -> None:
    async with service() as s:
        runtime = cluster_runtime()
        runtime["spec"]["scheduling"]["schedulingConstraints"]["topology"] = [{"key": "bad key!"}]
        await create(s.k, CLUSTER_RUNTIMES, runtime)
        await create(s.k, TRAINJOBS, small_trainjob())
        await condition_is(s.k, cond.INVALID_RUNTIME)
        await delete(s.k, CLUSTER_RUNTIMES, None, runtime["metadata"]["name"])
        s.reconciler.resync()
        found = await condition_is(s.k, cond.RUNTIME_NOT_FOUND)
        assert "not found" in found["message"]


async def test_a_missing_runtime_alone_writes_nothing() -> None:
    async with service() as s:
        await create(s.k, TRAINJOBS, small_trainjob())
        await eventually(lambda: events(s.k, "RuntimeNotFound"), "a RuntimeNotFound Event")
        assert await settled(s) == 0 and the_condition(s.k) is None


async def test_another_controllers_gang_objects_are_stood_down_for() -> None:
    async with service() as s:
        await create(s.k, CLUSTER_RUNTIMES, cluster_runtime())
        tj = await create(s.k, TRAINJOBS, small_trainjob())
        await create(s.k, WORKLOADS, hand_made_workload(tj["metadata"]["uid"]))
        found = await condition_is(s.k, cond.STOOD_DOWN)
        assert "'made-by-trainer'" in found["message"]


async def test_a_foreign_object_with_our_name_is_a_name_conflict() -> None:
    async with service(served=False) as s:  # served once the foreign object is there
        await create(s.k, CLUSTER_RUNTIMES, cluster_runtime())
        await create(s.k, TRAINJOBS, small_trainjob())
        name = gang(s.k)
        foreign = {
            "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"podGroupTemplates": [{"name": "x", "schedulingPolicy": {"basic": {}}}]},
        }  # fmt: skip
        await create(s.k, WORKLOADS, foreign)
        await eventually(lambda: s.cache.store(WORKLOAD).get(NS, name), "the foreign one cached")
        s.cache.apis["native"] = "served"
        s.reconciler.resync()
        found = await condition_is(s.k, cond.NAME_CONFLICT)
        assert name in found["message"]


async def test_a_refused_gang_object_is_said_then_made() -> None:
    async with service() as s:
        refused = status(422, 'admission webhook denied: quota "gpus" exceeded', "Invalid")
        next_requests(s.k[kmock.method.POST, POD_GROUPS], 1) << refused
        await create(s.k, CLUSTER_RUNTIMES, cluster_runtime())
        await create(s.k, TRAINJOBS, small_trainjob())
        await condition_is(s.k, cond.WAITING_FOR_SCHEDULER)  # retried, made
        assert s.sample("trainjob_scheduling_status_writes_total", reason=cond.CREATE_REFUSED) == 1


async def test_without_the_gang_api_the_condition_says_so() -> None:
    async with service(served=False) as s:
        await create(s.k, CLUSTER_RUNTIMES, cluster_runtime())
        await create(s.k, TRAINJOBS, small_trainjob())
        found = await condition_is(s.k, cond.GANG_API_UNAVAILABLE)
        assert "scheduling.k8s.io/v1beta1" in found["message"]


async def test_a_gang_that_can_never_fit_is_infeasible_with_the_numbers() -> None:
    async with service() as s:
        for obj in nodes("cpu", 3, zone="zone-a"):  # no GPU anywhere
            await create(s.k, NODES, obj)
        await with_its_gang(s)
        found = await condition_is(s.k, cond.INFEASIBLE)
        assert found["message"].startswith("can never fit as configured: gang")


async def stored_as_gates_off(s: Service, group: str) -> None:
    """The TrainJob's Workload and PodGroup stored again as an API server with the gate off
    stores them: without the topology constraint (null in a Workload template). What a real
    one drops is make e2e's (tests/e2e) and the captures' (tests/test_dropped_fields.py); here,
    the reconciler's report of it."""
    s.cache.apis["native"] = "not-served"  # the reconciler leaves the TrainJob alone
    for resource in (POD_GROUPS, WORKLOADS):
        found = await get(s.k, resource, NS, group)
        assert found is not None
        await delete(s.k, resource, NS, group)
        dropped = copy.deepcopy(found)
        for key in ("uid", "resourceVersion", "creationTimestamp", "generation"):
            dropped["metadata"].pop(key, None)
        dropped["metadata"].pop("finalizers", None)
        if resource == POD_GROUPS:
            del dropped["spec"]["schedulingConstraints"]
        else:
            for template in dropped["spec"]["podGroupTemplates"]:
                template["schedulingConstraints"] = None
        await create(s.k, resource, dropped)
    await eventually(
        lambda: (
            (e := s.cache.store(POD_GROUP).get(NS, group)) is not None
            and "schedulingConstraints" not in e.raw["spec"]
        ),
        "the dropped PodGroup cached",
    )
    s.cache.apis["native"] = "served"
    s.reconciler.resync()


async def test_fields_the_api_server_dropped_name_the_feature_gate() -> None:
    async with service() as s:
        group = await with_its_gang(s)
        await stored_as_gates_off(s, group)
        found = await condition_is(s.k, cond.FEATURE_GATE_OFF)
        assert (
            "schedulingConstraints from its PodGroup and Workload (feature gate "
            in (found["message"])
        )
        assert "TopologyAwareWorkloadScheduling is off" in found["message"]
        assert (
            s.sample(
                "trainjob_scheduling_gang_fields_dropped",
                kind="PodGroup",
                field="schedulingConstraints",
                gate="TopologyAwareWorkloadScheduling",
            )
            == 1
        )


async def test_a_gang_whose_topology_was_dropped_is_judged_over_the_whole_cluster() -> None:
    """The real cluster's case, with the required gates only: no zone holds the gang of 4, the
    cluster does. Kept, it is Infeasible in one zone. Stored without its constraint, it is
    judged over the cluster: FeatureGateOff while the scheduler has not judged it, then the
    scheduler's own verdict, the dropped fields named in each; and what the server stored is
    the cluster's evidence (`kube/constraints.py`), which admission reads."""
    async with service() as s:
        for obj in nodes("a", 2, zone="zone-a", gpus=4) + nodes("b", 2, zone="zone-b", gpus=4):
            await create(s.k, NODES, obj)
        group = await with_its_gang(s)
        found = await condition_is(s.k, cond.INFEASIBLE)
        assert "in one topology.kubernetes.io/zone; the largest zone has 8" in found["message"]
        assert s.cache.topology.kept is True  # what the server stored of the objects it made
        await stored_as_gates_off(s, group)
        found = await condition_is(s.k, cond.FEATURE_GATE_OFF)
        assert "schedulingConstraints from its PodGroup and Workload" in found["message"]
        assert s.cache.topology.kept is False
        evidence = s.cache.topology.evidence
        assert evidence is not None and evidence.source.endswith(f" {NS}/{group} as stored")
        said = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
        await scheduler_says(s, group, "False", "Unschedulable", said)
        found = await condition_is(s.k, cond.WAITING_FOR_CAPACITY)
        assert said in found["message"]
        assert "schedulingConstraints from its PodGroup and Workload" in found["message"]
        # Too few nodes left even for the whole cluster: Infeasible there, fields still named.
        await delete(s.k, NODES, None, "b-1")
        await eventually(lambda: len(s.cache.nodes) == 3, "the node gone from the summary")
        s.reconciler.resync()
        found = await condition_is(s.k, cond.INFEASIBLE)
        cluster = "needs 16 nvidia.com/gpu in the cluster; the cluster has 12 (3 nodes)"
        assert cluster in found["message"]
        assert "schedulingConstraints from its PodGroup and Workload" in found["message"]


async def test_a_replica_that_stops_leading_stops_counting_degraded_gangs() -> None:
    async with service() as s:
        await a_scheduled_gang(s)
        await condition_is(s.k, cond.SCHEDULED, "True")
        await delete(s.k, PODS, NS, f"{NAME}-node-0-0-x")
        await condition_is(s.k, cond.DEGRADED)
        assert s.sample("trainjob_scheduling_gangs_degraded") == 1
        leading = s.tasks[-1]  # reconciler.run(): cancelled when the Lease is lost
        leading.cancel()
        await asyncio.gather(leading, return_exceptions=True)
        assert s.sample("trainjob_scheduling_gangs_degraded") == 0


async def test_without_rbac_for_the_status_the_gang_is_made_and_the_log_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An old ClusterRole (no patch on trainjobs/status): the apply answers 403; the gang is
    still made, the log says what the role lacks once, and the pass is not retried for it."""
    async with service() as s:
        forbidden = status(403, 'trainjobs.trainer.kubeflow.org "my-job" is forbidden', "Forbidden")
        statuses = s.k[kmock.method.PATCH, TRAINJOBS, kmock.subresource("status")]
        next_requests(statuses, 1000) << forbidden
        with caplog.at_level("WARNING", logger="webhook.status"):
            group = await with_its_gang(s)
            await scheduler_says(s, group, "False", "Unschedulable", "no room")
            await eventually(lambda: len(statuses) >= 2, "two refused applies")
        said = [r for r in caplog.records if "cannot write the GangScheduling" in r.getMessage()]
        assert len(said) == 1 and "trainjobs/status" in said[0].getMessage()
        assert the_condition(s.k) is None and s.writes() == 0
        errors = s.sample(
            "controller_runtime_reconcile_total", controller=CONTROLLER, result="error"
        )
        assert errors == 0


async def test_only_the_leader_writes_the_condition() -> None:
    async with emulator() as (k, url):
        replicas = [
            Service(k, url, identity=name, lease=LeaseSettings("default", "r", name, 1.0, 0.6, 0.1))
            for name in ("replica-a", "replica-b")
        ]
        try:
            await eventually(lambda: lease_holder(k, lease="r") is not None, "a leader")
            leader = lease_holder(k, lease="r")
            await create(k, CLUSTER_RUNTIMES, cluster_runtime())
            await create(k, TRAINJOBS, small_trainjob())
            await condition_is(k, cond.WAITING_FOR_SCHEDULER)
            for s in replicas:
                await settled(s)

            def applies(identity: str) -> int:
                by: Any = kmock.headers({"User-Agent": identity})
                return len(k[kmock.method.PATCH, TRAINJOBS, kmock.subresource("status"), by])

            follower = "replica-b" if leader == "replica-a" else "replica-a"
            assert applies(str(leader)) == 1 and applies(follower) == 0
        finally:
            for s in replicas:
                await s.stop()


async def degraded_by_a_first_leader(k: VersionedEmulator, url: str) -> dict[str, Any]:
    """A scheduled gang that lost a pod, said Degraded (and its Event posted) by a first leader,
    which then stops; returns the Degraded condition."""
    first = Service(k, url, identity="first")
    try:
        await a_scheduled_gang(first)
        await condition_is(k, cond.SCHEDULED, "True")
        await delete(k, PODS, NS, f"{NAME}-node-0-3-x")
        degraded = await condition_is(k, cond.DEGRADED)
        await eventually(lambda: events(k, "GangDegraded"), "a GangDegraded Event")
    finally:
        await first.stop()
    return degraded


async def a_second_leader_keeps(k: VersionedEmulator, url: str, said: dict[str, Any]) -> Service:
    """A second leader whose pod list fails twice: it leaves the condition `said` alone until
    its pod watch has listed, and writes nothing then (the counts say the same); returns it,
    for the caller to stop."""
    lists = k[kmock.method.GET, PODS]
    next_requests(lists, 2) << status(500)  # the new leader's pod list fails twice
    second = Service(k, url, identity="second")
    try:
        await eventually(lambda: len(lists) >= 2, "the failed pod lists")
        assert current(k) == said  # not said Scheduled meanwhile
        await eventually(lambda: second.pods.synced, "the pods listed", timeout=15)
    except BaseException:
        await second.stop()
        raise
    return second


async def test_a_new_leader_keeps_degraded_until_its_pod_watch_has_listed() -> None:
    async with emulator() as (k, url):
        degraded = await degraded_by_a_first_leader(k, url)
        second = await a_second_leader_keeps(k, url, degraded)
        try:
            await asyncio.sleep(0.5)
            assert current(k) == degraded and second.writes() == 0
            assert len(events(k, "GangDegraded")) == 1
        finally:
            await second.stop()


async def test_a_new_leader_keeps_pods_untied_until_its_pod_watch_has_listed() -> None:
    """As of Degraded: without pod counts it would say Scheduled, then PodsUntied again."""
    async with emulator() as (k, url):
        first = Service(k, url, identity="first")
        try:
            group = await with_its_gang(first)
            for i in range(NUM_NODES):
                await create(k, PODS, pod(i, tied=i != 3))
            await scheduler_says(first, group, "True", "Scheduled", "")
            untied = await condition_is(k, cond.PODS_UNTIED)
        finally:
            await first.stop()
        second = await a_second_leader_keeps(k, url, untied)
        try:
            await eventually(
                lambda: second.sample("trainjob_scheduling_gangs_with_untied_pods") == 1,
                "the new leader's gauge",
            )
            await asyncio.sleep(0.3)
            assert current(k) == untied and second.writes() == 0
        finally:
            await second.stop()


async def a_degraded_trainjob_then_a_leader_without_pods(k: VersionedEmulator, url: str) -> None:
    """A Degraded TrainJob, and its first leader gone; the pods may not be listed from now on
    (a ClusterRole without pods: the service runs on without their counts)."""
    await degraded_by_a_first_leader(k, url)
    forbidden = status(403, 'pods is forbidden: cannot list resource "pods"', "Forbidden")
    next_requests(k[kmock.method.GET, PODS], 100_000) << forbidden


def counting_passes(s: Service) -> list[float]:
    """When each of the status writer's passes ran."""
    passes: list[float] = []
    sync = s.status.sync

    async def counted(key: tuple[str, str], outcome: Outcome | None) -> float | None:
        passes.append(time.monotonic())
        return await sync(key, outcome)

    s.status.sync = counted  # type: ignore[method-assign]
    return passes


async def test_a_degraded_trainjob_suspended_is_said_suspended_without_pod_counts() -> None:
    async with emulator() as (k, url):
        await a_degraded_trainjob_then_a_leader_without_pods(k, url)
        second = Service(k, url, identity="second")
        try:
            await patch(k, TRAINJOBS, NS, NAME, {"spec": {"suspend": True}})
            await condition_is(k, cond.SUSPENDED)
            assert not second.pods.synced
        finally:
            await second.stop()


async def test_a_pod_watch_that_never_lists_holds_degraded_back_a_bounded_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(status_module, "PODS_UNLISTED_RETRY", 0.01)  # 0.63 s of waits in all
    async with emulator() as (k, url):
        await a_degraded_trainjob_then_a_leader_without_pods(k, url)
        second = Service(k, url, identity="second")
        passes = counting_passes(second)
        try:
            # The pods unknown at last: the gang's object says Scheduled, so does the condition.
            await condition_is(k, cond.SCHEDULED, "True")
            await settled(second)
            before = len(passes)
            await asyncio.sleep(1.0)
            assert len(passes) - before <= 1  # no pass in a loop (one more, from its own write)
            waits = status_module.PODS_UNLISTED_TRIES + 3  # the waits, the write, its echo
            assert len(passes) <= waits and not second.pods.synced
        finally:
            await second.stop()


async def test_a_situation_walks_the_jobs_once_whatever_the_groups() -> None:
    """Job keys come from pod labels anyone who makes pods sets: their walk is not per group."""
    rt, tj = parsed(
        runtime(
            torch_node(replicas=3),
            scheduling={
                "replicatedJobs": [
                    {"targetReplicatedJobs": ["node"], "job": {"schedulingPolicy": {"gang": {}}}}
                ]
            },
        ),
        builders_trainjob(num_nodes=2),
    )
    plan = build_plan(tj, rt)
    assert plan is not None and len(plan.groups) == 3
    walks = 0

    class Jobs(dict[JobKey, JobPods]):
        def items(self) -> Any:
            nonlocal walks
            walks += 1
            return super().items()

    pods = GangPods()
    pods.synced = True
    for name, rj, index in [("a", "node", "0"), ("b", "node", "0"), ("c", "node", "2"),
                            ("d", "node", "7"), ("e", "forged", "0")]:  # fmt: skip
        labels = {JOBSET_NAME: plan.trainjob_name, REPLICATED_JOB_NAME: rj, JOB_INDEX: index}
        meta = {"name": name, "namespace": plan.namespace, "labels": labels}
        pods.apply("ADDED", {"metadata": meta, "spec": {"nodeName": "n"}})
    jobs = Jobs(pods.jobs(plan.namespace, plan.trainjob_name))
    pods.jobs = lambda namespace, jobset: jobs  # type: ignore[method-assign]
    cache = Cache(connected=True)
    cache.jobsets.replace([])  # listed, none: restart attempt 0
    nowhere: Any = None
    writer = StatusWriter(cache, nowhere, nowhere, pods)
    backend = cache.backends.named("native")
    situation = writer.situation({}, Outcome(plan=plan, backend=backend))
    assert walks == 1
    assert [g.pods for g in situation.gangs] == [cond.Pods(2, 0), cond.Pods(0, 0), cond.Pods(1, 0)]
    # Those pods have no schedulingGroup: untied for the native backend, whose pods tie by it,
    # in the Jobs the plan groups (not Job 7 nor "forged": as an untargeted ReplicatedJob's);
    # not for a backend whose pods carry an annotation or label instead.
    assert situation.untied == 3
    for other in ("volcano", "coscheduling", "kai"):
        found = writer.situation({}, Outcome(plan=plan, backend=cache.backends.named(other)))
        assert found.untied is None, other
    pods.synced = False
    assert writer.situation({}, Outcome(plan=plan, backend=backend)).untied is None

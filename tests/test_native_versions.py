"""Kubernetes 1.36 (`scheduling.k8s.io/v1alpha2`) and 1.37 (`v1beta1`) from one build.

* Discovery picks the newest served version the service knows: `v1beta1` when both are served.
* Against a 1.36 emulator the reconciler makes the 1.36 shapes (`podGroupTemplateRef`, string
  `disruptionMode`), against a 1.37 one the 1.37 shapes; the pod webhook ties pods the same way.
* 1.36's `gang.minCount` is immutable: the emulator refuses the change, and a minCount drift is
  a recreate (held by the reconciler while the TrainJob has pods).
* Status is read from the version's condition (`PodGroupScheduled` in 1.36).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.aio.client import ApiClient, Configuration

from tests.harness import fixture, webhook_path
from tests.kube_emulator import (
    CLUSTER_RUNTIMES,
    SCHEDULING_RESOURCES,
    TRAINJOBS,
    VersionedEmulator,
    create,
    declare_scheduling_resources,
    emulator,
    eventually,
)
from tests.test_informer import serving
from tests.test_reconciler import NS, cluster_runtime, gang, objects, stored, trainjob
from webhook.backends.native import NativeBackend
from webhook.explain.gather import gather
from webhook.kube.cache import Cache
from webhook.kube.client import informers, kind_informers
from webhook.kube.discovery import BackendApiWatch
from webhook.kube.events import EventRecorder
from webhook.kube.writer import ApiWriter, WriterSettings
from webhook.reconcile.reconciler import CONTROLLER, Reconciler, ReconcilerSettings

V1BETA1, V1ALPHA2 = "v1beta1", "v1alpha2"


@contextlib.asynccontextmanager
async def replica(url: str) -> AsyncIterator[tuple[Cache, NativeBackend]]:
    """Watches, discovery and a reconciler, in this process, as `serve` wires them."""
    api = ApiClient(configuration=Configuration(host=url))
    cache = Cache(connected=True)
    native = cache.backends.named("native")
    assert isinstance(native, NativeBackend)
    events = EventRecorder(api, CONTROLLER, "test-replica", dedupe_for=0.0)
    settings = ReconcilerSettings(workers=2, conflict_retry=0.2, wait_retry=0.05)
    reconciler = Reconciler(cache, ApiWriter(api, WriterSettings(timeout=10.0)), events, settings)
    watch = BackendApiWatch(
        api,
        cache,
        lambda kind: kind_informers(api, cache, kind),
        period=0.2,
        on_change=lambda backend, state: reconciler.resync() if state == "served" else None,
    )
    jobs = [*(i.run() for i in informers(api, cache)), events.run(), watch.run(), reconciler.run()]
    tasks = [asyncio.create_task(job) for job in jobs]
    try:
        yield cache, native
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        close: Any = api.close
        await close()


async def gang_objects(k: VersionedEmulator, version: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The level-1 runtime and a TrainJob on it, once the Workload and PodGroup of `version`
    exist."""
    await create(k, CLUSTER_RUNTIMES, cluster_runtime())
    await create(k, TRAINJOBS, trainjob())
    workloads, pod_groups = SCHEDULING_RESOURCES[version]

    def both() -> Any:
        name = gang(k)
        wl, pg = stored(k, workloads, name), stored(k, pod_groups, name)
        return (wl, pg) if wl and pg else None

    found: tuple[dict[str, Any], dict[str, Any]] = await eventually(both, f"{version} objects")
    return found


@pytest.mark.asyncio
async def test_on_1_36_the_reconciler_makes_the_v1alpha2_shapes() -> None:
    async with emulator(scheduling_version=V1ALPHA2) as (k, url), replica(url) as (_, native):
        workload, pod_group = await gang_objects(k, V1ALPHA2)
        assert native.version == V1ALPHA2
        name = gang(k)
        assert workload["apiVersion"] == pod_group["apiVersion"] == "scheduling.k8s.io/v1alpha2"
        (template,) = workload["spec"]["podGroupTemplates"]
        assert template["disruptionMode"] == "PodGroup"  # the runtime's `all`
        assert template["schedulingPolicy"] == {"gang": {"minCount": 100}}
        spec = pod_group["spec"]
        assert "workloadRef" not in spec
        assert spec["podGroupTemplateRef"] == {
            "workload": {"workloadName": name, "podGroupTemplateName": name}
        }
        assert spec["disruptionMode"] == "PodGroup" and "preemptionPolicy" not in spec
        owners = {o["kind"]: o["apiVersion"] for o in pod_group["metadata"]["ownerReferences"]}
        assert owners["Workload"] == "scheduling.k8s.io/v1alpha2"
        await asyncio.sleep(0.5)  # later passes see no drift in what they made
        assert stored(k, SCHEDULING_RESOURCES[V1ALPHA2][1], name) == pod_group


@pytest.mark.asyncio
async def test_on_1_37_the_reconciler_makes_the_v1beta1_shapes() -> None:
    async with emulator() as (k, url), replica(url) as (_, native):
        workload, pod_group = await gang_objects(k, V1BETA1)
        assert native.version == V1BETA1
        name = gang(k)
        assert pod_group["apiVersion"] == "scheduling.k8s.io/v1beta1"
        assert pod_group["spec"]["workloadRef"] == {"workloadName": name, "templateName": name}
        assert pod_group["spec"]["disruptionMode"] == {"all": {}}
        assert workload["spec"]["podGroupTemplates"][0]["disruptionMode"] == {"all": {}}


@pytest.mark.asyncio
async def test_discovery_picks_v1beta1_when_both_are_served() -> None:
    async with emulator() as (k, url):
        declare_scheduling_resources(k, V1ALPHA2)  # a cluster serving both
        async with replica(url) as (cache, native):
            await gang_objects(k, V1BETA1)
            assert native.version == V1BETA1 and cache.api(native) == "served"
            assert not objects(k, SCHEDULING_RESOURCES[V1ALPHA2][1])


def test_on_1_36_a_min_count_drift_is_a_recreate_and_on_1_37_a_patch() -> None:
    from tests.builders import rj, runtime, torch_node
    from tests.builders import trainjob as raw_trainjob
    from tests.test_backends import plan_of

    plan = plan_of(runtime(rj("init"), torch_node(), scheduling={}), raw_trainjob(num_nodes=2))
    for version, kind in ((V1ALPHA2, "recreate"), (V1BETA1, "patch")):
        backend = NativeBackend(version)
        for desired in backend.render(plan, context=_context()):
            stored_obj = json.loads(json.dumps(desired))
            stored_obj["metadata"]["uid"] = "u"
            spec = stored_obj["spec"]
            policies = [t["schedulingPolicy"] for t in spec.get("podGroupTemplates", [spec])]
            for policy in policies:
                policy["gang"]["minCount"] += 1
            drift = backend.drift(desired, stored_obj)
            assert drift.kind == kind, (version, desired["kind"], drift)
            assert backend.drift(desired, json.loads(json.dumps(desired))).kind == "none"


def _context() -> Any:
    from webhook.backends.base import Context

    return Context()


def test_status_reads_the_condition_of_the_objects_version() -> None:
    backend = NativeBackend(V1ALPHA2)
    kind = backend.kinds[-1]
    condition = {"status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    for version, name, scheduled in (
        (V1ALPHA2, "PodGroupScheduled", True),
        (V1ALPHA2, "PodGroupInitiallyScheduled", False),
        (V1BETA1, "PodGroupInitiallyScheduled", True),
    ):
        obj = {
            "apiVersion": f"scheduling.k8s.io/{version}",
            "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
            "status": {"conditions": [{"type": name, **condition}]},
        }
        status = backend.status(kind, obj)
        assert status is not None and status.scheduled is scheduled, (version, name)


@pytest.mark.asyncio
async def test_on_1_36_serve_discovers_v1alpha2_and_ties_pods(tmp_path: Path) -> None:
    review = fixture("pod-create-by-job-controller.mutate.json")
    async with (
        emulator(scheduling_version=V1ALPHA2) as (k, url),
        serving(tmp_path, url, reconcile=True) as (_, client),
    ):
        await gang_objects(k, V1ALPHA2)
        answer = (await client.post(webhook_path(review, "mutate"), json=review)).json()
        ops = json.loads(base64.b64decode(answer["response"]["patch"]))
        assert ops == [
            {"op": "add", "path": "/spec/schedulingGroup", "value": {"podGroupName": gang(k)}}
        ]
        assert stored(k, SCHEDULING_RESOURCES[V1BETA1][1], gang(k)) is None
        assert review["request"]["namespace"] == NS


@pytest.mark.asyncio
async def test_on_1_36_explain_reads_the_v1alpha2_gang_objects() -> None:
    """`kubectl trainjob-scheduling explain` asks discovery too: on 1.36 it lists the v1alpha2
    Workload and PodGroup and never says the gang API is not served."""
    async with emulator(scheduling_version=V1ALPHA2) as (k, url), replica(url):
        await gang_objects(k, V1ALPHA2)
        api = ApiClient(configuration=Configuration(host=url))
        try:
            found = await gather(api, NS, trainjob()["metadata"]["name"])
        finally:
            close: Any = api.close
            await close()
        assert not found.unserved
        versions = {obj["apiVersion"] for _, obj in found.gang_objects}
        kinds = sorted(kind.kind for kind, _ in found.gang_objects)
        assert versions == {"scheduling.k8s.io/v1alpha2"} and kinds == ["PodGroup", "Workload"]

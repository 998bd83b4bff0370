"""Kubernetes 1.36 (`scheduling.k8s.io/v1alpha2`) and 1.37 (`v1beta1`) from one build.

* Discovery picks the newest served version the service knows: `v1beta1` when both are served.
* Against a 1.36 emulator the reconciler makes the 1.36 shapes (`podGroupTemplateRef`, string
  `disruptionMode`), against a 1.37 one the 1.37 shapes; the pod webhook ties pods the same way.
* 1.36's `gang.minCount` is immutable: the emulator refuses the change, and a minCount drift is
  a recreate (held by the reconciler while the TrainJob has pods).
* Status is read from the version's condition (`PodGroupScheduled` in 1.36).
* The Workload and PodGroup defaulting webhooks (the chart sends them both versions, on one path
  each) give a 1.36 Workload or PodGroup of a TrainJob the minCount a 1.37 one gets, the
  PodGroup's template read from 1.36's `podGroupTemplateRef.workload.podGroupTemplateName`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import pytest
from kubernetes.aio.client import ApiClient, Configuration

from tests.harness import fixture, fixture_cache, running_server, webhook_path
from tests.kube_emulator import (
    CLUSTER_RUNTIMES,
    SCHEDULING_RESOURCES,
    TRAINJOBS,
    VersionedEmulator,
    create,
    declare_scheduling_resources,
    emulator,
    eventually,
    patch,
)
from tests.test_admission import MY_JOB_GROUP, patch_of, send
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
    cache.jobsets.replace([])  # listed, none: restart attempt 0
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
async def test_on_1_36_a_gang_scheduled_before_a_replica_starts_is_read_as_scheduled() -> None:
    """A replica that starts (or relists) reads the PodGroups from a list, whose items a real
    server sends without `apiVersion` (the emulator too, for built-in kinds): the 1.36 condition
    is still the one read, not 1.37's."""
    async with emulator(scheduling_version=V1ALPHA2) as (k, url):
        async with replica(url):
            await gang_objects(k, V1ALPHA2)
        pod_groups = SCHEDULING_RESOURCES[V1ALPHA2][1]
        await patch(
            k,
            pod_groups,
            NS,
            gang(k),
            {"status": {"conditions": [{"type": "PodGroupScheduled", "status": "True"}]}},
        )
        async with replica(url) as (cache, native):
            pod_group_kind = native.kinds[-1]
            store = cache.store(pod_group_kind)
            entry = await eventually(lambda: store.get(NS, gang(k)), "the listed PodGroup")
            assert entry.raw["apiVersion"] == "scheduling.k8s.io/v1alpha2"
            status = native.status(pod_group_kind, entry.raw)
            assert status is not None and status.scheduled is True


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


# --- the defaulting webhooks, fed a 1.36 (v1alpha2) or 1.37 (v1beta1) review -------------------

# The chart's rules for these two list both versions (matchPolicy Equivalent): the API server
# sends each object in its own version to the one path of its kind.
WORKLOAD_PATH = "/mutate-scheduling-k8s-io-v1beta1-workload"
POD_GROUP_PATH = "/mutate-scheduling-k8s-io-v1beta1-podgroup"


@pytest.fixture(scope="module", params=[V1BETA1, V1ALPHA2])
def defaulting(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, httpx.Client]]:
    """The service over HTTPS, its native backend speaking the version the cluster serves (as
    discovery sets it), with the version its reviews come in."""
    version: str = request.param
    cache = fixture_cache()
    native = cache.backends.named("native")
    assert isinstance(native, NativeBackend)
    native.use_version(version)
    with running_server(cache, tmp_path_factory.mktemp("certs")) as server, server.client() as c:
        yield version, c


def in_version(review: dict[str, Any], version: str) -> dict[str, Any]:
    """A captured 1.37 review as the API server sends it for an object of `version`."""
    out = copy.deepcopy(review)
    request = out["request"]
    for field in ("kind", "resource", "requestKind", "requestResource"):
        request[field]["version"] = version
    request["object"]["apiVersion"] = f"scheduling.k8s.io/{version}"
    return out


def pod_group_review(version: str, template: str) -> dict[str, Any]:
    """A hand-written PodGroup of TrainJob team-a/my-job without minCount, named after nothing of
    the plan: only its template reference says which gang it is. 1.36 spells the reference
    `podGroupTemplateRef.workload.{workloadName, podGroupTemplateName}` and disruptionMode as a
    string; 1.37 `workloadRef.{workloadName, templateName}` and a union."""
    review = in_version(fixture("podgroup-create.mutate.json"), version)
    review["request"]["name"] = "hand-written"
    pod_group = review["request"]["object"]
    pod_group["metadata"]["name"] = "hand-written"
    spec = pod_group["spec"]
    spec["schedulingPolicy"]["gang"]["minCount"] = 0  # the API server sends a missing one so
    del spec["workloadRef"]
    if version == V1ALPHA2:
        spec["podGroupTemplateRef"] = {
            "workload": {"workloadName": MY_JOB_GROUP, "podGroupTemplateName": template}
        }
        spec["disruptionMode"] = "Pod"
    else:
        spec["workloadRef"] = {"workloadName": MY_JOB_GROUP, "templateName": template}
    return review


def workload_review(version: str) -> dict[str, Any]:
    """A hand-written Workload of TrainJob my-job (its controllerRef): a basic template, then a
    gang template without minCount (1.36: disruptionMode as a string)."""
    review = in_version(
        fixture("workload-create-gang-without-mincount-patched.mutate.json"), version
    )
    templates = review["request"]["object"]["spec"]["podGroupTemplates"]
    templates.insert(0, {"name": "initializers", "schedulingPolicy": {"basic": {}}})
    templates[1]["disruptionMode"] = "PodGroup" if version == V1ALPHA2 else {"all": {}}
    return review


def defaulted(client: httpx.Client, path: str, review: dict[str, Any]) -> list[dict[str, Any]]:
    """The patch the webhook answers; checked to change only what it names, and to be asked for
    no more once applied (idempotent)."""
    response = send(client, path, review)
    assert response["allowed"] is True and not response.get("warnings"), response
    ops = patch_of(response)
    assert ops is not None
    original = review["request"]["object"]
    patched = jsonpatch.apply_patch(original, ops)
    assert jsonpatch.make_patch(original, patched).patch == ops
    again = copy.deepcopy(review)
    again["request"]["object"] = patched
    again["request"]["uid"] += "-again"
    assert patch_of(send(client, path, again)) is None
    return ops


def test_a_pod_group_of_either_version_gets_the_gangs_min_count(
    defaulting: tuple[str, httpx.Client],
) -> None:
    version, client = defaulting
    ops = defaulted(client, POD_GROUP_PATH, pod_group_review(version, "node"))
    assert ops == [{"op": "replace", "path": "/spec/schedulingPolicy/gang/minCount", "value": 100}]
    # The reference in the other version's field: that version's PodGroup has no such field,
    # so it names no template, and with a name that is no gang's it is left alone, said so.
    other = pod_group_review(V1ALPHA2 if version == V1BETA1 else V1BETA1, "node")
    review = pod_group_review(version, "node")
    review["request"]["object"]["spec"] = {
        **{k: v for k, v in review["request"]["object"]["spec"].items()
           if k not in ("workloadRef", "podGroupTemplateRef")},
        **{k: v for k, v in other["request"]["object"]["spec"].items()
           if k in ("workloadRef", "podGroupTemplateRef")},
    }  # fmt: skip
    response = send(client, POD_GROUP_PATH, review)
    assert patch_of(response) is None
    assert response["warnings"] == [
        'minCount not defaulted: template "hand-written" matches no gang of TrainJob '
        '"my-job"; set gang.minCount'
    ]


def test_a_workload_of_either_version_gets_the_gangs_min_count(
    defaulting: tuple[str, httpx.Client],
) -> None:
    version, client = defaulting
    ops = defaulted(client, WORKLOAD_PATH, workload_review(version))
    assert ops == [
        {"op": "replace", "path": "/spec/podGroupTemplates/1/schedulingPolicy/gang/minCount",
         "value": 100}
    ]  # fmt: skip

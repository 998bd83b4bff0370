"""A gang stays whole through a TrainJob's life (issue 26), over real connections: the API
emulator over HTTP (PodGroup protection finalizer, pods' grace periods, immutable gang specs,
garbage collection; tests/kube_emulator.py), the reconciler with its status writer and pod watch
(`tests/test_status.py:Service`), and the pod webhook over HTTPS in front of the same cache.

The Job controller is played by `Jobs.create_pod`: it sends the pod's AdmissionReview, creates
the pod as admitted (patch applied) or counts it held (denied: a Job controller retries). Each
scenario ends with every live pod tied to a live PodGroup of its own incarnation, or held and
said, and without Created/Deleted churn.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import kmock
import orjson
import pytest

from tests.harness import fixture, local_settings
from tests.kube_emulator import (
    CLUSTER_RUNTIMES,
    POD_GROUPS,
    PODS,
    TRAINJOBS,
    WORKLOADS,
    VersionedEmulator,
    create,
    delete,
    emulator,
    eventually,
    patch,
    status,
)
from tests.test_reconciler import NAME, NS, cluster_runtime, events, stored
from tests.test_status import NUM_NODES, Service, small_trainjob
from webhook.admission.handlers import HOLD_CODE
from webhook.backends.native import WORKLOAD
from webhook.core import condition as cond
from webhook.core import naming
from webhook.core.snapshot import SNAPSHOT_ANNOTATION
from webhook.kube.cache import FINISHED
from webhook.kube.lookup import TrainJobLookup, api_ask
from webhook.server.run import Service as WebhookService

pytestmark = pytest.mark.asyncio
POD_PATH = "/mutate--v1-pod"
REVIEW = fixture("pod-create-by-job-controller.mutate.json")


@contextlib.asynccontextmanager
async def webhook(service: Service, cert_dir: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The service's webhooks over HTTPS, on this loop, answering from `service.cache`."""
    settings, tls = local_settings(cert_dir, metrics_auth=None, shutdown_timeout=2.0)
    server = WebhookService(settings, service.cache, tls, None)
    task = asyncio.create_task(server.run([]))
    verify = ssl.create_default_context(cafile=str(cert_dir / "ca.crt"))
    health = f"http://127.0.0.1:{settings.health_port}/readyz"
    async with httpx.AsyncClient(timeout=10) as probe:
        for _ in range(200):
            with contextlib.suppress(httpx.HTTPError):
                if (await probe.get(health)).status_code == 200:
                    break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the webhook never became ready")
    url = f"https://localhost:{settings.port}"
    try:
        async with httpx.AsyncClient(base_url=url, verify=verify, timeout=10) as client:
            yield client
    finally:
        server.stop()
        await asyncio.gather(task, return_exceptions=True)


class Jobs:
    """The Job controller's pod creations, through the pod webhook."""

    def __init__(self, k: VersionedEmulator, client: httpx.AsyncClient) -> None:
        self.k = k
        self.client = client
        self.made = 0
        self.held: list[str] = []  # the denials' messages

    async def create_pod(
        self, index: int, attempt: int = 0, trainjob: str = NAME
    ) -> dict[str, Any] | None:
        """Pod `index` of the node Job (one pod each in this runtime's level-1 gang); the pod as
        stored, or None when the webhook held it."""
        doc = copy.deepcopy(REVIEW)
        request = doc["request"]
        pod = request["object"]
        self.made += 1
        pod["metadata"]["name"] = f"{trainjob}-node-0-{index}-{self.made}"
        labels = pod["metadata"]["labels"]
        labels["jobset.sigs.k8s.io/jobset-name"] = trainjob
        labels["jobset.sigs.k8s.io/restart-attempt"] = str(attempt)
        request["uid"] = f"review-{self.made}"
        answer = (await self.client.post(POD_PATH, content=orjson.dumps(doc))).json()["response"]
        if not answer["allowed"]:
            assert answer["status"]["code"] == HOLD_CODE, answer
            self.held.append(answer["status"]["message"])
            return None
        if "patch" in answer:
            ops = orjson.loads(base64.b64decode(answer["patch"]))
            pod = jsonpatch.apply_patch(pod, ops)
        pod["spec"]["nodeName"] = "node-1"  # bound, so its deletion waits for its grace
        pod["metadata"].pop("generateName", None)
        # The Job controller's tracking finalizer: no Job controller here removes it.
        pod["metadata"].pop("finalizers", None)
        created: dict[str, Any] = await create(self.k, PODS, pod)
        return created

    async def gang(self, attempt: int = 0, trainjob: str = NAME) -> list[dict[str, Any] | None]:
        return [await self.create_pod(i, attempt, trainjob) for i in range(NUM_NODES)]


def group_of(pod: dict[str, Any] | None) -> str | None:
    group = (pod or {}).get("spec", {}).get("schedulingGroup")
    return group.get("podGroupName") if isinstance(group, dict) else None


def pod_group(k: VersionedEmulator, name: str) -> dict[str, Any] | None:
    return stored(k, POD_GROUPS, name)


def live_pod_groups(k: VersionedEmulator) -> list[dict[str, Any]]:
    return [
        o.raw
        for (r, _, _), o in list(k.objects.items())
        if r == POD_GROUPS and not o.deleted and not o.raw["metadata"].get("deletionTimestamp")
    ]


def owner_uid(obj: dict[str, Any]) -> str:
    refs = obj["metadata"].get("ownerReferences") or []
    return next((r["uid"] for r in refs if r.get("controller")), "")


async def the_gang_of(k: VersionedEmulator, uid: str, attempt: int = 0) -> dict[str, Any]:
    """The live PodGroup of the TrainJob with `uid` in restart attempt `attempt`."""
    want = naming.for_attempt(naming.workload_name(NS, NAME, uid), attempt)

    def made() -> dict[str, Any] | None:
        found = pod_group(k, want)
        if found is None or found["metadata"].get("deletionTimestamp"):
            return None
        return found if owner_uid(found) == uid else None

    found: dict[str, Any] = await eventually(made, f"PodGroup {want}")
    return found


@contextlib.asynccontextmanager
async def cluster(tmp_path: Path, **service: Any) -> AsyncIterator[tuple[Service, Jobs]]:
    async with emulator() as (k, url):
        k.pod_grace = True  # pods on a node stay Terminating until finished, as kubelets do
        s = Service(k, url, **service)
        try:
            async with webhook(s, tmp_path / "certs") as client:
                yield s, Jobs(k, client)
        finally:
            await s.stop()


async def a_running_gang(s: Service, jobs: Jobs) -> tuple[str, dict[str, Any]]:
    """The runtime, the TrainJob and its 4 pods, each tied to the gang: (uid, PodGroup)."""
    await create(s.k, CLUSTER_RUNTIMES, cluster_runtime())
    tj = await create(s.k, TRAINJOBS, small_trainjob())
    uid = tj["metadata"]["uid"]
    group = await the_gang_of(s.k, uid)
    pods = await jobs.gang()
    assert [group_of(p) for p in pods] == [group["metadata"]["name"]] * NUM_NODES
    return uid, group


async def pods_gone(k: VersionedEmulator) -> None:
    """The kubelets stop the Terminating pods' containers."""
    await k.finish_pods(NS)


def tied_pods(k: VersionedEmulator) -> dict[str, str | None]:
    return {
        o.raw["metadata"]["name"]: group_of(o.raw)
        for (r, _, _), o in list(k.objects.items())
        if r == PODS and not o.deleted and not o.raw["metadata"].get("deletionTimestamp")
    }


# --- re-apply under the same name --------------------------------------------------------------


async def test_a_trainjob_re_applied_under_its_name_gets_a_gang_of_its_own(tmp_path: Path) -> None:
    """Deleted while its pods are in their grace period (its PodGroup stays Terminating: they
    name it) and applied again at once: the new TrainJob's PodGroup has another name, so it is
    made at once and its pods never meet the old one."""
    async with cluster(tmp_path) as (s, jobs):
        old_uid, old_group = await a_running_gang(s, jobs)
        await delete(s.k, TRAINJOBS, NS, NAME)
        # The garbage collector deletes the PodGroup; its pods still name it, so it stays.
        for o in [o for (r, _, _), o in list(s.k.objects.items()) if r == PODS]:
            await delete(s.k, PODS, NS, o.raw["metadata"]["name"])

        def terminating() -> bool:
            found = pod_group(s.k, old_group["metadata"]["name"])
            return found is not None and bool(found["metadata"].get("deletionTimestamp"))

        await eventually(terminating, "the old PodGroup Terminating")
        new = await create(s.k, TRAINJOBS, small_trainjob())
        new_uid = new["metadata"]["uid"]
        assert new_uid != old_uid
        group = await the_gang_of(s.k, new_uid)
        assert group["metadata"]["name"] != old_group["metadata"]["name"]
        pods = await jobs.gang()
        assert [group_of(p) for p in pods] == [group["metadata"]["name"]] * NUM_NODES
        await pods_gone(s.k)  # the old pods end: the old PodGroup goes
        await eventually(lambda: pod_group(s.k, old_group["metadata"]["name"]) is None, "gone")
        assert set(tied_pods(s.k).values()) == {group["metadata"]["name"]}
        assert not events(s.k, "Deleted"), "nothing of the new TrainJob was deleted"


# --- suspend, then resume before the old PodGroup is gone ---------------------------------------


async def test_a_resumed_gang_has_names_of_its_own_and_never_waits_for_the_old_one(
    tmp_path: Path,
) -> None:
    """A resume starts a run of its own (the TrainJob's generation): its pods are tied at once to
    PodGroups of that run, made at once, while the suspended run's PodGroup stays Terminating as
    long as its old pods take to end (issue 36: holds are for faults, not for lifecycles)."""
    async with cluster(tmp_path) as (s, jobs):
        uid, group = await a_running_gang(s, jobs)
        name = group["metadata"]["name"]
        await patch(s.k, TRAINJOBS, NS, NAME, {"spec": {"suspend": True}})
        # Suspended: the Jobs delete their pods (in their grace period) and the service its
        # PodGroup, which stays Terminating while they name it.
        for o in [o for (r, _, _), o in list(s.k.objects.items()) if r == PODS]:
            await delete(s.k, PODS, NS, o.raw["metadata"]["name"])
        await eventually(
            lambda: bool((pod_group(s.k, name) or {}).get("metadata", {}).get("deletionTimestamp")),
            "the PodGroup Terminating",
        )
        resumed = await patch(s.k, TRAINJOBS, NS, NAME, {"spec": {"suspend": False}})
        generation = resumed["metadata"]["generation"]
        assert generation == 3  # created, suspended, resumed
        await eventually(
            lambda: (
                (s.cache.trainjobs.get(NS, NAME) or None) and s.cache.not_running(NS, NAME) is None
            ),
            "the resume cached",
        )
        run = naming.workload_name(NS, NAME, f"{uid}/run/{generation}")
        assert run != name
        pods = await jobs.gang()  # none held: the old PodGroup is still Terminating
        assert jobs.held == []
        assert [group_of(p) for p in pods] == [run] * NUM_NODES
        again = await eventually(lambda: live_pod_group(s.k, run), "the run's PodGroup made")
        assert again["metadata"]["uid"] != group["metadata"]["uid"]
        old = pod_group(s.k, name)
        assert old is not None and old["metadata"].get("deletionTimestamp")  # still going
        await pods_gone(s.k)


def live_pod_group(k: VersionedEmulator, name: str) -> dict[str, Any] | None:
    found = pod_group(k, name)
    return found if found is not None and not found["metadata"].get("deletionTimestamp") else None


async def condition_reason(k: VersionedEmulator, reason: str) -> dict[str, Any]:
    from tests.test_status import the_condition

    def check() -> dict[str, Any] | None:
        found = the_condition(k)
        return found if found is not None and found["reason"] == reason else None

    found: dict[str, Any] = await eventually(check, f"GangScheduling reason {reason}")
    return found


# --- a JobSet restart ---------------------------------------------------------------------------


async def test_a_jobset_restart_is_a_new_gang_admitted_whole(tmp_path: Path) -> None:
    """JobSet counts a restart in its status.restarts, deletes every Job and makes them again
    with restart-attempt + 1: the reconciler makes the restart's own PodGroup at once (the
    attempt is read from the JobSet, not from pods), the new pods are tied to it, and the old
    gang's PodGroup is never deleted while its pods are there; it goes once they have ended."""
    async with cluster(tmp_path) as (s, jobs):
        uid, first = await a_running_gang(s, jobs)
        old = first["metadata"]["name"]
        s.cache.jobsets.replace([jobset_of(uid, restarts=1)])  # as its watch brings it
        restart = naming.for_attempt(old, 1)
        group = await the_gang_of(s.k, uid, attempt=1)  # before any pod of the restart
        assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": NUM_NODES}}
        assert pod_group(s.k, old) is not None  # its pods are still there
        assert not (pod_group(s.k, old) or {}).get("metadata", {}).get("deletionTimestamp")
        for o in [o for (r, _, _), o in list(s.k.objects.items()) if r == PODS]:
            await delete(s.k, PODS, NS, o.raw["metadata"]["name"])
        pods = await jobs.gang(attempt=1)
        assert [group_of(p) for p in pods] == [restart] * NUM_NODES
        await pods_gone(s.k)
        await eventually(lambda: pod_group(s.k, old) is None, "old gone")
        assert set(tied_pods(s.k).values()) == {restart}
        assert [p["metadata"]["name"] for p in live_pod_groups(s.k)] == [restart]


async def test_a_pod_that_forges_a_restart_attempt_changes_nothing(tmp_path: Path) -> None:
    """Anyone who may create a pod can label one `restart-attempt: "9"`: it is held (its JobSet
    is at attempt 0), and the running gang's PodGroup stays where it is."""
    async with cluster(tmp_path) as (s, jobs):
        _, first = await a_running_gang(s, jobs)
        assert await jobs.create_pod(0, attempt=9) is None
        assert "says attempt 9, its JobSet is at attempt 0" in jobs.held[-1]
        s.reconciler.resync()
        await asyncio.sleep(0.5)
        still = pod_group(s.k, first["metadata"]["name"])
        assert still is not None and still["metadata"]["uid"] == first["metadata"]["uid"]
        assert not still["metadata"].get("deletionTimestamp")
        assert not events(s.k, "Deleted")


async def test_a_gang_in_use_is_never_deleted_whatever_names_the_plan_moves_to(
    tmp_path: Path,
) -> None:
    """The plan's names move on (a new run: the TrainJob's generation changed, as when a
    suspend and resume come faster than Trainer suspends the JobSet) while the old run's pods
    still run: its PodGroup and Workload stay until those pods are gone, then go."""
    async with cluster(tmp_path) as (s, jobs):
        uid, first = await a_running_gang(s, jobs)
        old = first["metadata"]["name"]
        workload = first["spec"]["workloadRef"]["workloadName"]
        moved = await patch(s.k, TRAINJOBS, NS, NAME, {"spec": {"x-bump": 1}})
        run = naming.workload_name(NS, NAME, f"{uid}/run/{moved['metadata']['generation']}")
        await eventually(lambda: live_pod_group(s.k, run), "the new run's PodGroup made")
        await asyncio.sleep(0.5)  # passes enough to have deleted the old one, were it going
        for kind, name in ((POD_GROUPS, old), (WORKLOADS, workload)):
            still = stored(s.k, kind, name)
            assert still is not None and not still["metadata"].get("deletionTimestamp"), name
        for o in [o for (r, _, _), o in list(s.k.objects.items()) if r == PODS]:
            await delete(s.k, PODS, NS, o.raw["metadata"]["name"])
        await pods_gone(s.k)
        await eventually(lambda: stored(s.k, WORKLOADS, workload) is None, "the old run gone")
        assert pod_group(s.k, old) is None


async def test_a_leader_whose_pod_watch_has_not_listed_deletes_no_gang(tmp_path: Path) -> None:
    """A new leader that has not listed pods yet cannot tell "no pods" from "not seen yet": the
    plan's names moved on, and the old run's PodGroup and Workload stay untouched until the pod
    watch has listed (then they stay because its pods run)."""
    async with cluster(tmp_path) as (s, jobs):
        uid, first = await a_running_gang(s, jobs)
        old = first["metadata"]["name"]
        workload = first["spec"]["workloadRef"]["workloadName"]
        pods = [s.pods.trim(o.raw) for (r, _, _), o in list(s.k.objects.items()) if r == PODS]
        s.pods.replace([])  # as a replica that just took the lead: nothing seen yet,
        s.pods.synced = False  # its pod list under way
        moved = await patch(s.k, TRAINJOBS, NS, NAME, {"spec": {"x-bump": 1}})
        run = naming.workload_name(NS, NAME, f"{uid}/run/{moved['metadata']['generation']}")
        s.reconciler.resync()
        await asyncio.sleep(1)  # passes enough to have deleted the old run, were it going
        for kind, name in ((POD_GROUPS, old), (WORKLOADS, workload)):
            still = stored(s.k, kind, name)
            assert still is not None and not still["metadata"].get("deletionTimestamp"), name
        s.pods.replace(pods)  # listed: its pods are there
        s.reconciler.resync()
        await eventually(lambda: live_pod_group(s.k, run), "the new run's PodGroup made")
        await asyncio.sleep(0.5)
        still = stored(s.k, POD_GROUPS, old)
        assert still is not None and not still["metadata"].get("deletionTimestamp")


def jobset_of(trainjob_uid: str, restarts: int) -> dict[str, Any]:
    """The TrainJob's JobSet as its watch brings it (trimmed: owner and restart attempt)."""
    owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": NAME,
             "uid": trainjob_uid, "controller": True}  # fmt: skip
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": NAME, "namespace": NS, "uid": "js-uid", "resourceVersion": "1",
                     "ownerReferences": [owner]},
        "status": {"restarts": restarts},
    }  # fmt: skip


# --- a forged or leftover PodGroup with the computed name ----------------------------------------


async def test_a_forged_pod_group_with_the_computed_name_holds_the_pods_and_is_said(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, served=False) as (s, jobs):
        await create(s.k, CLUSTER_RUNTIMES, cluster_runtime())
        tj = await create(s.k, TRAINJOBS, small_trainjob())
        uid = tj["metadata"]["uid"]
        await eventually(
            lambda: (
                SNAPSHOT_ANNOTATION
                in (stored(s.k, TRAINJOBS, NAME) or {})["metadata"].get("annotations", {})
            ),
            "the runtime frozen",
        )
        name = naming.workload_name(NS, NAME, uid)
        forged = {
            "apiVersion": "scheduling.k8s.io/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 1}}},
        }
        await create(s.k, POD_GROUPS, forged)
        s.cache.apis["native"] = "served"
        s.reconciler.resync()
        await condition_reason(s.k, "NameConflict")
        assert await jobs.create_pod(0) is None
        assert "is not this TrainJob's" in jobs.held[-1]
        kept = pod_group(s.k, name) or {}
        assert owner_uid(kept) == "" and kept["spec"]["schedulingPolicy"]["gang"]["minCount"] == 1


# --- a pod before its TrainJob is in the cache ---------------------------------------------------


async def test_a_pod_before_its_trainjob_is_cached_is_held_on_every_replica(tmp_path: Path) -> None:
    """A second replica whose TrainJob watch lags: it asks the API server, which has the
    TrainJob, and holds the pod; a JobSet pod without a TrainJob passes untouched."""
    async with cluster(tmp_path) as (s, jobs):
        _, group = await a_running_gang(s, jobs)
        lagging = s.cache.trainjobs.get(NS, NAME)
        assert lagging is not None
        s.cache.trainjobs.replace([])  # this replica's watch has not brought it
        s.cache.trainjob_lookup = TrainJobLookup(api_ask(s.api))
        assert await jobs.create_pod(0) is None
        assert "not in this replica's cache yet" in jobs.held[-1]
        plain = await jobs.create_pod(0, trainjob="plain-jobset")
        assert plain is not None and group_of(plain) is None
        s.cache.trainjobs.replace([lagging.raw])  # caught up: tied as on the other replica
        pod = await jobs.create_pod(1)
        assert group_of(pod) == group["metadata"]["name"]


# --- an upgrade with a changed plan while gangs run ---------------------------------------------


async def test_an_upgrade_keeps_a_running_gangs_names_and_never_tears_it_down(
    tmp_path: Path,
) -> None:
    """A TrainJob frozen by an earlier release (a version-1 snapshot: the bare runtime) keeps
    the names that release gave, so its running pods keep their gang."""
    async with cluster(tmp_path) as (s, jobs):
        await create(s.k, CLUSTER_RUNTIMES, cluster_runtime())
        legacy = orjson.dumps(cluster_runtime()).decode()
        tj = small_trainjob()
        tj["metadata"]["annotations"] = {SNAPSHOT_ANNOTATION: legacy}
        created = await create(s.k, TRAINJOBS, tj)
        name = naming.workload_name(NS, NAME)  # version 1: no incarnation in the name
        await eventually(lambda: pod_group(s.k, name) is not None, "the legacy-named PodGroup")
        pods = await jobs.gang()
        assert [group_of(p) for p in pods] == [name] * NUM_NODES
        assert owner_uid(pod_group(s.k, name) or {}) == created["metadata"]["uid"]
        assert not events(s.k, "Deleted")


# --- a foreground delete ------------------------------------------------------------------------


async def test_a_trainjob_being_deleted_gets_nothing_made(tmp_path: Path) -> None:
    async with cluster(tmp_path, served=False) as (s, _):
        await create(s.k, CLUSTER_RUNTIMES, cluster_runtime())
        tj = small_trainjob()
        tj["metadata"]["finalizers"] = ["example.com/keep"]  # another controller's
        await create(s.k, TRAINJOBS, tj)
        await condition_reason(s.k, "GangApiUnavailable")  # its first pass is over
        await delete(s.k, TRAINJOBS, NS, NAME)

        def deleting() -> bool:
            entry = s.cache.trainjobs.get(NS, NAME)
            return entry is not None and bool(entry.raw["metadata"].get("deletionTimestamp"))

        await eventually(deleting, "the TrainJob Terminating in the cache")
        s.cache.apis["native"] = "served"
        s.reconciler.resync()
        await condition_reason(s.k, "TrainJobDeleting")
        assert not [o for (r, _, _), o in list(s.k.objects.items()) if r in (WORKLOADS, POD_GROUPS)]
        assert not events(s.k, "Created")


# --- a rollback: a plan a newer release froze ----------------------------------------------------


async def test_a_plan_a_newer_release_froze_is_left_exactly_as_it_is(tmp_path: Path) -> None:
    """A newer release froze a plan version this one does not know, then was rolled back: this
    release neither re-plans it (new names would delete the running gang's PodGroups) nor
    overwrites the snapshot; it says so and leaves every object alone."""
    async with cluster(tmp_path) as (s, jobs):
        _, group = await a_running_gang(s, jobs)
        newer = '{"planVersion": 99, "runtime": {"spec": {"whatever": "comes next"}}}'
        await patch(s.k, TRAINJOBS, NS, NAME,
                    {"metadata": {"annotations": {SNAPSHOT_ANNOTATION: newer}}})  # fmt: skip
        objects = (
            (WORKLOADS, group["spec"]["workloadRef"]["workloadName"]),
            (POD_GROUPS, group["metadata"]["name"]),  # (level 1: the same name)
        )
        before = {
            (kind, name): (stored(s.k, kind, name) or {}).get("metadata", {}).get("uid")
            for kind, name in objects
        }
        s.reconciler.resync()
        condition = await condition_reason(s.k, cond.PLAN_VERSION_UNKNOWN)
        assert "plan version 99" in condition["message"]
        tj = stored(s.k, TRAINJOBS, NAME) or {}
        assert tj["metadata"]["annotations"][SNAPSHOT_ANNOTATION] == newer  # not overwritten
        for kind, name in objects:
            now = stored(s.k, kind, name)
            assert now is not None and now["metadata"]["uid"] == before[(kind, name)], name
        assert not events(s.k, "Deleted")
        # A new pod of its Jobs is held, not tied by rules that would guess.
        assert await jobs.create_pod(0) is None
        assert "frozen by a newer release" in jobs.held[-1]


# --- drift on an immutable field while the gang runs ---------------------------------------------


def cached_workload(s: Service, name: str, like: dict[str, Any]) -> bool:
    entry = s.cache.store(WORKLOAD).get(NS, name)
    return entry is not None and entry.raw["spec"] == like["spec"]


async def test_drift_on_an_immutable_field_of_a_running_gang_is_said_not_torn_down(
    tmp_path: Path,
) -> None:
    """The Workload differs from the plan on a field the API server keeps immutable (as if an
    earlier release had made it so) while the gang's pods run: an Event and a condition say so,
    and nothing is deleted or recreated; once no pod is left, it is made as planned."""
    async with cluster(tmp_path) as (s, jobs):
        _, group = await a_running_gang(s, jobs)
        workload_name = group["spec"]["workloadRef"]["workloadName"]
        workload = stored(s.k, WORKLOADS, workload_name)
        assert workload is not None
        s.cache.apis["native"] = "not-served"  # the reconciler leaves the TrainJob alone
        await delete(s.k, WORKLOADS, NS, workload_name)
        drifted = copy.deepcopy(workload)
        template = drifted["spec"]["podGroupTemplates"][0]
        template["schedulingConstraints"] = {"topology": [{"key": "example.com/rack"}]}
        for key in ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"):
            drifted["metadata"].pop(key, None)
        await create(s.k, WORKLOADS, drifted)
        await eventually(lambda: cached_workload(s, workload_name, drifted), "the drift cached")
        s.cache.apis["native"] = "served"
        s.reconciler.resync()
        condition = await condition_reason(s.k, "DriftHeld")
        assert workload_name in condition["message"]
        kept = stored(s.k, WORKLOADS, workload_name) or {}
        assert kept["spec"]["podGroupTemplates"][0]["schedulingConstraints"] == {
            "topology": [{"key": "example.com/rack"}]
        }
        assert not events(s.k, "Deleted")
        assert set(tied_pods(s.k).values()) == {group["metadata"]["name"]}
        # The pods end (the TrainJob is restarted by hand, say): nothing uses the gang now.
        for o in [o for (r, _, _), o in list(s.k.objects.items()) if r == PODS]:
            await delete(s.k, PODS, NS, o.raw["metadata"]["name"])
        await pods_gone(s.k)

        planned = workload["spec"]["podGroupTemplates"][0].get("schedulingConstraints")

        def as_planned() -> bool:
            found = stored(s.k, WORKLOADS, workload_name) or {"spec": {}}
            templates = found["spec"].get("podGroupTemplates") or [{}]
            return bool(templates[0].get("schedulingConstraints") == planned)

        await eventually(as_planned, "the Workload made again as planned")


# --- a namespace being deleted -------------------------------------------------------------------


async def test_a_namespace_being_deleted_ends_the_pass_quietly(tmp_path: Path) -> None:
    """The NamespaceLifecycle plugin refuses creates in a namespace being deleted: no Event, no
    condition of a refusal, no retry loop (its TrainJob goes with the namespace)."""
    async with cluster(tmp_path) as (s, _):
        message = (
            f'podgroups.scheduling.k8s.io "x" is forbidden: unable to create new content in '
            f"namespace {NS} because it is being terminated"
        )
        details = {"causes": [{"reason": "NamespaceTerminating", "message": message}]}
        refusals = s.k[kmock.method.POST, POD_GROUPS]
        refusals << status(403, message, "Forbidden", details)
        await create(s.k, CLUSTER_RUNTIMES, cluster_runtime())
        await create(s.k, TRAINJOBS, small_trainjob())
        await eventually(lambda: len(s.k[kmock.method.POST, POD_GROUPS]) >= 1, "a create tried")
        # Passes that other changes wake (its Workload's ADDED event, its condition) try again;
        # none asks to: once they are over, nothing more is tried.
        counts = [len(s.k[kmock.method.POST, POD_GROUPS])]
        for _ in range(6):
            await asyncio.sleep(1.5)  # past a retry loop's first waits (here 0.05 s, 0.2 s)
            counts.append(len(s.k[kmock.method.POST, POD_GROUPS]))
            if counts[-1] == counts[-2]:
                break
        assert counts[-1] == counts[-2] and counts[-1] <= 4, counts
        assert not events(s.k, "Refused")


# --- a runtime that gains spec.scheduling while its TrainJob runs ---------------------------------


async def test_a_trainjob_that_started_without_a_gang_never_gets_one_mid_flight(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as (s, jobs):
        plain = cluster_runtime()
        scheduling = plain["spec"].pop("scheduling")
        await create(s.k, CLUSTER_RUNTIMES, plain)
        await create(s.k, TRAINJOBS, small_trainjob())
        pods = await jobs.gang()  # no spec.scheduling: default scheduling, nothing held
        assert [group_of(p) for p in pods] == [None] * NUM_NODES
        s.reconciler.wall = lambda: time.time() + 3600  # long past an earlier TrainJob's pods
        await patch(
            s.k, CLUSTER_RUNTIMES, None, "torch-distributed", {"spec": {"scheduling": scheduling}}
        )
        await eventually(lambda: events(s.k, "MixedSchedulingGroup"), "frozen without a gang")
        tj = stored(s.k, TRAINJOBS, NAME) or {}
        assert orjson.loads(tj["metadata"]["annotations"][SNAPSHOT_ANNOTATION])["runtime"] is None
        replacement = await jobs.create_pod(0)  # a pod of the running TrainJob, later
        assert replacement is not None and group_of(replacement) is None
        assert not [o for (r, _, _), o in list(s.k.objects.items()) if r in (WORKLOADS, POD_GROUPS)]


# --- a finished TrainJob: a tombstone in the cache (issue 27 part 4) ----------------------------


async def test_a_trainjob_that_completes_shrinks_to_a_tombstone_and_its_pods_are_held(
    tmp_path: Path,
) -> None:
    """Trainer says Complete: the reconciler releases the gang and says Finished, as it did; the
    cache keeps a tombstone (identity, the runtime snapshot, what decides its release, the
    conditions read: no labels, no trainer image nor resources, no memoised plan); a pod made
    for it then is held with that reason, never admitted loose nor tied to the released gang."""
    async with cluster(tmp_path) as (s, jobs):
        await create(s.k, CLUSTER_RUNTIMES, cluster_runtime())
        tj = small_trainjob()
        tj["metadata"]["labels"] = {"team": "vision"}
        tj["spec"]["trainer"].update(image="example/train:1", command=["torchrun", "train.py"])
        created = await create(s.k, TRAINJOBS, tj)
        group = await the_gang_of(s.k, created["metadata"]["uid"])
        pods = await jobs.gang()
        assert [group_of(p) for p in pods] == [group["metadata"]["name"]] * NUM_NODES
        running = s.cache.trainjobs.get(NS, NAME)
        assert running is not None and running.memo is not None  # the pod webhook's plan
        assert running.raw["metadata"]["labels"] == {"team": "vision"}
        trainer = running.raw["spec"]["trainer"]
        assert set(trainer) == {"numNodes", "resourcesPerNode"}  # no image, no command

        complete = {"type": "Complete", "status": "True", "reason": "Done", "message": "done"}
        kept = (stored(s.k, TRAINJOBS, NAME) or {})["status"]["conditions"]
        await patch(s.k, TRAINJOBS, NS, NAME, {"status": {"conditions": [*kept, complete]}})
        await condition_reason(s.k, cond.FINISHED)
        await eventually(
            lambda: (
                all(p["metadata"].get("deletionTimestamp") for p in live_pod_groups(s.k))
                or not live_pod_groups(s.k)
            ),
            "the gang released",
        )
        await pods_gone(s.k)
        await eventually(lambda: not live_pod_groups(s.k) and not pod_group(s.k, NAME), "gone")

        entry = s.cache.trainjobs.get(NS, NAME)
        assert entry is not None and entry.memo in (None, FINISHED)  # no plan kept
        meta = entry.raw["metadata"]
        assert "labels" not in meta and list(meta["annotations"]) == [SNAPSHOT_ANNOTATION]
        assert meta["uid"] == created["metadata"]["uid"]
        # What decides its release (issue 37): numNodes, not the resources per node.
        assert entry.raw["spec"]["trainer"] == {"numNodes": trainer["numNodes"]}
        types = sorted(c["type"] for c in entry.raw["status"]["conditions"])
        assert types == ["Complete", cond.CONDITION_TYPE]

        assert await jobs.create_pod(0) is None
        assert "the TrainJob has finished" in jobs.held[-1]
        entry = s.cache.trainjobs.get(NS, NAME)
        assert entry is not None and entry.memo is FINISHED  # holding it planned nothing
        assert not live_pod_groups(s.k)  # nothing made again for it

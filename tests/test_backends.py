"""Choosing a TrainJob's gang backend, and living beside other controllers.

* The backend follows the scheduler the pods name (runtime, or the TrainJob's runtime patch);
  an unknown scheduler or an unserved backend API is said at `kubectl apply` and in one Event,
  and nothing is created or tied.
* The service changes and deletes only what it made: a gang object another controller made for
  the TrainJob (seen on a real cluster: a hand-made Workload deleted 13 ms after its creation)
  makes the service stand down for that TrainJob: one Event, a metric, nothing created, no pod
  tied, nothing of theirs touched.
* Admission: a PriorityClass that does not exist is denied; Kueue topology-aware scheduling
  that would contradict the gang's topology is a warning.
"""

from __future__ import annotations

import asyncio
import base64
import copy
from pathlib import Path
from typing import Any

import kmock
import orjson
import pytest
import yaml

from tests.builders import TRAINJOB_UID, Json, rj, runtime, torch_node, trainjob
from tests.harness import fixture, frozen, held_because, running_server, served
from tests.kube_emulator import (
    CLUSTER_RUNTIMES,
    TRAINJOBS,
    WORKLOADS,
    create,
    eventually,
    next_requests,
    patch,
    status,
)
from tests.test_reconciler import (
    DELETE,
    NAME,
    NS,
    UPDATE,
    cluster_runtime,
    events,
    objects,
    stored,
    world,
)
from tests.test_reconciler import trainjob as stored_trainjob
from webhook.backends.base import Context
from webhook.backends.native import NativeBackend
from webhook.backends.registry import Backends, default_backends
from webhook.core import naming
from webhook.core.plan import build_plan
from webhook.core.trainer import Runtime, TrainJob
from webhook.core.validation import validate_trainjob
from webhook.kube.cache import Cache
from webhook.metrics.registry import Metrics

POD_PATH = "/mutate--v1-pod"
TRAINJOB_PATH = "/validate-trainer-kubeflow-org-v1alpha1-trainjob"


# --- which backend ---------------------------------------------------------------------------


def test_the_backend_follows_the_scheduler_name_and_names_are_settings() -> None:
    backends = default_backends()
    assert backends.for_scheduler("default-scheduler") is backends.named("native")
    assert backends.for_scheduler("my-own-scheduler") is None
    renamed = default_backends({"native": ("default-scheduler", "second-kube-scheduler")})
    assert renamed.for_scheduler("second-kube-scheduler") is renamed.named("native")

    class Renamed(NativeBackend):
        name = "renamed"

    with pytest.raises(ValueError, match="'x' is given to both native and renamed"):
        Backends((NativeBackend(), Renamed()), {"native": ("x",), "renamed": ("x",)})


def plan_of(raw_runtime: Json, raw_trainjob: Json) -> Any:
    return build_plan(TrainJob.model_validate(raw_trainjob), Runtime.model_validate(raw_runtime))


SAMPLE_PAIRS = [
    ("torch-100-nodes.trainjob.yaml", "torch-distributed.runtime.yaml"),  # level 1
    ("deepspeed-8-nodes.trainjob.yaml", "deepspeed-distributed.runtime.yaml"),  # level 2
    ("torch-rack.trainjob.yaml", "torch-rack.runtime.yaml"),  # level 3
]


@pytest.mark.parametrize(
    ("backend_name", "trainjob_file", "runtime_file"),
    [
        *[
            (b, *pair)
            for b in ("native", "coscheduling", "volcano", "kai")
            for pair in SAMPLE_PAIRS
        ],
        ("native", "tpu-slices.trainjob.yaml", "tpu-slices.runtime.yaml"),  # a tree
    ],
)
def test_every_backend_renders_plan_version_2_as_version_1_but_for_names_and_a_label(
    backend_name: str, trainjob_file: str, runtime_file: str
) -> None:
    """A TrainJob frozen by an earlier release (plan version 1) keeps the names it was made
    with; a new one's (version 2) carry its uid, and its objects say which version named them.
    Nothing else differs: the objects' tests at version 1 speak for version 2 too."""
    from tests.paths import SAMPLES

    raw_trainjob = yaml.safe_load((SAMPLES / trainjob_file).read_text())
    raw_trainjob["metadata"]["uid"] = TRAINJOB_UID
    raw_runtime = yaml.safe_load((SAMPLES / runtime_file).read_text())
    for job in raw_runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        pod = job["template"]["spec"].setdefault("template", {}).setdefault("spec", {})
        pod["schedulerName"] = SCHEDULER_OF[backend_name]
    tj, rt = TrainJob.model_validate(raw_trainjob), Runtime.model_validate(raw_runtime)
    legacy, plan = build_plan(tj, rt, plan_version=1), build_plan(tj, rt, plan_version=2)
    assert legacy is not None and plan is not None
    backends = default_backends()
    backend = backends.named(backend_name)
    assert backend is not None and backends.for_plan(plan) is backend
    incarnation = TRAINJOB_UID
    name = raw_trainjob["metadata"]["name"]
    renamed = {legacy.workload_name: naming.workload_name(NS, name, incarnation)}
    for old, new in zip(legacy.groups, plan.groups, strict=True):
        # Templates live inside the one Workload and keep their names; a level-1 template is
        # named as the Workload (and its PodGroup), and is renamed with it.
        assert new.template_name == renamed.get(old.template_name, old.template_name)
        if old.pod_group_name != legacy.workload_name:
            renamed[old.pod_group_name] = naming.pod_group_name(
                name, old.template_name, incarnation
            )
        assert new.pod_group_name == renamed[old.pod_group_name]
    for old_c, new_c in zip(legacy.composites, plan.composites, strict=True):
        if old_c.name != legacy.workload_name:  # the root is named as the Workload
            qualified = naming.pod_group_name(name, old_c.template_name, incarnation)
            renamed[old_c.name] = qualified
        assert new_c.name == renamed[old_c.name]
        assert new_c.template_name == renamed.get(old_c.template_name, old_c.template_name)
    assert len(set(renamed.values())) == len(renamed)
    assert not set(renamed) & set(renamed.values())

    def as_version_2(obj: Any) -> Any:
        if isinstance(obj, dict):
            out = {k: as_version_2(v) for k, v in obj.items()}
            if out.get("app.kubernetes.io/managed-by") == "trainjob-scheduling-webhook":
                out["trainjob-scheduling.dev/plan-version"] = "2"  # the owner labels
            return out
        if isinstance(obj, list):
            return [as_version_2(v) for v in obj]
        return renamed.get(obj, obj) if isinstance(obj, str) else obj

    uids = {("Workload", legacy.workload_name): "wl", ("Workload", plan.workload_name): "wl"}
    old_objects = backend.render(legacy, Context(), uids)
    new_objects = backend.render(plan, Context(), uids)
    assert new_objects == as_version_2(old_objects)
    for obj in new_objects:
        assert obj["metadata"]["labels"]["trainjob-scheduling.dev/plan-version"] == "2"
        assert obj["metadata"]["name"] in renamed.values()
    for obj in old_objects:
        assert "trainjob-scheduling.dev/plan-version" not in obj["metadata"]["labels"]


def test_a_trainjob_runtime_patch_chooses_the_scheduler_of_its_pods() -> None:
    rt = runtime(rj("init"), torch_node(), scheduling={})
    assert plan_of(rt, trainjob(num_nodes=2)).scheduler_name == "default-scheduler"
    patched = trainjob(num_nodes=2)
    volcano = {"schedulerName": "volcano"}
    patched["spec"]["runtimePatches"] = [
        {"manager": "example.com/picker", "trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": [
                {"name": n, "template": {"spec": {"template": {"spec": volcano}}}}
                for n in ("init", "node")
            ]}}}}
    ]  # fmt: skip
    plan = plan_of(rt, patched)
    assert plan.scheduler_name == "volcano" and {g.scheduler_name for g in plan.groups} == {
        "volcano"
    }
    half = copy.deepcopy(patched)
    jobs = half["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    jobs["replicatedJobs"] = jobs["replicatedJobs"][1:]  # only the node's pods move
    (err,) = validate_trainjob(half, Runtime.model_validate(rt)).errors
    assert err.path == "spec.runtimePatches" and "init=default-scheduler, node=volcano" in str(err)


def test_a_runtime_whose_gangs_name_different_schedulers_is_rejected() -> None:
    from webhook.core.validation import validate_runtime

    rt = runtime(
        rj("init", scheduler="volcano"),
        torch_node(),
        scheduling={"replicatedJobs": [{"targetReplicatedJobs": ["init"]},
                                       {"targetReplicatedJobs": ["node"]}]},
    )  # fmt: skip
    (err,) = validate_runtime(rt).errors
    assert err.path == (
        "spec.template.spec.replicatedJobs[1].template.spec.template.spec.schedulerName"
    )
    assert 'must match "volcano" of "init": one TrainJob\'s groups are made for one' in str(err)


# --- admission --------------------------------------------------------------------------------


def review(obj: Json) -> Json:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "trainer.kubeflow.org", "version": "v1alpha1", "kind": "TrainJob"},
            "resource": {
                "group": "trainer.kubeflow.org",
                "version": "v1alpha1",
                "resource": "trainjobs",
            },
            "name": obj["metadata"]["name"],
            "namespace": obj["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": obj,
        },
    }


def cache_with(raw_runtime: Json, priority_classes: list[str] | None = None) -> Cache:
    cache = Cache(connected=True)
    cache.jobsets.replace([])  # listed, none: restart attempt 0
    cache.cluster_runtimes.replace([raw_runtime])
    cache.trainjobs.replace([])
    cache.training_runtimes.replace([])
    if priority_classes is not None:
        cache.priority_classes.replace([{"metadata": {"name": n}} for n in priority_classes])
    return cache


def answer(cache: Cache, tmp_path: Path, path: str, doc: Json) -> Json:
    with running_server(cache, tmp_path / "certs") as srv, srv.client() as client:
        resp = client.post(path, content=orjson.dumps(doc))
        assert resp.status_code == 200, resp.text
        response: Json = resp.json()["response"]
        return response


def test_trainjob_admission_says_what_its_gang_backend_cannot_do(tmp_path: Path) -> None:
    rt = runtime(rj("init", priority_class="gold"), torch_node(priority_class="gold"),
                 scheduling={}, name="rt")  # fmt: skip
    cache = cache_with(rt, priority_classes=["silver"])
    cache.apis["native"] = "not-served"
    with running_server(cache, tmp_path / "certs") as srv, srv.client() as client:
        denied = client.post(TRAINJOB_PATH, content=orjson.dumps(review(trainjob(num_nodes=2))))
        response = denied.json()["response"]
        assert response["allowed"] is False
        assert "PriorityClass 'gold', which does not exist" in response["status"]["message"]
        assert any("native gang scheduling is unavailable" in w for w in response["warnings"])
        # Once the class exists (the cache follows the cluster), only the warning stays.
        cache.priority_classes.replace([{"metadata": {"name": "gold"}}])
        allowed = client.post(TRAINJOB_PATH, content=orjson.dumps(review(trainjob(num_nodes=2))))
        response = allowed.json()["response"]
        assert response["allowed"] is True
        (warning,) = response["warnings"]
        assert warning.startswith("native gang scheduling is unavailable (scheduling.k8s.io/")


def test_an_unknown_scheduler_is_a_warning_at_apply(tmp_path: Path) -> None:
    rt = runtime(rj("init", scheduler="my-scheduler"), torch_node(scheduler="my-scheduler"),
                 scheduling={}, name="rt")  # fmt: skip
    response = answer(cache_with(rt), tmp_path, TRAINJOB_PATH, review(trainjob(num_nodes=2)))
    assert response["allowed"] is True
    (warning,) = response["warnings"]
    assert warning.startswith("its pods name the scheduler 'my-scheduler', which no gang backend")


def test_kueue_topology_aware_scheduling_that_contradicts_the_gang_is_a_warning(
    tmp_path: Path,
) -> None:
    def node(kueue: dict[str, str]) -> Json:
        job = torch_node()
        job["template"]["spec"]["template"]["metadata"] = {"annotations": kueue}
        return job

    zone = {"topology": [{"key": "topology.kubernetes.io/zone"}]}
    queued = trainjob(num_nodes=2)
    queued["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    rack = {"kueue.x-k8s.io/podset-required-topology": "example.com/rack"}
    preferred = {"kueue.x-k8s.io/podset-preferred-topology": "topology.kubernetes.io/zone"}
    same = {"kueue.x-k8s.io/podset-required-topology": "topology.kubernetes.io/zone"}
    cases = [(rack, 'Kueue keeps "node" in one example.com/rack, the gang in one'),
             (preferred, 'Kueue may spread "node" over several topology.kubernetes.io/zone'),
             (same, None)]  # fmt: skip
    for i, (kueue, expected) in enumerate(cases):
        rt = runtime(node(kueue), scheduling={"schedulingConstraints": zone}, name="rt")
        response = answer(cache_with(rt), tmp_path / str(i), TRAINJOB_PATH, review(queued))
        warnings = response.get("warnings", [])
        if expected is None:
            assert warnings == [], warnings
        else:
            assert len(warnings) == 1 and warnings[0].startswith(expected), warnings
    # Not queued by Kueue: its annotations do nothing, nothing to say.
    rt = runtime(node(rack), scheduling={"schedulingConstraints": zone}, name="rt")
    response = answer(
        cache_with(rt), tmp_path / "plain", TRAINJOB_PATH, review(trainjob(num_nodes=2))
    )
    assert "warnings" not in response


SCHEDULER_OF = {"native": "default-scheduler", "coscheduling": "scheduler-plugins-scheduler",
                "volcano": "volcano", "kai": "kai-scheduler"}  # fmt: skip


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", list(SCHEDULER_OF))
async def test_kueue_admits_through_suspend_and_every_backend_follows(backend: str) -> None:
    """The README's Kueue example: the TrainJob is queued (Kueue's webhook creates it
    suspended), admitted (resumed), preempted (suspended again), re-admitted. Nothing exists
    while it waits in the queue, so no gang holds anything Kueue has not granted."""
    rt = cluster_runtime()
    for job in rt["spec"]["template"]["spec"]["replicatedJobs"]:
        pod = job["template"]["spec"]["template"]
        pod["spec"]["schedulerName"] = SCHEDULER_OF[backend]
        pod.setdefault("metadata", {})["annotations"] = {
            "kueue.x-k8s.io/podset-required-topology": "topology.kubernetes.io/zone"
        }
    queued = stored_trainjob(suspend=True)
    queued["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    kind = default_backends().named(backend).kinds[-1]  # type: ignore[union-attr]
    resource = kmock.resource(kind.group, kind.version, kind.plural)
    async with world(served=(backend,)) as w:
        await create(w.k, CLUSTER_RUNTIMES, rt)
        await create(w.k, TRAINJOBS, queued)
        await asyncio.sleep(0.3)
        assert objects(w.k, resource) == []  # queued: nothing made
        for _ in range(2):  # admitted, preempted, admitted again
            await patch(w.k, TRAINJOBS, NS, NAME, {"spec": {"suspend": False}})
            await eventually(lambda: objects(w.k, resource), f"the {backend} gang on admission")
            await patch(w.k, TRAINJOBS, NS, NAME, {"spec": {"suspend": True}})
            await eventually(lambda: not objects(w.k, resource), "released on preemption")


@pytest.mark.asyncio
async def test_a_gang_object_the_api_server_refuses_is_reported_and_retried_slowly() -> None:
    """Another scheduler's webhook may refuse a PodGroup as it is (a closed Volcano queue): an
    Event says why, and the reconciler tries again after a while, not in a tight loop."""
    rt = cluster_runtime()
    for job in rt["spec"]["template"]["spec"]["replicatedJobs"]:
        job["template"]["spec"]["template"]["spec"]["schedulerName"] = "volcano"
    kind = default_backends().named("volcano").kinds[0]  # type: ignore[union-attr]
    resource = kmock.resource(kind.group, kind.version, kind.plural)
    async with world(served=("volcano",)) as w:
        refused = status(422, 'admission webhook denied: queue "q" is closed', "Invalid")
        next_requests(w.k[kmock.method.POST, resource], 1) << refused
        await create(w.k, CLUSTER_RUNTIMES, rt)
        await create(w.k, TRAINJOBS, stored_trainjob())
        (event,) = await eventually(lambda: events(w.k, "Refused"), "a Refused Event")
        assert "the API server refused PodGroup" in event["note"]
        assert 'queue "q" is closed' in event["note"] and event["type"] == "Warning"
        # Retried after conflict_retry (0.2 s here, a minute by default): made once allowed.
        await eventually(lambda: objects(w.k, resource), "the PodGroup, once allowed")
        assert len(w.k[kmock.method.POST, resource]) == 2


# --- the pod webhook ---------------------------------------------------------------------------


def pod_review(scheduler: str | None = None) -> Json:
    doc = fixture("pod-create-by-job-controller.mutate.json")
    if scheduler is not None:
        doc["request"]["object"]["spec"]["schedulerName"] = scheduler
    return doc


def pod_cache() -> Cache:
    """The fixture pod's TrainJob (team-a/my-job, frozen) on a level-1 runtime, native API
    served."""
    cache = Cache(connected=True)
    cache.jobsets.replace([])  # listed, none: restart attempt 0
    cache.cluster_runtimes.replace([cluster_runtime("torch-distributed")])
    tj = stored_trainjob("my-job")
    tj["metadata"]["uid"] = TRAINJOB_UID
    cache.trainjobs.replace([frozen(cache, tj)])
    cache.training_runtimes.replace([])
    served(cache, "native")
    return cache


def test_a_pod_naming_another_scheduler_than_its_gangs_is_not_tied(tmp_path: Path) -> None:
    # Not tied, and not let through loose either: held until its Job makes it right.
    cache = pod_cache()
    with running_server(cache, tmp_path / "certs") as srv, srv.client() as client:
        tied = client.post(POD_PATH, content=orjson.dumps(pod_review())).json()["response"]
        assert tied["allowed"] is True and "patch" in tied
        other = client.post(POD_PATH, content=orjson.dumps(pod_review("volcano"))).json()
        assert held_because(other["response"]).startswith(
            "it names the scheduler 'volcano', its gang is for 'default-scheduler'"
        )
        cache.apis["native"] = "not-served"
        unserved = client.post(POD_PATH, content=orjson.dumps(pod_review())).json()
        assert held_because(unserved["response"]).startswith(
            "the gang API scheduling.k8s.io/v1beta1 or v1alpha2 is not served"
        )


# --- living beside other controllers -----------------------------------------------------------


def hand_made_workload(owner_uid: str) -> Json:
    """A Workload for the TrainJob that another controller (or a person) made: it is controlled
    by the TrainJob but has none of this service's labels."""
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {
            "name": "made-by-trainer",
            "namespace": NS,
            "labels": {"app.kubernetes.io/managed-by": "trainer.kubeflow.org"},
            "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1",
                                 "kind": "TrainJob", "name": "my-job", "uid": owner_uid,
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {"podGroupTemplates": [{"name": "t", "schedulingPolicy": {"basic": {}}}]},
    }  # fmt: skip


def workload_of(trainjob: Json) -> str:
    """The Workload of a TrainJob the reconciler froze (plan version 2: named by its uid)."""
    return naming.workload_name(NS, trainjob["metadata"]["name"], trainjob["metadata"]["uid"])


@pytest.mark.asyncio
async def test_another_controllers_gang_objects_make_the_service_stand_down() -> None:
    metrics = Metrics()
    async with world() as w:
        w.reconciler.metrics = metrics
        await create(w.k, CLUSTER_RUNTIMES, cluster_runtime())
        tj = await create(w.k, TRAINJOBS, stored_trainjob())
        theirs = await create(w.k, WORKLOADS, hand_made_workload(tj["metadata"]["uid"]))
        said = await eventually(lambda: events(w.k, "StandingDown"), "a StandingDown event")
        assert "'made-by-trainer'" in said[0]["note"] and said[0]["type"] == "Warning"
        await asyncio.sleep(0.5)  # several passes
        # Nothing created, nothing of theirs changed or deleted (13 ms on a real cluster before).
        assert [o["metadata"]["name"] for o in objects(w.k, WORKLOADS)] == ["made-by-trainer"]
        assert stored(w.k, WORKLOADS, "made-by-trainer") == theirs
        assert len(w.k[UPDATE, WORKLOADS]) == 0 and len(w.k[DELETE, WORKLOADS]) == 0
        # No retry loop: the test recorder posts every Event (production keeps one per 10
        # min), and passes come only from changes: the TrainJob created, its own snapshot
        # write, the foreign Workload seen (at most 3, however the watches interleave).
        passes = len(events(w.k, "StandingDown"))
        await asyncio.sleep(0.5)
        assert len(events(w.k, "StandingDown")) == passes <= 3
        value = metrics.registry.get_sample_value("trainjob_scheduling_trainjobs_stood_down")
        assert value == 1.0
        assert stored(w.k, WORKLOADS, workload_of(tj)) is None


@pytest.mark.asyncio
async def test_objects_of_ours_no_longer_in_the_plan_go_and_others_stay() -> None:
    """The stale-object sweep deletes only what carries this service's label."""
    async with world() as w:
        await create(w.k, CLUSTER_RUNTIMES, cluster_runtime())
        tj = await create(w.k, TRAINJOBS, stored_trainjob())
        uid = tj["metadata"]["uid"]
        ours_stale = hand_made_workload(uid)
        ours_stale["metadata"]["name"] = "stale-of-ours"
        ours_stale["metadata"]["labels"] = {
            "app.kubernetes.io/managed-by": "trainjob-scheduling-webhook"
        }
        await create(w.k, WORKLOADS, ours_stale)
        await eventually(lambda: stored(w.k, WORKLOADS, workload_of(tj)), "our Workload")
        await eventually(lambda: stored(w.k, WORKLOADS, "stale-of-ours") is None, "stale gone")


def test_a_stood_down_trainjobs_pods_are_not_tied(tmp_path: Path) -> None:
    cache = pod_cache()
    uid = cache.trainjobs.get(NS, "my-job").raw["metadata"]["uid"]  # type: ignore[union-attr]
    from webhook.backends.native import WORKLOAD as WORKLOAD_KIND

    cache.store(WORKLOAD_KIND).replace([{**hand_made_workload(uid), "metadata": {
        **hand_made_workload(uid)["metadata"], "uid": "theirs"}}])  # fmt: skip
    with running_server(cache, tmp_path / "certs") as srv, srv.client() as client:
        response = client.post(POD_PATH, content=orjson.dumps(pod_review())).json()["response"]
        assert response["allowed"] is True  # admitted without a group: another controller's
        assert "patch" not in response and "warnings" not in response
        # A group the other controller named, its PodGroup not in this replica's cache yet:
        # kept (removing it would run the pod loose, outside that controller's gang).
        theirs = pod_review()
        theirs["request"]["object"]["spec"]["schedulingGroup"] = {"podGroupName": "kueue-pg"}
        response = client.post(POD_PATH, content=orjson.dumps(theirs)).json()["response"]
        assert response["allowed"] is True and "patch" not in response
        # A group this service's plan names (its Job webhook's, before the gang stood down):
        # no object will ever have it, so it is taken off.
        ours = pod_review()
        name = naming.workload_name(NS, "my-job", str(uid))
        ours["request"]["object"]["spec"]["schedulingGroup"] = {"podGroupName": name}
        response = client.post(POD_PATH, content=orjson.dumps(ours)).json()["response"]
        assert response["allowed"] is True, response
        patch = orjson.loads(base64.b64decode(response["patch"]))
        assert patch == [{"op": "remove", "path": "/spec/schedulingGroup"}]


# --- plan --backend ---------------------------------------------------------------------------


def test_plan_renders_for_the_backend_asked(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.paths import REPO, SAMPLES

    files = ["-f", str(SAMPLES / "torch-100-nodes.trainjob.yaml"),
             "-f", str(SAMPLES / "torch-distributed.runtime.yaml")]  # fmt: skip
    run = [sys.executable, "-m", "webhook", "plan", *files]
    native = subprocess.run([*run, "--backend", "native"], capture_output=True, text=True,
                            cwd=REPO, check=False)  # fmt: skip
    assert native.returncode == 0, native.stderr
    assert "kind: Workload" in native.stdout
    unknown = subprocess.run([*run, "--backend", "nope"], capture_output=True, text=True,
                             cwd=REPO, check=False)  # fmt: skip
    assert unknown.returncode == 2 and "no backend 'nope'" in unknown.stderr
    for backend in default_backends().backends:
        kind = backend.kinds[-1]
        done = subprocess.run([*run, "--backend", backend.name], capture_output=True, text=True,
                              cwd=REPO, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        docs = list(yaml.safe_load_all(done.stdout))
        assert {(d["apiVersion"], d["kind"]) for d in docs} >= {(kind.group_version, kind.kind)}
        assert all(d["metadata"]["namespace"] == "team-a" for d in docs)

"""The KAI Scheduler backend: `scheduling.run.ai/v2alpha2` PodGroups, pods tied by annotation.

* Rendering: one flat PodGroup per plan group, exact objects for each level; everything rendered
  from any valid plan passes KAI v0.17.0's published PodGroup CRD schema.
* Drift, status and admission as KAI behaves (see `webhook/backends/kai.py`).
* The pod webhook over HTTPS: `pod-group-name` and `kai.scheduler/skip-podgrouper` added once.
* The lifecycle against the API emulator over HTTP: create, suspend, resume, finish, delete,
  drift, a foreign PodGroup; and one `serve` process choosing the backend per TrainJob.

KAI's PodGroup carries no resources (v2alpha2 has no `minResources`), so none are checked here.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import time
from pathlib import Path

import jsonpatch
import kmock
import orjson
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests import reference
from tests.builders import TRAINJOB_UID, Json, rj, runtime, torch_node, trainjob
from tests.crd_schema import crd_errors
from tests.harness import frozen, held_because, running_server, served, webhook_path
from tests.kube_emulator import (
    CLUSTER_RUNTIMES,
    POD_GROUPS,
    TRAINJOBS,
    VersionedEmulator,
    create,
    delete,
    emulator,
    eventually,
    patch,
)
from tests.paths import SAMPLES
from tests.test_backends import pod_review, review
from tests.test_informer import serving
from tests.test_properties import runtimes, trainjobs
from tests.test_reconciler import (
    CREATE,
    DELETE,
    NAME,
    NS,
    UPDATE,
    events,
    objects,
    stored,
    uid,
    world,
)
from tests.test_reconciler import cluster_runtime as native_runtime
from tests.test_reconciler import trainjob as stored_trainjob
from webhook.backends.base import ClusterFacts, Context, Drift
from webhook.backends.kai import (
    POD_GROUP,
    KaiBackend,
    KaiSettings,
    pod_group_status,
)
from webhook.backends.native import POD_GROUP as NATIVE_POD_GROUP
from webhook.backends.registry import default_backends
from webhook.core import naming
from webhook.core.plan import Plan, build_plan
from webhook.core.snapshot import PLAN_VERSION
from webhook.core.trainer import Runtime, TrainJob
from webhook.core.validation import validate_runtime, validate_trainjob
from webhook.kube.cache import Cache
from webhook.metrics.gangs import GangTracker
from webhook.metrics.registry import Metrics
from webhook.reconcile.reconciler import ReconcilerSettings

CRD = "scheduling.run.ai_podgroups.yaml"
KAI_POD_GROUPS = kmock.resource("scheduling.run.ai", "v2alpha2", "podgroups")
KAI = "kai-scheduler"
UID = TRAINJOB_UID
# Level 1: team-a/my-job's one group, as earlier releases named it (plan version 1)...
LEGACY_GROUP = "my-job-f438be8c51"
# ... and as this release names it for the TrainJob of uid UID (version 2).
MY_JOB_GROUP = naming.workload_name("team-a", "my-job", UID)
POD_PATH = "/mutate--v1-pod"
TRAINJOB_PATH = "/validate-trainer-kubeflow-org-v1alpha1-trainjob"
LABELS = {
    "app.kubernetes.io/managed-by": "trainjob-scheduling-webhook",
    "trainer.kubeflow.org/trainjob-name": "my-job",
}
LABELS_V3 = {**LABELS, "trainjob-scheduling.dev/plan-version": "3"}  # plan version 3's objects
ZONE = {"topology": [{"key": "topology.kubernetes.io/zone"}]}


def kai_pods(raw_runtime: Json) -> Json:
    """The runtime with every pod template naming KAI's scheduler."""
    out = copy.deepcopy(raw_runtime)
    for job in out["spec"]["template"]["spec"]["replicatedJobs"]:
        pod = job.setdefault("template", {}).setdefault("spec", {}).setdefault("template", {})
        pod.setdefault("spec", {})["schedulerName"] = KAI
    return out


def plan_of(raw_runtime: Json, raw_trainjob: Json, plan_version: int = PLAN_VERSION) -> Plan:
    """The plan (`plan_version` 1: with the names earlier releases gave, which the exact objects
    below spell; test_backends shows version 2 renders the same but for names and a label)."""
    tj, rt = TrainJob.model_validate(raw_trainjob), Runtime.model_validate(raw_runtime)
    plan = build_plan(tj, rt, plan_version)
    assert plan is not None
    return plan


def sample(name: str) -> Json:
    doc: Json = yaml.safe_load((SAMPLES / name).read_text())
    return doc


def owner(name: str, trainjob_uid: str = UID) -> Json:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": name,
        "uid": trainjob_uid, "controller": True, "blockOwnerDeletion": True,
    }  # fmt: skip


def expected(name: str, trainjob: str, policy: str, spec: Json) -> Json:
    return {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {
            "labels": {**LABELS, "trainer.kubeflow.org/trainjob-name": trainjob},
            "name": name,
            "namespace": "team-a",
            "ownerReferences": [owner(trainjob)],
            "annotations": {"trainjob-scheduling.dev/policy": policy},
        },
        "spec": spec,
    }


# --- rendering -----------------------------------------------------------------------------------


def test_level_1_is_one_pod_group_with_queue_priority_class_and_required_level() -> None:
    rt = kai_pods(runtime(torch_node(priority_class="high"), scheduling={
        "schedulingPolicy": {"gang": {}}, "schedulingConstraints": ZONE}))  # fmt: skip
    plan = plan_of(rt, trainjob(num_nodes=4), plan_version=1)
    (pg,) = KaiBackend().render(plan, Context(labels={"kai.scheduler/queue": "team-a-gpus"}))
    assert pg == expected(LEGACY_GROUP, "my-job", "gang", {
        "minMember": 4,
        "queue": "team-a-gpus",
        "priorityClassName": "high",
        "topologyConstraint": {
            "requiredTopologyLevel": "topology.kubernetes.io/zone", "topology": "cluster-topology",
        },
    })  # fmt: skip
    assert crd_errors(pg, CRD) == []


def test_level_2_basic_initializer_and_a_gang_whose_launcher_joins_later() -> None:
    tj = sample("deepspeed-8-nodes.trainjob.yaml")
    tj["metadata"]["uid"] = UID
    plan = plan_of(sample("deepspeed-distributed.runtime.yaml"), tj, plan_version=1)
    init, gang = KaiBackend().render(plan, Context())
    assert init == expected(
        "llm-finetune-dataset-initializer-98a4d87d90", "llm-finetune", "basic",
        {"minMember": 1, "queue": "default-queue"},
    )  # fmt: skip
    # Eight workers make the gang; the launcher (Ready after them) is a ninth member, later.
    assert plan.groups[1].pod_count == 9 and plan.groups[1].joins_later == ("launcher",)
    assert gang == expected("llm-finetune-launcher-node-2b59b7a401", "llm-finetune", "gang", {
        "minMember": 8,
        "queue": "default-queue",
        "topologyConstraint": {
            "requiredTopologyLevel": "topology.kubernetes.io/zone", "topology": "cluster-topology",
        },
    })  # fmt: skip
    assert "subGroups" not in gang["spec"]  # separate gangs are separate PodGroups


def test_level_3_one_pod_group_per_job_in_the_trainjobs_topology() -> None:
    tj = sample("torch-rack.trainjob.yaml")
    tj["metadata"]["uid"] = UID
    plan = plan_of(sample("torch-rack.runtime.yaml"), tj, plan_version=1)
    context = Context(annotations={"kai.scheduler/topology": "racks"})
    pods = KaiBackend().render(plan, context)
    rack = {"requiredTopologyLevel": "topology.kubernetes.io/rack", "topology": "racks"}
    spec = {"minMember": 4, "queue": "default-queue", "topologyConstraint": rack}
    assert pods == [
        expected("rack-job-node-0-837085d65f", "rack-job", "gang", spec),
        expected("rack-job-node-1-2d2e504e99", "rack-job", "gang", spec),
    ]


def test_settings_queue_and_topology() -> None:
    rt = kai_pods(runtime(torch_node(), scheduling={"schedulingConstraints": ZONE}))
    plan = plan_of(rt, trainjob(num_nodes=2))
    bare = KaiBackend(KaiSettings(default_queue="", topology=""))
    (pg,) = bare.render(plan, Context())
    # No queue at all (admission denies such a TrainJob); the level kept, KAI ignores it.
    level = {"requiredTopologyLevel": "topology.kubernetes.io/zone"}
    assert pg["spec"] == {"minMember": 2, "topologyConstraint": level}
    (pg,) = KaiBackend(KaiSettings("batch", "dc")).render(plan, Context())
    assert pg["spec"]["queue"] == "batch" and pg["spec"]["topologyConstraint"]["topology"] == "dc"
    with pytest.raises(ValueError, match="'Team_A' is not a valid object name"):
        KaiSettings(default_queue="Team_A")


CONTEXTS = [
    Context(),
    Context(labels={"kai.scheduler/queue": "q"}),
    Context(annotations={"kai.scheduler/topology": "t.example.com"}),
]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(runtimes(sloppy=False), trainjobs(), st.sampled_from(CONTEXTS), st.booleans())
def test_any_valid_plan_renders_pod_groups_the_crd_accepts(
    raw_runtime: Json, raw_trainjob: Json, context: Context, bare: bool
) -> None:
    raw_runtime = kai_pods(raw_runtime)
    assume("scheduling" in raw_runtime["spec"])
    assume(validate_runtime(raw_runtime).allowed)
    assume(validate_trainjob(raw_trainjob, Runtime.model_validate(raw_runtime)).allowed)
    plan = plan_of(raw_runtime, raw_trainjob)
    assert plan.scheduler_name == KAI
    backend = KaiBackend(KaiSettings("", "") if bare else KaiSettings())
    rendered = backend.render(plan, context)
    assert len(rendered) == len(plan.groups)
    assert len({o["metadata"]["name"] for o in rendered}) == len(rendered)
    for group, obj in zip(plan.groups, rendered, strict=True):
        assert crd_errors(obj, CRD) == [], obj
        assert obj["metadata"]["name"] == group.pod_group_name
        spec = obj["spec"]
        assert spec["minMember"] == (group.min_count if group.policy == "gang" else 1)
        want = reference.expected_template_fields(reference.group_settings(
            raw_runtime, group.replicated_jobs, group.job_index is not None))  # fmt: skip
        key = (want["schedulingConstraints"] or {"topology": [{}]})["topology"][0].get("key")
        assert spec.get("topologyConstraint", {}).get("requiredTopologyLevel") == key
        assert backend.drift(obj, copy.deepcopy(obj)) == Drift()
        pod = {"metadata": {"labels": {}}, "spec": {"schedulerName": KAI}}
        tied = jsonpatch.apply_patch(pod, backend.pod_patch(pod, plan, group))
        assert tied["metadata"]["annotations"]["pod-group-name"] == group.pod_group_name
        assert backend.pod_patch(tied, plan, group) == []


# --- drift ---------------------------------------------------------------------------------------


def level_1_pod_group() -> Json:
    rt = kai_pods(runtime(torch_node(), scheduling={"schedulingConstraints": ZONE}))
    (pg,) = KaiBackend().render(plan_of(rt, trainjob(num_nodes=4)), Context())
    return pg


def as_stored(obj: Json) -> Json:
    """What the API server and KAI add to a stored PodGroup of ours: none of it is drift."""
    out = copy.deepcopy(obj)
    out["metadata"] |= {"uid": "pg-uid", "resourceVersion": "7", "generation": 1}
    out["metadata"]["annotations"]["kai.scheduler/last-start-timestamp"] = "2026-01-01T00:01:00Z"
    out["spec"] |= {"preemptibility": "preemptible", "markUnschedulable": True}  # unowned
    out["status"] = {"schedulingConditions": [unschedulable()]}
    return out


def test_server_and_scheduler_additions_are_not_drift() -> None:
    desired = level_1_pod_group()
    assert KaiBackend().drift(desired, as_stored(desired)) == Drift()


def test_owned_fields_are_patched_back_in_place_and_the_rest_kept() -> None:
    desired = level_1_pod_group()
    stored_pg = as_stored(desired)
    stored_pg["spec"]["minMember"] = 3
    del stored_pg["spec"]["queue"]
    stored_pg["spec"]["topologyConstraint"]["requiredTopologyLevel"] = "example.com/rack"
    stored_pg["spec"] |= {"minSubGroup": 1, "subGroups": [{"name": "a", "minMember": 1}]}
    drift = KaiBackend().drift(desired, stored_pg)
    assert drift.kind == "patch"
    fields = ("minMember", "minSubGroup", "subGroups", "queue", "topologyConstraint")
    assert drift.reason == ", ".join(f"spec.{f}" for f in fields) + " differ"
    assert drift.patch[0] == {"op": "test", "path": "/metadata/uid", "value": "pg-uid"}
    repaired = jsonpatch.apply_patch(stored_pg, list(drift.patch))
    assert repaired["spec"] == {**desired["spec"], "preemptibility": "preemptible",
                                "markUnschedulable": True}  # fmt: skip
    assert KaiBackend().drift(desired, repaired) == Drift()  # once: no loop
    (op,) = KaiBackend().drift(desired, {**stored_pg, "spec": None}).patch[1:]
    assert op == {"op": "add", "path": "/spec", "value": desired["spec"]}


# --- status --------------------------------------------------------------------------------------


def kai_status(policy: str = "gang", started: str | None = None, *conditions: Json) -> Json:
    annotations = {"trainjob-scheduling.dev/policy": policy}
    if started:
        annotations["kai.scheduler/last-start-timestamp"] = started
    return {"metadata": {"annotations": annotations},
            "status": {"schedulingConditions": list(conditions)}}  # fmt: skip


def unschedulable(*reasons: str, status: str = "True") -> Json:
    return {"type": "UnschedulableOnNodePool", "status": status, "nodePool": "default",
            "reason": "Unschedulable", "reasons": [{"reason": r} for r in reasons]}  # fmt: skip


def test_status_reads_kais_start_annotation_and_scheduling_conditions() -> None:
    def read(obj: Json) -> tuple[str, bool, str, str | None]:
        s = pod_group_status(obj)
        return s.policy, s.scheduled, s.reason, s.scheduled_at

    assert read(kai_status()) == ("gang", False, "NotEvaluated", None)
    assert read({"metadata": {}}) == ("gang", False, "NotEvaluated", None)
    assert read(kai_status("basic")) == ("basic", False, "NotEvaluated", None)
    assert read(kai_status("gang", None, unschedulable("OverLimit"))) == (
        "gang", False, "Unschedulable", None)  # fmt: skip
    assert read(kai_status("gang", None, unschedulable("QueueDoesNotExist")))[2] == "Other"
    assert read(kai_status("gang", None, unschedulable(status="False")))[2] == "NotEvaluated"
    other = {"type": "ScenarioSearchUnresolved", "status": "True"}
    assert read(kai_status("gang", None, unschedulable(), other))[2] == "Other"  # the latest
    # Conditions stay after the gang starts: the start annotation decides.
    at = "2026-01-01T00:01:30Z"
    assert read(kai_status("basic", at, unschedulable())) == ("basic", True, "Scheduled", at)
    assert KaiBackend().status(NATIVE_POD_GROUP, kai_status()) is None


def test_gang_metrics_carry_the_kai_backend() -> None:
    metrics, cache = Metrics(), Cache(connected=True)
    GangTracker(metrics, cache, clock=lambda: 1767225600.0 + 600)
    obj = level_1_pod_group()
    obj["metadata"] |= {"uid": "u1", "creationTimestamp": "2026-01-01T00:00:00Z"}
    waiting = copy.deepcopy(obj)
    waiting["status"] = {"schedulingConditions": [unschedulable("OverLimit")]}
    store = cache.store(POD_GROUP)
    store.apply("ADDED", waiting)

    def sample_value(name: str, **labels: str) -> float | None:
        value: float | None = metrics.registry.get_sample_value(name, {"backend": "kai", **labels})
        return value

    gangs = "trainjob_scheduling_gangs"
    assert sample_value(gangs, policy="gang", state="waiting", reason="Unschedulable") == 1
    running = as_stored(obj)
    running["metadata"]["uid"] = "u1"  # the same object, now started
    running["metadata"]["annotations"]["kai.scheduler/last-start-timestamp"] = (
        "2026-01-01T00:01:30Z"
    )
    store.apply("MODIFIED", running)
    assert sample_value(gangs, policy="gang", state="scheduled", reason="Scheduled") == 1
    seconds = "trainjob_scheduling_gang_time_to_scheduled_seconds_sum"
    assert sample_value(seconds, policy="gang", waited_on="capacity") == 90


# --- admission over HTTPS ------------------------------------------------------------------------


def kai_cache(
    raw_runtime: Json, kai: KaiSettings | None = None, classes: tuple[str, ...] = ()
) -> Cache:
    cache = Cache(connected=True, backends=default_backends(kai=kai))
    cache.jobsets.replace([])  # listed, none: restart attempt 0
    cache.cluster_runtimes.replace([raw_runtime])
    cache.trainjobs.replace([])
    cache.training_runtimes.replace([])
    cache.priority_classes.replace([{"metadata": {"name": n}} for n in classes])
    served(cache, "kai")
    return cache


def labelled(**labels: str) -> Json:
    tj = trainjob(num_nodes=2)
    tj["metadata"]["labels"] = labels
    return tj


QUEUE_WARNING = (
    "KAI queue 'default-queue': the TrainJob has no kai.scheduler/queue label; "
    "that Queue must exist"
)
ZONE_WARNING = (
    "topology.kubernetes.io/zone is a required level of KAI Topology 'cluster-topology': it must "
    "exist with that node label"
)


def test_trainjob_admission_says_what_kai_will_do_and_denies_what_it_never_would(
    tmp_path: Path,
) -> None:
    node_only = {"replicatedJobs": [{"targetReplicatedJobs": ["node"],
                                     "schedulingConstraints": ZONE}]}  # fmt: skip
    rt = kai_pods(runtime(rj("init"), torch_node(priority_class="gold"), scheduling=node_only))
    cache = kai_cache(rt, classes=("gold",))
    with running_server(cache, tmp_path / "certs") as srv, srv.client() as client:

        def answer(tj: Json) -> Json:
            resp = client.post(TRAINJOB_PATH, content=orjson.dumps(review(tj)))
            assert resp.status_code == 200, resp.text
            response: Json = resp.json()["response"]
            return response

        untargeted = (
            '"init" has no gang: KAI\'s podgrouper puts its pods in a JobSet PodGroup that may '
            "wait for every ReplicatedJob"
        )
        response = answer(labelled())
        assert response["allowed"] is True
        assert response["warnings"] == [QUEUE_WARNING, ZONE_WARNING, untargeted]
        assert all(len(w) <= 120 for w in response["warnings"])
        response = answer(labelled(**{"kai.scheduler/queue": "team-a"}))
        assert response["warnings"] == [ZONE_WARNING, untargeted]
        # A label no Queue can have: KAI would never schedule the gang.
        response = answer(labelled(**{"kai.scheduler/queue": "Team_A"}))
        assert response["allowed"] is False
        (cause,) = response["status"]["details"]["causes"]
        assert cause["field"] == "metadata.labels[kai.scheduler/queue]"
        assert cause["message"].startswith('Invalid value: "Team_A": not a possible KAI Queue')
        # The pods' PriorityClass must exist (the pods would be refused).
        cache.priority_classes.replace([])
        response = answer(labelled(**{"kai.scheduler/queue": "team-a"}))
        assert response["allowed"] is False
        assert "PriorityClass 'gold', which does not exist" in response["status"]["message"]


def test_without_a_default_queue_a_trainjob_needs_the_queue_label(tmp_path: Path) -> None:
    rt = kai_pods(runtime(torch_node(), scheduling={}))
    cache = kai_cache(rt, KaiSettings(default_queue="", topology=""))
    with running_server(cache, tmp_path / "certs") as srv, srv.client() as client:
        denied = client.post(TRAINJOB_PATH, content=orjson.dumps(review(labelled()))).json()
        response = denied["response"]
        assert response["allowed"] is False
        (cause,) = response["status"]["details"]["causes"]
        assert cause["field"] == "metadata.labels[kai.scheduler/queue]"
        assert cause["message"].startswith("Required value: KAI schedules a PodGroup only in a")
        ok = labelled(**{"kai.scheduler/queue": "team-a"})
        allowed = client.post(TRAINJOB_PATH, content=orjson.dumps(review(ok))).json()
        assert allowed["response"]["allowed"] is True and "warnings" not in allowed["response"]


def test_warnings_stay_short_with_long_names() -> None:
    key = "a" * 60 + ".example.com/" + "b" * 60
    rt = kai_pods(runtime(rj("i" * 63), torch_node(), scheduling={"replicatedJobs": [
        {"targetReplicatedJobs": ["node"], "schedulingConstraints": {"topology": [{"key": key}]}}
    ]}))  # fmt: skip
    plan = plan_of(rt, trainjob(num_nodes=2))
    for kai in (KaiSettings("q" * 200, "t" * 200), KaiSettings("q", "")):
        found = KaiBackend(kai).admission_warnings(plan, Context())
        assert len(found) == 3 and all(len(w) <= 120 for w in found), found
    tj = Context(annotations={"kai.scheduler/topology": "Bad_Topology"})
    (error,) = KaiBackend().admission_errors(plan, tj, ClusterFacts())
    assert error.path == "metadata.annotations[kai.scheduler/topology]"


# --- the pod webhook over HTTPS ------------------------------------------------------------------


def pod_cache() -> Cache:
    """The fixture pod's TrainJob (team-a/my-job, frozen) on the level-1 runtime, its pods on
    KAI."""
    cache = kai_cache(kai_pods(native_runtime("torch-distributed")))
    tj = stored_trainjob("my-job")
    tj["metadata"]["uid"] = UID
    cache.trainjobs.replace([frozen(cache, tj)])
    return cache


def patched(response: Json) -> list[Json]:
    if "patch" not in response:
        return []
    ops: list[Json] = json.loads(base64.b64decode(response["patch"]))
    return ops


def test_pods_are_annotated_once_with_their_group_and_the_podgrouper_kept_away(
    tmp_path: Path,
) -> None:
    cache = pod_cache()
    with running_server(cache, tmp_path / "certs") as srv, srv.client() as client:

        def answer(doc: Json) -> Json:
            resp = client.post(POD_PATH, content=orjson.dumps(doc))
            assert resp.status_code == 200, resp.text
            response: Json = resp.json()["response"]
            return response

        def tie(doc: Json) -> Json:
            response = answer(doc)
            assert response["allowed"] is True
            return response

        doc = pod_review(KAI)
        ops = patched(tie(doc))
        assert ops == [
            {"op": "add", "path": "/metadata/annotations/pod-group-name", "value": MY_JOB_GROUP},
            {"op": "add", "path": "/metadata/annotations/kai.scheduler~1skip-podgrouper",
             "value": "true"},
        ]  # fmt: skip
        pod = jsonpatch.apply_patch(doc["request"]["object"], ops)
        assert pod["spec"]["schedulerName"] == KAI and "schedulingGroup" not in pod["spec"]
        labels = doc["request"]["object"]["metadata"]["labels"]
        assert pod["metadata"]["labels"] == labels  # no subgroup label: the PodGroup is flat
        again = copy.deepcopy(doc)
        again["request"]["object"] = pod
        assert patched(tie(again)) == []  # idempotent
        # A pod template that named another group, or let the podgrouper in, is corrected.
        other = copy.deepcopy(doc)
        other["request"]["object"]["metadata"]["annotations"] |= {
            "pod-group-name": "pg-my-job-1cf4f6db",
            "kai.scheduler/skip-podgrouper": "false",
        }
        assert [op["op"] for op in patched(tie(other))] == ["replace", "replace"]
        bare = copy.deepcopy(doc)
        del bare["request"]["object"]["metadata"]["annotations"]
        (op,) = patched(tie(bare))
        assert op == {"op": "add", "path": "/metadata/annotations", "value": {
            "pod-group-name": MY_JOB_GROUP, "kai.scheduler/skip-podgrouper": "true"}}  # fmt: skip
        # Another scheduler than the gang's, or KAI's API not served: held, never loose.
        why = held_because(answer(pod_review("default-scheduler")))
        assert why.startswith("it names the scheduler 'default-scheduler', its gang is for 'kai")
        cache.apis["kai"] = "not-served"
        why = held_because(answer(pod_review(KAI)))
        assert why.startswith("the gang API scheduling.run.ai/v2alpha2 is not served")


# --- lifecycle against the API emulator ----------------------------------------------------------


def kai_trainjob(name: str = NAME, queue: str | None = "team-a") -> Json:
    tj = stored_trainjob(name)
    if queue:
        tj["metadata"]["labels"] = {"kai.scheduler/queue": queue}
    return tj


def kai_writes(k: VersionedEmulator) -> int:
    return sum(len(k[action, KAI_POD_GROUPS]) for action in (CREATE, UPDATE, DELETE))


async def kai_quiet(k: VersionedEmulator, seconds: float = 0.5) -> int:
    last, since = kai_writes(k), time.monotonic()
    while time.monotonic() - since < seconds:
        await asyncio.sleep(0.05)
        if kai_writes(k) != last:
            last, since = kai_writes(k), time.monotonic()
    return last


def group_of(trainjob: Json) -> str:
    """A level-1 TrainJob's one PodGroup, named by its uid (the reconciler froze it: plan
    version 2)."""
    return naming.workload_name(NS, trainjob["metadata"]["name"], uid(trainjob))


async def kai_gang(k: VersionedEmulator) -> tuple[str, Json]:
    """The PodGroup of a new TrainJob on KAI, once made: (its name, it)."""
    await create(k, CLUSTER_RUNTIMES, kai_pods(native_runtime()))
    name = group_of(await create(k, TRAINJOBS, kai_trainjob()))
    pg: Json = await eventually(lambda: stored(k, KAI_POD_GROUPS, name), "the PodGroup")
    return name, pg


@pytest.mark.asyncio
async def test_lifecycle_create_suspend_resume_finish() -> None:
    async with world(served=("kai",)) as w:
        group, pg = await kai_gang(w.k)
        tj = stored(w.k, TRAINJOBS, NAME)
        assert pg["metadata"]["ownerReferences"] == [owner(NAME, uid(tj))]
        assert pg["metadata"]["labels"] == LABELS_V3
        assert pg["spec"] == {
            "minMember": 100,
            "queue": "team-a",
            "topologyConstraint": {
                "requiredTopologyLevel": "topology.kubernetes.io/zone",
                "topology": "cluster-topology",
            },
        }
        assert crd_errors(pg, CRD) == []
        assert not objects(w.k, POD_GROUPS)  # nothing of the native backend
        assert await kai_quiet(w.k) == 1

        await patch(w.k, TRAINJOBS, NS, NAME, {"spec": {"suspend": True}})
        await eventually(lambda: not stored(w.k, KAI_POD_GROUPS, group), "gone on suspend")
        resumed = await patch(w.k, TRAINJOBS, NS, NAME, {"spec": {"suspend": False}})
        # The resumed run has a gang of its own (plan version 3: named by its generation).
        run = naming.workload_name(NS, NAME, f"{uid(tj)}/run/{resumed['metadata']['generation']}")
        again = await eventually(lambda: stored(w.k, KAI_POD_GROUPS, run), "resumed")
        assert run != group and again["spec"] == pg["spec"]

        finished = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
        await patch(w.k, TRAINJOBS, NS, NAME, finished)
        await eventually(lambda: not objects(w.k, KAI_POD_GROUPS), "gone when finished")
        assert await kai_quiet(w.k) == 4  # create, delete, create, delete: nothing more


@pytest.mark.asyncio
async def test_deleting_the_trainjob_leaves_its_pod_group_to_garbage_collection() -> None:
    quick = ReconcilerSettings(workers=2, conflict_retry=0.2, wait_retry=0.05, gc_grace=0.5)
    async with world(served=("kai",), settings=quick) as w:
        await kai_gang(w.k)
        await delete(w.k, TRAINJOBS, NS, NAME)
        await eventually(lambda: not objects(w.k, KAI_POD_GROUPS), "collected")
        assert len(w.k[DELETE, KAI_POD_GROUPS]) == 0  # not by the reconciler
        assert await kai_quiet(w.k, 1.0) == 1  # and not made again after gc_grace


@pytest.mark.asyncio
async def test_drift_is_repaired_once_and_kais_own_writes_are_not_drift() -> None:
    async with world(served=("kai",)) as w:
        group, pg = await kai_gang(w.k)
        # KAI's scheduler marks the gang started and records an old verdict: no write of ours.
        started = {"kai.scheduler/last-start-timestamp": "2026-01-01T00:00:00Z"}
        await patch(w.k, KAI_POD_GROUPS, NS, group, {
            "metadata": {"annotations": started},
            "status": {"schedulingConditions": [unschedulable("OverLimit")]},
        })  # fmt: skip
        assert await kai_quiet(w.k) == 2  # our create, their patch
        # Someone shrinks the gang and moves it to another queue.
        shrunk = {"spec": {"minMember": 3, "queue": "other"}}
        await patch(w.k, KAI_POD_GROUPS, NS, group, shrunk)
        repaired = await eventually(
            lambda: (
                (p := stored(w.k, KAI_POD_GROUPS, group)) and p["spec"]["minMember"] == 100 and p
            ),
            "minMember patched back",
        )
        assert uid(repaired) == uid(pg) and repaired["spec"]["queue"] == "team-a"
        assert await kai_quiet(w.k) == 4  # their two patches, our create and one repair
        (event,) = events(w.k, "Updated")
        assert "spec.minMember, spec.queue differ" in event["note"]


@pytest.mark.asyncio
async def test_a_foreign_pod_group_with_our_name_is_left_alone() -> None:
    async with world(served=("kai",)) as w:
        # The name is known once the TrainJob has its uid: it waits suspended (nothing made)
        # while someone else takes the name.
        await create(w.k, CLUSTER_RUNTIMES, kai_pods(native_runtime()))
        suspended = kai_trainjob()
        suspended["spec"]["suspend"] = True
        created = await create(w.k, TRAINJOBS, suspended)
        # Its run once resumed (one spec change after its creation: generation 2).
        group = naming.workload_name(NS, NAME, f"{uid(created)}/run/2")
        theirs = {
            "apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
            "metadata": {"name": group, "namespace": NS}, "spec": {"minMember": 1},
        }  # fmt: skip
        await create(w.k, KAI_POD_GROUPS, theirs)
        before = stored(w.k, KAI_POD_GROUPS, group)
        await patch(w.k, TRAINJOBS, NS, NAME, {"spec": {"suspend": False}})
        (conflict, *_) = await eventually(lambda: events(w.k, "Conflict"), "a Conflict event")
        assert group in conflict["note"]
        await asyncio.sleep(0.4)  # a few conflict retries
        assert stored(w.k, KAI_POD_GROUPS, group) == before
        assert len(w.k[UPDATE, KAI_POD_GROUPS]) == len(w.k[DELETE, KAI_POD_GROUPS]) == 0


@pytest.mark.asyncio
async def test_one_serve_process_picks_the_backend_per_trainjob(tmp_path: Path) -> None:
    async with (
        emulator(backends=["kai"]) as (k, url),
        serving(tmp_path, url, "--leader-elect=false", reconcile=True) as (_, client),
    ):
        await create(k, CLUSTER_RUNTIMES, kai_pods(native_runtime()))
        await create(k, CLUSTER_RUNTIMES, native_runtime("plain"))
        group = group_of(await create(k, TRAINJOBS, kai_trainjob()))
        plain = stored_trainjob("plain-job")
        plain["spec"]["runtimeRef"]["name"] = "plain"
        await create(k, TRAINJOBS, plain)
        await eventually(lambda: stored(k, KAI_POD_GROUPS, group), "the KAI PodGroup", 20)
        await eventually(lambda: objects(k, POD_GROUPS), "the plain job's native PodGroup", 20)
        assert [p["metadata"]["name"] for p in objects(k, KAI_POD_GROUPS)] == [group]
        native = objects(k, POD_GROUPS)[0]["metadata"]["name"]
        assert native.startswith("plain-job-")

        async def tie(doc: Json) -> list[Json]:
            path = webhook_path(doc, "mutate")
            response = (await client.post(path, json=doc)).json()["response"]
            return patched(response)

        kai_ops = await tie(pod_review(KAI))
        assert [op["path"] for op in kai_ops] == [
            "/metadata/annotations/pod-group-name",
            "/metadata/annotations/kai.scheduler~1skip-podgrouper",
        ]
        doc = pod_review(None)  # the plain job's pod, on kube-scheduler
        meta = doc["request"]["object"]["metadata"]
        meta["labels"]["jobset.sigs.k8s.io/jobset-name"] = "plain-job"
        assert await tie(doc) == [{"op": "add", "path": "/spec/schedulingGroup",
                                   "value": {"podGroupName": native}}]  # fmt: skip

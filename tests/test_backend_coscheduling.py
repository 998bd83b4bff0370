"""The Coscheduling backend (scheduler-plugins `scheduling.x-k8s.io/v1alpha1` PodGroup).

Rendering with `minResources` worked out by hand; every rendered PodGroup against the published
CRD (a hypothesis property over valid plans, the native backend's own); drift, status, the pod
tie (label, and topology as required pod affinity) and admission over real HTTPS; the lifecycle
against the API emulator over HTTP (create, suspend, resume, finish, delete, drift, ownership).
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import jsonpatch
import kmock
import kubernetes_validate
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests import reference
from tests.builders import Json, parsed, rj, runtime, trainjob
from tests.crd_schema import crd_errors
from tests.harness import fixture, frozen, held_because, running_server, served, webhook_path
from tests.kube_emulator import (
    CLUSTER_RUNTIMES,
    TRAINJOBS,
    create,
    delete,
    eventually,
    json_patch,
    patch,
)
from tests.test_properties import _num_nodes, _plan, runtimes, trainjobs
from tests.test_reconciler import events, objects, stored, uid, world
from webhook.admission.handlers import mutate_pod_review
from webhook.admission.review import Decision, Review
from webhook.backends.base import Context, GangStatus
from webhook.backends.coscheduling import (
    POD_GROUP,
    POD_GROUP_LABEL,
    CoschedulingBackend,
    CoschedulingSettings,
    affinity_ops,
    pod_group_status,
)
from webhook.backends.registry import default_backends
from webhook.core import naming
from webhook.core.plan import Plan, build_plan
from webhook.core.resources import parse
from webhook.core.validation import validate_runtime, validate_trainjob
from webhook.kube.cache import Cache
from webhook.metrics.gangs import GangTracker
from webhook.metrics.registry import Metrics

CRD = "scheduling.x-k8s.io_podgroups.yaml"
PLUGINS, SLURM = "scheduler-plugins-scheduler", "slurm-bridge-scheduler"
ZONE = "topology.kubernetes.io/zone"
NS, NAME = "team-a", "my-job"
GANG_TEMPLATE = "node-eval-00872d903f"  # the [node, eval] gang's template in my-job's Workload
LEGACY_GANG = "my-job-node-eval-00872d903f"  # its PodGroup as earlier releases named it (v1)
# Its PodGroup's name for gpu_trainjob() (uid "uid-my-job"), as this release names it (v2).
GANG = naming.pod_group_name(NAME, GANG_TEMPLATE, "uid-my-job")
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PODGROUPS = kmock.resource("scheduling.x-k8s.io", "v1alpha1", "podgroups")
CREATE, UPDATE, DELETE = kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE
GiB = 2**30

# The gang of gpu_runtime() under gpu_trainjob(), worked out by hand. A pod requests the larger
# of (its containers + its sidecars) and (the sidecars + its heaviest plain init container).
# * node, 3 pods (numNodes): containers node (resourcesPerNode: 6 CPU, 32Gi, 4 GPU) + log-agent
#   (250m, 256Mi) + sidecar proxy (500m, 1Gi) = 6.75 CPU, 33.25Gi, 4 GPU; init fetch (8 CPU,
#   1Gi) beside proxy = 8.5 CPU, 2Gi. So 8.5 CPU, 33.25Gi, 4 GPU each: 25.5 CPU, 99.75Gi, 12 GPU.
# * eval, 2 pods (parallelism): limits only, which are its requests: 1 CPU, 2Gi each.
# * Together: 27.5 CPU, 103.75Gi, 12 GPU over 5 pods; dataset-initializer is basic: no PodGroup.
MIN_RESOURCES = {"cpu": "27500m", "memory": str(int(103.75 * GiB)), "nvidia.com/gpu": "12"}
# Without resourcesPerNode, node's own container counts (4 CPU, 16Gi, GPU limit 2): per pod
# max(4.75, 8.5) CPU, 17.25Gi, 2 GPU; with eval: 27.5 CPU, 3 * 17.25 + 4 = 55.75Gi, 6 GPU.
TEMPLATE_RESOURCES = {"cpu": "27500m", "memory": str(int(55.75 * GiB)), "nvidia.com/gpu": "6"}


def gpu_runtime(name: str = "cos-rt", scheduler: str = PLUGINS) -> Json:
    node = rj("node", ancestor="trainer", scheduler=scheduler)
    pod = node["template"]["spec"]["template"]["spec"]
    pod["containers"] = [
        {"name": "node", "image": "x", "resources": {
            "requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"nvidia.com/gpu": "2"}}},
        {"name": "log-agent", "image": "x",
         "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}}},
    ]  # fmt: skip
    pod["initContainers"] = [
        {"name": "proxy", "image": "x", "restartPolicy": "Always",
         "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
        {"name": "fetch", "image": "x", "resources": {"requests": {"cpu": "8", "memory": "1Gi"}}},
    ]  # fmt: skip
    evaluate = rj("eval", parallelism=2, scheduler=scheduler)
    evaluate["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"cpu": "1", "memory": "2Gi"}
    }
    init = rj("dataset-initializer", ancestor="dataset-initializer", scheduler=scheduler)
    entries = [
        {"targetReplicatedJobs": ["dataset-initializer"], "schedulingPolicy": {"basic": {}}},
        {"targetReplicatedJobs": ["node", "eval"],
         "schedulingConstraints": {"topology": [{"key": ZONE}]}},
    ]  # fmt: skip
    return runtime(init, node, evaluate, scheduling={"replicatedJobs": entries}, name=name)


def gpu_trainjob(
    name: str = NAME, runtime_name: str = "cos-rt", per_node: bool = True, uid: str | None = None
) -> Json:
    tj = trainjob(name, runtime_name=runtime_name, num_nodes=3, uid=uid or f"uid-{name}")
    if per_node:
        tj["spec"]["trainer"]["resourcesPerNode"] = {
            "requests": {"cpu": "6", "memory": "32Gi"}, "limits": {"nvidia.com/gpu": "4"},
        }  # fmt: skip
    return tj


def plan_of(raw_runtime: Json, raw_trainjob: Json) -> Plan:
    rt, tj = parsed(raw_runtime, raw_trainjob)
    plan = build_plan(tj, rt)
    assert plan is not None
    return plan


def gang_name(
    trainjob_name: str, trainjob_uid: str | None = None, generation: int | None = None
) -> str:
    """The plan's name for the [node, eval] gang of a TrainJob of gpu_runtime() (in the run of
    `generation`, past the first: plan version 3)."""
    tj = gpu_trainjob(trainjob_name, uid=trainjob_uid)
    tj["metadata"]["generation"] = generation
    group = plan_of(gpu_runtime(), tj).group_for("node", 0)
    assert group is not None
    return group.pod_group_name


def owner(tj: Json) -> Json:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "name": tj["metadata"]["name"], "uid": tj["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}  # fmt: skip


def expected_pod_group(tj: Json, resources: Json = MIN_RESOURCES) -> Json:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {
            "labels": {"app.kubernetes.io/managed-by": "trainjob-scheduling-webhook",
                       "trainer.kubeflow.org/trainjob-name": NAME,
                       "trainjob-scheduling.dev/plan-version": "3"},
            "name": naming.pod_group_name(NAME, GANG_TEMPLATE, tj["metadata"]["uid"]),
            "namespace": NS,
            "ownerReferences": [owner(tj)],
        },
        "spec": {"minMember": 5, "minResources": resources, "scheduleTimeoutSeconds": 60},
    }  # fmt: skip


# --- rendering -------------------------------------------------------------------------------


def test_one_pod_group_per_gang_with_min_resources_worked_out_by_hand() -> None:
    tj = gpu_trainjob()
    plan = plan_of(gpu_runtime(), tj)
    assert [g.pod_group_name for g in plan.groups if g.policy == "gang"] == [GANG]
    assert [g.template_name for g in plan.groups if g.policy == "gang"] == [GANG_TEMPLATE]
    objs = CoschedulingBackend().render(plan, Context())
    assert objs == [expected_pod_group(tj)]
    assert crd_errors(objs[0], CRD) == []
    # A TrainJob frozen by an earlier release keeps the name its PodGroup was made with.
    rt, parsed_tj = parsed(gpu_runtime(), tj)
    legacy = build_plan(parsed_tj, rt, plan_version=1)
    assert legacy is not None
    assert [g.pod_group_name for g in legacy.groups if g.policy == "gang"] == [LEGACY_GANG]


def test_without_resources_per_node_the_templates_requests_count() -> None:
    tj = gpu_trainjob(per_node=False)
    [obj] = CoschedulingBackend().render(plan_of(gpu_runtime(), tj), Context())
    assert obj == expected_pod_group(tj, TEMPLATE_RESOURCES)


def test_the_schedule_timeout_is_a_setting() -> None:
    plan = plan_of(gpu_runtime(), gpu_trainjob())
    [obj] = CoschedulingBackend(CoschedulingSettings(schedule_timeout=600)).render(plan, Context())
    assert obj["spec"]["scheduleTimeoutSeconds"] == 600
    [obj] = CoschedulingBackend(CoschedulingSettings(schedule_timeout=0)).render(plan, Context())
    assert "scheduleTimeoutSeconds" not in obj["spec"]  # the scheduler's permitWaitingTime
    for bad in (-1, 2**31):
        with pytest.raises(ValueError, match="int32"):
            CoschedulingSettings(schedule_timeout=bad)
    configured = default_backends(coscheduling=CoschedulingSettings(schedule_timeout=120))
    chosen = configured.named("coscheduling")
    assert isinstance(chosen, CoschedulingBackend) and chosen.schedule_timeout == 120
    assert configured.for_scheduler(SLURM) is chosen  # Slurm Bridge uses this backend too


def test_basic_groups_get_no_pod_group() -> None:
    rt = runtime(rj("node", ancestor="trainer", scheduler=PLUGINS),
                 scheduling={"schedulingPolicy": {"basic": {}}})  # fmt: skip
    plan = plan_of(rt, trainjob(num_nodes=2))
    assert plan.groups and CoschedulingBackend().render(plan, Context()) == []


@st.composite
def requests(draw: st.DrawFn) -> Json:
    out = {
        "cpu": draw(st.sampled_from(["100m", "1", "2.5", "7"])),
        "memory": draw(st.sampled_from(["512Mi", "1Gi", "3G"])),
    }
    if draw(st.booleans()):
        out["nvidia.com/gpu"] = draw(st.sampled_from(["1", "8"]))
    return out


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(runtimes(sloppy=False), trainjobs(), st.data())
def test_any_valid_plan_renders_pod_groups_the_crd_accepts(
    raw_runtime: Json, raw_trainjob: Json, data: st.DataObject
) -> None:
    """The native backend's property for this one: one PodGroup per gang, each valid against
    the published CRD, with minMember and minResources as the reference counts them, and a
    gang's pod tied by a patch that applies, makes a Pod the API accepts, and is final."""
    asked: dict[str, Json] = {}
    for job in raw_runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        pod = job["template"]["spec"]["template"]["spec"]
        pod["schedulerName"] = PLUGINS
        asked[job["name"]] = data.draw(requests())
        pod["containers"][0]["resources"] = {"requests": asked[job["name"]]}
    assume("scheduling" in raw_runtime["spec"])
    assume(validate_runtime(raw_runtime).allowed)
    assume(validate_trainjob(raw_trainjob, parsed(raw_runtime, raw_trainjob)[0]).allowed)
    plan = _plan(raw_runtime, raw_trainjob)
    assert plan is not None  # its own properties: tests/test_properties.py, same strategies
    backend = CoschedulingBackend()
    objs = backend.render(plan, Context())
    gangs = [g for g in plan.groups if g.policy == "gang"]
    assert [o["metadata"]["name"] for o in objs] == [g.pod_group_name for g in gangs]
    counts = reference.pods_per_job(raw_runtime, _num_nodes(raw_trainjob))
    for group, obj in zip(gangs, objs, strict=True):
        assert crd_errors(obj, CRD) == []
        # The pods there before the gang is admitted (not those that join later), counted
        # from the reference reading of the runtime, and what they request together.
        members = [t for t in group.replicated_jobs if t not in group.joins_later]
        pods = {t: counts[t][0] * (1 if group.job_index is not None else counts[t][1])
                for t in members}  # fmt: skip
        assert obj["spec"]["minMember"] == group.min_count == sum(pods.values())
        total: dict[str, Decimal] = {}
        for name, count in pods.items():
            for resource, value in asked[name].items():
                total[resource] = total.get(resource, Decimal(0)) + quantity(value) * count
        assert {k: quantity(v) for k, v in obj["spec"]["minResources"].items()} == total
        assert backend.drift(obj, {**obj, "metadata": {**obj["metadata"], "uid": "u"}}).kind == (
            "none"
        )
    if gangs:  # one pod of a gang as JobSet makes it (a Pod schema check costs ~40 ms)
        group = data.draw(st.sampled_from(gangs))
        name = group.replicated_jobs[0]
        template = next(
            j for j in raw_runtime["spec"]["template"]["spec"]["replicatedJobs"]
            if j["name"] == name
        )  # fmt: skip
        pod = jobset_pod(plan.trainjob_name, name, group.job_index or 0)
        pod["spec"] = copy.deepcopy(template["template"]["spec"]["template"]["spec"])
        ops = backend.pod_patch(pod, plan, group)
        tied = jsonpatch.apply_patch(pod, ops)
        assert tied["metadata"]["labels"][POD_GROUP_LABEL] == group.pod_group_name
        assert backend.pod_patch(tied, plan, group) == []
        kubernetes_validate.validate(tied, "1.37.0", strict=True)


def quantity(value: Any) -> Decimal:
    number = parse(value)
    assert number is not None, value
    return number


def jobset_pod(trainjob_name: str, replicated_job: str, index: int = 0) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{trainjob_name}-{replicated_job}-{index}-0-",
            "namespace": NS,
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": trainjob_name,
                "jobset.sigs.k8s.io/replicatedjob-name": replicated_job,
                "jobset.sigs.k8s.io/job-index": str(index),
            },
        },
        "spec": {"containers": [{"name": "c", "image": "x"}], "schedulerName": PLUGINS},
    }


# --- drift -----------------------------------------------------------------------------------


def stored_copy(**spec: Any) -> Json:
    obj = copy.deepcopy(expected_pod_group(gpu_trainjob()))
    obj["metadata"].update(uid="stored-uid", resourceVersion="7", generation=1)
    obj["spec"].update(spec)
    for key in [k for k, v in spec.items() if v is None]:
        del obj["spec"][key]
    return obj


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"minMember": 3}, "spec.minMember differs"),
        ({"minResources": {**MIN_RESOURCES, "cpu": "1"}}, "spec.minResources differs"),
        ({"minResources": {**MIN_RESOURCES, "example.com/fpga": "1"}}, "spec.minResources differs"),
        ({"minResources": None}, "spec.minResources differs"),
        ({"scheduleTimeoutSeconds": None, "minMember": 9},
         "spec.minMember, spec.scheduleTimeoutSeconds differs"),
    ],
)  # fmt: skip
def test_a_changed_spec_is_patched_in_place(spec: Json, reason: str) -> None:
    desired = expected_pod_group(gpu_trainjob())
    drifted = stored_copy(**spec)
    drift = CoschedulingBackend().drift(desired, drifted)
    assert (drift.kind, drift.reason) == ("patch", reason)
    assert drift.patch[0] == {"op": "test", "path": "/metadata/uid", "value": "stored-uid"}
    repaired = jsonpatch.apply_patch(drifted, list(drift.patch))
    assert repaired["spec"] == desired["spec"]
    assert CoschedulingBackend().drift(desired, repaired).kind == "none"


def test_no_drift_from_what_others_write_or_how_a_quantity_is_spelled() -> None:
    desired = expected_pod_group(gpu_trainjob())
    same = stored_copy(minResources={"cpu": "27.5", "memory": 103.75 * GiB // 1,
                                     "nvidia.com/gpu": 12})  # fmt: skip
    same["status"] = {"phase": "Running", "running": 5, "occupiedBy": "team-a/my-job-node-0"}
    same["metadata"]["annotations"] = {"note": "someone's"}
    assert CoschedulingBackend().drift(desired, same).kind == "none"
    odd = stored_copy(minResources={**MIN_RESOURCES, "cpu": "lots"})
    assert CoschedulingBackend().drift(desired, odd).kind == "patch"
    bare = stored_copy()
    del bare["spec"]
    drift = CoschedulingBackend().drift(desired, bare)
    assert jsonpatch.apply_patch(bare, list(drift.patch))["spec"] == desired["spec"]


# --- status ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "scheduled", "reason"),
    [
        (None, False, "NotEvaluated"),  # the controller has not seen it yet
        ("Pending", False, "NotEvaluated"),  # fewer than minMember pods: assembling
        ("Scheduling", False, "Other"),  # all pods there, fewer than minMember running
        ("Unknown", False, "Unschedulable"),  # part placed, the rest cannot be
        ("Running", True, "Scheduled"),
        ("Finished", True, "Scheduled"),
        ("Failed", True, "Scheduled"),  # it was placed; its pods failed later
        ("SomethingNew", False, "Other"),
        (7, False, "Other"),
    ],
)
def test_status_phases_as_gang_signals(phase: Any, scheduled: bool, reason: str) -> None:
    obj = expected_pod_group(gpu_trainjob())
    if phase is not None:
        obj["status"] = {"phase": phase}
    assert pod_group_status(obj) == GangStatus("gang", scheduled, reason)
    assert CoschedulingBackend().status(POD_GROUP, obj) == GangStatus("gang", scheduled, reason)


# --- pods ------------------------------------------------------------------------------------

TERM = {"labelSelector": {"matchLabels": {POD_GROUP_LABEL: GANG}}, "topologyKey": ZONE}
OTHER_TERM = {"labelSelector": {"matchLabels": {"app": "cache"}},
              "topologyKey": "kubernetes.io/hostname"}  # fmt: skip
NODE_AFFINITY = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]}}  # fmt: skip
affinities: st.SearchStrategy[Any] = st.sampled_from(
    [
        "absent",
        None,
        {},
        {"nodeAffinity": NODE_AFFINITY},
        {"podAffinity": None},
        {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        {"podAffinity": {REQUIRED: None}},
        {"podAffinity": {REQUIRED: []}},
        {"podAffinity": {REQUIRED: [OTHER_TERM]}},
        {"podAffinity": {REQUIRED: [OTHER_TERM, TERM]}},
        {"podAntiAffinity": {REQUIRED: [OTHER_TERM]}, "nodeAffinity": NODE_AFFINITY},
    ]
)
label_sets: st.SearchStrategy[Any] = st.sampled_from(
    ["absent", None, {}, {"app": "x"}, {POD_GROUP_LABEL: GANG}]
)


@settings(max_examples=60, deadline=None)
@given(affinities, label_sets)
def test_the_pod_patch_adds_the_label_and_the_affinity_term_once(
    affinity: Any, labels: Any
) -> None:
    plan = plan_of(gpu_runtime(), gpu_trainjob())
    group = plan.group_for("node", 0)
    assert group is not None
    pod = jobset_pod(NAME, "node")
    pod["metadata"].pop("labels")
    if labels != "absent":
        pod["metadata"]["labels"] = copy.deepcopy(labels)
    if affinity != "absent":
        pod["spec"]["affinity"] = copy.deepcopy(affinity)
    tied = jsonpatch.apply_patch(pod, CoschedulingBackend().pod_patch(pod, plan, group))
    assert tied["metadata"]["labels"][POD_GROUP_LABEL] == GANG
    required = tied["spec"]["affinity"]["podAffinity"][REQUIRED]
    assert required.count(TERM) == 1
    # Whatever else was there is kept, in its order.
    before = (affinity or {}) if affinity != "absent" else {}
    kept = ((before.get("podAffinity") or {}).get(REQUIRED)) or []
    assert [t for t in required if t != TERM] == [t for t in kept if t != TERM]
    for key, value in before.items():
        if key != "podAffinity":
            assert tied["spec"]["affinity"][key] == value
    assert CoschedulingBackend().pod_patch(tied, plan, group) == []


def test_which_pods_get_what() -> None:
    backend = CoschedulingBackend()
    plan = plan_of(gpu_runtime(), gpu_trainjob())
    gang, basic = plan.group_for("node", 0), plan.group_for("dataset-initializer", 0)
    assert gang is not None and basic is not None
    label = {"op": "add", "path": "/metadata/labels/scheduling.x-k8s.io~1pod-group",
             "value": GANG}  # fmt: skip
    affinity = {"op": "add", "path": "/spec/affinity",
                "value": {"podAffinity": {REQUIRED: [TERM]}}}  # fmt: skip
    assert backend.pod_patch(jobset_pod(NAME, "node"), plan, gang) == [label, affinity]
    # No PodGroup for a basic group: a label naming none would keep the pod from scheduling.
    assert backend.pod_patch(jobset_pod(NAME, "dataset-initializer"), plan, basic) == []
    # Already labelled for another PodGroup: whoever did so decides.
    taken = jobset_pod(NAME, "node")
    taken["metadata"]["labels"][POD_GROUP_LABEL] = NAME  # Trainer's own coscheduling name
    assert backend.pod_patch(taken, plan, gang) == []
    # Slurm Bridge places a gang through Slurm: a pod affinity could contradict its nodes.
    slurm = plan_of(gpu_runtime(scheduler=SLURM), gpu_trainjob())
    assert backend.pod_patch(jobset_pod(NAME, "node"), slurm, gang) == [label]
    assert CoschedulingBackend(CoschedulingSettings(affinity_schedulers=frozenset())).pod_patch(
        jobset_pod(NAME, "node"), plan, gang
    ) == [label]
    # A spec value the API server would refuse anyway is not touched.
    assert affinity_ops({"spec": {"affinity": "junk"}}, TERM) == []
    assert affinity_ops({"spec": {"affinity": {"podAffinity": {REQUIRED: {}}}}}, TERM) == []
    assert affinity_ops({}, TERM) == []


# --- admission -------------------------------------------------------------------------------

AFFINITY_WARNING = (
    f"Coscheduling: topology {ZONE} becomes required pod affinity; a gang's first pod picks the "
    "domain"
)
SLURM_WARNING = f"Coscheduling: {SLURM} does not enforce topology {ZONE} (PodGroups have none)"


def test_admission_says_what_topology_claims_and_disruption_become() -> None:
    backend = CoschedulingBackend()
    plan = plan_of(gpu_runtime(), gpu_trainjob())
    assert backend.admission_warnings(plan, Context()) == [AFFINITY_WARNING]
    slurm = plan_of(gpu_runtime(scheduler=SLURM), gpu_trainjob())
    assert backend.admission_warnings(slurm, Context()) == [SLURM_WARNING]
    level = {"schedulingPolicy": {"basic": {}}, "disruptionMode": {"all": {}},
             "schedulingConstraints": {"topology": [{"key": "example.com/rack"}]},
             "resourceClaims": [{"name": "gpus",
                                 "resourceClaimTemplateName": "gpu-slice"}]}  # fmt: skip
    rt = runtime(rj("node", ancestor="trainer", scheduler=PLUGINS), scheduling=level)
    warnings = backend.admission_warnings(plan_of(rt, trainjob(num_nodes=2)), Context())
    assert warnings == [
        "Coscheduling: topology example.com/rack of a basic group is not enforced (no PodGroup)",
        "Coscheduling: the groups' resourceClaims are dropped (PodGroups have none); claim them "
        "in the pod templates",
        "Coscheduling: disruptionMode all is dropped; pods of a gang are evicted one by one",
    ]
    assert all(len(w) <= 120 for w in [*warnings, AFFINITY_WARNING, SLURM_WARNING])


# --- over HTTPS: the pod webhook and TrainJob admission ----------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, Cache]]:
    cache = Cache(connected=True)
    cache.jobsets.replace([])  # listed, none: restart attempt 0
    cache.cluster_runtimes.replace([gpu_runtime(), gpu_runtime("cos-slurm", SLURM)])
    cache.training_runtimes.replace([])
    trainjobs = [gpu_trainjob(), gpu_trainjob("slurm-job", "cos-slurm"), gpu_trainjob("unserved")]
    cache.trainjobs.replace([frozen(cache, tj) for tj in trainjobs])
    served(cache, "coscheduling")
    with running_server(cache, tmp_path_factory.mktemp("certs")) as srv, srv.client() as client:
        yield client, cache


def pod_review(trainjob_name: str, replicated_job: str, scheduler: str | None) -> Json:
    review = copy.deepcopy(fixture("pod-create-by-job-controller.mutate.json"))
    pod = review["request"]["object"]
    labels = pod["metadata"]["labels"]
    labels["jobset.sigs.k8s.io/jobset-name"] = trainjob_name
    labels["jobset.sigs.k8s.io/replicatedjob-name"] = replicated_job
    pod["spec"].pop("schedulerName", None)
    if scheduler is not None:
        pod["spec"]["schedulerName"] = scheduler
    return review


def answer_of(client: httpx.Client, review: Json) -> Json:
    answer: Json = client.post(webhook_path(review, "mutate"), json=review).json()["response"]
    return answer


def send(client: httpx.Client, review: Json) -> tuple[Json, list[Json]]:
    answer = answer_of(client, review)
    assert answer["allowed"] is True
    patch_ops = json.loads(base64.b64decode(answer["patch"])) if "patch" in answer else []
    return answer, patch_ops


def test_pods_get_the_label_and_affinity_over_https_once(
    server: tuple[httpx.Client, Cache],
) -> None:
    client, _ = server
    review = pod_review(NAME, "node", PLUGINS)
    pod = review["request"]["object"]
    _, ops = send(client, review)
    tied = jsonpatch.apply_patch(pod, ops)
    assert tied["metadata"]["labels"][POD_GROUP_LABEL] == GANG
    assert tied["spec"]["affinity"]["podAffinity"][REQUIRED] == [TERM]
    assert tied["metadata"]["annotations"] == pod["metadata"]["annotations"]  # none added
    assert tied["spec"]["schedulerName"] == PLUGINS and "schedulingGroup" not in tied["spec"]
    kubernetes_validate.validate(tied, "1.37.0", strict=True)
    review["request"]["object"] = tied
    assert send(client, review)[1] == []  # idempotent: a second pass changes nothing
    # Slurm Bridge's pods: the label only (Slurm chooses the nodes).
    review = pod_review("slurm-job", "eval", SLURM)
    ops = send(client, review)[1]
    assert jsonpatch.apply_patch(review["request"]["object"], ops)["metadata"]["labels"][
        POD_GROUP_LABEL
    ] == gang_name("slurm-job")
    assert [op["path"] for op in ops] == ["/metadata/labels/scheduling.x-k8s.io~1pod-group"]


def test_no_label_for_another_scheduler_a_basic_group_or_an_unserved_api(
    server: tuple[httpx.Client, Cache],
) -> None:
    client, cache = server
    # Another scheduler than its gang's: held (denied), never let through loose.
    why = held_because(answer_of(client, pod_review(NAME, "node", None)))  # default-scheduler
    assert why.startswith(
        f"it names the scheduler 'default-scheduler', its gang is for {PLUGINS!r}"
    )
    why = held_because(answer_of(client, pod_review(NAME, "node", SLURM)))  # not its TrainJob's
    assert why.startswith(f"it names the scheduler {SLURM!r}, its gang is for {PLUGINS!r}")
    # A basic group has no PodGroup here: admitted as it is.
    assert send(client, pod_review(NAME, "dataset-initializer", PLUGINS))[1] == []
    cache.apis["coscheduling"] = "not-served"
    try:
        why = held_because(answer_of(client, pod_review("unserved", "node", PLUGINS)))
        assert why.startswith("the gang API scheduling.x-k8s.io/v1alpha1 is not served")
    finally:
        served(cache, "coscheduling")


def test_trainjob_admission_says_what_the_topology_becomes(
    server: tuple[httpx.Client, Cache],
) -> None:
    client, _ = server
    review = copy.deepcopy(fixture("trainjob-create.validate.json"))
    for name, expected in (("cos-rt", AFFINITY_WARNING), ("cos-slurm", SLURM_WARNING)):
        review["request"]["object"] = gpu_trainjob("fresh-job", name)
        review["request"]["name"] = "fresh-job"
        answer = client.post(webhook_path(review, "validate"), json=review).json()["response"]
        assert answer["allowed"] is True
        assert [w for w in answer["warnings"] if w.startswith("Coscheduling")] == [expected]


# --- the lifecycle, against the API emulator -----------------------------------------------------


def stored_gang(k: Any) -> str:
    """The gang's PodGroup name for the TrainJob my-job the emulator holds (named by its uid
    and its run)."""
    tj = stored(k, TRAINJOBS, NAME)
    return gang_name(NAME, uid(tj), (tj or {}).get("metadata", {}).get("generation"))


def pod_group_of(k: Any) -> Json | None:
    return stored(k, PODGROUPS, stored_gang(k))


def cos_writes(k: Any) -> int:
    return sum(len(k[action, PODGROUPS]) for action in (CREATE, UPDATE, DELETE))


async def quiet(k: Any, seconds: float = 0.4) -> int:
    import asyncio
    import time

    last, since = cos_writes(k), time.monotonic()
    while time.monotonic() - since < seconds:
        await asyncio.sleep(0.05)
        if cos_writes(k) != last:
            last, since = cos_writes(k), time.monotonic()
    return last


def review_of(pod: Json) -> Review:
    return Review("u", "", "v1", "Pod", "pods", "", "", NS, "CREATE", "x", pod, None, False)


def as_stored(obj: Json) -> Json:
    return {k: v for k, v in obj.items() if k != "status"}


@pytest.mark.asyncio
async def test_create_suspend_resume_finish_delete() -> None:
    async with world(served=("coscheduling",)) as w:
        await create(w.k, CLUSTER_RUNTIMES, gpu_runtime())
        await create(w.k, TRAINJOBS, gpu_trainjob())
        pg = await eventually(lambda: pod_group_of(w.k), "the PodGroup")
        tj = stored(w.k, TRAINJOBS, NAME)
        assert tj is not None
        want = expected_pod_group(tj)
        assert {"metadata": {k: pg["metadata"][k] for k in want["metadata"]},
                **{k: pg[k] for k in ("apiVersion", "kind", "spec")}} == want  # fmt: skip
        assert crd_errors(as_stored(pg), CRD) == []
        assert len(objects(w.k, PODGROUPS)) == 1  # none for the basic group
        await quiet(w.k)
        assert cos_writes(w.k) == 1
        # The pod webhook, from the same cache: label and affinity, nothing else.
        decision = mutate_pod_review(review_of(jobset_pod(NAME, "node")), w.cache)
        assert isinstance(decision, Decision) and decision.patch is not None
        assert len(decision.patch) == 2 and decision.patch[0]["value"] == stored_gang(w.k)

        await patch(w.k, TRAINJOBS, NS, NAME, {"spec": {"suspend": True}})
        await eventually(lambda: not pod_group_of(w.k), "deleted on suspend")
        await patch(w.k, TRAINJOBS, NS, NAME, {"spec": {"suspend": False}})
        again = await eventually(lambda: pod_group_of(w.k), "recreated on resume")
        assert uid(again) != uid(pg) and again["spec"] == pg["spec"]

        finished = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
        await patch(w.k, TRAINJOBS, NS, NAME, finished)
        await eventually(lambda: not pod_group_of(w.k), "deleted when finished")
        assert await quiet(w.k) == 4  # create, delete, create, delete: nothing made again
        assert len(events(w.k, "Deleted")) == 2

        second = gang_name("second", uid(await create(w.k, TRAINJOBS, gpu_trainjob("second"))))
        made = await eventually(lambda: stored(w.k, PODGROUPS, second), "second's PodGroup")
        await delete(w.k, TRAINJOBS, NS, "second")
        await eventually(lambda: not stored(w.k, PODGROUPS, second), "garbage collected")
        assert len(w.k[DELETE, PODGROUPS]) == 2  # the reconciler's two; the collector did this
        assert await quiet(w.k, 2.5) == 5 and made  # and nothing recreated after it


@pytest.mark.asyncio
async def test_drift_is_repaired_once_and_status_is_not_drift() -> None:
    async with world(served=("coscheduling",)) as w:
        await create(w.k, CLUSTER_RUNTIMES, gpu_runtime())
        await create(w.k, TRAINJOBS, gpu_trainjob())
        pg = await eventually(lambda: pod_group_of(w.k), "the PodGroup")
        metrics = Metrics()
        GangTracker(metrics, w.cache)

        def gangs(state: str, reason: str) -> float | None:
            labels = {"backend": "coscheduling", "policy": "gang", "state": state,
                      "reason": reason}  # fmt: skip
            return metrics.registry.get_sample_value("trainjob_scheduling_gangs", labels)

        await eventually(lambda: gangs("waiting", "NotEvaluated") == 1, "counted, assembling")
        gang = pg["metadata"]["name"]
        assert gang == stored_gang(w.k)
        # The scheduler-plugins controller writes status; a quantity spelled another way.
        await patch(w.k, PODGROUPS, NS, gang, {"status": {"phase": "Running", "running": 5}})
        await patch(w.k, PODGROUPS, NS, gang, {"spec": {"minResources": {"cpu": "27.5"}}})
        await eventually(lambda: gangs("scheduled", "Scheduled") == 1, "counted as scheduled")
        before = await quiet(w.k)
        assert before == 3 and len(events(w.k, "Updated")) == 0
        await json_patch(w.k, PODGROUPS, NS, gang, [
            {"op": "replace", "path": "/spec/minMember", "value": 2},
            {"op": "remove", "path": "/spec/scheduleTimeoutSeconds"},
        ])  # fmt: skip
        repaired = await eventually(
            lambda: (p := pod_group_of(w.k)) and p["spec"]["minMember"] == 5 and p,
            "minMember patched back",
        )
        assert repaired["spec"]["scheduleTimeoutSeconds"] == 60 and uid(repaired) == uid(pg)
        assert await quiet(w.k) == before + 2  # the edit and one repair: no loop
        (updated,) = events(w.k, "Updated")
        assert "spec.minMember, spec.scheduleTimeoutSeconds differs" in updated["note"]


@pytest.mark.asyncio
async def test_a_foreign_pod_group_is_left_alone_and_trainers_own_means_standing_down() -> None:
    async with world(served=("coscheduling",)) as w:
        # The name is known once the TrainJob has its uid: it waits suspended (nothing made)
        # while someone else takes the name.
        await create(w.k, CLUSTER_RUNTIMES, gpu_runtime())
        suspended = gpu_trainjob()
        suspended["spec"]["suspend"] = True
        # (the run it starts once resumed: generation 2)
        gang = gang_name(NAME, uid(await create(w.k, TRAINJOBS, suspended)), 2)
        foreign = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                   "metadata": {"name": gang, "namespace": NS},
                   "spec": {"minMember": 1}}  # fmt: skip
        await create(w.k, PODGROUPS, foreign)
        await patch(w.k, TRAINJOBS, NS, NAME, {"spec": {"suspend": False}})
        await eventually(lambda: events(w.k, "Conflict"), "a Conflict event")
        await quiet(w.k)
        assert (pod_group_of(w.k) or {}).get("spec") == {"minMember": 1}
        assert len(w.k[UPDATE, PODGROUPS]) == 0 and len(w.k[DELETE, PODGROUPS]) == 0
        await delete(w.k, PODGROUPS, NS, gang)
        ours = await eventually(
            lambda: (p := pod_group_of(w.k)) and p["spec"]["minMember"] == 5 and p, "ours"
        )
        assert ours

        # Trainer's coscheduling plugin makes a PodGroup named after the TrainJob it controls:
        # another controller schedules that TrainJob, so nothing is made and no pod is tied.
        # (Created suspended, as Kueue does, so that Trainer's PodGroup comes first.)
        tj = gpu_trainjob("trainers")
        tj["spec"]["suspend"] = True
        tj = await create(w.k, TRAINJOBS, tj)
        theirs = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                  "metadata": {"name": "trainers", "namespace": NS, "ownerReferences": [owner(tj)]},
                  "spec": {"minMember": 5}}  # fmt: skip
        await create(w.k, PODGROUPS, theirs)
        await patch(w.k, TRAINJOBS, NS, "trainers", {"spec": {"suspend": False}})
        await eventually(lambda: events(w.k, "StandingDown"), "standing down")
        await quiet(w.k)
        names = sorted(p["metadata"]["name"] for p in objects(w.k, PODGROUPS))
        assert names == sorted([gang, "trainers"])
        decision = mutate_pod_review(review_of(jobset_pod("trainers", "node")), w.cache)
        # Admitted without a group (another controller's gang), not held.
        assert isinstance(decision, Decision) and decision.allowed and decision.patch is None

"""The Volcano backend: what it renders (numbers worked out by hand), its drift and status rules,
the pod tie and the admission checks over real HTTPS, every object against the published CRD,
and a TrainJob's life against the API emulator over HTTP with the real reconciler.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jsonpatch
import kmock
import orjson
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from tests.builders import TRAINJOB_UID, Json, rj, trainjob
from tests.crd_schema import crd_errors
from tests.harness import fixture, frozen, held_because, running_server, served
from tests.kube_emulator import (
    CLUSTER_RUNTIMES,
    TRAINJOBS,
    VersionedEmulator,
    create,
    delete,
    eventually,
    patch,
    replace,
)
from tests.test_properties import runtimes, trainjobs
from tests.test_reconciler import events, objects, stored, uid, world
from webhook.admission.handlers import mutate_pod_review
from webhook.admission.review import Decision
from webhook.admission.review import parse as parse_review
from webhook.backends.base import ClusterFacts, Context, GangStatus, is_managed
from webhook.backends.registry import default_backends
from webhook.backends.volcano import (
    POD_GROUP,
    VolcanoBackend,
    VolcanoSettings,
    parse_tiers,
    pod_group_drift,
    pod_group_status,
)
from webhook.cli import build_parser
from webhook.core.plan import Plan, build_plan
from webhook.core.trainer import Runtime, TrainJob
from webhook.core.validation import validate_runtime, validate_trainjob
from webhook.kube.cache import Cache
from webhook.metrics.gangs import GangTracker
from webhook.metrics.registry import Metrics

CRD = "scheduling.volcano.sh_podgroups.yaml"
PODGROUPS = kmock.resource("scheduling.volcano.sh", "v1beta1", "podgroups")
NS, NAME = "team-a", "my-job"
ZONE = "topology.kubernetes.io/zone"
TIERS = VolcanoSettings({ZONE: 2, "example.com/rack": 1})
QUEUE = "scheduling.volcano.sh/queue-name"
GROUP_NAME = "scheduling.k8s.io/group-name"
TASK_SPEC = "volcano.sh/task-spec"
GiB = 2**30
MiB = 2**20


def container(name: str, **requests: str) -> Json:
    """Its extended resources (GPUs) get an equal limit: the API server refuses them without."""
    limits = {k: v for k, v in requests.items() if "/" in k}
    resources = {"requests": requests, "limits": limits} if limits else {"requests": requests}
    return {"name": name, "image": "example/trainer:latest", "resources": resources}


def mpi_runtime(*, deferred: bool = False, name: str = "mpi-volcano") -> Json:
    """Level 2, every pod on Volcano: a basic dataset-initializer, and a gang of the MPI launcher
    and its nodes in one zone. `deferred`: DeepSpeed's shape, the launcher a node of its own that
    starts once the nodes are Ready (it joins the gang later)."""
    launcher = rj("launcher", scheduler="volcano", priority_class="high",
                  depends=[("node", "Ready")] if deferred else None)  # fmt: skip
    spec = launcher["template"]["spec"]["template"]["spec"]
    spec["containers"] = [container("launcher", cpu="1", memory="2Gi")]
    spec["overhead"] = {"cpu": "100m", "memory": "64Mi"}  # a RuntimeClass's
    node = rj("node", scheduler="volcano", priority_class="high")
    spec = node["template"]["spec"]["template"]["spec"]
    spec["containers"] = [
        container("node", cpu="2", memory="8Gi", **{"nvidia.com/gpu": "1"}),  # resourcesPerNode
        container("logger", cpu="250m", memory="256Mi"),
    ]
    spec["initContainers"] = [
        {**container("proxy", cpu="500m", memory="512Mi"), "restartPolicy": "Always"},  # sidecar
        container("warmup", cpu="16", memory="1Gi"),  # needs more CPU than the app containers
    ]
    initializer = rj("dataset-initializer", ancestor="dataset-initializer", scheduler="volcano")
    scheduling = {
        "replicatedJobs": [
            {"targetReplicatedJobs": ["dataset-initializer"], "schedulingPolicy": {"basic": {}}},
            {
                "targetReplicatedJobs": ["launcher", "node"],
                "schedulingPolicy": {"gang": {}},
                "schedulingConstraints": {"topology": [{"key": ZONE}]},
            },
        ]
    }
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name},
        "spec": {
            "mlPolicy": {"numNodes": 1, "mpi": {"runLauncherAsNode": deferred}},
            "template": {"spec": {"replicatedJobs": [initializer, launcher, node]}},
            "scheduling": scheduling,
        },
    }


def mpi_trainjob(num_nodes: int = 4, *, runtime: str = "mpi-volcano", **meta: Any) -> Json:
    tj = trainjob(NAME, namespace=NS, runtime_name=runtime, num_nodes=num_nodes)
    tj["spec"]["trainer"]["resourcesPerNode"] = {
        "requests": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4"},
        "limits": {"nvidia.com/gpu": "4"},  # the API server refuses GPUs without an equal limit
    }
    tj["metadata"].update(meta)
    return tj


def plan_of(raw_runtime: Json, raw_trainjob: Json) -> Plan:
    plan = build_plan(TrainJob.model_validate(raw_trainjob), Runtime.model_validate(raw_runtime))
    assert plan is not None
    return plan


def render(raw_runtime: Json, raw_trainjob: Json, backend: VolcanoBackend | None = None) -> Json:
    """The PodGroups by ReplicatedJob set: 'init' (basic) and 'gang'."""
    plan = plan_of(raw_runtime, raw_trainjob)
    rendered = (backend or VolcanoBackend(TIERS)).render(plan, Context.of(raw_trainjob))
    for obj in rendered:
        assert crd_errors(obj, CRD) == []
    init, gang = rendered
    return {"init": init, "gang": gang, "plan": plan}


# --- rendering -------------------------------------------------------------------------------

# One node pod: its `node` container as resourcesPerNode says (8 CPU, 32Gi, 4 GPUs), the logger
# (250m, 256Mi) and the proxy sidecar (500m, 512Mi) run together: 8.75 CPU, 32Gi + 768Mi. Before
# them the warmup init container runs beside the sidecar: 16.5 CPU, 1.5Gi. The pod requests the
# larger of each: 16.5 CPU, 32Gi + 768Mi, 4 GPUs.
NODE_MEMORY = 32 * GiB + 768 * MiB
# The launcher: 1 CPU and 2Gi, plus the pod overhead (100m, 64Mi).
LAUNCHER_MEMORY = 2 * GiB + 64 * MiB


def test_a_gang_of_launcher_and_nodes_gets_min_member_per_task_and_its_requests() -> None:
    objects_ = render(mpi_runtime(), mpi_trainjob(4, labels={QUEUE: "research"}))
    gang, plan = objects_["gang"], objects_["plan"]
    group = plan.groups[1]
    assert gang["metadata"]["name"] == group.pod_group_name
    assert gang["metadata"]["annotations"] == {"trainjob-scheduling.dev/policy": "gang"}
    assert is_managed(gang)
    assert gang["spec"] == {
        "minMember": 5,  # 4 nodes and the launcher
        "minTaskMember": {"launcher": 1, "node": 4},
        "minResources": {
            "cpu": "67100m",  # 4 x 16.5 + 1.1
            "memory": str(4 * NODE_MEMORY + LAUNCHER_MEMORY),  # 142874771456
            "nvidia.com/gpu": "16",  # 4 x 4; the launcher has none
        },
        "queue": "research",
        "priorityClassName": "high",
        "networkTopology": {"mode": "hard", "highestTierAllowed": 2},
    }
    assert 4 * NODE_MEMORY + LAUNCHER_MEMORY == 142874771456


def test_the_deferred_launcher_is_outside_min_member_min_task_member_and_min_resources() -> None:
    # DeepSpeed, numNodes 8: 7 node pods and the launcher, which starts once they are Ready.
    objects_ = render(mpi_runtime(deferred=True), mpi_trainjob(8))
    spec = objects_["gang"]["spec"]
    assert objects_["plan"].groups[1].joins_later == ("launcher",)
    assert spec["minMember"] == 7
    assert spec["minTaskMember"] == {"node": 7}  # a launcher entry would never be met
    assert spec["minResources"] == {
        "cpu": "115500m",  # 7 x 16.5
        "memory": str(7 * NODE_MEMORY),  # 246155313152
        "nvidia.com/gpu": "28",
    }
    assert "queue" not in spec  # none named: Volcano's webhook fills in its default


def test_a_queue_volcano_chose_is_not_drift_when_the_trainjob_names_none() -> None:
    desired = render(mpi_runtime(), mpi_trainjob(4))["gang"]
    assert "queue" not in desired["spec"]
    stored = stored_copy(desired)
    stored["spec"]["queue"] = "team-a-queue"  # e.g. from the namespace's annotation
    assert pod_group_drift(desired, stored).kind == "none"


def test_a_basic_group_gets_a_podgroup_of_one_in_the_same_queue() -> None:
    objects_ = render(mpi_runtime(), mpi_trainjob(4, annotations={QUEUE: "from-annotation"}))
    init = objects_["init"]
    assert init["spec"] == {"minMember": 1, "queue": "from-annotation"}
    assert init["metadata"]["annotations"] == {"trainjob-scheduling.dev/policy": "basic"}


@pytest.mark.parametrize(
    ("labels", "annotations", "queue"),
    [
        ({QUEUE: "a"}, {QUEUE: "b"}, "a"),  # the label wins
        ({}, {QUEUE: "b"}, "b"),  # as Trainer reads it
        ({QUEUE: ""}, {}, None),  # empty is none, as Volcano reads it (denied at create)
        ({}, {}, None),  # Volcano's webhook fills in its default
    ],
)
def test_the_queue_comes_from_the_label_then_the_annotation_then_default(
    labels: dict[str, str], annotations: dict[str, str], queue: str | None
) -> None:
    objects_ = render(mpi_runtime(), mpi_trainjob(labels=labels, annotations=annotations))
    assert objects_["gang"]["spec"].get("queue") == objects_["init"]["spec"].get("queue") == queue


def test_a_topology_key_without_a_tier_gets_no_network_topology_and_a_warning() -> None:
    backend = VolcanoBackend(VolcanoSettings({"example.com/rack": 1}))
    objects_ = render(mpi_runtime(), mpi_trainjob(), backend)
    assert "networkTopology" not in objects_["gang"]["spec"]
    [warning] = backend.admission_warnings(objects_["plan"], Context())
    assert warning == (
        "topology 'topology.kubernetes.io/zone' is not enforced: no Volcano HyperNode tier is set "
        "for it (--volcano-topology-tiers)"
    )
    assert VolcanoBackend(TIERS).admission_warnings(objects_["plan"], Context()) == []


def test_the_tier_table_parses_from_the_flag() -> None:
    assert parse_tiers(f"{ZONE}=2, example.com/rack=1,") == {ZONE: 2, "example.com/rack": 1}
    assert parse_tiers("") == {}
    for bad in ("zone", "zone=", "=2", "zone=-1", "zone=two", "zone=²"):
        with pytest.raises(ValueError):
            parse_tiers(bad)


def test_the_tiers_come_from_the_flag_the_environment_or_the_config_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def tiers(argv: list[str], config: dict[str, object] | None = None) -> Any:
        return build_parser(config or {}).parse_args(["serve", *argv]).volcano_topology_tiers

    assert tiers([]) == {}
    assert tiers(["--volcano-topology-tiers", f"{ZONE}=2"]) == {ZONE: 2}
    assert tiers([], {"volcano-topology-tiers": {ZONE: 3, "example.com/rack": 1}}) == {
        ZONE: 3,
        "example.com/rack": 1,
    }  # a YAML mapping in the file
    monkeypatch.setenv("WEBHOOK_VOLCANO_TOPOLOGY_TIERS", "example.com/rack=1")
    assert tiers([]) == {"example.com/rack": 1}
    with pytest.raises(SystemExit):
        tiers(["--volcano-topology-tiers", "zone"])


# --- every object against the published CRD ----------------------------------------------------


def on_volcano(raw_runtime: Json) -> Json:
    for job in raw_runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        job["template"]["spec"]["template"]["spec"]["schedulerName"] = "volcano"
    return raw_runtime


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    runtimes(sloppy=False).map(on_volcano),
    trainjobs(),
    st.sampled_from([{}, {QUEUE: "default"}, {QUEUE: "team-a.gpu"}, {QUEUE: "q" * 63}]),
)
def test_any_valid_plan_renders_podgroups_the_crd_accepts(
    raw_runtime: Json, raw_trainjob: Json, labels: dict[str, str]
) -> None:
    assume("scheduling" in raw_runtime["spec"])
    assume(validate_runtime(raw_runtime).allowed)
    assume(validate_trainjob(raw_trainjob, Runtime.model_validate(raw_runtime)).allowed)
    raw_trainjob["metadata"]["labels"] = labels
    plan = plan_of(raw_runtime, raw_trainjob)
    backend = default_backends(volcano=TIERS).for_plan(plan)
    assert isinstance(backend, VolcanoBackend)
    context = Context.of(raw_trainjob)
    rendered = backend.render(plan, context)
    assert [o["metadata"]["name"] for o in rendered] == [g.pod_group_name for g in plan.groups]
    for obj, group in zip(rendered, plan.groups, strict=True):
        assert crd_errors(obj, CRD) == [], obj
        spec = obj["spec"]
        assert spec.get("queue") == (labels.get(QUEUE) or None)
        if group.policy == "basic":
            assert spec["minMember"] == 1 and "minResources" not in spec
            continue
        assert spec["minMember"] == group.min_count
        tasks = spec.get("minTaskMember")
        event(f"minTaskMember={tasks is not None}, networkTopology={'networkTopology' in spec}")
        if tasks is not None:
            assert sum(tasks.values()) == spec["minMember"]  # so Volcano checks every task
            assert not set(tasks) & set(group.joins_later)
        assert ("networkTopology" in spec) == (group.topology_key in TIERS.topology_tiers)
        assert backend.drift(obj, copy.deepcopy(obj)).kind == "none"
    assert all(len(w) <= 120 for w in backend.admission_warnings(plan, context))


# --- drift -------------------------------------------------------------------------------------


def stored_copy(desired: Json) -> Json:
    """The object as the API server holds it after vc-scheduler wrote it back: the same values
    re-serialized the Go way, fields it defaults or drops when empty, and a status."""
    obj = copy.deepcopy(desired)
    obj["metadata"] |= {"uid": "6a1b", "resourceVersion": "7"}
    spec = obj["spec"]
    spec["minResources"]["memory"] = f"{int(spec['minResources']['memory']) // MiB}Mi"
    spec["minResources"]["cpu"] = "67.1"
    spec["minResources"]["pods"] = "0"
    del spec["networkTopology"]["mode"]
    obj["status"] = {"phase": "Inqueue", "running": 0}
    return obj


def gang_object() -> Json:
    gang: Json = render(mpi_runtime(), mpi_trainjob(4, labels={QUEUE: "research"}))["gang"]
    return gang


def test_values_written_back_the_go_way_are_not_drift() -> None:
    desired = gang_object()
    assert pod_group_drift(desired, stored_copy(desired)).kind == "none"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda s: s.update(minMember=3), "minMember differ"),
        (lambda s: s["minResources"].update(cpu="1"), "minResources differ"),
        (lambda s: s.pop("minTaskMember"), "minTaskMember differ"),
        (lambda s: s.update(priorityClassName="low"), "priorityClassName differ"),
        (lambda s: s.pop("priorityClassName"), "priorityClassName differ"),
    ],
)
def test_what_volcano_changes_in_place_is_patched_back_once(change: Any, reason: str) -> None:
    desired = gang_object()
    have = stored_copy(desired)
    change(have["spec"])
    drift = pod_group_drift(desired, have)
    assert (drift.kind, drift.reason) == ("patch", reason)
    assert drift.patch[0] == {"op": "test", "path": "/metadata/uid", "value": "6a1b"}
    patched = jsonpatch.apply_patch(have, list(drift.patch))
    assert pod_group_drift(desired, patched).kind == "none"  # no loop


def test_a_priority_class_someone_added_is_removed_in_place() -> None:
    desired = gang_object()
    del desired["spec"]["priorityClassName"]
    drift = pod_group_drift(desired, stored_copy(gang_object()))
    assert list(drift.patch[1:]) == [{"op": "remove", "path": "/spec/priorityClassName"}]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda s: s.update(queue="other"), "spec.queue differs"),
        (lambda s: s.pop("queue"), "spec.queue differs"),  # read as `default`
        (lambda s: s["networkTopology"].update(highestTierAllowed=1), "spec.networkTopology"),
        (lambda s: s.pop("networkTopology"), "spec.networkTopology differs"),
        (lambda s: s["networkTopology"].update(mode="soft"), "spec.networkTopology differs"),
        (lambda s: s.update(subGroupPolicy=[{"name": "x"}]), "spec.subGroupPolicy differs"),
    ],
)
def test_any_other_difference_recreates(change: Any, reason: str) -> None:
    desired = gang_object()
    have = stored_copy(desired)
    change(have["spec"])
    drift = pod_group_drift(desired, have)
    assert drift.kind == "recreate" and drift.reason.startswith(reason)
    assert pod_group_drift(desired, {"metadata": {}}).kind == "recreate"


# --- status --------------------------------------------------------------------------------------


def pg_status(phase: str | None, *conditions: tuple[str, str, str], policy: str = "gang") -> Json:
    status: Json = {
        "conditions": [
            {"type": t, "status": s, "reason": r, "lastTransitionTime": "2026-01-02T03:04:05Z"}
            for t, s, r in conditions
        ]
    }
    if phase:
        status["phase"] = phase
    meta = {"annotations": {"trainjob-scheduling.dev/policy": policy}}
    return {"metadata": meta, "status": status}


UNSCHEDULABLE = ("Unschedulable", "True", "NotEnoughResources")
ASSEMBLING = ("Unschedulable", "True", "NotEnoughTasks")
SCHEDULED = ("Scheduled", "True", "tasks in gang are ready to be scheduled")


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"metadata": {}}, GangStatus("gang", False, "NotEvaluated")),
        (pg_status("Pending"), GangStatus("gang", False, "NotEvaluated")),
        (pg_status("Pending", UNSCHEDULABLE), GangStatus("gang", False, "Unschedulable")),
        (pg_status("Inqueue", ASSEMBLING), GangStatus("gang", False, "NotEvaluated")),
        (
            pg_status("Inqueue", ("Unschedulable", "True", "NotEnoughPodsOfTask")),
            GangStatus("gang", False, "NotEvaluated"),
        ),
        (pg_status("Pending", ("Unschedulable", "True", "Odd")),
         GangStatus("gang", False, "Other")),
        (
            pg_status("Running", UNSCHEDULABLE, SCHEDULED),
            GangStatus("gang", True, "Scheduled", "2026-01-02T03:04:05Z"),
        ),
        (pg_status("Completed"), GangStatus("gang", True, "Scheduled")),
        # Some of an admitted gang's pods cannot be placed again: it was scheduled, and stays.
        (pg_status("Unknown", UNSCHEDULABLE, SCHEDULED, policy="basic"),
         GangStatus("basic", True, "Scheduled", "2026-01-02T03:04:05Z")),
    ],
)  # fmt: skip
def test_status_reads_the_phase_and_the_unschedulable_reason(
    obj: Json, expected: GangStatus
) -> None:
    assert pod_group_status(obj) == expected
    assert VolcanoBackend().status(POD_GROUP, obj) == expected


def test_gang_metrics_count_volcano_podgroups_and_time_them_once() -> None:
    metrics = Metrics()
    cache = Cache(connected=True)
    cache.jobsets.replace([])  # listed, none: restart attempt 0
    GangTracker(metrics, cache, clock=lambda: 1767225600.0 + 600)
    store = cache.store(POD_GROUP)

    def pg(name: str, obj: Json) -> Json:
        labels = {"app.kubernetes.io/managed-by": "trainjob-scheduling-webhook"}
        meta = {"name": name, "namespace": NS, "uid": name, "labels": labels,
                "creationTimestamp": "2026-01-01T00:00:00Z", **obj["metadata"]}  # fmt: skip
        return {**obj, "metadata": meta}

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"backend": "volcano", **labels})

    store.replace([pg("full", pg_status("Pending", UNSCHEDULABLE)), pg("init", pg_status(None))])
    gangs = "trainjob_scheduling_gangs"
    assert sample(gangs, policy="gang", state="waiting", reason="Unschedulable") == 1
    assert sample(gangs, policy="gang", state="waiting", reason="NotEvaluated") == 1
    running = pg_status("Running", UNSCHEDULABLE, SCHEDULED)
    running["status"]["conditions"][1]["lastTransitionTime"] = "2026-01-01T00:01:30Z"
    store.apply("MODIFIED", pg("full", running))
    assert sample(gangs, policy="gang", state="scheduled", reason="Scheduled") == 1
    seconds = "trainjob_scheduling_gang_time_to_scheduled_seconds"
    assert sample(f"{seconds}_sum", policy="gang", waited_on="capacity") == 90
    store.apply("MODIFIED", pg("full", pg_status("Unknown", UNSCHEDULABLE, SCHEDULED)))
    assert sample(f"{seconds}_count", policy="gang", waited_on="capacity") == 1  # once


# --- the pod webhook and TrainJob admission over real HTTPS ---------------------------------------

POD_PATH = "/mutate--v1-pod"
TRAINJOB_PATH = "/validate-trainer-kubeflow-org-v1alpha1-trainjob"
TJ_UID = TRAINJOB_UID


def volcano_cache(priority_classes: tuple[str, ...] = ("high",)) -> Cache:
    """A synced cache of a cluster that serves Volcano: the runtime, its TrainJob, the
    PriorityClasses that exist, and no PodGroups yet."""
    cache = Cache(connected=True, backends=default_backends(volcano=TIERS))
    cache.jobsets.replace([])  # listed, none: restart attempt 0
    cache.cluster_runtimes.replace([mpi_runtime()])
    cache.training_runtimes.replace([])
    cache.trainjobs.replace([frozen(cache, mpi_trainjob(4, uid=TJ_UID))])
    cache.priority_classes.replace([{"metadata": {"name": n}} for n in priority_classes])
    for store in cache.gang_stores.values():
        store.replace([])
    cache.apis.update(native="served", volcano="served")
    return cache


def pod_review(replicated_job: str = "node", scheduler: str = "volcano") -> Json:
    review = copy.deepcopy(fixture("pod-create-by-job-controller.mutate.json"))
    pod = review["request"]["object"]
    pod["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] = replicated_job
    pod["spec"]["schedulerName"] = scheduler
    return review


def send(client: httpx.Client, path: str, review: Json) -> Json:
    r = client.post(
        path, content=orjson.dumps(review), headers={"content-type": "application/json"}
    )
    assert r.status_code == 200, r.text
    response: Json = r.json()["response"]
    return response


def patched(review: Json, response: Json) -> Json:
    ops = orjson.loads(base64.b64decode(response["patch"]))
    result: Json = jsonpatch.apply_patch(review["request"]["object"], ops)
    return result


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, Cache]]:
    cache = volcano_cache()
    with running_server(cache, tmp_path_factory.mktemp("certs")) as srv, srv.client() as c:
        yield c, cache


def test_a_pod_of_the_gang_gets_the_group_annotation_and_its_task(
    server: tuple[httpx.Client, Cache],
) -> None:
    client, _ = server
    plan = plan_of(mpi_runtime(), mpi_trainjob(4))
    for has_map in (True, False):  # with and without an annotations map of its own
        review = pod_review("launcher")
        if not has_map:
            del review["request"]["object"]["metadata"]["annotations"]
        response = send(client, POD_PATH, review)
        pod = patched(review, response)
        assert pod["metadata"]["annotations"][GROUP_NAME] == plan.groups[1].pod_group_name
        assert pod["metadata"]["annotations"][TASK_SPEC] == "launcher"
        assert pod["spec"]["schedulerName"] == "volcano" and "schedulingGroup" not in pod["spec"]
        review["request"]["object"] = pod
        assert "patch" not in send(client, POD_PATH, review)  # idempotent


def test_a_pod_of_a_basic_group_gets_only_the_group_annotation(
    server: tuple[httpx.Client, Cache],
) -> None:
    client, _ = server
    review = pod_review("dataset-initializer")
    review["request"]["object"]["metadata"]["annotations"][GROUP_NAME] = "stale"
    pod = patched(review, send(client, POD_PATH, review))
    annotations = pod["metadata"]["annotations"]
    assert (
        annotations[GROUP_NAME] == plan_of(mpi_runtime(), mpi_trainjob()).groups[0].pod_group_name
    )
    assert TASK_SPEC not in annotations


def test_no_annotation_for_another_scheduler_an_unserved_api_or_a_foreign_gang(
    server: tuple[httpx.Client, Cache],
) -> None:
    client, cache = server
    # Another scheduler, or Volcano's API not served: held (denied), never let through loose.
    response = send(client, POD_PATH, pod_review(scheduler="default-scheduler"))
    assert held_because(response).startswith(
        "it names the scheduler 'default-scheduler', its gang is for 'volcano'"
    )
    cache.apis["volcano"] = "not-served"
    try:
        response = send(client, POD_PATH, pod_review())
        assert held_because(response).startswith(
            "the gang API scheduling.volcano.sh/v1beta1 is not served"
        )
    finally:
        served(cache, "volcano")
    # A PodGroup the TrainJob controls that this service did not make: another controller's gang.
    owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": NAME,
             "uid": TJ_UID, "controller": True}  # fmt: skip
    theirs = {"metadata": {"name": NAME, "namespace": NS, "ownerReferences": [owner]}}
    cache.store(POD_GROUP).replace([theirs])
    try:
        response = send(client, POD_PATH, pod_review())
        assert response["allowed"] is True and "patch" not in response  # stood down
    finally:
        cache.store(POD_GROUP).replace([])
    assert "patch" in send(client, POD_PATH, pod_review())


def trainjob_review(**meta: Any) -> Json:
    review = copy.deepcopy(fixture("trainjob-create.validate.json"))
    review["request"]["object"] = mpi_trainjob(4, uid=TJ_UID, **meta)
    return review


def test_admission_denies_an_empty_or_invalid_queue_and_a_missing_priority_class(
    server: tuple[httpx.Client, Cache],
) -> None:
    client, cache = server
    assert send(client, TRAINJOB_PATH, trainjob_review(labels={QUEUE: "gpu"}))["allowed"] is True
    cases = {
        "metadata.labels[scheduling.volcano.sh/queue-name]: Required value: name the Volcano "
        "queue, or remove the key for the default queue": {"labels": {QUEUE: ""}},
        "metadata.annotations[scheduling.volcano.sh/queue-name]: Required value": {
            "annotations": {QUEUE: ""}
        },
        'metadata.labels[scheduling.volcano.sh/queue-name]: Invalid value: "GPU_Queue": a '
        "Volcano queue name is a DNS-1123 subdomain": {"labels": {QUEUE: "GPU_Queue"}},
    }
    for message, meta in cases.items():
        response = send(client, TRAINJOB_PATH, trainjob_review(**meta))
        assert response["allowed"] is False and response["status"]["code"] == 422
        assert message in response["status"]["message"], response["status"]["message"]
    cache.priority_classes.replace([])  # PriorityClass "high" is gone
    try:
        response = send(client, TRAINJOB_PATH, trainjob_review())
        assert response["allowed"] is False
        assert "PriorityClass 'high', which does not exist" in response["status"]["message"]
    finally:
        cache.priority_classes.replace([{"metadata": {"name": "high"}}])


def test_admission_says_what_volcano_will_not_enforce(server: tuple[httpx.Client, Cache]) -> None:
    client, cache = server
    review = trainjob_review(labels={QUEUE: "a"}, annotations={QUEUE: "b"})
    rack = copy.deepcopy(mpi_runtime(name="rack-runtime"))
    gang = rack["spec"]["scheduling"]["replicatedJobs"][1]
    gang["schedulingConstraints"] = {"topology": [{"key": "example.com/row"}]}
    gang["disruptionMode"] = {"all": {}}
    cache.cluster_runtimes.replace([mpi_runtime(), rack])
    review["request"]["object"]["spec"]["runtimeRef"]["name"] = "rack-runtime"
    response = send(client, TRAINJOB_PATH, review)
    assert response["allowed"] is True
    assert response["warnings"] == [
        "the scheduling.volcano.sh/queue-name label and annotation differ: the label's queue is "
        "used",
        "topology 'example.com/row' is not enforced: no Volcano HyperNode tier is set for it "
        "(--volcano-topology-tiers)",
        "disruptionMode all is not carried: Volcano PodGroups have no disruption mode",
    ]
    assert VolcanoBackend().admission_errors(
        plan_of(rack, mpi_trainjob()), Context(), ClusterFacts(priority_classes=None)
    ) == []  # fmt: skip


# --- a TrainJob's life against the API emulator --------------------------------------------------


def volcano_writes(k: VersionedEmulator) -> int:
    """Creates, patches, PUTs and deletes of Volcano PodGroups so far (kmock gives a PUT no
    action)."""
    actions = (kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE, kmock.method.PUT)
    return sum(len(k[a, PODGROUPS]) for a in actions)


async def quiet(k: VersionedEmulator, seconds: float = 0.5) -> int:
    last, since = volcano_writes(k), time.monotonic()
    while time.monotonic() - since < seconds:
        await asyncio.sleep(0.05)
        if (now := volcano_writes(k)) != last:
            last, since = now, time.monotonic()
    return last


def names(trainjob_uid: str, generation: int | None = None) -> tuple[str, str]:
    """The PodGroups of the TrainJob with this uid in the run of `generation` (its names carry
    both: plan version 3)."""
    plan = plan_of(mpi_runtime(), mpi_trainjob(uid=trainjob_uid, generation=generation))
    return plan.groups[0].pod_group_name, plan.groups[1].pod_group_name


async def both(k: VersionedEmulator, min_member: int = 5) -> tuple[Json, Json]:
    tj = stored(k, TRAINJOBS, NAME)
    init_name, gang_name = names(uid(tj), (tj or {}).get("metadata", {}).get("generation"))

    def found() -> Any:
        init, gang = stored(k, PODGROUPS, init_name), stored(k, PODGROUPS, gang_name)
        return init and gang and gang["spec"]["minMember"] == min_member and (init, gang)

    result: tuple[Json, Json] = await eventually(found, "both Volcano PodGroups")
    return result


def gone(k: VersionedEmulator) -> bool:
    return not objects(k, PODGROUPS)


async def a_volcano_trainjob(k: VersionedEmulator) -> tuple[Json, Json]:
    await create(k, CLUSTER_RUNTIMES, mpi_runtime())
    await create(k, TRAINJOBS, mpi_trainjob(4, uid=None, labels={QUEUE: "research"}))
    return await both(k)


def tie_pod(cache: Cache, replicated_job: str) -> Json:
    """The pod webhook's answer for a new pod of the TrainJob, from the reconciler's cache."""
    review = pod_review(replicated_job)
    decision = mutate_pod_review(parse_review(orjson.dumps(review)), cache)
    assert isinstance(decision, Decision) and decision.patch is not None  # from the cache
    result: Json = jsonpatch.apply_patch(review["request"]["object"], decision.patch)
    return result


@pytest.mark.asyncio
async def test_a_volcano_trainjob_through_create_suspend_resume_and_finish() -> None:
    async with world(served=("volcano",)) as w:
        w.cache.backends.named("volcano").settings = TIERS  # type: ignore[union-attr]
        init, gang = await a_volcano_trainjob(w.k)
        tj = stored(w.k, TRAINJOBS, NAME)
        owner = {
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": NAME,
            "uid": uid(tj), "controller": True, "blockOwnerDeletion": True,
        }  # fmt: skip
        assert gang["metadata"]["ownerReferences"] == init["metadata"]["ownerReferences"] == [owner]
        assert gang["metadata"]["labels"] == {
            "app.kubernetes.io/managed-by": "trainjob-scheduling-webhook",
            "trainer.kubeflow.org/trainjob-name": NAME,
            "trainjob-scheduling.dev/plan-version": "3",
        }
        assert gang["spec"] == {
            "minMember": 5,
            "minTaskMember": {"launcher": 1, "node": 4},
            "minResources": {"cpu": "67100m", "memory": "142874771456", "nvidia.com/gpu": "16"},
            "queue": "research",
            "priorityClassName": "high",
            "networkTopology": {"mode": "hard", "highestTierAllowed": 2},
        }
        assert init["spec"] == {"minMember": 1, "queue": "research"}
        # Its pods join through the annotation, on the scheduler they name.
        for job, group in (("node", gang), ("dataset-initializer", init)):
            pod = tie_pod(w.cache, job)
            assert pod["metadata"]["annotations"][GROUP_NAME] == group["metadata"]["name"]
            assert pod["spec"]["schedulerName"] == "volcano"
            assert pod["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] == job
        assert tie_pod(w.cache, "node")["metadata"]["annotations"][TASK_SPEC] == "node"
        assert await quiet(w.k) == 2  # two creates, nothing else

        await patch(w.k, TRAINJOBS, NS, NAME, {"spec": {"suspend": True}})
        await eventually(lambda: gone(w.k), "no PodGroup holds a reservation while suspended")
        await patch(w.k, TRAINJOBS, NS, NAME, {"spec": {"suspend": False}})
        _, again = await both(w.k)
        assert uid(again) != uid(gang)

        done = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
        await patch(w.k, TRAINJOBS, NS, NAME, done)
        await eventually(lambda: gone(w.k), "both deleted once finished")
        assert await quiet(w.k) == 8  # 2 creates, 2 deletes, twice: nothing made again


@pytest.mark.asyncio
async def test_deleting_the_trainjob_leaves_its_podgroups_to_garbage_collection() -> None:
    async with world(served=("volcano",)) as w:
        await a_volcano_trainjob(w.k)
        await delete(w.k, TRAINJOBS, NS, NAME)
        await eventually(lambda: gone(w.k), "the garbage collector removes them")
        assert len(w.k[kmock.action.DELETE, PODGROUPS]) == 0  # not the reconciler
        assert await quiet(w.k, 2.5) == 2 and gone(w.k)  # nor made again


@pytest.mark.asyncio
async def test_drift_is_repaired_once_and_volcano_write_backs_are_left_alone() -> None:
    async with world(served=("volcano",)) as w:
        _, gang = await a_volcano_trainjob(w.k)
        before = await quiet(w.k)
        # vc-scheduler writes the whole object back: its status, Go's quantities, defaults.
        written = copy.deepcopy(stored(w.k, PODGROUPS, gang["metadata"]["name"]))
        assert written is not None
        written["spec"]["minResources"]["memory"] = f"{142874771456 // MiB}Mi"
        written["status"] = {"phase": "Inqueue", "conditions": [
            {"type": "Unschedulable", "status": "True", "reason": "NotEnoughTasks"}]}  # fmt: skip
        await replace(w.k, PODGROUPS, written)
        assert await quiet(w.k) == before + 1  # our own PUT only

        await patch(w.k, PODGROUPS, NS, gang["metadata"]["name"], {"spec": {"minMember": 2}})
        fixed = await both(w.k, min_member=5)
        assert uid(fixed[1]) == uid(gang)  # patched in place
        assert await quiet(w.k) == before + 3  # the edit and one patch back
        await eventually(lambda: events(w.k, "Updated"), "an Updated event")

        await patch(w.k, PODGROUPS, NS, gang["metadata"]["name"], {"spec": {"queue": "other"}})

        def recreated() -> Any:
            g = stored(w.k, PODGROUPS, gang["metadata"]["name"])
            return g and uid(g) != uid(gang) and g["spec"]["queue"] == "research"

        await eventually(recreated, "the PodGroup recreated in its queue")


@pytest.mark.asyncio
async def test_a_foreign_podgroup_of_the_name_is_left_alone() -> None:
    async with world(served=("volcano",)) as w:
        # The name is known once the TrainJob has its uid: it waits suspended (nothing made)
        # while someone else takes the name.
        await create(w.k, CLUSTER_RUNTIMES, mpi_runtime())
        suspended = mpi_trainjob(4, uid=None)
        suspended["spec"]["suspend"] = True
        # (the run it starts once resumed: generation 2)
        _, gang_name = names(uid(await create(w.k, TRAINJOBS, suspended)), 2)
        foreign = {
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
            "metadata": {"name": gang_name, "namespace": NS}, "spec": {"minMember": 9},
        }  # fmt: skip
        await create(w.k, PODGROUPS, foreign)
        before = stored(w.k, PODGROUPS, gang_name)
        await patch(w.k, TRAINJOBS, NS, NAME, {"spec": {"suspend": False}})
        conflict = (await eventually(lambda: events(w.k, "Conflict"), "a Conflict event"))[0]
        assert gang_name in conflict["note"]
        await asyncio.sleep(0.5)  # several conflict retries
        assert stored(w.k, PODGROUPS, gang_name) == before
        assert len(w.k[kmock.action.UPDATE, PODGROUPS]) == 0
        assert len(w.k[kmock.action.DELETE, PODGROUPS]) == 0

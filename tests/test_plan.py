"""The planner on the reference's worked examples, the shipped samples and the captured fixtures."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.apiserver_rules import objects_errors
from tests.builders import TRAINJOB_UID as UID
from tests.builders import parsed, rj, runtime, torch_node, trainjob
from tests.paths import FIXTURES, SAMPLES
from webhook.backends.base import Context
from webhook.backends.native import NativeBackend
from webhook.core import naming
from webhook.core.layout import GroupKind
from webhook.core.plan import Plan, PlanningError, build_plan, pod_group_for_labels
from webhook.core.snapshot import PLAN_VERSION
from webhook.core.trainer import Runtime, TrainJob


def plan_of(
    raw_runtime: dict[str, Any], raw_trainjob: dict[str, Any], plan_version: int = PLAN_VERSION
) -> Plan:
    rt, tj = parsed(raw_runtime, raw_trainjob)
    plan = build_plan(tj, rt, plan_version)
    assert plan is not None
    return plan


def sample(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((SAMPLES / name).read_text())
    return doc


def fixture_object(name: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads((FIXTURES / name).read_text())["request"]["object"]
    return obj


# --- was-api.md section 3, worked examples -----------------------------------------------------


def test_torch_level_one_gang_of_100() -> None:
    rt, tj = runtime(torch_node(), scheduling={}), trainjob(num_nodes=100)
    plan = plan_of(rt, tj, plan_version=1)  # was-api.md section 4's names
    (group,) = plan.groups
    assert group.kind is GroupKind.TRAINJOB
    assert (group.policy, group.min_count, group.pod_count) == ("gang", 100, 100)
    assert group.template_name == group.pod_group_name == plan.workload_name == "my-job-f438be8c51"
    # Version 2 (the default) qualifies the one name by the TrainJob's uid; nothing else changes.
    plan2 = plan_of(rt, tj)
    (group2,) = plan2.groups
    assert (group2.policy, group2.min_count, group2.pod_count) == ("gang", 100, 100)
    named = naming.workload_name("team-a", "my-job", UID)
    assert group2.template_name == group2.pod_group_name == plan2.workload_name == named
    assert named != "my-job-f438be8c51"


def test_mpi_launcher_and_node_without_dependency_count_both() -> None:
    rt = runtime(
        rj("launcher", ancestor="trainer"),
        rj("node"),
        ml={"numNodes": 1, "mpi": {"numProcPerNode": 1}},
        scheduling={"replicatedJobs": [{"targetReplicatedJobs": ["launcher", "node"]}]},
    )
    (group,) = plan_of(rt, trainjob(num_nodes=50)).groups
    assert (group.min_count, group.pod_count, group.joins_later) == (51, 51, ())


def torchtune(node_entry: dict[str, Any]) -> dict[str, Any]:
    """Initializers as one basic entry; `node` (waiting for both to Complete) as another."""
    return runtime(
        rj("dataset-initializer", ancestor="dataset-initializer"),
        rj("model-initializer", ancestor="model-initializer"),
        torch_node(
            depends=[("dataset-initializer", "Complete"), ("model-initializer", "Complete")]
        ),
        scheduling={
            "replicatedJobs": [
                {
                    "targetReplicatedJobs": ["dataset-initializer", "model-initializer"],
                    "schedulingPolicy": {"basic": {}},
                },
                {"targetReplicatedJobs": ["node"], **node_entry},
            ]
        },
    )


def test_torchtune_initializers_basic_node_gang() -> None:
    rt = torchtune({"schedulingPolicy": {"gang": {}}})
    init, node = plan_of(rt, trainjob(num_nodes=8)).groups
    assert (init.policy, init.min_count, init.pod_count) == ("basic", None, 2)
    assert (node.policy, node.min_count) == ("gang", 8)


def test_level_three_one_template_per_replica() -> None:
    rt = runtime(
        torch_node(replicas=3),
        scheduling={
            "replicatedJobs": [
                {"targetReplicatedJobs": ["node"], "job": {"schedulingPolicy": {"gang": {}}}}
            ]
        },
    )
    plan = plan_of(rt, trainjob(num_nodes=4))
    assert [g.template_name.rsplit("-", 1)[0] for g in plan.groups] == [
        "node-0",
        "node-1",
        "node-2",
    ]
    assert [(g.min_count, g.pod_count, g.job_index) for g in plan.groups] == [
        (4, 4, 0),
        (4, 4, 1),
        (4, 4, 2),
    ]
    assert plan.groups[0].template_name == "node-0-33e00f497c"


@pytest.mark.parametrize(("num_nodes", "node_pods"), [(8, 7), (2, 1), (1, 1)])
def test_deepspeed_run_launcher_as_node_ready_dependency(num_nodes: int, node_pods: int) -> None:
    # Built-in deepspeed-distributed: launcher dependsOn node Ready, runLauncherAsNode true.
    rt = runtime(
        rj("node"),
        rj("launcher", ancestor="trainer", depends=[("node", "Ready")]),
        ml={"numNodes": 1, "mpi": {"runLauncherAsNode": True}},
        scheduling={"replicatedJobs": [{"targetReplicatedJobs": ["launcher", "node"]}]},
    )
    plan = plan_of(rt, trainjob(num_nodes=num_nodes))
    (group,) = plan.groups
    assert group.min_count == node_pods  # max(n - 1, 1)
    assert group.pod_count == node_pods + 1
    assert group.joins_later == ("launcher",)
    assert any('"launcher" starts after "node"' in w for w in plan.warnings)


def test_without_ml_policy_every_job_uses_its_parallelism() -> None:
    # was-api.md section 3: rule 1 (numNodes) needs an mlPolicy; otherwise rule 3 applies.
    rt = runtime(torch_node(parallelism=4), scheduling={})
    del rt["spec"]["mlPolicy"]
    assert plan_of(rt, trainjob(num_nodes=8)).groups[0].min_count == 4
    assert plan_of(rt, trainjob()).groups[0].min_count == 4


def test_mpi_launcher_is_one_pod_whatever_its_template_says() -> None:
    rt = runtime(
        rj("launcher", ancestor="trainer", parallelism=3),
        rj("node", parallelism=5),
        ml={"mpi": {}},
        scheduling={"replicatedJobs": [{"targetReplicatedJobs": ["launcher", "node"]}]},
    )
    (group,) = plan_of(rt, trainjob(num_nodes=6)).groups
    assert (group.min_count, group.pod_count) == (7, 7)  # 1 launcher + 6 nodes


def test_ml_policy_without_num_nodes_means_one_node() -> None:
    rt = runtime(torch_node(), rj("init", parallelism=2), scheduling={}, ml={"torch": {}})
    assert plan_of(rt, trainjob()).groups[0].min_count == 1 + 2


def test_trainjob_without_namespace_is_named_in_default() -> None:
    tj = trainjob()
    del tj["metadata"]["namespace"]
    rt = runtime(torch_node(), scheduling={})
    plan = plan_of(rt, tj, plan_version=1)
    assert (plan.namespace, plan.workload_name) == ("default", "my-job-4b4041aa94")
    plan2 = plan_of(rt, tj)
    assert (plan2.namespace, plan2.workload_name) == (
        "default",
        naming.workload_name("default", "my-job", UID),
    )


def test_numnodes_falls_back_to_the_runtime() -> None:
    rt = runtime(torch_node(), scheduling={}, ml={"numNodes": 3, "torch": {}})
    assert plan_of(rt, trainjob()).groups[0].min_count == 3


def test_parallelism_and_replicas_multiply_for_other_jobs() -> None:
    rt = runtime(
        torch_node(),
        rj("eval", parallelism=3, replicas=2),
        scheduling={"schedulingPolicy": {"gang": {}}},
    )
    assert plan_of(rt, trainjob(num_nodes=4)).groups[0].min_count == 4 + 6


# --- level 1 and dependencies (rule 8(c)) ------------------------------------------------------


def test_level_one_split_by_complete_dependency() -> None:
    rt = runtime(
        rj("dataset-initializer", ancestor="dataset-initializer"),
        torch_node(depends=[("dataset-initializer", "Complete")]),
        scheduling={
            "schedulingConstraints": {"topology": [{"key": "topology.kubernetes.io/zone"}]}
        },
    )
    plan = plan_of(rt, trainjob(num_nodes=5))
    assert [(g.kind, g.replicated_jobs, g.min_count) for g in plan.groups] == [
        (GroupKind.SPLIT, ("dataset-initializer",), 1),
        (GroupKind.SPLIT, ("node",), 5),
    ]
    assert plan.groups[1].template_name == "node-a0cc56a224"
    assert all(g.topology_key == "topology.kubernetes.io/zone" for g in plan.groups)
    assert plan.warnings == (
        'scheduling: gang split per ReplicatedJob: "node" waits for "dataset-initializer" '
        "to Complete",
    )


def test_level_one_basic_is_not_split() -> None:
    rt = runtime(
        rj("init"),
        torch_node(depends=[("init", "Complete")]),
        scheduling={"schedulingPolicy": {"basic": {}}},
    )
    (group,) = plan_of(rt, trainjob(num_nodes=5)).groups
    assert (group.kind, group.min_count, group.pod_count) == (GroupKind.TRAINJOB, None, 6)


def test_in_order_startup_counts_as_ready_chain() -> None:
    rt = runtime(
        rj("a", parallelism=2),
        rj("b", parallelism=3),
        torch_node(),
        scheduling={},
        startupPolicy=None,
    )
    rt["spec"]["template"]["spec"]["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
    (group,) = plan_of(rt, trainjob(num_nodes=4)).groups
    assert group.joins_later == ("b", "node")
    assert (group.min_count, group.pod_count) == (2, 9)


def test_invalid_input_raises_planning_error_with_the_field_errors() -> None:
    rt = runtime(torch_node(), scheduling={"schedulingPolicy": {"gang": {"minCount": 3}}})
    with pytest.raises(PlanningError) as exc:
        plan_of(rt, trainjob(num_nodes=2))
    assert "gang.minCount is computed from numNodes" in str(exc.value)
    with pytest.raises(PlanningError):
        plan_of(runtime(torch_node(), scheduling={}), trainjob(num_nodes=0))


def test_no_scheduling_means_no_plan() -> None:
    rt, tj = parsed(runtime(torch_node()), trainjob(num_nodes=2))
    assert build_plan(tj, rt) is None


# --- pods to groups ----------------------------------------------------------------------------


def test_pod_labels_map_to_pod_groups() -> None:
    rt = runtime(
        rj("init"),
        torch_node(replicas=2),
        rj("eval"),
        scheduling={
            "replicatedJobs": [
                {"targetReplicatedJobs": ["init"], "schedulingPolicy": {"basic": {}}},
                {"targetReplicatedJobs": ["node"], "job": {"schedulingPolicy": {"gang": {}}}},
            ]
        },
    )
    plan = plan_of(rt, trainjob(num_nodes=2))

    def labels(rj_name: str, index: str, jobset: str = "my-job") -> dict[str, str]:
        return {
            "jobset.sigs.k8s.io/jobset-name": jobset,
            "jobset.sigs.k8s.io/replicatedjob-name": rj_name,
            "jobset.sigs.k8s.io/job-index": index,
        }

    init, node0, node1 = plan.groups
    assert pod_group_for_labels(plan, labels("init", "0")) == init.pod_group_name
    assert pod_group_for_labels(plan, labels("node", "0")) == node0.pod_group_name
    assert pod_group_for_labels(plan, labels("node", "1")) == node1.pod_group_name
    assert pod_group_for_labels(plan, labels("eval", "0")) is None  # untargeted
    assert pod_group_for_labels(plan, labels("node", "0", jobset="other")) is None
    assert pod_group_for_labels(plan, labels("node", "x")) is None
    assert pod_group_for_labels(plan, {}) is None
    assert plan.untargeted == ("eval",)


def test_fixture_pod_from_job_controller_gets_the_level_one_group() -> None:
    pod = fixture_object("pod-create-by-job-controller.mutate.json")
    rt = Runtime.model_validate(
        fixture_object("clustertrainingruntime-create-level1.validate.json")
    )
    tj = TrainJob.model_validate(fixture_object("trainjob-create.validate.json"))
    legacy = build_plan(tj, rt, plan_version=1)
    assert legacy is not None
    assert pod_group_for_labels(legacy, pod["metadata"]["labels"]) == "my-job-f438be8c51"
    plan = build_plan(tj, rt)
    assert plan is not None and tj.metadata.uid
    assert pod_group_for_labels(plan, pod["metadata"]["labels"]) == naming.workload_name(
        "team-a", "my-job", tj.metadata.uid
    )


# --- rendering ---------------------------------------------------------------------------------


def reference_complete_example() -> dict[str, Any]:
    """was-api.md section 1.8: initializers basic, node gang with a zone constraint."""
    return torchtune(
        {
            "schedulingPolicy": {"gang": {}},
            "schedulingConstraints": {"topology": [{"key": "topology.kubernetes.io/zone"}]},
        }
    )


def test_reference_complete_example_renders_exactly() -> None:
    # was-api.md section 1.8 with numNodes 8, under the names it documents (plan version 1,
    # which running TrainJobs frozen by earlier releases keep).
    rt = reference_complete_example()
    plan = plan_of(rt, trainjob(num_nodes=8, uid="tj-uid"), plan_version=1)
    uids = {("Workload", plan.workload_name): "wl-uid"}
    workload, init_pg, node_pg = NativeBackend().render(plan, Context(), uids)
    owner = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "name": "my-job",
        "uid": "tj-uid",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    labels = {
        "app.kubernetes.io/managed-by": "trainjob-scheduling-webhook",
        "trainer.kubeflow.org/trainjob-name": "my-job",
    }
    zone = {"topology": [{"key": "topology.kubernetes.io/zone"}]}
    assert workload == {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {
            "name": "my-job-f438be8c51",
            "namespace": "team-a",
            "labels": labels,
            "ownerReferences": [owner],
        },
        "spec": {
            "controllerRef": {
                "apiGroup": "trainer.kubeflow.org",
                "kind": "TrainJob",
                "name": "my-job",
            },
            "podGroupTemplates": [
                {
                    "name": "dataset-initializer-model-initializer-a2400d82a0",
                    "schedulingPolicy": {"basic": {}},
                },
                {
                    "name": "node-d1c371e3b1",
                    "schedulingPolicy": {"gang": {"minCount": 8}},
                    "schedulingConstraints": zone,
                },
            ],
        },
    }
    assert init_pg["metadata"]["name"] == "my-job-dataset-initializer-model-initializer-a2400d82a0"
    assert init_pg["spec"] == {
        "workloadRef": {
            "workloadName": "my-job-f438be8c51",
            "templateName": "dataset-initializer-model-initializer-a2400d82a0",
        },
        "schedulingPolicy": {"basic": {}},
    }
    assert node_pg["metadata"] == {
        "name": "my-job-node-d1c371e3b1",
        "namespace": "team-a",
        "labels": labels,
        "ownerReferences": [
            owner,
            {
                "apiVersion": "scheduling.k8s.io/v1beta1",
                "kind": "Workload",
                "name": "my-job-f438be8c51",
                "uid": "wl-uid",
            },
        ],
    }
    assert node_pg["spec"] == {
        "workloadRef": {"workloadName": "my-job-f438be8c51", "templateName": "node-d1c371e3b1"},
        "schedulingPolicy": {"gang": {"minCount": 8}},
        "schedulingConstraints": zone,
    }
    assert objects_errors([workload, init_pg, node_pg]) == []


def test_reference_complete_example_at_plan_version_2_differs_only_in_names_and_a_label() -> None:
    # The same example as a new TrainJob gets it: the Workload's and the PodGroups' names carry
    # the TrainJob's uid (templates keep theirs: they live inside the one Workload), and every
    # object says which plan version named it.
    rt, tj = reference_complete_example(), trainjob(num_nodes=8, uid="tj-uid")
    legacy, plan = plan_of(rt, tj, plan_version=1), plan_of(rt, tj, plan_version=2)
    workload_name = naming.workload_name("team-a", "my-job", "tj-uid")
    init_template = "dataset-initializer-model-initializer-a2400d82a0"
    init_name = naming.pod_group_name("my-job", init_template, "tj-uid")
    node_name = naming.pod_group_name("my-job", "node-d1c371e3b1", "tj-uid")
    assert len({workload_name, init_name, node_name, legacy.workload_name}) == 4
    assert all(naming.is_dns_label(n) for n in (workload_name, init_name, node_name))
    assert plan.workload_name == workload_name
    assert [g.pod_group_name for g in plan.groups] == [init_name, node_name]
    assert [g.template_name for g in plan.groups] == [g.template_name for g in legacy.groups]

    renamed = {
        legacy.workload_name: workload_name,
        "my-job-" + init_template: init_name,
        "my-job-node-d1c371e3b1": node_name,
    }

    def as_version_2(obj: Any) -> Any:
        """A version-1 object as version 2 renders it: names swapped, the label added."""
        if isinstance(obj, dict):
            out = {k: as_version_2(v) for k, v in obj.items()}
            if "trainer.kubeflow.org/trainjob-name" in out:  # the owner labels
                out["trainjob-scheduling.dev/plan-version"] = "2"
            return out
        if isinstance(obj, list):
            return [as_version_2(v) for v in obj]
        return renamed.get(obj, obj) if isinstance(obj, str) else obj

    old = NativeBackend().render(legacy, Context(), {("Workload", legacy.workload_name): "wl"})
    new = NativeBackend().render(plan, Context(), {("Workload", workload_name): "wl"})
    assert new == as_version_2(old)
    assert new[0]["metadata"]["labels"]["trainjob-scheduling.dev/plan-version"] == "2"
    assert objects_errors(new) == []


def test_single_disruption_mode_renders_as_single() -> None:
    rt = runtime(torch_node(), scheduling={"disruptionMode": {"single": {}}})
    objects = NativeBackend().render(plan_of(rt, trainjob(num_nodes=2)), Context())
    assert objects[0]["spec"]["podGroupTemplates"][0]["disruptionMode"] == {"single": {}}
    assert objects[1]["spec"]["disruptionMode"] == {"single": {}}


def test_all_group_fields_render_and_validate() -> None:
    settings = {
        "schedulingPolicy": {"gang": {}},
        "schedulingConstraints": {"topology": [{"key": "example.com/block"}]},
        "disruptionMode": {"all": {}},
        "resourceClaims": [
            {"name": "slice", "resourceClaimTemplateName": "tpu-slice"},
            {"name": "shared", "resourceClaimName": "nfs-cache"},
        ],
    }
    rt = runtime(torch_node(priority_class="high"), scheduling=settings)
    objects = NativeBackend().render(plan_of(rt, trainjob(num_nodes=2)), Context())
    template = objects[0]["spec"]["podGroupTemplates"][0]
    assert template["disruptionMode"] == {"all": {}}
    assert template["resourceClaims"] == settings["resourceClaims"]
    assert template["priorityClassName"] == "high"
    assert "ownerReferences" in objects[1]["metadata"]
    assert objects_errors(objects) == []


@pytest.mark.parametrize(
    ("trainjob_file", "runtime_file"),
    [
        ("torch-100-nodes.trainjob.yaml", "torch-distributed.runtime.yaml"),
        ("deepspeed-8-nodes.trainjob.yaml", "deepspeed-distributed.runtime.yaml"),
        ("torch-rack.trainjob.yaml", "torch-rack.runtime.yaml"),
    ],
)
def test_samples_render_objects_the_api_accepts(trainjob_file: str, runtime_file: str) -> None:
    objects = NativeBackend().render(
        plan_of(sample(runtime_file), sample(trainjob_file)), Context()
    )
    assert objects_errors(objects) == []


@pytest.mark.parametrize(
    ("runtime_fixture", "expected"),
    [
        # TrainJob my-job, numNodes 100, against each captured runtime: (policy, minCount, topology)
        ("clustertrainingruntime-create-level1.validate.json", [("gang", 100, None)]),
        (
            # deepspeed: runLauncherAsNode, launcher waits for node Ready -> node pods only
            "clustertrainingruntime-create-level2.validate.json",
            [("basic", None, None), ("gang", 99, "topology.kubernetes.io/zone")],
        ),
        (
            "clustertrainingruntime-create-level3-server-side-apply.validate.json",
            [("gang", 100, "topology.kubernetes.io/rack")] * 2,
        ),
        (
            "clustertrainingruntime-update-apply.validate.json",
            [("gang", 100, "topology.kubernetes.io/zone")],
        ),
        (
            "clustertrainingruntime-update-server-side-apply.validate.json",
            [("gang", 100, "topology.kubernetes.io/zone")],
        ),
        ("trainingruntime-create.validate.json", [("gang", 100, "topology.kubernetes.io/zone")]),
    ],
)
def test_captured_runtimes_plan(
    runtime_fixture: str, expected: list[tuple[str, int | None, str | None]]
) -> None:
    rt = Runtime.model_validate(fixture_object(runtime_fixture))
    tj = TrainJob.model_validate(fixture_object("trainjob-create.validate.json"))
    plan = build_plan(tj, rt)
    assert plan is not None
    assert [(g.policy, g.min_count, g.topology_key) for g in plan.groups] == expected
    assert objects_errors(NativeBackend().render(plan, Context())) == []


TRAINER_MODELS: dict[str, type[TrainJob] | type[Runtime]] = {
    "TrainJob": TrainJob,
    "ClusterTrainingRuntime": Runtime,
    "TrainingRuntime": Runtime,
}
TRAINER_OBJECTS = [
    (path.name, obj)
    for path in sorted(FIXTURES.glob("*.json"))
    for review in [json.loads(path.read_text())["request"]]
    if review["kind"]["kind"] in TRAINER_MODELS
    for obj in (review["object"], review["oldObject"])
    if obj is not None
]


def test_fixtures_hold_trainer_objects() -> None:
    assert len(TRAINER_OBJECTS) >= 30


@pytest.mark.parametrize(("fixture", "obj"), TRAINER_OBJECTS, ids=[f for f, _ in TRAINER_OBJECTS])
def test_models_round_trip_captured_objects_without_loss(fixture: str, obj: dict[str, Any]) -> None:
    # A newer Trainer (or Kubernetes) must not lose data through the service's models.
    assert TRAINER_MODELS[obj["kind"]].model_validate(obj).dump() == obj

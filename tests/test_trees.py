"""Gangs of gangs: levels combined into a tree of CompositePodGroups (issue 14).

Worked out by hand: zone > block > rack; several TPU slices as one gang of gangs, each slice a
Job-level gang with its own claim; a basic initializer beside a gang of gangs. The rendered
objects pass the Kubernetes 1.37 schemas (v1beta1 and v1alpha3) and the API server's tree
rules; hypothesis checks that any valid multi-level runtime gives a tree in which each pod
belongs to exactly one leaf, every gang's count is met by its children, nothing deadlocks, and
the objects pass. The reconciler builds, repairs, suspends, resumes and removes trees against
the emulator (parents first, children removed first); without CompositePodGroups served, a
multi-level runtime is denied with the gate to turn on, and single-level ones work as before;
the other backends, which have no trees, deny them and never make them.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import itertools
import subprocess
import sys
from pathlib import Path
from typing import Any

import kmock
import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.apiserver_rules import objects_errors
from tests.builders import TRAINJOB_UID, Json, rj, runtime, torch_node, trainjob
from tests.harness import fixture, frozen, held_because, running_server, served
from tests.kube_emulator import (
    CLUSTER_RUNTIMES,
    COMPOSITE_POD_GROUPS,
    POD_GROUPS,
    TRAINJOBS,
    WORKLOADS,
    create,
    delete,
    eventually,
    patch,
    recreate,
)
from tests.paths import REPO
from tests.test_properties import _check_plan, runtimes, trainjobs
from tests.test_reconciler import NS, events, objects, stored, world
from webhook.backends.base import Context
from webhook.backends.native import COMPOSITE, NativeBackend
from webhook.core import naming
from webhook.core.layout import CompositeKind, is_multi_level
from webhook.core.plan import Plan, build_plan, pod_group_for_labels
from webhook.core.snapshot import PLAN_VERSION
from webhook.core.trainer import Runtime, TrainJob
from webhook.core.validation import validate_runtime, validate_trainjob
from webhook.kube.cache import Cache

ZONE = {"topology": [{"key": "topology.kubernetes.io/zone"}]}
BLOCK = {"topology": [{"key": "example.com/block"}]}
RACK = {"topology": [{"key": "example.com/rack"}]}
SLICE = {"name": "slice", "resourceClaimTemplateName": "tpu-slice"}
RUNTIME_PATH = "/validate-trainer-kubeflow-org-v1alpha1-clustertrainingruntime"


def plan_of(
    raw_runtime: Json,
    num_nodes: int = 4,
    name: str = "my-job",
    *,
    uid: str = TRAINJOB_UID,
    plan_version: int = PLAN_VERSION,
) -> Plan:
    assert validate_runtime(raw_runtime).errors == (), validate_runtime(raw_runtime).errors
    plan = build_plan(
        TrainJob.model_validate(trainjob(name, num_nodes=num_nodes, uid=uid)),
        Runtime.model_validate(raw_runtime),
        plan_version,
    )
    assert plan is not None
    return plan


def rendered(plan: Plan) -> list[Json]:
    objects = NativeBackend().render(plan, Context(), {("Workload", plan.workload_name): "w-uid"})
    assert objects_errors(objects) == []
    return objects


def zone_block_rack() -> Json:
    """One zone for the whole TrainJob, one block for the slices' gang, a rack per slice."""
    return runtime(
        torch_node(replicas=2),
        scheduling={
            "schedulingPolicy": {"gang": {}},
            "schedulingConstraints": ZONE,
            "replicatedJobs": [
                {
                    "targetReplicatedJobs": ["node"],
                    "schedulingPolicy": {"gang": {}},
                    "schedulingConstraints": BLOCK,
                    "job": {"schedulingPolicy": {"gang": {}}, "schedulingConstraints": RACK},
                }
            ],
        },
    )


def test_zone_block_rack() -> None:
    plan = plan_of(zone_block_rack(), plan_version=1)  # the names earlier releases gave
    root, block = plan.composites
    assert (root.kind, root.policy, root.min_group_count, root.topology_key) == (
        CompositeKind.TRAINJOB, "gang", 1, "topology.kubernetes.io/zone"
    )  # fmt: skip
    assert root.template_name == root.name == plan.workload_name == "my-job-f438be8c51"
    assert root.children == (block.template_name,) and root.parent_name is None
    assert (block.kind, block.policy, block.min_group_count, block.topology_key) == (
        CompositeKind.REPLICATED_JOB, "gang", 2, "example.com/block"
    )  # fmt: skip
    assert block.name == f"my-job-{block.template_name}" and block.parent_name == root.name
    assert [g.template_name for g in plan.groups] == list(block.children)
    for index, leaf in enumerate(plan.groups):
        assert (leaf.job_index, leaf.policy, leaf.min_count, leaf.topology_key) == (
            index, "gang", 4, "example.com/rack"
        )  # fmt: skip
        assert leaf.parent_name == block.name
    workload, *rest = rendered(plan)
    assert [o["kind"] for o in rest] == ["CompositePodGroup"] * 2 + ["PodGroup"] * 2
    (tree,) = workload["spec"]["compositePodGroupTemplates"]
    assert "podGroupTemplates" not in workload["spec"]
    assert tree["schedulingPolicy"] == {"gang": {"minGroupCount": 1}}
    assert tree["schedulingConstraints"] == ZONE
    (inner,) = tree["compositePodGroupTemplates"]
    assert inner["schedulingPolicy"] == {"gang": {"minGroupCount": 2}}
    assert [t["schedulingConstraints"] for t in inner["podGroupTemplates"]] == [RACK, RACK]
    root_object, block_object = rest[:2]
    assert root_object["apiVersion"] == "scheduling.k8s.io/v1alpha3"
    assert "parentCompositePodGroupName" not in root_object["spec"]
    assert block_object["spec"]["parentCompositePodGroupName"] == root.name
    assert block_object["metadata"]["ownerReferences"][1] == {
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "Workload",
        "name": plan.workload_name, "uid": "w-uid",
    }  # fmt: skip
    assert [pg["spec"]["parentCompositePodGroupName"] for pg in rest[2:]] == [block.name] * 2


def test_zone_block_rack_at_plan_version_2_and_a_jobset_restart() -> None:
    # A new TrainJob's tree: the Workload, the composites and the leaves carry its uid, the
    # templates inside the Workload keep their names; a JobSet restart gets composites and
    # leaves of its own (a new gang of gangs), linked to each other, under the same Workload.
    legacy, plan = plan_of(zone_block_rack(), plan_version=1), plan_of(zone_block_rack())
    root, block = plan.composites
    assert root.name == root.template_name == plan.workload_name
    assert plan.workload_name == naming.workload_name(NS, "my-job", TRAINJOB_UID)
    assert block.template_name == legacy.composites[1].template_name
    assert block.name == naming.pod_group_name("my-job", block.template_name, TRAINJOB_UID)
    assert block.parent_name == root.name
    for leaf, old in zip(plan.groups, legacy.groups, strict=True):
        assert leaf.template_name == old.template_name
        assert leaf.pod_group_name == naming.pod_group_name(
            "my-job", leaf.template_name, TRAINJOB_UID
        )
        assert leaf.parent_name == block.name
    rendered(plan)

    again = plan.at_attempt(1)
    assert again.attempt == 1 and again.workload_name == plan.workload_name
    new_root, new_block = again.composites
    assert new_root.name == naming.for_attempt(root.name, 1) != root.name
    assert new_block.name == naming.for_attempt(block.name, 1) != block.name
    assert new_block.parent_name == new_root.name
    for leaf, before in zip(again.groups, plan.groups, strict=True):
        assert leaf.template_name == before.template_name
        assert leaf.pod_group_name == naming.for_attempt(before.pod_group_name, 1)
        assert leaf.parent_name == new_block.name
    restarted = rendered(again)
    names = {o["metadata"]["name"] for o in restarted[1:]}
    assert not names & {o["metadata"]["name"] for o in rendered(plan)[1:]}  # none shared
    assert plan.at_attempt(0) is plan and again.at_attempt(1) is again
    assert legacy.at_attempt(1) is legacy  # version 1: one set of names for every attempt


def tpu_slices(slices: int = 4) -> Json:
    """Slices as one gang of gangs (no TrainJob-level fields: an implied basic root)."""
    return runtime(
        torch_node(replicas=slices),
        scheduling={
            "replicatedJobs": [
                {
                    "targetReplicatedJobs": ["node"],
                    "schedulingPolicy": {"gang": {}},
                    "job": {"schedulingPolicy": {"gang": {}}, "resourceClaims": [SLICE]},
                }
            ]
        },
    )


def test_tpu_slices_as_one_gang_of_gangs_each_with_its_claim() -> None:
    plan = plan_of(tpu_slices(), num_nodes=8)
    root, slices = plan.composites
    # Only one entry has fields of its own: the root is implied, basic, unconstrained.
    assert (root.policy, root.min_group_count, root.topology_key) == ("basic", None, None)
    assert (slices.policy, slices.min_group_count) == ("gang", 4)
    assert len(plan.groups) == 4
    assert {(g.min_count, g.resource_claims[0].name) for g in plan.groups} == {(8, "slice")}
    workload = rendered(plan)[0]
    (tree,) = workload["spec"]["compositePodGroupTemplates"]
    assert tree["schedulingPolicy"] == {"basic": {}}
    leaves = tree["compositePodGroupTemplates"][0]["podGroupTemplates"]
    assert [leaf["resourceClaims"] for leaf in leaves] == [[SLICE]] * 4


def initializer_beside_slices() -> Json:
    """A basic initializer that must Complete first, and the slices' gang of gangs, all in one
    zone: the root is basic (its children start apart), its topology still holds."""
    return runtime(
        rj("dataset-initializer", ancestor="dataset-initializer"),
        torch_node(replicas=2, depends=[("dataset-initializer", "Complete")]),
        scheduling={
            "schedulingPolicy": {"basic": {}},
            "schedulingConstraints": ZONE,
            "replicatedJobs": [
                {
                    "targetReplicatedJobs": ["dataset-initializer"],
                    "schedulingPolicy": {"basic": {}},
                },
                {
                    "targetReplicatedJobs": ["node"],
                    "schedulingPolicy": {"gang": {}},
                    "job": {"schedulingPolicy": {"gang": {}}, "schedulingConstraints": RACK},
                },
            ],
        },
    )


def test_a_basic_initializer_beside_a_gang_of_gangs() -> None:
    plan = plan_of(initializer_beside_slices())
    root, slices = plan.composites
    init, *jobs = plan.groups
    assert root.children == (init.template_name, slices.template_name)
    assert (init.policy, init.parent_name) == ("basic", root.name)
    assert [j.parent_name for j in jobs] == [slices.name, slices.name]
    assert (slices.policy, slices.min_group_count) == ("gang", 2)
    rendered(plan)
    # With a gang at the top instead, the initializer's Complete dependency would deadlock it.
    gang_root = initializer_beside_slices()
    gang_root["spec"]["scheduling"]["schedulingPolicy"] = {"gang": {}}
    (err,) = validate_runtime(gang_root).errors
    assert err.path == "spec.scheduling"
    assert '"node" starts only after "dataset-initializer" is Complete' in str(err)


def test_a_ready_dependency_between_children_joins_the_gang_of_groups_later() -> None:
    raw = runtime(
        torch_node(replicas=2),
        rj("launcher", depends=[("node", "Ready")]),
        scheduling={
            "schedulingPolicy": {"gang": {}},
            "replicatedJobs": [
                {"targetReplicatedJobs": ["launcher"]},
                {"targetReplicatedJobs": ["node"], "schedulingPolicy": {"gang": {}},
                 "job": {"schedulingPolicy": {"gang": {}}}},
            ],
        },
    )  # fmt: skip
    verdict = validate_runtime(raw)
    assert verdict.errors == ()
    assert any('the group of "launcher" starts after "node"' in w for w in verdict.warnings)
    root, _ = plan_of(raw).composites
    launcher = plan_of(raw).groups[0]
    assert root.min_group_count == 1 and root.joins_later == (launcher.template_name,)


def test_a_child_whose_late_joiners_wait_for_a_sibling_still_counts() -> None:
    """InOrder node, launcher, dataset-initializer: the launcher's group waits for node Ready,
    and the second group's dataset-initializer for the launcher, but that group's gang waits
    only for node. So it counts, the launcher joins later: minGroupCount 1 (hypothesis found
    the 0 the API refuses)."""
    raw = runtime(
        torch_node(replicas=1),
        rj("launcher"),
        rj("dataset-initializer", ancestor="dataset-initializer"),
        scheduling={
            "schedulingPolicy": {"gang": {}},
            "replicatedJobs": [
                {"targetReplicatedJobs": ["launcher"]},
                {"targetReplicatedJobs": ["node", "dataset-initializer"]},
            ],
        },
    )
    raw["spec"]["template"]["spec"]["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
    plan = plan_of(raw)
    (root,) = plan.composites
    launcher, pair = plan.groups
    assert pair.joins_later == ("dataset-initializer",)
    assert root.min_group_count == 1 and root.joins_later == (launcher.template_name,)
    rendered(plan)


def test_a_gang_of_groups_whose_groups_wait_on_each_other_is_rejected_not_made_empty() -> None:
    """InOrder launcher, node, dataset-initializer under a gang root: node's gang waits for the
    launcher's basic group, whose dataset-initializer waits for node. Hypothesis found this
    planned as a gang of 0 groups (which the API refuses); it is rejected at apply instead."""
    raw = runtime(
        rj("launcher"),
        rj("node"),
        rj("dataset-initializer"),
        rj("model-initializer"),
        scheduling={
            "schedulingPolicy": {"gang": {}},
            "replicatedJobs": [
                {"targetReplicatedJobs": ["node"]},
                {"targetReplicatedJobs": ["launcher", "dataset-initializer"],
                 "schedulingPolicy": {"basic": {}}},
            ],
        },
    )  # fmt: skip
    del raw["spec"]["mlPolicy"]
    raw["spec"]["template"]["spec"]["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
    (err,) = validate_runtime(raw).errors
    assert err.path == "spec.scheduling.replicatedJobs"
    assert "put them in one replicatedJobs entry or remove a dependsOn" in str(err)
    raw["spec"]["scheduling"]["schedulingPolicy"] = {"basic": {}}  # the fix the message names
    assert validate_runtime(raw).errors == ()


def test_the_apis_limits_on_a_tree_are_admission_errors() -> None:
    (err,) = validate_runtime(tpu_slices(slices=9)).errors
    assert err.path == "spec.scheduling.replicatedJobs[0].job"
    assert "9 Job groups, and a composite holds at most 8" in str(err)
    nine_leaves = runtime(
        torch_node(replicas=9),
        scheduling={"schedulingConstraints": ZONE,
                    "replicatedJobs": [{"targetReplicatedJobs": ["node"], "job": {}}]},
    )  # fmt: skip
    (err,) = validate_runtime(nine_leaves).errors
    assert err.path == "spec.scheduling.replicatedJobs"
    assert "9 groups at the TrainJob level of this tree, and a composite holds at most 8" in str(
        err
    )


def test_a_pod_gets_its_leaf() -> None:
    plan = plan_of(zone_block_rack())
    labels = {
        "jobset.sigs.k8s.io/jobset-name": "my-job",
        "jobset.sigs.k8s.io/replicatedjob-name": "node",
    }
    for index, leaf in enumerate(plan.groups):
        found = pod_group_for_labels(plan, {**labels, "jobset.sigs.k8s.io/job-index": str(index)})
        assert found == leaf.pod_group_name


POD_PATH = "/mutate--v1-pod"


def test_the_pod_webhook_ties_each_pod_to_its_leaf_over_https(tmp_path: Path) -> None:
    """The captured pod of my-job's node Job 0 (then Job 1) on a zone > block > rack runtime:
    its schedulingGroup names that Job's rack PodGroup, the leaf under the block composite."""
    tree_runtime = zone_block_rack() | {"metadata": {"name": "torch-distributed"}}
    tj = tree_trainjob()
    tj["spec"]["runtimeRef"] = {"name": "torch-distributed"}
    tj["metadata"]["uid"] = TRAINJOB_UID
    plan = plan_of(tree_runtime)
    cache = Cache(connected=True)
    cache.jobsets.replace([])  # listed, none: restart attempt 0
    cache.cluster_runtimes.replace([tree_runtime])
    cache.training_runtimes.replace([])
    cache.trainjobs.replace([frozen(cache, tj)])
    served(cache, "native")
    cache.kind_states[COMPOSITE] = "served"
    review = fixture("pod-create-by-job-controller.mutate.json")

    def tie(index: int) -> Any:
        doc = copy.deepcopy(review)
        labels = doc["request"]["object"]["metadata"]["labels"]
        labels["jobset.sigs.k8s.io/job-index"] = str(index)
        labels["batch.kubernetes.io/job-name"] = labels["job-name"] = f"my-job-node-{index}"
        answer = client.post(POD_PATH, content=orjson.dumps(doc)).json()["response"]
        return answer, orjson.loads(base64.b64decode(answer["patch"])) if "patch" in answer else []

    with running_server(cache, tmp_path / "certs") as srv, srv.client() as client:
        for index, leaf in enumerate(plan.groups):
            assert leaf.parent_name == plan.composites[1].name
            answer, ops = tie(index)
            assert answer["allowed"] is True
            assert ops == [{"op": "add", "path": "/spec/schedulingGroup",
                            "value": {"podGroupName": leaf.pod_group_name}}], ops  # fmt: skip
        # Without CompositePodGroups served the tree is never made: held, never loose.
        cache.kind_states[COMPOSITE] = "not-served"
        answer, ops = tie(0)
        assert held_because(answer) == (
            "its tree needs CompositePodGroups, not served; its Job creates it again shortly "
            "(trainjob-scheduling)"
        )


def test_plan_prints_the_tree(tmp_path: Path) -> None:
    import yaml

    docs = [initializer_beside_slices() | {"metadata": {"name": "rt"}},
            trainjob(num_nodes=4, uid=None)]  # fmt: skip
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    cmd = [sys.executable, "-m", "webhook", "plan", "-f", str(path), "-o", "tree"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=True).stdout
    lines = out.splitlines()
    assert (
        lines[0]
        == "TrainJob team-a/my-job: Workload my-job-f438be8c51, scheduler default-scheduler"
    )
    assert (
        lines[1]
        == "└─ my-job-f438be8c51 (CompositePodGroup) basic in one topology.kubernetes.io/zone"
    )
    assert lines[2].startswith("   ├─ my-job-dataset-initializer-") and "basic, 1 pods" in lines[2]
    assert "(CompositePodGroup) gang of 2/2 groups" in lines[3]
    assert lines[4].startswith("      ├─ my-job-node-0-") and "in one example.com/rack" in lines[4]
    assert lines[5].startswith("      └─ my-job-node-1-")


# --- any valid multi-level runtime ------------------------------------------------------------


@st.composite
def trees(draw: st.DrawFn) -> Json:
    """A valid single-level runtime of entries, made multi-level: TrainJob-level fields, and
    job entries that get fields of their own (a gang of their Jobs)."""
    raw = draw(runtimes(sloppy=False))
    scheduling = raw["spec"].get("scheduling")
    assume(isinstance(scheduling, dict) and "replicatedJobs" in scheduling)
    raw = copy.deepcopy(raw)
    scheduling = raw["spec"]["scheduling"]
    if draw(st.booleans()):
        scheduling["schedulingPolicy"] = draw(st.sampled_from([{"gang": {}}, {"basic": {}}]))
        if draw(st.booleans()):
            scheduling["schedulingConstraints"] = ZONE
    for entry in scheduling["replicatedJobs"]:
        if "job" in entry and draw(st.booleans()):
            entry["schedulingPolicy"] = draw(st.sampled_from([{"gang": {}}, {"basic": {}}]))
            if draw(st.booleans()):
                entry["schedulingConstraints"] = BLOCK
    if not is_multi_level(Runtime.model_validate(raw).spec.scheduling):  # type: ignore[arg-type]
        scheduling["schedulingPolicy"] = draw(st.sampled_from([{"gang": {}}, {"basic": {}}]))
    return raw


def _gangs_wait_forever(plan: Plan, raw_runtime: Json) -> bool:
    """Plays the tree forward apart from the planner: a composite gang is admitted once its
    counted children could be (each leaf gang once its pods exist), and holds its members."""
    jobs = raw_runtime["spec"]["template"]["spec"]["replicatedJobs"]
    prereqs = {j["name"]: {d["name"] for d in j.get("dependsOn", [])} for j in jobs}
    if (raw_runtime["spec"]["template"]["spec"].get("startupPolicy") or {}).get(
        "startupPolicyOrder"
    ) == "InOrder":
        for before, after in itertools.pairwise(jobs):
            prereqs[after["name"]].add(before["name"])
    leaves = {g.template_name: g for g in plan.groups}
    composites = {c.template_name: c for c in plan.composites}

    def ready(name: str, created: set[str]) -> bool:
        if name in leaves:
            g = leaves[name]
            pods = set(g.replicated_jobs) - set(g.joins_later)
            return g.policy != "gang" or pods <= created
        c = composites[name]
        children = [ch for ch in c.children if ch not in c.joins_later]
        return all(ready(ch, created) for ch in children) if c.policy == "gang" else True

    running: set[str] = set()
    while True:
        created = {n for n, deps in prereqs.items() if deps <= running}
        blocked: set[str] = set()
        for name in (*leaves, *composites):
            node = leaves.get(name) or composites[name]
            if not ready(name, created):
                blocked |= set(node.replicated_jobs)
        now = created - blocked
        if now == running:
            return set(prereqs) - running != set()
        running = now


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(trees(), trainjobs())
def test_any_valid_tree_is_sound_and_renders_objects_the_api_accepts(
    raw_runtime: Json, raw_trainjob: Json
) -> None:
    assume(validate_runtime(raw_runtime).allowed)
    assume(validate_trainjob(raw_trainjob, Runtime.model_validate(raw_runtime)).allowed)
    plan = build_plan(TrainJob.model_validate(raw_trainjob), Runtime.model_validate(raw_runtime))
    assert plan is not None
    _check_plan(plan, raw_runtime, raw_trainjob)  # every pod in exactly one leaf, and more
    if plan.composites:
        names = {g.template_name for g in plan.groups} | {c.template_name for c in plan.composites}
        below = [child for c in plan.composites for child in c.children]
        assert sorted(below) == sorted(names - {plan.composites[0].template_name})  # a tree
        for c in plan.composites:
            if c.policy == "gang":
                assert c.min_group_count is not None
                assert 1 <= c.min_group_count <= len(c.children)
        assert all(g.parent_name for g in plan.groups)
        counts = [len(c.children) for c in plan.composites]
        assert max(counts) <= 8
    pods = {j["name"] for j in raw_runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    if all(p > 0 for p in (g.pod_count for g in plan.groups)) and pods:
        assert not _gangs_wait_forever(plan, raw_runtime)
    rendered(plan)


# --- admission: only where CompositePodGroups are served -----------------------------------------


def runtime_review(obj: Json) -> Json:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "trainer.kubeflow.org", "version": "v1alpha1",
                     "kind": "ClusterTrainingRuntime"},
            "resource": {"group": "trainer.kubeflow.org", "version": "v1alpha1",
                         "resource": "clustertrainingruntimes"},
            "name": obj["metadata"]["name"],
            "operation": "CREATE",
            "userInfo": {"username": "admin"},
            "object": obj,
        },
    }  # fmt: skip


def test_a_tree_is_denied_where_composite_pod_groups_are_not_served(tmp_path: Path) -> None:
    cache = Cache(connected=True)
    cache.jobsets.replace([])  # listed, none: restart attempt 0
    for store in cache.stores:
        store.replace([])
    cache.kind_states[COMPOSITE] = "not-served"
    with running_server(cache, tmp_path / "certs") as srv, srv.client() as client:

        def answer(obj: Json) -> Json:
            body = orjson.dumps(runtime_review(obj))
            response = client.post(RUNTIME_PATH, content=body).json()["response"]
            assert isinstance(response, dict)
            return response

        denied = answer(zone_block_rack())
        assert denied["allowed"] is False
        message = denied["status"]["message"]
        assert "enable the CompositePodGroup feature gate" in message, message
        assert "--runtime-config=scheduling.k8s.io/v1alpha3=true" in message
        single = runtime(torch_node(), scheduling={"schedulingConstraints": ZONE})
        assert answer(single)["allowed"] is True  # one level: as before
        cache.kind_states[COMPOSITE] = "served"
        assert answer(zone_block_rack())["allowed"] is True


# --- the reconciler builds and removes trees ---------------------------------------------------


def tree_trainjob() -> Json:
    tj: Json = copy.deepcopy(fixture("trainjob-create.validate.json")["request"]["object"])
    tj["metadata"] = {"name": "my-job", "namespace": NS}
    tj["spec"] = {"runtimeRef": {"name": "rt"}, "trainer": {"numNodes": 4}}
    return tj


def names(k: Any, resource: Any) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objects(k, resource))


@pytest.mark.asyncio
async def test_the_reconciler_builds_repairs_suspends_resumes_and_removes_a_tree() -> None:
    async with world(composites=True) as w:
        await create(w.k, CLUSTER_RUNTIMES, zone_block_rack() | {"metadata": {"name": "rt"}})
        tj = await create(w.k, TRAINJOBS, tree_trainjob())
        plan = plan_of(zone_block_rack() | {"metadata": {"name": "rt"}}, uid=tj["metadata"]["uid"])
        want_composites = sorted(c.name for c in plan.composites)
        want_groups = sorted(g.pod_group_name for g in plan.groups)

        def built() -> bool:
            return (
                names(w.k, COMPOSITE_POD_GROUPS) == want_composites
                and names(w.k, POD_GROUPS) == want_groups
                and names(w.k, WORKLOADS) == [plan.workload_name]
            )

        await eventually(built, "the Workload, 2 CompositePodGroups and 2 PodGroups")
        root = stored(w.k, COMPOSITE_POD_GROUPS, plan.composites[0].name)
        assert (
            root is not None
            and root["metadata"]["ownerReferences"][0]["uid"] == tj["metadata"]["uid"]
        )
        # Parents first: the requests the reconciler made, in order.
        creates = [str(r.url).rsplit("/", 1)[-1] for r in w.k if r.method == "POST"]
        kinds = [c for c in creates if c in ("workloads", "compositepodgroups", "podgroups")]
        assert kinds == ["workloads", "compositepodgroups", "compositepodgroups", "podgroups",
                         "podgroups"], kinds  # fmt: skip

        # Someone replaces the block composite with another constraint (the API server
        # refuses to change it in place): immutable, so the whole tree is made again.
        block = plan.composites[1].name
        before = stored(w.k, COMPOSITE_POD_GROUPS, block)
        assert before is not None
        drifted = copy.deepcopy(before)
        drifted["spec"]["schedulingConstraints"] = RACK
        replaced = await recreate(w.k, COMPOSITE_POD_GROUPS, drifted)
        earlier = (before["metadata"]["uid"], replaced["metadata"]["uid"])

        def rebuilt() -> bool:
            now = stored(w.k, COMPOSITE_POD_GROUPS, block)
            return (
                now is not None
                and now["metadata"]["uid"] not in earlier
                and now["spec"]["schedulingConstraints"] == BLOCK
                and built()
            )

        await eventually(rebuilt, "the tree made again")

        # Suspend: PodGroups first, then the composites children first, then the Workload.
        mark = len(list(w.k))
        await patch(w.k, TRAINJOBS, NS, "my-job", {"spec": {"suspend": True}})
        await eventually(lambda: not objects(w.k, WORKLOADS), "removed on suspend")
        deleted = [str(r.url).split("/")[-2:] for r in list(w.k)[mark:] if r.method == "DELETE"]
        order = [(resource, name) for resource, name in deleted]
        assert [r for r, _ in order] == ["podgroups", "podgroups", "compositepodgroups",
                                         "compositepodgroups", "workloads"], order  # fmt: skip
        assert order[2][1] == block and order[3][1] == plan.composites[0].name

        resumed = await patch(w.k, TRAINJOBS, NS, "my-job", {"spec": {"suspend": False}})
        # The resumed run's tree, named by its generation (plan version 3).
        parsed = TrainJob.model_validate(resumed)
        run = build_plan(
            parsed, Runtime.model_validate(zone_block_rack() | {"metadata": {"name": "rt"}})
        )
        assert run is not None and run.workload_name != plan.workload_name
        plan = run
        want_composites = sorted(c.name for c in plan.composites)
        want_groups = sorted(g.pod_group_name for g in plan.groups)
        await eventually(built, "made again on resume")
        await delete(w.k, TRAINJOBS, NS, "my-job")
        await eventually(lambda: not objects(w.k, COMPOSITE_POD_GROUPS), "collected on delete")


@pytest.mark.asyncio
async def test_without_composite_pod_groups_a_tree_gets_nothing_and_says_why() -> None:
    async with world(composites=False) as w:
        await create(w.k, CLUSTER_RUNTIMES, zone_block_rack() | {"metadata": {"name": "rt"}})
        await create(w.k, TRAINJOBS, tree_trainjob())
        (event,) = (await eventually(lambda: events(w.k, "GangKindUnavailable"), "an Event"))[:1]
        assert "CompositePodGroups, which the cluster does not serve" in event["note"]
        await asyncio.sleep(0.3)
        assert not objects(w.k, WORKLOADS) and not objects(w.k, POD_GROUPS)


# --- trees are the native backend's alone --------------------------------------------------------

OTHER_SCHEDULERS = {"coscheduling": "scheduler-plugins-scheduler", "volcano": "volcano",
                    "kai": "kai-scheduler"}  # fmt: skip


def on_scheduler(raw: Json, scheduler: str) -> Json:
    raw = copy.deepcopy(raw)
    for job in raw["spec"]["template"]["spec"]["replicatedJobs"]:
        job["template"]["spec"]["template"]["spec"]["schedulerName"] = scheduler
    return raw


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", list(OTHER_SCHEDULERS))
async def test_another_backends_tree_is_denied_and_never_made(backend: str, tmp_path: Path) -> None:
    tree = on_scheduler(zone_block_rack(), OTHER_SCHEDULERS[backend])
    cache = Cache(connected=True)
    cache.jobsets.replace([])  # listed, none: restart attempt 0
    for store in cache.stores:
        store.replace([])
    cache.kind_states[COMPOSITE] = "served"
    with running_server(cache, tmp_path / "certs") as srv, srv.client() as client:
        body = orjson.dumps(runtime_review(tree))
        denied = client.post(RUNTIME_PATH, content=body).json()["response"]
    assert denied["allowed"] is False
    assert f"which the {backend} gang backend cannot express" in denied["status"]["message"]
    # Stored all the same (made before this service ran): nothing is made, one Event says why.
    kind = next(b for b in cache.backends.backends if b.name == backend).kinds[0]
    resource = kmock.resource(kind.group, kind.version, kind.plural)
    async with world(served=(backend,), composites=True) as w:
        await create(w.k, CLUSTER_RUNTIMES, tree | {"metadata": {"name": "rt"}})
        await create(w.k, TRAINJOBS, tree_trainjob())
        said = await eventually(lambda: events(w.k, "GangKindUnavailable"), "an Event")
        assert f"which the {backend} gang backend cannot express" in said[0]["note"]
        await asyncio.sleep(0.2)
        # One per change of the TrainJob (created, its snapshot written), never a retry loop.
        assert len(events(w.k, "GangKindUnavailable")) <= 2
        assert objects(w.k, resource) == [] and objects(w.k, COMPOSITE_POD_GROUPS) == []


# --- drift of a tree: what the server fills in or drops is not drift ------------------------------


def test_tree_drift_ignores_what_the_server_fills_in_or_drops_behind_a_gate() -> None:
    from webhook.backends.native import composite_drift, workload_drift

    objects = rendered(plan_of(zone_block_rack()))
    workload = next(o for o in objects if o["kind"] == "Workload")
    block = [o for o in objects if o["kind"] == "CompositePodGroup"][1]
    assert workload_drift(workload, copy.deepcopy(workload)).kind == "none"

    # TopologyAwareWorkloadScheduling off: the server dropped every schedulingConstraints.
    def without_constraints(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: without_constraints(v) for k, v in value.items()
                    if k != "schedulingConstraints"}  # fmt: skip
        return [without_constraints(v) for v in value] if isinstance(value, list) else value

    gated = without_constraints(workload)
    drift = workload_drift(workload, gated)
    assert drift.kind == "none" and drift.dropped
    assert all("TopologyAwareWorkloadScheduling" in d for d in drift.dropped)
    drift = composite_drift(block, without_constraints(block))
    assert drift.kind == "none" and drift.dropped

    # A global default PriorityClass and the defaults the server writes: not drift either.
    filled = copy.deepcopy(workload)
    root = filled["spec"]["compositePodGroupTemplates"][0]
    root.update(priorityClassName="default-priority", priority=1000, disruptionMode={"single": {}})
    assert workload_drift(workload, filled).kind == "none"
    stored_block = copy.deepcopy(block)
    stored_block["spec"].update(priorityClassName="default-priority", priority=1000)
    assert composite_drift(block, stored_block).kind == "none"

    # A real change, anywhere in the tree: the whole tree is made again.
    changed = copy.deepcopy(workload)
    leaf = changed["spec"]["compositePodGroupTemplates"][0]["compositePodGroupTemplates"][0]
    leaf["podGroupTemplates"][0]["schedulingPolicy"]["gang"]["minCount"] += 1
    assert workload_drift(workload, changed).kind == "recreate"
    other = copy.deepcopy(block)
    other["spec"]["schedulingConstraints"] = RACK
    assert composite_drift(block, other).kind == "recreate"
    extra = copy.deepcopy(workload)
    extra["spec"]["compositePodGroupTemplates"][0]["podGroupTemplates"] = [
        {"name": "x", "schedulingPolicy": {"basic": {}}}
    ]
    assert workload_drift(workload, extra).kind == "recreate"

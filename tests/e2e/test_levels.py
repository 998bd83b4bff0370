"""End to end through the real Trainer, JobSet and Job controllers and kube-scheduler: the three
levels of a runtime's `spec.scheduling` and a DeepSpeed (MPI) launcher that joins its nodes' gang.

Each TrainJob's pods are made by the Job controller, tied by the service's pod webhook (the
chart's registration) and bound by kube-scheduler to the test's fake nodes; the tests play the
kubelet (pods/status) to make `dependsOn` prerequisites Ready or Complete. For every TrainJob:
every pod named its planned PodGroup (the plan of the snapshot the service froze; names from the
planner), the number of pods Trainer made is the planner's, all bind, no Workload of the Job
controller's own (WorkloadWithJob) exists for its Jobs, and the `GangScheduling` condition ends
True/Scheduled.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from webhook.core.plan import JOBSET_NAME, Plan

from .cluster import Json
from .objects import ZONE, deepspeed, level1, level2_torchtune, level3, trainjob
from .scenario import Pool, Scenario

pytestmark = pytest.mark.e2e

RJ = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"


def zones(pool: Pool, per_zone: int, cpu: int = 4) -> None:
    pool.add(per_zone, cpu, {ZONE: "zone-a"})
    pool.add(per_zone, cpu, {ZONE: "zone-b"})


def rj_is(name: str) -> Callable[[Json], bool]:
    return lambda pod: pod["metadata"]["labels"].get(RJ) == name


def start(scenario: Scenario, runtime: Json, name: str, num_nodes: int) -> Plan:
    """The runtime applied, the TrainJob created; the plan of what the service froze, checked
    to be the runtime's plan; its Workload and PodGroups there."""
    stored_runtime = scenario.apply_runtime(runtime)
    created = scenario.create_trainjob(
        trainjob(name, scenario.namespace, stored_runtime, num_nodes=num_nodes)
    )
    plan = scenario.frozen_plan(name)
    assert plan == scenario.plan_of_runtime(created, stored_runtime)
    scenario.gang_objects(plan)
    return plan


def no_job_controller_gang(scenario: Scenario, name: str) -> None:
    """No Workload of the Job controller's own (WorkloadWithJob: controllerRef kind Job) for the
    TrainJob's Jobs: the service's gang is the only one."""
    jobs = {j["metadata"]["name"] for j in scenario.jobs(name)}
    assert jobs, f"no Jobs of {name}"
    theirs = [
        w["metadata"]["name"]
        for w in scenario.cluster.gangs("workloads", scenario.namespace)
        if (w["spec"].get("controllerRef") or {}).get("kind") == "Job"
        and (w["spec"].get("controllerRef") or {}).get("name") in jobs
    ]
    assert not theirs, f"the Job controller made its own Workloads for {name}'s Jobs: {theirs}"


def finish(scenario: Scenario, name: str, plan: Plan, pods: list[Json]) -> None:
    scenario.wait_condition(name, "True", "Scheduled")
    assert len(pods) == sum(g.pod_count for g in plan.groups), "Trainer made other pod counts"
    scenario.assert_tied(name)
    no_job_controller_gang(scenario, name)


def test_level1_one_gang_of_every_pod_of_the_trainjob(scenario: Scenario, pool: Pool) -> None:
    zones(pool, 1)
    plan = start(scenario, level1("level1", pool.name, None), "level1", num_nodes=3)
    (group,) = plan.groups
    assert group.min_count == 4, group  # 3 node pods and the param-server: one gang
    pods = scenario.wait_bound("level1", 4)
    assert {p["spec"]["schedulingGroup"]["podGroupName"] for p in pods} == {group.pod_group_name}
    finish(scenario, "level1", plan, pods)


def test_level2_torchtune_initializers_then_the_node_gang(scenario: Scenario, pool: Pool) -> None:
    """Initializers pod by pod (basic), `node` a gang that starts once both are Complete."""
    zones(pool, 2)
    plan = start(scenario, level2_torchtune("torchtune", pool.name, scenario.namespace),
                 "torchtune", num_nodes=3)  # fmt: skip
    by_rj = {rj: g for g in plan.groups for rj in g.replicated_jobs}
    assert by_rj["dataset-initializer"] is by_rj["model-initializer"]
    assert by_rj["dataset-initializer"].min_count is None  # basic: no minCount
    assert by_rj["node"].min_count == 3
    initializers = scenario.wait_bound("torchtune", 2)
    assert {p["metadata"]["labels"][RJ] for p in initializers} == {
        "dataset-initializer", "model-initializer",
    }  # fmt: skip
    # The node gang's PodGroup exists before its pods: they come once both are Complete.
    scenario.set_pod_status(initializers, "Succeeded")
    nodes = scenario.wait_bound("torchtune", 3, where=rj_is("node"))
    finish(scenario, "torchtune", plan, initializers + nodes)


def test_level3_one_gang_per_job(scenario: Scenario, pool: Pool) -> None:
    """`slice` (2 Jobs of 2 pods): a gang per Job; `node` one gang beside them."""
    zones(pool, 2)
    plan = start(scenario, level3("level3", pool.name, scenario.namespace), "level3",
                 num_nodes=2)  # fmt: skip
    slices = sorted(
        (g for g in plan.groups if g.job_index is not None), key=lambda g: g.job_index or 0
    )
    assert [(g.replicated_jobs, g.job_index, g.min_count) for g in slices] == [
        (("slice",), 0, 2), (("slice",), 1, 2),
    ]  # fmt: skip
    pods = scenario.wait_bound("level3", 6)
    groups: dict[str, set[str]] = {}
    for pod in pods:
        labels = pod["metadata"]["labels"]
        key = f"{labels[RJ]}-{labels[JOB_INDEX]}"
        groups.setdefault(key, set()).add(pod["spec"]["schedulingGroup"]["podGroupName"])
    assert all(len(names) == 1 for names in groups.values()), groups
    assert groups["slice-0"] != groups["slice-1"], groups
    finish(scenario, "level3", plan, pods)


def test_deepspeed_launcher_joins_the_admitted_node_gang(scenario: Scenario, pool: Pool) -> None:
    """MPI with `runLauncherAsNode`: `[launcher, node]` is one gang whose minCount counts the
    node pods only (rule 8(c)); once they are Ready JobSet makes the launcher, which names the
    same PodGroup and must be bound too (no deadlock)."""
    zones(pool, 2)
    plan = start(scenario, deepspeed("deepspeed", pool.name, scenario.namespace), "deepspeed",
                 num_nodes=3)  # fmt: skip
    (group,) = plan.groups
    assert set(group.replicated_jobs) == {"launcher", "node"}
    assert group.min_count == 2 and group.joins_later == ("launcher",), group
    nodes = scenario.wait_bound("deepspeed", 2)
    assert all(p["metadata"]["labels"][RJ] == "node" for p in nodes)
    scenario.set_pod_status(nodes, "Ready")
    pods = scenario.wait_bound("deepspeed", 3)
    launcher = [p for p in pods if p["metadata"]["labels"][RJ] == "launcher"]
    assert len(launcher) == 1
    assert launcher[0]["spec"]["schedulingGroup"]["podGroupName"] == group.pod_group_name
    finish(scenario, "deepspeed", plan, pods)
    assert all(p["metadata"]["labels"][JOBSET_NAME] == "deepspeed" for p in pods)

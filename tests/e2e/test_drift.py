"""End to end: someone else changes or deletes the service's gang objects. A changed
`gang.minCount` is put back in place (1.37; 1.36 refuses the change: nothing moves); a PodGroup
deleted while no pod names it is made again and its pods come later and bind; a Workload
deleted under a running gang is made again. A running gang is never torn down: its pods keep
their uids and nodes, its PodGroup its uid."""

from __future__ import annotations

import time

import pytest
from kubernetes.client.exceptions import ApiException

from .cluster import JSON_PATCH, SCHEDULING_GROUP, NotYet
from .objects import level2_torchtune, min_count, placement, trainjob, uid
from .scenario import Pool, Scenario

pytestmark = pytest.mark.e2e

RJ = "jobset.sigs.k8s.io/replicatedjob-name"


def test_a_changed_min_count_is_put_back_and_the_gang_kept(scenario: Scenario, pool: Pool) -> None:
    plan = scenario.start_gang(pool, "mincount")
    (group,) = plan.groups
    workload, pod_group = scenario.gang_objects(plan)
    pods = scenario.pods("mincount")
    version = scenario.cluster.scheduling_version
    try:
        scenario.cluster.patch(
            SCHEDULING_GROUP, version, "podgroups", scenario.namespace, group.pod_group_name,
            [{"op": "replace", "path": "/spec/schedulingPolicy/gang/minCount", "value": 2}],
            content_type=JSON_PATCH,
        )  # fmt: skip
        scenario.cluster.patch(
            SCHEDULING_GROUP, version, "workloads", scenario.namespace, plan.workload_name,
            [{"op": "replace", "path": "/spec/podGroupTemplates/0/schedulingPolicy/gang/minCount",
              "value": 2}],
            content_type=JSON_PATCH,
        )  # fmt: skip
    except ApiException as err:
        if version == "v1beta1" or err.status != 422:
            raise
        # 1.36 (v1alpha2): minCount is immutable, the server refuses the change; nothing moved.
        assert "immutable" in str(err.body), err.body
        now = scenario.gang_objects(plan)
        assert [uid(o) for o in now] == [uid(workload), uid(pod_group)]
        assert placement(scenario.pods("mincount")) == placement(pods), "the running gang moved"
        scenario.assert_tied("mincount")
        return

    def put_back() -> bool:
        now_pg, now_wl = (
            scenario.pod_group(group.pod_group_name),
            scenario.workload(plan.workload_name),
        )
        assert now_pg is not None and now_wl is not None, "a gang object was deleted"
        assert uid(now_pg) == uid(pod_group), "the PodGroup was recreated under a running gang"
        assert uid(now_wl) == uid(workload), "the Workload was recreated under a running gang"
        counts = (min_count(now_pg["spec"]), min_count(now_wl["spec"]["podGroupTemplates"][0]))
        if counts != (group.min_count, group.min_count):
            raise NotYet(f"minCount (PodGroup, template) {counts}")
        return True

    scenario.wait(put_back, "minCount put back in place")
    assert placement(scenario.pods("mincount")) == placement(pods), "the running gang moved"
    scenario.wait_condition("mincount", "True", "Scheduled")
    scenario.assert_tied("mincount")


def test_a_pod_group_deleted_before_its_pods_exist_is_made_again(
    scenario: Scenario, pool: Pool
) -> None:
    """torchtune: the node gang's PodGroup exists while the initializers run (no pod names it
    yet); deleted then, it is made again (a new uid), and the node pods bind to it later."""
    pool.add(3, cpu=4)
    stored = scenario.apply_runtime(level2_torchtune("regrow", pool.name, scenario.namespace))
    scenario.create_trainjob(trainjob("regrow", scenario.namespace, stored, num_nodes=2))
    plan = scenario.frozen_plan("regrow")
    node_group = next(g for g in plan.groups if "node" in g.replicated_jobs)
    _, *groups = scenario.gang_objects(plan)
    before = next(g for g in groups if g["metadata"]["name"] == node_group.pod_group_name)
    initializers = scenario.wait_bound("regrow", 2)
    assert scenario.cluster.delete(
        SCHEDULING_GROUP, scenario.cluster.scheduling_version, "podgroups",
        node_group.pod_group_name, scenario.namespace,
    )  # fmt: skip
    scenario.gang_objects(plan, not_uids=frozenset({uid(before)}))
    scenario.set_pod_status(initializers, "Succeeded")
    scenario.wait_bound("regrow", 2, where=lambda p: p["metadata"]["labels"].get(RJ) == "node")
    scenario.wait_condition("regrow", "True", "Scheduled")
    scenario.assert_tied("regrow")


def test_a_workload_deleted_under_a_running_gang_is_made_again(
    scenario: Scenario, pool: Pool
) -> None:
    plan = scenario.start_gang(pool, "rewl")
    workload, pod_group = scenario.gang_objects(plan)
    pods = scenario.pods("rewl")
    assert scenario.cluster.delete(
        SCHEDULING_GROUP, scenario.cluster.scheduling_version, "workloads", plan.workload_name,
        scenario.namespace,
    )  # fmt: skip
    new_workload, new_pod_group = scenario.gang_objects(plan, not_uids=frozenset({uid(workload)}))
    assert uid(new_pod_group) == uid(pod_group), "the PodGroup of a running gang was recreated"
    time.sleep(3)  # and it stays so
    again = scenario.pod_group(pod_group["metadata"]["name"])
    assert again is not None and uid(again) == uid(pod_group)
    assert not again["metadata"].get("deletionTimestamp"), again["metadata"]
    assert placement(scenario.pods("rewl")) == placement(pods), "the running gang moved"
    assert uid(new_workload) != uid(workload)
    scenario.wait_condition("rewl", "True", "Scheduled")
    scenario.assert_tied("rewl")

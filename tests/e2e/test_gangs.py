"""End to end: kube-scheduler admits a TrainJob's gang whole or not at all. A gang larger than
the nodes binds no pod (its pods are tied and wait) and the `GangScheduling` condition says it
cannot fit (Infeasible: the service judges the nodes); a node more and every pod binds. A gang
that fits the nodes but not the room left on them (a plain pod holds one) binds none either
(WaitingForCapacity, kube-scheduler's Unschedulable) until the room is there. With a zone
topology constraint (needs TopologyAwareWorkloadScheduling), a gang that fits the cluster but
no single zone waits too, and lands in one zone once one is big enough."""

from __future__ import annotations

import pytest

from .cluster import Json, NotYet
from .objects import CREATED_BY, ZONE, level1, pod_spec, trainjob
from .scenario import Pool, Scenario, describe_pods

pytestmark = pytest.mark.e2e

QUIET = 8.0  # seconds a gang that cannot fit is watched not to bind (behaviour, not latency)
WAITING = ("Infeasible", "WaitingForCapacity")  # too big for the nodes / for the room left
SCHEDULED_CONDITIONS = ("PodGroupInitiallyScheduled", "PodGroupScheduled")  # 1.37, 1.36


def pod_group_condition(scenario: Scenario, name: str) -> dict[str, str] | None:
    obj = scenario.pod_group(name) or {}
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") in SCHEDULED_CONDITIONS:
            return dict(condition)
    return None


def test_a_gang_larger_than_the_nodes_binds_none_until_a_node_comes(
    scenario: Scenario, pool: Pool
) -> None:
    pool.add(3, cpu=1)  # room for 3 pods of 1 cpu; the gang is 4
    runtime = scenario.apply_runtime(level1("small", pool.name, scenario.namespace))
    scenario.create_trainjob(trainjob("small", scenario.namespace, runtime, num_nodes=3))
    plan = scenario.frozen_plan("small")
    (group,) = plan.groups
    assert group.min_count == 4
    scenario.gang_objects(plan)
    scenario.wait(lambda: len(scenario.pods("small")) == 4, "the 4 pods of small created")
    scenario.unbound_for("small", QUIET, expect=4)
    waiting = wait_waiting(scenario, "small")
    pool.add(1, cpu=1)
    pods = scenario.wait_bound("small", 4)
    assert len({p["spec"]["nodeName"] for p in pods}) == 4
    scenario.wait_condition("small", "True", "Scheduled")
    found = pod_group_condition(scenario, group.pod_group_name)
    assert found is not None and found.get("status") == "True", found
    assert waiting.get("message"), waiting
    scenario.assert_tied("small")


def test_a_gang_without_room_binds_none_until_a_pod_leaves(scenario: Scenario, pool: Pool) -> None:
    (blocked, *_) = pool.add(4, cpu=1)  # the gang of 4 fits the nodes, but one is taken
    blocker: Json = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "blocker", "labels": dict(CREATED_BY)},
        "spec": {**pod_spec(pool.name, "blocker"), "nodeName": blocked},
    }  # fmt: skip
    scenario.cluster.create("", "v1", "pods", blocker, scenario.namespace)
    runtime = scenario.apply_runtime(level1("crowded", pool.name, scenario.namespace))
    scenario.create_trainjob(trainjob("crowded", scenario.namespace, runtime, num_nodes=3))
    plan = scenario.frozen_plan("crowded")
    (group,) = plan.groups
    scenario.gang_objects(plan)
    scenario.wait(lambda: len(scenario.pods("crowded")) == 4, "the 4 pods of crowded created")
    scenario.unbound_for("crowded", QUIET, expect=4)

    def unschedulable() -> dict[str, str]:
        found = pod_group_condition(scenario, group.pod_group_name)
        if not found or found.get("status") != "False":
            raise NotYet(f"PodGroup condition {found}")
        return found

    verdict = scenario.wait(unschedulable, "kube-scheduler's verdict on the PodGroup")
    assert verdict.get("reason") == "Unschedulable", verdict
    scenario.wait_condition("crowded", "False", "WaitingForCapacity")
    scenario.cluster.delete("", "v1", "pods", "blocker", scenario.namespace, grace_seconds=0)
    pods = scenario.wait_bound("crowded", 4)
    assert blocked in {p["spec"]["nodeName"] for p in pods}, describe_pods(pods)
    scenario.wait_condition("crowded", "True", "Scheduled")
    scenario.assert_tied("crowded")


def wait_waiting(scenario: Scenario, name: str) -> Json:
    def check() -> Json:
        found = scenario.condition(name)
        if not found or found.get("status") != "False" or found.get("reason") not in WAITING:
            raise NotYet(f"condition {found}")
        return found

    return scenario.wait(check, f"TrainJob {name}: GangScheduling False, {' or '.join(WAITING)}")


def test_a_zone_gang_waits_for_one_zone_big_enough(scenario: Scenario, pool: Pool) -> None:
    if not scenario.facts.topology:
        pytest.skip(
            "TopologyAwareWorkloadScheduling is off: the server drops schedulingConstraints "
            "(test_gates.py covers that configuration)"
        )
    pool.add(2, cpu=1, labels={ZONE: "zone-a"})
    pool.add(2, cpu=1, labels={ZONE: "zone-b"})  # 4 cpus in all, 2 per zone; the gang is 3
    runtime = scenario.apply_runtime(
        level1("zonal", pool.name, scenario.namespace,
               schedulingConstraints={"topology": [{"key": ZONE}]})
    )  # fmt: skip
    scenario.create_trainjob(trainjob("zonal", scenario.namespace, runtime, num_nodes=2))
    plan = scenario.frozen_plan("zonal")
    (group,) = plan.groups
    assert (group.min_count, group.topology_key) == (3, ZONE)
    scenario.gang_objects(plan)
    scenario.wait(lambda: len(scenario.pods("zonal")) == 3, "the 3 pods of zonal created")
    scenario.unbound_for("zonal", QUIET, expect=3)
    wait_waiting(scenario, "zonal")
    (extra,) = pool.add(1, cpu=1, labels={ZONE: "zone-b"})
    pods = scenario.wait_bound("zonal", 3)
    zones = {
        (scenario.cluster.get("", "v1", "nodes", p["spec"]["nodeName"]) or {})["metadata"][
            "labels"
        ].get(ZONE)
        for p in pods
    }
    assert zones == {"zone-b"}, zones
    assert extra in {p["spec"]["nodeName"] for p in pods}
    scenario.wait_condition("zonal", "True", "Scheduled")
    scenario.assert_tied("zonal")

"""End to end against a real kube-apiserver, the reconciler's side: a TrainJob on a level-1
runtime (zone topology, `disruptionMode: all`) whose pods can land on no node gets its Workload
and PodGroup (names from the planner, owner references, controllerRef, the template reference,
minCount, the runtime snapshot, `Created` Events, no churn), loses them on suspend, gets new
ones on resume, and the garbage collector removes them when the TrainJob is deleted.

The service runs with the chart's webhooks registered (conftest.py), so the runtime and the
TrainJob also went through its admission; the gang objects are read in the scheduling.k8s.io
version discovery lists (v1beta1 on 1.37, v1alpha2 on 1.36).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from kubernetes.client.exceptions import ApiException

from webhook.core.fields import parse
from webhook.core.plan import Plan, build_plan
from webhook.core.snapshot import SNAPSHOT_ANNOTATION, from_annotations
from webhook.core.trainer import TrainJob
from webhook.reconcile.reconciler import CONTROLLER

from .cluster import Json, NotYet, timeout
from .objects import (
    NUM_NODES,
    ZONE,
    cluster_runtime,
    controller_of,
    disruption,
    min_count,
    plan_for,
    template_ref,
    trainjob,
    trainjob_owner,
    uid,
)
from .scenario import Scenario

pytestmark = pytest.mark.e2e

MANAGED_BY = {"app.kubernetes.io/managed-by": "trainjob-scheduling-webhook"}


@dataclass(frozen=True)
class Gang:
    """A TrainJob that has converged: it and its objects, as stored."""

    trainjob: Json
    plan: Plan
    workload: Json
    pod_group: Json


@pytest.fixture(scope="module")
def runtime(scenario: Scenario) -> Json:
    """The module's level-1 ClusterTrainingRuntime, as the API server stored it (admitted by the
    service's runtime webhooks)."""
    return scenario.apply_runtime(cluster_runtime(scenario.namespace))


@pytest.fixture(scope="module")
def gang(scenario: Scenario, runtime: Json) -> Iterator[Gang]:
    """TrainJob `gang` (numNodes 4) created, and its Workload and PodGroup there."""
    created = scenario.create_trainjob(trainjob("gang", scenario.namespace, _name(runtime)))
    plan = plan_for(created, runtime)
    assert len(plan.groups) == 1, plan  # level 1: one gang of every pod
    assert scenario.frozen_plan("gang") == plan
    workload, pod_group = scenario.gang_objects(plan)
    stored = scenario.trainjob("gang")
    assert stored is not None
    yield Gang(stored, plan, workload, pod_group)
    with contextlib.suppress(ApiException):  # best effort: the namespace goes at the end anyway
        scenario.delete_trainjob("gang")


def _name(obj: Json) -> str:
    return str(obj["metadata"]["name"])


def test_the_runtime_was_stored_with_its_scheduling(runtime: Json) -> None:
    assert runtime["spec"].get("scheduling"), (
        "the API server pruned spec.scheduling: the ClusterTrainingRuntime CRD does not declare "
        "it (install tests/e2e/crds/)"
    )


def test_the_workload_is_controlled_by_the_trainjob(scenario: Scenario, gang: Gang) -> None:
    wl, tj, plan = gang.workload, gang.trainjob, gang.plan
    assert wl["metadata"]["name"] == plan.workload_name
    assert wl["metadata"]["ownerReferences"] == [trainjob_owner(tj)]
    assert wl["spec"]["controllerRef"] == {
        "apiGroup": "trainer.kubeflow.org", "kind": "TrainJob", "name": "gang",
    }  # fmt: skip
    assert MANAGED_BY.items() <= (wl["metadata"].get("labels") or {}).items()
    [template] = wl["spec"]["podGroupTemplates"]
    assert template["name"] == plan.groups[0].template_name
    assert template["schedulingPolicy"] == {"gang": {"minCount": NUM_NODES}}
    if "disruptionMode" not in (scenario.facts.dropped_fields or ()):  # WorkloadAwarePreemption
        assert disruption(template) == "all"


def test_the_pod_group_belongs_to_the_workload_with_min_count(
    scenario: Scenario, gang: Gang
) -> None:
    pg, wl, group = gang.pod_group, gang.workload, gang.plan.groups[0]
    assert pg["metadata"]["name"] == group.pod_group_name
    assert controller_of(pg) == trainjob_owner(gang.trainjob)
    others = [r for r in pg["metadata"]["ownerReferences"] if not r.get("controller")]
    for ref in others:  # the optional second owner (KEP-3015): the Workload, not a controller
        assert (ref["kind"], ref["name"], ref["uid"]) == (
            "Workload",
            wl["metadata"]["name"],
            uid(wl),
        )
    assert template_ref(pg) == (gang.plan.workload_name, group.template_name)
    assert pg["spec"]["schedulingPolicy"] == {"gang": {"minCount": NUM_NODES}}
    assert group.min_count == NUM_NODES
    if "disruptionMode" not in (scenario.facts.dropped_fields or ()):  # WorkloadAwarePreemption
        assert disruption(pg["spec"]) == "all"


def test_the_zone_topology_constraint_is_kept(scenario: Scenario, gang: Gang) -> None:
    """Needs TopologyAwareWorkloadScheduling on the API server; without it the server drops
    `schedulingConstraints` from both objects, which is a cluster setting, not a bug here."""
    wanted = {"topology": [{"key": ZONE}]}
    template = gang.workload["spec"]["podGroupTemplates"][0]
    if not scenario.facts.topology:
        pytest.skip(
            "TopologyAwareWorkloadScheduling is off: the API server drops schedulingConstraints "
            "from Workloads and PodGroups (test_gates.py covers that configuration)"
        )
    assert template.get("schedulingConstraints") == wanted
    assert gang.pod_group["spec"].get("schedulingConstraints") == wanted


def test_the_runtime_snapshot_is_on_the_trainjob(gang: Gang) -> None:
    annotations = gang.trainjob["metadata"].get("annotations") or {}
    assert SNAPSHOT_ANNOTATION in annotations
    frozen = from_annotations(annotations)
    assert frozen is not None, annotations[SNAPSHOT_ANNOTATION]
    job, _ = parse(TrainJob, gang.trainjob)
    assert job is not None
    assert frozen.runtime is not None, "frozen without a gang"
    # The snapshot plans what the runtime plans, with the names of its plan version.
    assert build_plan(job, frozen.runtime, frozen.version) == gang.plan


def test_created_events_name_both_objects(scenario: Scenario, gang: Gang) -> None:
    trainjob_uid = uid(gang.trainjob)

    def created() -> list[str]:
        notes = [
            str(e.get("note"))
            for e in scenario.events()
            if e.get("reason") == "Created"
            and (e.get("regarding") or {}).get("uid") == trainjob_uid
            and e.get("reportingController") == CONTROLLER
            and e.get("type") == "Normal"
        ]
        names = [gang.plan.workload_name, gang.plan.groups[0].pod_group_name]
        if not all(any(name in note for note in notes) for name in names):
            raise NotYet(f"Created events: {notes}")
        return notes

    notes = scenario.wait(created, "Created events for the Workload and the PodGroup")
    assert any("Workload" in n for n in notes) and any("PodGroup" in n for n in notes)


def test_a_converged_gang_is_left_alone(scenario: Scenario, gang: Gang) -> None:
    """Server defaults (priority, preemptionPolicy, ...) must not read as drift: no
    delete-and-recreate loop. A few seconds of quiet, then the same objects."""
    time.sleep(min(10.0, timeout() / 6))
    workload = scenario.workload(gang.plan.workload_name)
    pod_group = scenario.pod_group(gang.plan.groups[0].pod_group_name)
    assert workload is not None and uid(workload) == uid(gang.workload)
    assert pod_group is not None and uid(pod_group) == uid(gang.pod_group)
    assert min_count(pod_group["spec"]) == NUM_NODES


def test_pods_that_can_land_nowhere_are_tied_and_wait(scenario: Scenario, gang: Gang) -> None:
    """Trainer, JobSet and the Job controller make the 4 pods; each names the PodGroup (the pod
    webhook), and none binds (no node matches their nodeSelector)."""

    def created() -> list[Json]:
        pods = scenario.pods("gang")
        if len(pods) != NUM_NODES:
            raise NotYet(f"{len(pods)} pods")
        return pods

    pods = scenario.wait(created, "the 4 pods of TrainJob gang")
    assert not [p for p in pods if p["spec"].get("nodeName")]
    scenario.assert_tied("gang")


def test_suspend_removes_resume_recreates_delete_collects(
    scenario: Scenario, runtime: Json
) -> None:
    created = scenario.create_trainjob(trainjob("cycle", scenario.namespace, _name(runtime)))
    plan = plan_for(created, runtime)
    workload, *pod_groups = scenario.gang_objects(plan)
    trainjob_obj = scenario.trainjob("cycle")
    assert trainjob_obj is not None
    old = frozenset([uid(workload), *(uid(pg) for pg in pod_groups)])

    # Suspend: the TrainJob stays, so only the service can have deleted them.
    scenario.set_suspend("cycle", True)
    scenario.gone(plan, "the TrainJob is suspended")
    assert scenario.trainjob("cycle") is not None

    # Resume: new objects (new uids), once the old ones have really gone.
    scenario.set_suspend("cycle", False)
    plan = scenario.frozen_plan("cycle")  # the resumed run's names (plan version 3: its own)
    workload, *pod_groups = scenario.gang_objects(plan, not_uids=old)
    again = scenario.trainjob("cycle")
    assert again is not None and uid(again) == uid(trainjob_obj)  # the same TrainJob
    owner = trainjob_owner(trainjob_obj)
    assert workload["metadata"]["ownerReferences"] == [owner]
    assert all(controller_of(pg) == owner for pg in pod_groups)

    # Delete: no finalizer of ours; the garbage collector removes what the TrainJob owned,
    # once the TrainJob itself is gone (background propagation).
    assert scenario.delete_trainjob("cycle")

    def trainjob_gone() -> bool:
        left = scenario.trainjob("cycle")
        if left is not None:
            raise NotYet(f"TrainJob still there, finalizers {left['metadata'].get('finalizers')}")
        return True

    scenario.wait(trainjob_gone, "the TrainJob deleted")
    scenario.gone(plan, "garbage collection after the TrainJob was deleted", 2 * timeout())

"""End to end against a real kube-apiserver: a TrainJob on a gang-scheduling runtime gets its
Workload and PodGroup, loses them on suspend, gets new ones on resume, and the garbage collector
removes them when the TrainJob is deleted.

Runs only when a cluster is named (tests/e2e/README.md has the whole story):

* `E2E_KUBECONFIG`, else `KUBECONFIG`: the kubeconfig (its current context); neither set: skip.
  `~/.kube/config` is never picked up on its own.
* `E2E=0` skips even then; `E2E=1` turns every skip (no cluster, GenericWorkload off, no
  Trainer CRDs) into a failure, for a CI job that must run these.
* `E2E_EXTERNAL_SERVICE=1`: the service is already deployed in the cluster (watching all
  namespaces, or the `wasched-e2e-*` ones); the tests only observe it.
* `E2E_TIMEOUT` (seconds, default 90) bounds each wait; `E2E_KEEP=1` keeps the namespace and the
  ClusterTrainingRuntime for a look afterwards; `E2E_SKIP_CRD_CHECK=1` skips reading the runtime
  CRD (for API servers without apiextensions, such as the test emulator).

Without `E2E_EXTERNAL_SERVICE`, the tests start `python -m webhook serve --kubeconfig <it>
--namespace <test ns> --watch-namespaces <test ns> --metrics-auth=false --leader-elect=false`
with development certificates on free ports. No ValidatingWebhookConfiguration or
MutatingWebhookConfiguration is created, so the API server never calls its webhooks: this
exercises the reconciler (and the objects the API server accepts from it) only, not admission
and not pod `schedulingGroup` injection.

What the cluster needs: Kubernetes 1.37 with the `GenericWorkload` feature gate on and
`--runtime-config=scheduling.k8s.io/v1beta1=true` (else skip: "GenericWorkload off"), the Kubeflow
Trainer v2.4 CRDs whose runtimes declare `spec.scheduling` (tests/e2e/crds/; else skip).
`TopologyAwareWorkloadScheduling` is optional: without it the API server drops
`schedulingConstraints` and the topology test is an expected failure. The Trainer controller is
optional: nothing here depends on JobSets or pods (if it runs, its pods stay Pending on a
nodeSelector no node has). Its own workload-aware scheduling (gate
`TrainJobWorkloadAwareScheduling`) must be off, and no other copy of this service may reconcile
the test namespace.

RBAC of the kubeconfig's user (cluster-admin is simplest): create/delete namespaces; get/create/
delete clustertrainingruntimes; get customresourcedefinitions; in the test namespace get/list/
watch/create/patch/delete trainjobs, workloads and podgroups, create/patch/list events
(events.k8s.io) and update trainjobs/finalizers (blockOwnerDeletion under
OwnerReferencesPermissionEnforcement); list/watch of the Trainer resources the service watches.
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
from .objects import NUM_NODES, ZONE, controller_of, plan_for, trainjob, trainjob_owner
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


def uid(obj: Json) -> str:
    return str(obj["metadata"]["uid"])


@pytest.fixture(scope="module")
def gang(scenario: Scenario) -> Iterator[Gang]:
    """TrainJob `gang` (numNodes 4) created, and its Workload and PodGroup there."""
    created = scenario.create_trainjob(trainjob("gang", scenario.namespace, _runtime(scenario)))
    plan = plan_for(created, scenario.runtime)
    assert len(plan.groups) == 1, plan  # level 1: one gang of every pod
    stored, workload, [pod_group] = scenario.converged("gang", plan)
    yield Gang(stored, plan, workload, pod_group)
    with contextlib.suppress(ApiException):  # best effort: the namespace goes at the end anyway
        scenario.delete_trainjob("gang")


def _runtime(scenario: Scenario) -> str:
    return str(scenario.runtime["metadata"]["name"])


def test_the_workload_is_controlled_by_the_trainjob(gang: Gang) -> None:
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
    assert template.get("disruptionMode") == {"all": {}}


def test_the_pod_group_belongs_to_the_workload_with_min_count(gang: Gang) -> None:
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
    assert pg["spec"]["workloadRef"] == {
        "workloadName": gang.plan.workload_name, "templateName": group.template_name,
    }  # fmt: skip
    assert pg["spec"]["schedulingPolicy"] == {"gang": {"minCount": NUM_NODES}}
    assert group.min_count == NUM_NODES
    assert pg["spec"].get("disruptionMode") == {"all": {}}


def test_the_zone_topology_constraint_is_kept(gang: Gang) -> None:
    """Needs TopologyAwareWorkloadScheduling on the API server; without it the server drops
    `schedulingConstraints` from both objects, which is a cluster setting, not a bug here."""
    wanted = {"topology": [{"key": ZONE}]}
    template = gang.workload["spec"]["podGroupTemplates"][0]
    kept = [obj for obj in (template, gang.pod_group["spec"]) if "schedulingConstraints" in obj]
    if not kept:
        pytest.xfail(
            "TopologyAwareWorkloadScheduling is off: the API server dropped "
            "schedulingConstraints from the Workload and the PodGroup"
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
    assert pod_group["spec"]["schedulingPolicy"] == {"gang": {"minCount": NUM_NODES}}


def test_suspend_removes_resume_recreates_delete_collects(scenario: Scenario) -> None:
    created = scenario.create_trainjob(trainjob("cycle", scenario.namespace, _runtime(scenario)))
    plan = plan_for(created, scenario.runtime)
    trainjob_obj, workload, pod_groups = scenario.converged("cycle", plan)
    old = frozenset([uid(workload), *(uid(pg) for pg in pod_groups)])

    # Suspend: the TrainJob stays, so only the service can have deleted them.
    scenario.set_suspend("cycle", True)
    scenario.gone(plan, "the TrainJob is suspended")
    assert scenario.trainjob("cycle") is not None

    # Resume: new objects (new uids), once the old ones have really gone.
    scenario.set_suspend("cycle", False)
    again, workload, pod_groups = scenario.converged("cycle", plan, not_uids=old)
    assert uid(again) == uid(trainjob_obj)  # the same TrainJob
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

"""End to end: what depends on the cluster's configuration, learnt from the server itself
(discovery, the API server's feature gates in its /metrics, a dry-run PodGroup), never from the
environment:

* the service writes its gang objects in the scheduling.k8s.io version discovery lists (1.37:
  v1beta1; 1.36: v1alpha2);
* where the server drops a gated field (TopologyAwareWorkloadScheduling, WorkloadAwarePreemption
  off: topology, disruptionMode, priorityClassName), the gang is made once and kept, not
  deleted and made again in a loop (the number of creations is in the assertion message): the
  TrainJob gets one `FeatureGateOff` Warning naming each field and its gate, its condition is
  False while the gang waits (FeatureGateOff, or WaitingForCapacity once kube-scheduler said
  Unschedulable, naming the fields and gates) and True/Scheduled once it is scheduled (never
  DriftHeld), and `trainjob_scheduling_gang_fields_dropped{kind, field, gate}` says it;
* with WorkloadWithJob on, a plain Indexed Job still gets the Job controller's own gang (the
  service leaves it alone); test_levels.py checks that ganged TrainJobs' Jobs get none.
"""

from __future__ import annotations

import time

import pytest

from webhook.backends.native import GATES

from .cluster import SCHEDULING_GROUP, Json, NotYet, api_path, probe_dropped_fields
from .conftest import NOTES
from .objects import CREATED_BY, ZONE, level1, pod_spec, trainjob, uid
from .recorder import CreationCounter, Watcher
from .registration import RUN_LABEL
from .scenario import Pool, Scenario, describe_pods

pytestmark = pytest.mark.e2e

OBSERVE = 30.0  # seconds a converged gang is watched for re-creations
DROPPED_METRIC = "trainjob_scheduling_gang_fields_dropped"


def test_the_gang_objects_are_written_in_the_served_version(scenario: Scenario, pool: Pool) -> None:
    pool.add(1, cpu=8)
    stored = scenario.apply_runtime(level1("served", pool.name, scenario.namespace))
    scenario.create_trainjob(trainjob("served", scenario.namespace, stored, num_nodes=1))
    plan = scenario.frozen_plan("served")
    workload, _ = scenario.gang_objects(plan)
    version = f"{SCHEDULING_GROUP}/{scenario.facts.scheduling_version}"
    written = {entry.get("apiVersion") for entry in workload["metadata"].get("managedFields") or []}
    assert written == {version}, (
        f"the Workload was written as {written}, discovery serves {version}"
    )
    scenario.wait_bound("served", 2)
    scenario.wait_condition("served", "True", "Scheduled")
    scenario.assert_tied("served")


def test_gated_fields_the_server_drops_are_reported_not_recreated(
    scenario: Scenario, pool: Pool
) -> None:
    cluster, namespace = scenario.cluster, scenario.namespace
    priority_class = f"e2e-{scenario.run.id}-high"
    cluster.create("scheduling.k8s.io", "v1", "priorityclasses", {
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": priority_class, "labels": {**CREATED_BY, RUN_LABEL: scenario.run.id}},
        "value": 1000, "description": "trainjob-scheduling e2e",
    })  # fmt: skip
    try:
        dropped = probe_dropped_fields(cluster, namespace, priority_class)
        if dropped is None:
            pytest.skip("the server refused the dry-run PodGroup probe")
        if not dropped:
            pytest.skip(
                "this server keeps every gated PodGroup field (topology, disruptionMode, "
                "priorityClassName): their gates are on, nothing is dropped"
            )
        _gated_fields_case(scenario, pool, priority_class, dropped)
    finally:
        cluster.delete("scheduling.k8s.io", "v1", "priorityclasses", priority_class)


def _gated_fields_case(
    scenario: Scenario, pool: Pool, priority_class: str, dropped: frozenset[str]
) -> None:
    cluster, namespace, name = scenario.cluster, scenario.namespace, "gated"
    version = cluster.scheduling_version
    counters = {
        plural: CreationCounter(cluster, api_path(SCHEDULING_GROUP, version, plural, namespace))
        for plural in ("workloads", "podgroups")
    }
    reasons: list[str] = []

    def seen(kind: str, obj: Json) -> None:
        if (obj.get("metadata") or {}).get("name") != name:
            return
        for condition in (obj.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "GangScheduling":
                reason = str(condition.get("reason"))
                if not reasons or reasons[-1] != reason:
                    reasons.append(reason)

    conditions = Watcher(
        cluster, api_path("trainer.kubeflow.org", "v1alpha1", "trainjobs", namespace), seen
    )
    for counter in counters.values():
        counter.start()
    conditions.start()
    try:
        # Room for the gang of 3 once a plain pod (of the same priority: not preempted) leaves.
        (taken, *_) = pool.add(3, cpu=1, labels={ZONE: "zone-a"})
        blocker = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "blocker", "labels": dict(CREATED_BY)},
            "spec": {**pod_spec(pool.name, "blocker"), "nodeName": taken,
                     "priorityClassName": priority_class},
        }  # fmt: skip
        cluster.create("", "v1", "pods", blocker, namespace)
        body = level1(
            name, pool.name, namespace,
            schedulingConstraints={"topology": [{"key": ZONE}]},
            disruptionMode={"all": {}},
        )  # fmt: skip
        for job in body["spec"]["template"]["spec"]["replicatedJobs"]:
            job["template"]["spec"]["template"]["spec"]["priorityClassName"] = priority_class
        stored = scenario.apply_runtime(body)
        created = scenario.create_trainjob(trainjob(name, namespace, stored, num_nodes=2))
        plan = scenario.frozen_plan(name)
        scenario.gang_objects(plan)
        scenario.wait(lambda: len(scenario.pods(name)) == 3, "the 3 pods created")
        scenario.wait(lambda: said_dropped(scenario, name, dropped),
                      "the gang waits, its condition naming the dropped fields")  # fmt: skip
        cluster.delete("", "v1", "pods", "blocker", namespace, grace_seconds=0)
        scenario.wait_bound(name, 3)
        scenario.wait_condition(name, "True", "Scheduled")
        workload, pod_group = scenario.gang_objects(plan)
        time.sleep(OBSERVE)
        after = scenario.gang_objects(plan)
    finally:
        conditions.stop()
        for counter in counters.values():
            counter.stop()
    created_uids = {p: {u for _, u in c.added} for p, c in counters.items()}
    summary = (
        f"fields the server drops: {sorted(dropped)}; creations seen: "
        + ", ".join(f"{p} {len(u)} (deleted {len(counters[p].deleted)})"
                    for p, u in created_uids.items())
        + f"; condition reasons seen: {reasons}"
    )  # fmt: skip
    assert [uid(o) for o in after] == [uid(workload), uid(pod_group)], summary
    assert all(len(u) == 1 for u in created_uids.values()), (
        "the gang objects were deleted and made again: " + summary
    )
    assert "DriftHeld" not in reasons, summary
    notes = [
        str(e.get("note"))
        for e in scenario.events(uid(created), "FeatureGateOff")
        if e.get("type") == "Warning"
    ]
    assert len(notes) == 1, f"FeatureGateOff Events: {notes}; {summary}"
    for field in dropped:
        assert field in notes[0] and GATES.get(field, "") in notes[0], (field, notes[0])
    samples = scenario.service.metrics()
    if samples is not None:
        reported = {
            (dict(labels).get("field"), dict(labels).get("gate"))
            for (metric, labels), value in samples.items()
            if metric == DROPPED_METRIC and value >= 1
        }
        for field in dropped:
            assert (field, GATES.get(field)) in reported, (
                f"{DROPPED_METRIC} says {sorted(map(str, reported))}; {summary}"
            )
    scenario.assert_tied(name)
    NOTES.append(f"gated fields: {summary}")


def said_dropped(scenario: Scenario, name: str, dropped: frozenset[str]) -> Json:
    """The condition while the gang waits: False, FeatureGateOff (or WaitingForCapacity once
    kube-scheduler said Unschedulable: the service says the dropped fields with it), naming each
    dropped field and its gate."""
    found = scenario.condition(name)
    if not found or found.get("status") != "False":
        raise NotYet(f"condition {found}")
    if found.get("reason") not in ("FeatureGateOff", "WaitingForCapacity"):
        raise NotYet(f"condition {found}")
    message = str(found.get("message"))
    missing = [f for f in dropped if f not in message or GATES.get(f, "?") not in message]
    if missing:
        raise NotYet(f"the message does not name {missing} with their gates: {found}")
    return found


def test_a_plain_indexed_job_keeps_the_job_controllers_own_gang(
    scenario: Scenario, pool: Pool
) -> None:
    """WorkloadWithJob on (KEP-5547): the Job controller makes a Workload and a PodGroup for an
    Indexed Job of parallelism = completions > 1; the service leaves that Job and its pods
    alone."""
    gate = scenario.facts.gate("WorkloadWithJob")
    if gate is False:
        pytest.skip("WorkloadWithJob is off on this API server: the Job controller makes no gang")
    pool.add(1, cpu=4)
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "plain-indexed", "labels": dict(CREATED_BY)},
        "spec": {"parallelism": 2, "completions": 2, "completionMode": "Indexed",
                 "template": {"spec": {**pod_spec(pool.name, "work"), "restartPolicy": "Never"}}},
    }  # fmt: skip
    stored = scenario.cluster.create("batch", "v1", "jobs", job, scenario.namespace)
    assert not stored["spec"]["template"]["spec"].get("schedulingGroup"), stored["spec"]

    def theirs() -> Json:
        for workload in scenario.cluster.gangs("workloads", scenario.namespace):
            ref = workload["spec"].get("controllerRef") or {}
            if ref.get("kind") == "Job" and ref.get("name") == "plain-indexed":
                found: Json = workload
                return found
        raise NotYet("no Workload of the Job controller's")

    try:
        workload = scenario.wait(theirs, "the Job controller's Workload for the plain Job",
                                 seconds=None if gate else 20)  # fmt: skip
    except AssertionError:
        if gate is None:  # the gates were not readable, and nothing came: taken as off
            pytest.skip("no Workload of the Job controller's came: WorkloadWithJob looks off")
        raise
    assert "trainjob-scheduling-webhook" not in str(workload["metadata"].get("labels")), workload

    def bound() -> list[Json]:
        pods = scenario.cluster.list_objects(
            "",
            "v1",
            "pods",
            scenario.namespace,
            labels="batch.kubernetes.io/job-name=plain-indexed",
        )
        if len(pods) != 2 or not all(p["spec"].get("nodeName") for p in pods):
            raise NotYet(describe_pods(pods))
        return pods

    pods = scenario.wait(bound, "the plain Job's 2 pods bound")
    groups = {(p["spec"].get("schedulingGroup") or {}).get("podGroupName") for p in pods}
    theirs_groups = {
        pg["metadata"]["name"]
        for pg in scenario.cluster.gangs("podgroups", scenario.namespace)
        if any(
            r.get("kind") in ("Job", "Workload")
            for r in pg["metadata"].get("ownerReferences") or []
        )
    }
    assert len(groups) == 1 and groups <= theirs_groups, (groups, theirs_groups)

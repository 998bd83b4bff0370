"""End to end: a running gang through a TrainJob's life on the real controllers. Suspend and
resume (the PodGroup of the same name goes and comes back; resumed pods are tied to it),
re-apply under the same name (delete and create again at once: a new incarnation, new names,
never the old gang), a JobSet restart (a failed pod: the new attempt's pods name the new
attempt's PodGroup, all bound) and a foreground delete. Through all of it, no pod of a ganged
TrainJob is ever admitted without its planned PodGroup (the module's pod recorder saw every
pod)."""

from __future__ import annotations

import contextlib
import time

import pytest
from kubernetes.client.exceptions import ApiException

from webhook.core.plan import RESTART_ATTEMPT

from .cluster import JSON_PATCH, Json, NotYet
from .conftest import NOTES
from .objects import level1, replicated_job, runtime, trainjob, uid
from .recorder import JOBSET_UID
from .scenario import Pool, Scenario, describe_pods

pytestmark = pytest.mark.e2e

LOOP_WATCH = 10.0  # seconds a foreground delete that Trainer keeps alive is watched


def test_suspend_and_resume_a_running_gang(scenario: Scenario, pool: Pool) -> None:
    plan = scenario.start_gang(pool, "pause")
    workload, pod_group = scenario.gang_objects(plan)
    old = frozenset({uid(workload), uid(pod_group)})
    scenario.set_suspend("pause", True)
    scenario.wait(lambda: not scenario.pods("pause"), "the suspended TrainJob's pods deleted")
    scenario.gone(plan, "the TrainJob is suspended")
    scenario.wait_condition("pause", "False", "Suspended")
    scenario.set_suspend("pause", False)
    # The resumed run's gang: new objects (the planner's names for this run: plan version 3
    # gives each run after a resume a gang of its own), once the old ones have gone.
    resumed = scenario.frozen_plan("pause")
    scenario.gang_objects(resumed, not_uids=old)
    scenario.wait_bound("pause", 4)
    scenario.wait_condition("pause", "True", "Scheduled")
    scenario.assert_tied("pause")


def test_delete_and_apply_again_under_the_same_name(scenario: Scenario, pool: Pool) -> None:
    first = scenario.start_gang(pool, "again")
    old_uid = uid(scenario.trainjob("again") or {"metadata": {"uid": ""}})
    assert scenario.delete_trainjob("again")
    scenario.wait(lambda: scenario.trainjob("again") is None, "the TrainJob deleted")
    body = trainjob("again", scenario.namespace, _runtime_of(scenario, "again"), num_nodes=3)
    created = scenario.create_trainjob(body)  # at once: the old pods are still there
    assert uid(created) != old_uid
    second = scenario.frozen_plan("again")
    assert second.trainjob_uid == uid(created)
    old_names = {g.pod_group_name for g in first.groups}
    new_names = {g.pod_group_name for g in second.groups}
    assert not old_names & new_names, "a new incarnation must not share the old gang's names"
    scenario.gang_objects(second)

    def new_gang(pod: Json) -> bool:
        return (pod["spec"].get("schedulingGroup") or {}).get("podGroupName") in new_names

    scenario.wait_bound("again", 4, where=new_gang)

    def old_ones_gone() -> bool:
        left = [p for p in scenario.pods("again") if not new_gang(p)]
        if left:
            raise NotYet(f"pods of the first incarnation left: {describe_pods(left)}")
        return True

    scenario.wait(old_ones_gone, "the first incarnation's pods gone")
    pods = scenario.wait_bound("again", 4)
    scenario.wait_condition("again", "True", "Scheduled")
    scenario.assert_tied("again")
    owners = {scenario.recorder.jobset_owner.get(p["metadata"]["labels"].get(JOBSET_UID, ""))
              for p in pods}  # fmt: skip
    assert owners <= {uid(created), None}, owners


def _runtime_of(scenario: Scenario, name: str) -> Json:
    stored = scenario.cluster.get(
        "trainer.kubeflow.org", "v1alpha1", "trainingruntimes", name, scenario.namespace
    )
    assert stored is not None
    return stored


def test_a_jobset_restart_is_a_new_gang_tied_to_the_new_attempt(
    scenario: Scenario, pool: Pool
) -> None:
    """A pod fails; its Job (backoffLimit 0) fails; JobSet's failurePolicy restarts every Job
    (restart-attempt 1): the new pods name attempt 1's PodGroup and all bind."""
    pool.add(2, cpu=4)
    body = runtime(
        "restart",
        {"schedulingPolicy": {"gang": {}}},
        [
            replicated_job("node", pool.name, ancestor="trainer", backoff_limit=0),
            replicated_job("param-server", pool.name, container="ps", backoff_limit=0),
        ],
        namespace=scenario.namespace,
        jobset={"failurePolicy": {"maxRestarts": 3}},
    )
    plan = scenario.start_gang(pool, "restart", body)
    victim = scenario.pods("restart")[0]
    scenario.set_pod_status([victim], "Failed")
    restarted = plan.at_attempt(1)
    new_names = {g.pod_group_name for g in restarted.groups}
    assert not new_names & {g.pod_group_name for g in plan.groups}

    def attempt_one(pod: Json) -> bool:
        return bool(pod["metadata"]["labels"].get(RESTART_ATTEMPT) == "1")

    pods = scenario.wait_bound("restart", 4, where=attempt_one)
    assert {p["spec"]["schedulingGroup"]["podGroupName"] for p in pods} == new_names

    def only_attempt_one() -> bool:
        left = [p for p in scenario.pods("restart") if not attempt_one(p)]
        if left:
            raise NotYet(f"attempt 0 pods left: {describe_pods(left)}")
        return True

    scenario.wait(only_attempt_one, "the first attempt's pods gone")
    scenario.gang_objects(restarted)
    scenario.wait_condition("restart", "True", "Scheduled")
    scenario.assert_tied("restart")


@pytest.mark.parametrize("when", ["running", "starting"])
def test_a_foreground_delete_never_admits_a_pod_loose(
    scenario: Scenario, pool: Pool, when: str
) -> None:
    """`propagationPolicy: Foreground`: the TrainJob stays (deletionTimestamp) while the garbage
    collector deletes its JobSet, Jobs, pods, Workload and PodGroups; the Job controller keeps
    trying to make pods meanwhile. None is admitted once the deletion began (held:
    TrainJobDeleting), none ever untied; the service makes nothing; everything goes.

    Trainer (8c0f5059, the harness's) does not look at a TrainJob's deletionTimestamp: it makes
    the JobSet again each time the garbage collector deleted it, so the foreground delete never
    ends on its own. The test watches that loop for a while: every pod it brings is held (the
    Jobs' FailedCreate Events say `SchedulingBlocked: ... the TrainJob is being deleted`, and
    `trainjob_scheduling_pods_held_total{reason="TrainJobDeleting"}` counts them), none is
    admitted, let alone bound; then the test takes the foregroundDeletion finalizer off to end
    it, and says so."""
    name = f"fg-{when}"
    if when == "running":
        plan = scenario.start_gang(pool, name)
    else:
        pool.add(2, cpu=4)
        stored = scenario.apply_runtime(level1(name, pool.name, scenario.namespace))
        scenario.create_trainjob(trainjob(name, scenario.namespace, stored, num_nodes=3))
        plan = scenario.frozen_plan(name)
        scenario.wait(lambda: scenario.pods(name) or None, f"the first pod of {name}")
    held_before = scenario.held_count("TrainJobDeleting")
    assert scenario.delete_trainjob(name, propagation="Foreground")
    deleting = scenario.trainjob(name)
    since = str((deleting or {}).get("metadata", {}).get("deletionTimestamp") or "")

    def ended_or_looping() -> str:
        current = scenario.trainjob(name)
        if current is None:
            return "deleted"
        jobset = scenario.jobset(name) or {}
        made = str(jobset.get("metadata", {}).get("creationTimestamp") or "")
        if since and made > since:
            return "looping"  # Trainer made the JobSet again under a deleting TrainJob
        raise NotYet(f"TrainJob {name} still there, JobSet made {made or '-'}")

    outcome = scenario.wait(ended_or_looping, f"TrainJob {name} deleted (foreground)")
    if outcome == "looping":
        time.sleep(LOOP_WATCH)  # the loop goes on; every pod it brings must be held
        _held_for_the_deletion(scenario, name, held_before)
        NOTES.append(
            f"{name}: Trainer makes the JobSet again under a TrainJob being deleted in the "
            "foreground (it never ends on its own); the test took the foregroundDeletion "
            "finalizer off after watching the loop"
        )
        with contextlib.suppress(ApiException):
            scenario.cluster.patch(
                "trainer.kubeflow.org", "v1alpha1", "trainjobs", scenario.namespace, name,
                [{"op": "remove", "path": "/metadata/finalizers"}], content_type=JSON_PATCH,
            )  # fmt: skip
        scenario.wait(lambda: scenario.trainjob(name) is None, f"TrainJob {name} deleted")
    scenario.wait(lambda: not scenario.pods(name), f"the pods of {name} gone")
    scenario.gone(plan, "the TrainJob was deleted")
    scenario.assert_tied(name)
    late = [r.name for r in scenario.recorder.of(name) if since and r.created > since]
    assert not late, f"pods admitted after the TrainJob's deletion began ({since}): {late}"


def _held_for_the_deletion(scenario: Scenario, name: str, before: float | None) -> None:
    """The pods the Job controller made for the deleting TrainJob were held (denied: 403
    SchedulingBlocked, the Job says FailedCreate) as `TrainJobDeleting`, and counted."""

    def said() -> list[str]:
        found = [m for m in scenario.failed_creates(name) if "SchedulingBlocked" in m]
        if not any("the TrainJob is being deleted" in m for m in found):
            raise NotYet(f"FailedCreate Events of its Jobs: {scenario.failed_creates(name)}")
        return found

    scenario.wait(said, f"the Jobs of {name} say their pods were held for the deletion")
    held = scenario.held_count("TrainJobDeleting")
    if held is not None and before is not None:
        assert held > before, (
            f"trainjob_scheduling_pods_held_total{{reason=TrainJobDeleting}} stayed at {held}"
        )

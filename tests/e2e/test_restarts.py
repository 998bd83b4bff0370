"""End to end: JobSet restarts beside a gang, on the real JobSet controller (the harness runs
v0.12). The restart attempt is its JobSet's (`status.restarts`), never what a pod's label says:

* a bare pod a tenant makes with the labels of a TrainJob's pods and another restart attempt
  (`restart-attempt: "9"`, the gang label or not) next to its running gang is held
  (`RestartAttemptMismatch`): no gang is made for attempt 9, and the running gang keeps its
  Workload, its PodGroup and its bound pods;
* a `BlockingRecreate` restart deletes every Job of the attempt before it makes the next one's,
  a gap with no pods: the new attempt's PodGroup is made as soon as the JobSet counts the
  restart (before its pods come), the old attempt's is never made again, and every new pod
  binds in the new gang;
* a runtime with `spec.scheduling` whose JobSet `failurePolicy` recreates one Job of a running
  gang (`RestartJob`, `RestartJobAndIgnoreMaxRestarts`) is denied at apply, created or changed
  so, naming the field; `InPlaceRestart` (the pods stay bound) is admitted, and so is a runtime
  without `spec.scheduling` (no gang's: the service does not judge it)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kubernetes.client.exceptions import ApiException

from webhook.core.defaults import GANG_LABEL
from webhook.core.plan import JOB_INDEX, JOBSET_NAME, REPLICATED_JOB_NAME
from webhook.core.plan import RESTART_ATTEMPT as ATTEMPT
from webhook.core.trainer import ANCESTOR_LABEL

from .cluster import (
    JOBSET_GROUP,
    JOBSET_VERSION,
    SCHEDULING_GROUP,
    TRAINER_GROUP,
    TRAINER_VERSION,
    Json,
    api_path,
)
from .conftest import NOTES
from .objects import placement, plain_pod, replicated_job, runtime, uid
from .recorder import JOBSET_UID, CreationCounter, Watcher
from .scenario import Pool, Scenario, describe_pods

pytestmark = pytest.mark.e2e

OBSERVE = 10.0  # seconds the running gang is watched after the forged pods
STALL = 30.0  # seconds the new attempt's PodGroup may take after the JobSet counts the restart
GANG: Json = {"schedulingPolicy": {"gang": {}}}
FIELD = "spec.template.spec.failurePolicy.rules[0].action"


def _attempt(pod: Json) -> str | None:
    return (pod["metadata"].get("labels") or {}).get(ATTEMPT)


def test_a_forged_restart_attempt_pod_is_held_and_the_running_gang_kept(
    scenario: Scenario, pool: Pool
) -> None:
    plan = scenario.start_gang(pool, "forged")
    gang = [uid(o) for o in scenario.gang_objects(plan)]
    pods = scenario.wait_bound("forged", 4)
    jobset = scenario.jobset("forged")
    assert jobset is not None
    held_before = scenario.held_count("RestartAttemptMismatch")
    labels = {
        JOBSET_NAME: "forged", JOBSET_UID: uid(jobset), REPLICATED_JOB_NAME: "node",
        JOB_INDEX: "0", ATTEMPT: "9", ANCESTOR_LABEL: "trainer",
    }  # fmt: skip
    # With the gang label the pod goes to the pod webhook that holds (Fail); without it, to the
    # best-effort one (Ignore): the same judgement, and the service answers both.
    for name, more in (("forged-9", {GANG_LABEL: "true"}), ("forged-9-unlabelled", {})):
        with pytest.raises(ApiException) as refused:
            scenario.cluster.create(
                "", "v1", "pods", plain_pod(name, pool.name, {**labels, **more}),
                scenario.namespace,
            )  # fmt: skip
        body = str(refused.value.body)
        assert refused.value.status == 403, body
        assert "SchedulingBlocked" in body and "says attempt 9" in body, body
    forged_groups = [g.pod_group_name for g in plan.at_attempt(9).groups]
    deadline = time.monotonic() + OBSERVE
    while time.monotonic() < deadline:
        assert [uid(o) for o in scenario.gang_objects(plan)] == gang, "the running gang moved"
        assert placement(scenario.pods("forged")) == placement(pods), (
            f"the running gang's pods moved: {describe_pods(scenario.pods('forged'))}"
        )
        made = [n for n in forged_groups if scenario.pod_group(n) is not None]
        assert not made, f"a PodGroup was made for the forged attempt: {made}"
        time.sleep(1)
    held = scenario.held_count("RestartAttemptMismatch")
    if held is not None and held_before is not None:
        assert held - held_before >= 2, f"held RestartAttemptMismatch: {held_before} -> {held}"
    scenario.wait_condition("forged", "True", "Scheduled")
    scenario.assert_tied("forged")


def test_a_blocking_recreate_gap_gets_the_new_attempts_gang_at_once(
    scenario: Scenario, pool: Pool
) -> None:
    """A pod fails (its Job's backoffLimit is 0): JobSet restarts with BlockingRecreate,
    counting the restart in status.restarts, deleting attempt 0's Jobs and making attempt 1's
    only once they are all gone."""
    pool.add(2, cpu=4)
    body = runtime(
        "blocking", GANG,
        [
            replicated_job("node", pool.name, ancestor="trainer", backoff_limit=0),
            replicated_job("param-server", pool.name, container="ps", backoff_limit=0),
        ],
        namespace=scenario.namespace,
        jobset={"failurePolicy": {"maxRestarts": 3, "restartStrategy": "BlockingRecreate"}},
    )  # fmt: skip
    plan = scenario.start_gang(pool, "blocking", body)
    restarted = plan.at_attempt(1)
    old_names = {g.pod_group_name for g in plan.groups}
    new_names = {g.pod_group_name for g in restarted.groups}
    assert not old_names & new_names
    cluster, namespace = scenario.cluster, scenario.namespace
    path = api_path(SCHEDULING_GROUP, cluster.scheduling_version, "podgroups", namespace)
    created = CreationCounter(cluster, path)
    counted: list[float] = []  # when the JobSet's watch first showed status.restarts 1

    def restarts(kind: str, obj: Json) -> None:
        del kind
        if not counted and ((obj.get("status") or {}).get("restarts") or 0) >= 1:
            counted.append(time.monotonic())

    jobsets = Watcher(cluster, api_path(JOBSET_GROUP, JOBSET_VERSION, "jobsets", namespace),
                      restarts)  # fmt: skip
    created.start()
    jobsets.start()
    try:
        scenario.set_pod_status([scenario.pods("blocking")[0]], "Failed")
        new_pods = scenario.wait_bound("blocking", 4, where=lambda p: _attempt(p) == "1")
        scenario.gang_objects(restarted)
    finally:
        created.stop()
        jobsets.stop()
    assert counted, "the JobSet never counted the restart (status.restarts)"
    counted_at = counted[0]
    assert {p["spec"]["schedulingGroup"]["podGroupName"] for p in new_pods} == new_names
    again = [name for name, _ in created.added if name in old_names]
    assert not again, f"attempt 0's PodGroup was made again: {again}"
    made = {name: created.added_at[u] for name, u in created.added if name in new_names}
    assert set(made) == new_names, f"PodGroups made: {created.added}"
    records = scenario.recorder.of("blocking")
    old_gone = max(r.deleted_at or float("inf") for r in records if r.labels[ATTEMPT] == "0")
    first_new = min(r.seen_at for r in records if r.labels[ATTEMPT] == "1")
    assert old_gone < first_new, "BlockingRecreate made attempt 1's pods before 0's were gone"
    pod_group_at = max(made.values())
    assert pod_group_at - counted_at < STALL, (
        f"attempt 1's PodGroup came {pod_group_at - counted_at:.1f}s after the JobSet counted "
        "the restart"
    )
    # Made during the gap, not for the pods: no later than the first of them (the API server's
    # timestamps, to the second; the watches' clocks say the same to the tenth).
    first_pod = min(str(p["metadata"]["creationTimestamp"]) for p in new_pods)
    for name in new_names:
        pod_group = scenario.pod_group(name)
        assert pod_group is not None
        assert str(pod_group["metadata"]["creationTimestamp"]) <= first_pod, (pod_group, first_pod)
    NOTES.append(
        f"BlockingRecreate: no pods for {first_new - old_gone:.2f}s; attempt 1's PodGroup "
        f"{pod_group_at - counted_at:.2f}s after the JobSet counted the restart, "
        f"{first_new - pod_group_at:.2f}s before its first pod"
    )
    scenario.wait_condition("blocking", "True", "Scheduled")
    scenario.assert_tied("blocking")


def _restart_runtime(
    scenario: Scenario, name: str, scheduling: Json | None, failure_policy: Json | None
) -> Json:
    """A TrainingRuntime of one ReplicatedJob (pods on no node) with this JobSet failurePolicy."""
    return runtime(
        name, scheduling, [replicated_job("node", None, ancestor="trainer")],
        namespace=scenario.namespace,
        jobset={"failurePolicy": failure_policy} if failure_policy else None,
    )  # fmt: skip


def _denied(write: Callable[[], object], action: str) -> None:
    """The write is refused with 422, naming the rule's action field and the action."""
    with pytest.raises(ApiException) as refused:
        write()
    body = str(refused.value.body)
    assert refused.value.status == 422, body
    assert FIELD in body and action in body, body


@pytest.mark.parametrize("action", ["RestartJob", "RestartJobAndIgnoreMaxRestarts"])
def test_a_runtime_that_restarts_one_job_of_a_gang_is_denied(
    scenario: Scenario, action: str
) -> None:
    policy = {"maxRestarts": 3, "rules": [{"name": "again", "action": action}]}
    name = f"one-job-{action.lower()}"
    _denied(lambda: scenario.apply_runtime(_restart_runtime(scenario, name, GANG, policy)), action)
    # Applied again over a runtime that had no failurePolicy: the same denial.
    scenario.apply_runtime(_restart_runtime(scenario, name, GANG, None))
    patch = {"spec": {"template": {"spec": {"failurePolicy": policy}}}}
    _denied(
        lambda: scenario.cluster.merge_patch(
            TRAINER_GROUP, TRAINER_VERSION, "trainingruntimes", scenario.namespace, name, patch
        ),
        action,
    )
    # Without spec.scheduling the runtime is no gang's: admitted as if the service were absent.
    scenario.apply_runtime(_restart_runtime(scenario, f"plain-{name}", None, policy))


def test_in_place_restart_is_admitted(scenario: Scenario) -> None:
    """InPlaceRestart restarts containers in pods that stay bound: the gang keeps its nodes."""
    policy = {"maxRestarts": 3, "restartStrategy": "InPlaceRestart"}
    stored = scenario.apply_runtime(_restart_runtime(scenario, "in-place", GANG, policy))
    assert stored["spec"]["template"]["spec"]["failurePolicy"] == policy

"""The pod counts per Job that gang health is judged from: each watch event reduced to a Job and
a state, listeners told only when live or succeeded counts change (or a TrainJob's restart
attempt or untied pods), lists replacing a namespace."""

from __future__ import annotations

import random
from typing import Any

from webhook.core.plan import JOB_INDEX, JOBSET_NAME, REPLICATED_JOB_NAME, RESTART_ATTEMPT
from webhook.kube.gangpods import GangPods, state_of


def pod(
    name: str,
    *,
    ns: str = "ns",
    jobset: str = "job",
    rj: str = "node",
    index: Any = "0",
    node: str | None = "n1",
    phase: str = "Running",
    deleting: bool = False,
    attempt: Any = None,
    group: str | None = "pg",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "labels": {JOBSET_NAME: jobset, REPLICATED_JOB_NAME: rj, JOB_INDEX: index},
    }
    if attempt is not None:
        meta["labels"][RESTART_ATTEMPT] = attempt
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T10:00:00Z"
    spec: dict[str, Any] = {"nodeName": node} if node else {}
    if group is not None:
        spec["schedulingGroup"] = {"podGroupName": group}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def counts(pods: GangPods, ns: str = "ns", jobset: str = "job") -> dict[tuple[str, int], list[int]]:
    return {key: list(job.counts) for key, job in pods.jobs(ns, jobset).items()}


def test_states() -> None:
    assert state_of(pod("a")) == 1  # bound, running
    assert state_of(pod("a", phase="Pending")) == 1  # bound, starting
    assert state_of(pod("a", node=None, phase="Pending")) == 0
    assert state_of(pod("a", phase="Succeeded")) == 2
    assert state_of(pod("a", phase="Failed")) == 3
    assert state_of(pod("a", deleting=True)) == 3  # evicted or its node drained: lost


def test_a_pod_moves_between_counts_and_listeners_hear_of_live_changes_only() -> None:
    pods, heard = GangPods(), []
    pods.subscribe(lambda ns, name: heard.append((ns, name)))
    pods.apply("ADDED", pod("a", node=None, phase="Pending"))
    assert counts(pods) == {("node", 0): [1, 0, 0, 0]} and heard == []
    pods.apply("MODIFIED", pod("a", phase="Pending"))  # bound
    assert counts(pods) == {("node", 0): [0, 1, 0, 0]} and heard == [("ns", "job")]
    pods.apply("MODIFIED", pod("a"))  # running: still live, nothing to tell
    assert heard == [("ns", "job")]
    pods.apply("MODIFIED", pod("a", phase="Failed"))
    assert counts(pods) == {("node", 0): [0, 0, 0, 1]} and len(heard) == 2
    pods.apply("DELETED", pod("a", phase="Failed"))
    assert counts(pods) == {} and len(pods) == 0 and len(heard) == 2  # nothing live changed


def test_jobs_are_counted_apart_and_pods_of_others_ignored() -> None:
    pods = GangPods()
    pods.apply("ADDED", pod("a", index="0"))
    pods.apply("ADDED", pod("b", index="1"))
    pods.apply("ADDED", pod("c", rj="launcher"))
    pods.apply("ADDED", pod("d", jobset="other"))
    for bad in ("x", "-1", "²", 7, "1" * 11):
        pods.apply("ADDED", pod("e", index=bad))
    pods.apply("ADDED", {"metadata": {"name": "f", "namespace": "ns"}})
    assert counts(pods) == {
        ("node", 0): [0, 1, 0, 0],
        ("node", 1): [0, 1, 0, 0],
        ("launcher", 0): [0, 1, 0, 0],
    }
    assert len(pods) == 4


def test_a_list_replaces_its_namespace_and_tells_every_jobset_it_touched() -> None:
    pods, heard = GangPods(), set()
    pods.subscribe(lambda ns, name: heard.add((ns, name)))
    pods.apply("ADDED", pod("a"))
    pods.apply("ADDED", pod("z", ns="other"))
    heard.clear()
    pods.watched = ("ns", "other")
    pods.replace([pods.trim(pod("b", jobset="job2")), pods.trim({"metadata": {}})], "ns")
    assert not pods.synced  # "other" not listed yet
    assert counts(pods) == {} and counts(pods, "ns", "job2") == {("node", 0): [0, 1, 0, 0]}
    assert counts(pods, "other", "job") == {("node", 0): [0, 1, 0, 0]}  # untouched
    assert heard == {("ns", "job"), ("ns", "job2")}
    pods.replace([], "other")
    assert pods.synced and len(pods) == 1


def test_a_trimmed_pod_keeps_nothing_of_the_pod() -> None:
    big = pod("a")
    big["spec"]["containers"] = [{"name": "x" * 1000}]
    trimmed = GangPods().trim(big)
    assert set(trimmed) == {"job", "state", "attempt", "group"} and "x" * 10 not in repr(trimmed)


def test_a_relabelled_pod_leaves_the_job_it_counted_in() -> None:
    pods, heard = GangPods(), []
    pods.subscribe(lambda ns, name: heard.append((ns, name)))
    pods.apply("ADDED", pod("a"))
    pods.apply("MODIFIED", pod("a", index="1"))  # its job-index label edited
    assert counts(pods) == {("node", 1): [0, 1, 0, 0]} and len(pods) == 1
    pods.apply("MODIFIED", pod("a", jobset="other", index="1"))
    assert counts(pods) == {} and counts(pods, "ns", "other") == {("node", 1): [0, 1, 0, 0]}
    assert heard[-2:] == [("ns", "job"), ("ns", "other")]  # both JobSets' live counts changed
    for bad in ("x", "1" * 11):  # edited to what no Job is: counted nowhere
        pods.apply("MODIFIED", pod("a", index=bad))
        assert counts(pods, "ns", "other") == {} and len(pods) == 0
        pods.apply("MODIFIED", pod("a"))
    assert counts(pods) == {("node", 0): [0, 1, 0, 0]} and len(pods) == 1


def test_a_pod_that_leaves_the_selector_is_forgotten() -> None:
    """Its JobSet label removed: the watch says DELETED, with the object as it is now."""
    pods = GangPods()
    pods.apply("ADDED", pod("a"))
    pods.apply("ADDED", pod("b"))
    gone = pod("a")
    del gone["metadata"]["labels"][JOBSET_NAME]
    pods.apply("DELETED", gone)
    assert counts(pods) == {("node", 0): [0, 1, 0, 0]} and len(pods) == 1


def test_pods_of_the_same_name_in_two_namespaces_are_two_pods() -> None:
    pods = GangPods()
    pods.apply("ADDED", pod("a"))
    pods.apply("ADDED", pod("a", ns="other"))
    pods.apply("MODIFIED", pod("a", ns="other", index="1"))
    assert counts(pods) == {("node", 0): [0, 1, 0, 0]}
    assert counts(pods, "other") == {("node", 1): [0, 1, 0, 0]} and len(pods) == 2


def test_a_list_forgets_where_the_pods_it_replaces_were() -> None:
    pods = GangPods()
    pods.apply("ADDED", pod("a"))
    pods.replace([pods.trim(pod("a", index="2"))], "ns")
    pods.apply("MODIFIED", pod("a", index="3"))
    assert counts(pods) == {("node", 3): [0, 1, 0, 0]} and len(pods) == 1
    pods.replace([])
    pods.apply("DELETED", pod("a", index="3"))
    assert counts(pods) == {} and len(pods) == 0


def test_a_restart_attempt_is_the_newest_among_pods_still_present() -> None:
    """A JobSet restart deletes its pods (lost while they terminate) and makes new ones with the
    next attempt; the old attempt's are forgotten once they are gone."""
    pods, heard = GangPods(), []
    pods.subscribe(lambda ns, name: heard.append((ns, name)))
    assert pods.attempt("ns", "job") == 0  # nothing known
    pods.apply("ADDED", pod("a", attempt="0", index="0"))
    pods.apply("ADDED", pod("b", attempt="0", index="1"))
    assert pods.attempt("ns", "job") == 0
    heard.clear()
    pods.apply("MODIFIED", pod("a", attempt="0", index="0", deleting=True))
    pods.apply("MODIFIED", pod("b", attempt="0", index="1", deleting=True))
    pods.apply("ADDED", pod("a2", attempt="1", index="0", node=None, phase="Pending"))
    assert pods.attempt("ns", "job") == 1 and heard[-1] == ("ns", "job")
    heard.clear()
    pods.apply("ADDED", pod("b2", attempt="1", index="1", node=None, phase="Pending"))
    assert heard == []  # pending, the same attempt: nothing a listener acts on changed
    pods.apply("DELETED", pod("a", attempt="0", index="0", deleting=True))
    assert pods.attempt("ns", "job") == 1
    pods.apply("MODIFIED", pod("a2", attempt="1", index="0", phase="Failed"))
    pods.apply("MODIFIED", pod("b2", attempt="1", index="1", phase="Succeeded"))
    assert pods.attempt("ns", "job") == 0  # none present: lost and finished pods say nothing
    assert pods.attempt("other", "job") == 0


def test_an_attempt_label_is_parsed_bounded() -> None:
    pods = GangPods()
    for i, bad in enumerate(("x", "-1", "²", "1" * 11, str(2**31), " 1", 3)):
        pods.apply("ADDED", pod(f"bad{i}", attempt=bad))
    assert pods.attempt("ns", "job") == 0 and len(pods) == 7
    pods.apply("ADDED", pod("ok", attempt=str(2**31 - 1)))
    assert pods.attempt("ns", "job") == 2**31 - 1
    pods.apply("MODIFIED", pod("ok", attempt="2"))  # its label edited: counted at the new one
    assert pods.attempt("ns", "job") == 2


def test_untied_pods_are_the_present_ones_without_a_scheduling_group() -> None:
    pods, heard = GangPods(), []
    pods.subscribe(lambda ns, name: heard.append((ns, name)))
    pods.apply("ADDED", pod("tied", node=None, phase="Pending"))
    assert pods.untied("ns", "job") == 0 and heard == []
    pods.apply("ADDED", pod("loose", node=None, phase="Pending", group=None))
    assert pods.untied("ns", "job") == 1 and heard == [("ns", "job")]
    pods.apply("ADDED", pod("loose2", index="1", group=None))
    assert pods.untied("ns", "job") == 2
    # schedulingGroup is immutable: read when the pod is first seen, not from later events.
    pods.apply("MODIFIED", pod("loose", group="pg"))
    assert pods.untied("ns", "job") == 2
    heard.clear()
    pods.apply("MODIFIED", pod("loose", group=None, phase="Succeeded"))
    assert pods.untied("ns", "job") == 1 and heard == [("ns", "job")]
    pods.apply("MODIFIED", pod("loose2", index="1", group=None, deleting=True))
    assert pods.untied("ns", "job") == 0
    pods.apply("MODIFIED", pod("loose2", index="2", group=None))  # relabelled, present again
    assert pods.untied("ns", "job") == 1
    pods.apply("DELETED", pod("loose2", index="2", group=None))
    assert pods.untied("ns", "job") == 0 and pods.untied("ns", "nothing") == 0


def test_a_list_carries_attempts_and_untied_pods() -> None:
    pods, heard = GangPods(), set()
    pods.subscribe(lambda ns, name: heard.add((ns, name)))
    pods.replace(
        [
            pods.trim(pod("a", attempt="3", group=None)),
            pods.trim(pod("b", attempt="2", index="1")),
            pods.trim(pod("c", attempt="4", index="2", deleting=True, group=None)),
        ],
        "ns",
    )
    assert pods.attempt("ns", "job") == 3 and pods.untied("ns", "job") == 1
    assert heard == {("ns", "job")}
    pods.apply("MODIFIED", pod("a", attempt="3", group="pg"))  # remembered as listed: untied
    assert pods.untied("ns", "job") == 1
    pods.replace([], "ns")
    assert pods.attempt("ns", "job") == 0 and pods.untied("ns", "job") == 0


def test_pods_of_many_attempts_share_bounded_shapes() -> None:
    """Each pod is remembered as a tuple its Job shares: attempts that churn do not grow a Job's
    store past its bound, nor change what is counted."""
    pods = GangPods()
    for attempt in range(200):
        pods.apply("ADDED", pod(f"p{attempt}", attempt=str(attempt)))
        if attempt:
            pods.apply("DELETED", pod(f"p{attempt - 1}", attempt=str(attempt - 1)))
    job = pods.jobs("ns", "job")[("node", 0)]
    assert len(job._shapes) <= 64 and job.counts == [0, 1, 0, 0]
    assert pods.attempt("ns", "job") == 199 and len(pods) == 1


def test_attempt_and_untied_follow_any_sequence_of_events_and_each_change_is_told() -> None:
    """Against a model that keeps every pod: after each event, the same attempt and untied
    count, and a listener told whenever either changed."""
    rng = random.Random(26)
    pods, heard = GangPods(), []
    pods.subscribe(lambda ns, name: heard.append((ns, name)))
    model: dict[str, dict[str, Any]] = {}
    untied_of: dict[str, bool] = {}  # as first seen: immutable
    for _ in range(3000):
        name = f"p{rng.randrange(12)}"
        before = (pods.attempt("ns", "job"), pods.untied("ns", "job"))
        heard.clear()
        if rng.random() < 0.15:
            pods.apply("DELETED", pod(name))
            model.pop(name, None)
            untied_of.pop(name, None)
        else:
            raw = pod(
                name,
                index=str(rng.randrange(3)),
                attempt=str(rng.randrange(4)),
                node=rng.choice([None, "n1"]),
                phase=rng.choice(["Pending", "Running", "Succeeded", "Failed"]),
                deleting=rng.random() < 0.2,
                group=rng.choice([None, "pg"]),
            )
            pods.apply("MODIFIED", raw)
            model[name] = raw
            untied_of.setdefault(name, "schedulingGroup" not in raw["spec"])
        present = [(n, r) for n, r in model.items() if state_of(r) in (0, 1)]
        attempts = [int(r["metadata"]["labels"][RESTART_ATTEMPT]) for _, r in present]
        after = (max(attempts, default=0), sum(untied_of[n] for n, _ in present))
        assert (pods.attempt("ns", "job"), pods.untied("ns", "job")) == after
        if after != before:  # told (twice when its Job label moved: out of one, into another)
            assert heard and set(heard) == {("ns", "job")}


def test_untied_pods_of_the_jobs_a_plan_groups() -> None:
    """Pods of a ReplicatedJob no group targets rightly have no schedulingGroup: a caller
    that knows the plan counts only the grouped Jobs'."""
    pods = GangPods()
    pods.apply("ADDED", pod("init", rj="dataset-initializer", group=None))
    pods.apply("ADDED", pod("n0", group=None))
    pods.apply("ADDED", pod("n1", index="1"))
    assert pods.untied("ns", "job") == 2
    assert pods.untied("ns", "job", lambda rj, index: rj == "node") == 1
    assert pods.untied("ns", "job", lambda rj, index: rj == "node" and index == 1) == 0
    assert pods.jobs("ns", "job")[("node", 0)].untied == 1

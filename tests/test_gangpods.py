"""The pod counts per Job that gang health is judged from: each watch event reduced to a Job and
a state, listeners told only when live or succeeded counts change, lists replacing a namespace."""

from __future__ import annotations

from typing import Any

from webhook.core.plan import JOB_INDEX, JOBSET_NAME, REPLICATED_JOB_NAME
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
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "labels": {JOBSET_NAME: jobset, REPLICATED_JOB_NAME: rj, JOB_INDEX: index},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T10:00:00Z"
    return {
        "metadata": meta,
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase},
    }


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
    assert set(trimmed) == {"job", "state"} and "x" * 10 not in repr(trimmed)


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

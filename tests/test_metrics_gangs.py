"""Gang signals: synthetic PodGroups through a real cache `Store`, read back from the registry."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from webhook.backends.base import MANAGED_BY, MANAGED_BY_LABEL
from webhook.backends.native import POD_GROUP
from webhook.kube.cache import Cache
from webhook.metrics.gangs import GangTracker, gang_state
from webhook.metrics.registry import Metrics

CREATED = "2026-01-01T00:00:00Z"
T0 = 1767225600.0  # CREATED as unix time


def pod_group(
    name: str,
    condition: tuple[str, str | None, str] | None = None,
    policy: str = "gang",
    managed: bool = True,
    uid: str | None = None,
) -> dict[str, Any]:
    """A PodGroup; `condition` is PodGroupInitiallyScheduled's (status, reason, time)."""
    labels = {MANAGED_BY_LABEL: MANAGED_BY} if managed else {"app": "other"}
    obj: dict[str, Any] = {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": uid or f"uid-{name}",
            "labels": labels,
            "creationTimestamp": CREATED,
        },
        "spec": {
            "schedulingPolicy": {"gang": {"minCount": 4}} if policy == "gang" else {"basic": {}},
            "workloadRef": {"workloadName": "w", "templateName": "t"},
        },
    }
    if condition is not None:
        status, reason, at = condition
        cond = {"type": "PodGroupInitiallyScheduled", "status": status, "lastTransitionTime": at}
        if reason:
            cond["reason"] = reason
        other = {"type": "DisruptionTarget", "status": "False", "lastTransitionTime": at}
        obj["status"] = {"conditions": [other, cond]}
    return obj


def scheduled(at: str = "2026-01-01T00:00:42Z") -> tuple[str, str | None, str]:
    return ("True", "Scheduled", at)


def waiting(reason: str) -> tuple[str, str | None, str]:
    return ("False", reason, "2026-01-01T00:00:05Z")


class Gangs:
    def __init__(self) -> None:
        self.metrics = Metrics()
        self.cache = Cache(connected=True)
        self.cache.jobsets.replace([])  # listed, none: restart attempt 0
        self.store = self.cache.store(POD_GROUP)
        self.now = T0 + 600
        self.tracker = GangTracker(self.metrics, self.cache, clock=lambda: self.now)

    def count(self, policy: str, state: str, reason: str) -> float | None:
        labels = {"backend": "native", "policy": policy, "state": state, "reason": reason}
        return self.metrics.registry.get_sample_value("trainjob_scheduling_gangs", labels)

    def oldest(self, policy: str, reason: str) -> float | None:
        return self.metrics.registry.get_sample_value(
            "trainjob_scheduling_gangs_waiting_oldest_seconds",
            {"backend": "native", "policy": policy, "reason": reason},
        )

    def observed(self, policy: str, waited_on: str, what: str = "count") -> float:
        value = self.metrics.registry.get_sample_value(
            f"trainjob_scheduling_gang_time_to_scheduled_seconds_{what}",
            {"backend": "native", "policy": policy, "waited_on": waited_on},
        )
        return value or 0.0

    def all_observed(self) -> float:
        return sum(
            self.observed(p, w)
            for p in ("gang", "basic")
            for w in ("pods", "capacity", "scheduler_error", "other")
        )


def test_the_gauge_counts_managed_pod_groups_by_state_and_reason() -> None:
    g = Gangs()
    g.store.replace(
        [
            pod_group("fresh"),  # no verdict yet: assembling
            pod_group("full", waiting("Unschedulable")),
            pod_group("full-2", waiting("Unschedulable")),
            pod_group("broken", waiting("SchedulerError")),
            pod_group("odd", waiting("SomethingNew")),
            pod_group("running", scheduled()),
            pod_group("single", scheduled(), policy="basic"),
            pod_group("foreign", waiting("Unschedulable"), managed=False),
        ]
    )
    assert g.count("gang", "waiting", "NotEvaluated") == 1
    assert g.count("gang", "waiting", "Unschedulable") == 2
    assert g.count("gang", "waiting", "SchedulerError") == 1
    assert g.count("gang", "waiting", "Other") == 1
    assert g.count("gang", "scheduled", "Scheduled") == 1
    assert g.count("basic", "scheduled", "Scheduled") == 1
    assert g.count("basic", "waiting", "Unschedulable") == 0  # every series exists, zeros too
    assert g.oldest("gang", "Unschedulable") == 600
    assert g.oldest("basic", "NotEvaluated") == 0
    # follows changes at scrape time
    g.store.apply("MODIFIED", pod_group("full", scheduled()))
    g.store.apply("DELETED", pod_group("full-2"))
    assert g.count("gang", "waiting", "Unschedulable") == 0
    assert g.count("gang", "scheduled", "Scheduled") == 2


def test_no_object_names_in_labels() -> None:
    g = Gangs()
    g.store.replace([pod_group("secret-project-x", waiting("Unschedulable"))])
    for family in g.metrics.registry.collect():
        for sample in family.samples:
            assert "secret-project-x" not in str(sample.labels), sample


@pytest.mark.parametrize(
    ("history", "waited_on"),
    [
        ([None], "pods"),  # created, never judged until scheduled: assembly took the time
        ([None, waiting("Unschedulable")], "capacity"),
        ([waiting("Unschedulable"), waiting("Unschedulable")], "capacity"),
        ([None, waiting("SchedulerError"), waiting("Unschedulable")], "scheduler_error"),
        ([waiting("Unschedulable"), waiting("SchedulerError")], "scheduler_error"),
        ([waiting("SomethingNew")], "other"),
    ],
)
def test_time_to_scheduled_says_what_the_gang_waited_on(
    history: list[tuple[str, str | None, str] | None], waited_on: str
) -> None:
    g = Gangs()
    g.store.apply("ADDED", pod_group("job", history[0]))
    for condition in history[1:]:
        g.store.apply("MODIFIED", pod_group("job", condition))
    assert g.all_observed() == 0
    g.store.apply("MODIFIED", pod_group("job", scheduled("2026-01-01T00:01:30Z")))
    assert g.observed("gang", waited_on) == 1
    assert g.observed("gang", waited_on, "sum") == 90
    assert g.all_observed() == 1
    # Later changes (pods evicted, status rewritten) never count it again.
    g.store.apply("MODIFIED", pod_group("job", scheduled("2026-01-01T00:01:30Z")))
    g.store.apply("MODIFIED", pod_group("job", scheduled("2026-01-01T00:09:00Z")))
    assert g.all_observed() == 1


def test_already_scheduled_when_first_seen_is_not_observed() -> None:
    """After a restart the list shows gangs scheduled long ago: they must not count again."""
    g = Gangs()
    g.store.replace([pod_group("old", scheduled()), pod_group("waits", waiting("Unschedulable"))])
    g.store.apply("MODIFIED", pod_group("old", scheduled()))
    assert g.all_observed() == 0
    # a PodGroup that was waiting when the list came, and is scheduled later, does count
    g.store.apply("MODIFIED", pod_group("waits", scheduled()))
    assert g.observed("gang", "capacity") == 1


def test_a_relist_after_a_watch_gap_still_observes() -> None:
    g = Gangs()
    g.store.replace([pod_group("job")])
    # the watch broke; meanwhile the gang was scheduled; the next list shows it
    g.store.replace([pod_group("job", scheduled())])
    assert g.observed("gang", "pods") == 1


def test_basic_policy_and_unmanaged_pod_groups() -> None:
    g = Gangs()
    g.store.apply("ADDED", pod_group("single", policy="basic"))
    g.store.apply("MODIFIED", pod_group("single", scheduled(), policy="basic"))
    g.store.apply("ADDED", pod_group("foreign", managed=False))
    g.store.apply("MODIFIED", pod_group("foreign", scheduled(), managed=False))
    assert g.observed("basic", "pods") == 1
    assert g.all_observed() == 1


def test_memory_is_released_on_delete_and_on_schedule() -> None:
    g = Gangs()
    for i in range(100):
        g.store.apply("ADDED", pod_group(f"job-{i}"))
    assert len(g.tracker._waiting) == 100
    for i in range(50):
        g.store.apply("DELETED", pod_group(f"job-{i}"))
    for i in range(50, 100):
        g.store.apply("MODIFIED", pod_group(f"job-{i}", scheduled()))
    assert g.tracker._waiting == {}
    # a relist that no longer has an object deletes it, too
    g.store.replace([pod_group("a"), pod_group("b")])
    g.store.replace([pod_group("a")])
    assert list(g.tracker._waiting) == ["uid-a"]


def test_a_recreated_pod_group_is_a_new_gang() -> None:
    g = Gangs()
    g.store.apply("ADDED", pod_group("job", waiting("Unschedulable"), uid="first"))
    g.store.apply("DELETED", pod_group("job", uid="first"))
    g.store.apply("ADDED", pod_group("job", uid="second"))
    g.store.apply("MODIFIED", pod_group("job", scheduled(), uid="second"))
    assert g.observed("gang", "pods") == 1
    assert g.observed("gang", "capacity") == 0


def test_gang_state_reads_malformed_objects() -> None:
    malformed: tuple[dict[str, Any], ...] = (
        {},
        {"metadata": None, "spec": [], "status": "x"},
        {"status": {"conditions": [None, {"type": "PodGroupInitiallyScheduled"}]}},
        {"metadata": {"creationTimestamp": "yesterday"}},
    )
    for raw in malformed:
        state = gang_state(copy.deepcopy(raw))
        assert (state.policy, state.scheduled, state.reason) == ("basic", False, "NotEvaluated")
    # scheduled, but without the times: counted, never observed
    g = Gangs()
    g.store.apply("ADDED", pod_group("job"))
    broken = pod_group("job", scheduled())
    del broken["metadata"]["creationTimestamp"]
    g.store.apply("MODIFIED", broken)
    assert g.all_observed() == 0
    assert g.count("gang", "scheduled", "Scheduled") == 1

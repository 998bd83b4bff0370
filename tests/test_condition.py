"""The GangScheduling condition's pure decision: each reason from the situation that causes it,
no write when nothing changed, degraded and back, lastTransitionTime kept."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from webhook.core import condition as c
from webhook.core.condition import Gang, Pods, Situation, decide

NOW = "2026-12-02T10:00:00Z"
LATER = "2026-12-02T10:05:00Z"


def gang(
    name: str = "pg-a",
    *,
    min_count: int | None = 4,
    scheduled: bool = False,
    verdict: str = "NotEvaluated",
    message: str = "",
    live: int | None = None,
    succeeded: int = 0,
    exists: bool = True,
) -> Gang:
    pods = None if live is None else Pods(live, succeeded)
    return Gang(name, min_count, exists, scheduled, verdict, message, pods)


def stored(reason: str, status: str = "False", at: str = NOW, message: str = "") -> dict[str, Any]:
    return {
        "type": c.CONDITION_TYPE,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": at,
    }


def reason(situation: Situation, previous: dict[str, Any] | None = None) -> str | None:
    desired = decide(situation, previous, NOW)
    return None if desired is None else desired.reason


def test_every_reason_is_documented_valid_and_of_the_status_it_says() -> None:
    for name, doc in c.REASONS.items():
        assert c.REASON_PATTERN.match(name), name
        assert doc.status in ("True", "False") and doc.meaning and doc.todo
    assert set(c.FROM_EVENT.values()) <= set(c.REASONS)
    # Never one of Trainer's own condition types (Suspended, Complete, Failed, Created, ...).
    assert c.CONDITION_TYPE not in ("Created", "Suspended", "Complete", "Failed", "Running")
    assert not c.FIELD_MANAGER.startswith("trainer") and c.FIELD_MANAGER != "OpenAPI-Generator"


def test_objects_made_and_not_judged_wait_for_the_scheduler() -> None:
    assert reason(Situation(gangs=(gang(),))) == c.WAITING_FOR_SCHEDULER
    # One being created says the same: a new TrainJob's condition is written once, not twice.
    assert decide(Situation(gangs=(gang(exists=False),)), None, NOW) == decide(
        Situation(gangs=(gang(),)), None, NOW
    )


def test_unschedulable_waits_for_capacity_with_the_schedulers_message_shortened() -> None:
    said = "0/64 nodes are available: 64 Insufficient nvidia.com/gpu. " + "x" * 2000
    desired = decide(Situation(gangs=(gang(verdict="Unschedulable", message=said),)), None, NOW)
    assert desired is not None and desired.reason == c.WAITING_FOR_CAPACITY
    assert desired.status == "False"
    assert "64 Insufficient nvidia.com/gpu" in desired.message
    assert len(desired.message.encode()) <= c.MAX_SCHEDULER_MESSAGE + 100


@pytest.mark.parametrize("verdict", ["SchedulerError", "Other"])
def test_a_scheduler_error_is_said(verdict: str) -> None:
    assert reason(Situation(gangs=(gang(verdict=verdict, message="boom"),))) == c.SCHEDULER_ERROR


def test_every_gang_admitted_is_scheduled() -> None:
    situation = Situation(gangs=(gang(scheduled=True, verdict="Scheduled"), gang("pg-b")))
    assert reason(situation) == c.WAITING_FOR_SCHEDULER  # one of two still waits
    both = Situation(
        gangs=(
            gang(scheduled=True, verdict="Scheduled", live=4),
            gang("pg-b", scheduled=True, verdict="Scheduled", live=4),
        )
    )
    desired = decide(both, None, NOW)
    assert desired == c.Desired("True", c.SCHEDULED, "all 2 gangs are scheduled")


def test_basic_groups_do_not_hold_a_gang_back() -> None:
    situation = Situation(gangs=(gang(scheduled=True, verdict="Scheduled"), gang(min_count=None)))
    assert reason(situation) == c.SCHEDULED


@pytest.mark.parametrize(
    ("lifecycle", "expected"),
    [("suspended", c.SUSPENDED), ("finished", c.FINISHED), ("elsewhere", None)],
)
def test_lifecycle_wins_and_is_never_degraded(lifecycle: Any, expected: str | None) -> None:
    lost = gang(scheduled=True, verdict="Scheduled", live=1)
    assert reason(Situation(lifecycle, gangs=(lost,)), stored(c.SCHEDULED, "True")) == expected


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ("InvalidRuntime", c.INVALID_RUNTIME),
        ("InvalidScheduling", c.INVALID_RUNTIME),
        ("StandingDown", c.STOOD_DOWN),
        ("NoGangBackend", c.GANG_API_UNAVAILABLE),
        ("GangBackendUnavailable", c.GANG_API_UNAVAILABLE),
        ("GangKindUnavailable", c.GANG_API_UNAVAILABLE),
        ("Conflict", c.NAME_CONFLICT),
        ("Refused", c.CREATE_REFUSED),
        ("PodGroupCleanupBlocked", c.POD_GROUP_CLEANUP_BLOCKED),
        ("DriftHeld", c.DRIFT_HELD),
        ("TrainJobDeleting", c.TRAINJOB_DELETING),
    ],
)
def test_todays_event_reasons_map_onto_reasons(event: str, expected: str) -> None:
    desired = decide(Situation(blocker=(event, "what the Event said")), None, NOW)
    assert desired is not None and desired.reason == expected
    assert desired.message == "what the Event said"


def test_a_missing_runtime_is_said_only_for_a_trainjob_already_spoken_for() -> None:
    situation = Situation(blocker=("RuntimeNotFound", 'ClusterTrainingRuntime "x" not found'))
    assert reason(situation) is None
    assert reason(situation, stored(c.INVALID_RUNTIME)) == c.RUNTIME_NOT_FOUND


def test_dropped_fields_are_said_while_waiting_and_kept_in_the_scheduled_message() -> None:
    note = (
        "the API server dropped schedulingConstraints (feature gate "
        "TopologyAwareWorkloadScheduling is off)"
    )
    waiting = Situation(gangs=(gang(),), dropped=note)
    desired = decide(waiting, None, NOW)
    assert desired is not None and desired.reason == c.FEATURE_GATE_OFF
    assert desired.status == "False" and "TopologyAwareWorkloadScheduling" in desired.message
    # A gang that is scheduled is said Scheduled (True): never waiting, never FeatureGateOff.
    scheduled = Situation(gangs=(gang(scheduled=True, verdict="Scheduled"),), dropped=note)
    desired = decide(scheduled, None, NOW)
    assert desired is not None and (desired.status, desired.reason) == ("True", c.SCHEDULED)
    assert "TopologyAwareWorkloadScheduling" in desired.message
    # The scheduler's own verdict (and feasibility's) comes first, the dropped fields beside
    # it: FeatureGateOff is the reason only while nothing has judged the gang.
    for verdict, infeasible, expected in (
        ("Unschedulable", None, c.WAITING_FOR_CAPACITY),
        ("SchedulerError", None, c.SCHEDULER_ERROR),
        ("Unschedulable", "gang node of 4 pods needs room for 4 pods in the cluster", c.INFEASIBLE),
        ("NotEvaluated", "gang node of 4 pods needs room for 4 pods in the cluster", c.INFEASIBLE),
    ):
        judged = Situation(gangs=(gang(verdict=verdict),), dropped=note, infeasible=infeasible)
        desired = decide(judged, None, NOW)
        assert desired is not None and desired.reason == expected, (verdict, infeasible)
        assert note in desired.message


def test_infeasible_carries_the_numbers_unless_the_gang_was_scheduled_anyway() -> None:
    numbers = "gang pg-a needs 64 pods; the largest rack holds 32"
    situation = Situation(gangs=(gang(verdict="Unschedulable"),), infeasible=numbers)
    desired = decide(situation, None, NOW)
    assert desired is not None and desired.reason == c.INFEASIBLE and numbers in desired.message
    placed = Situation(gangs=(gang(scheduled=True, verdict="Scheduled"),), infeasible=numbers)
    assert reason(placed) == c.SCHEDULED


def test_degraded_and_back() -> None:
    healthy = Situation(gangs=(gang(scheduled=True, verdict="Scheduled", live=4),))
    first = decide(healthy, None, NOW)
    assert first is not None and first.reason == c.SCHEDULED
    was = c.condition(first, None, 1, NOW)
    lost = Situation(gangs=(gang(scheduled=True, verdict="Scheduled", live=3),))
    degraded = decide(lost, was, LATER)
    assert degraded is not None and degraded.reason == c.DEGRADED
    assert degraded.message == (
        f"gang pg-a has 3 of the 4 live pods it needs (minCount) since {LATER}"
    )
    written = c.condition(degraded, was, 1, LATER)
    assert written["lastTransitionTime"] == LATER  # True -> False: a transition
    # Another pod lost later: still since the first loss, and the time is kept.
    worse = decide(
        Situation(gangs=(gang(scheduled=True, verdict="Scheduled", live=2),)), written, "x"
    )
    assert worse is not None and f"since {LATER}" in worse.message
    assert c.condition(worse, written, 1, "x")["lastTransitionTime"] == LATER
    back = decide(healthy, written, "2026-12-02T10:09:00Z")
    assert back is not None and back.reason == c.SCHEDULED


def test_untied_pods_of_a_gang_that_exists_are_said_before_degraded() -> None:
    placed = gang(scheduled=True, verdict="Scheduled", live=3)
    was = stored(c.SCHEDULED, "True")
    desired = decide(Situation(gangs=(placed,), untied=2), was, NOW)
    assert desired is not None and desired.reason == c.PODS_UNTIED and desired.status == "False"
    assert desired.message == (
        "2 pending or running pods have no spec.schedulingGroup (admitted without the gang): "
        "gang pg-a counts only the pods that reference it, and may wait for ever while those "
        "hold nodes"
    )
    waiting = decide(Situation(gangs=(gang(),), untied=1), None, NOW)
    assert waiting is not None and waiting.message.startswith("1 pending or running pod has")
    # No gang object: nothing waits for them (the reconciler decides "no gang" for such pods).
    missing = Situation(gangs=(gang(exists=False),), untied=1)
    assert reason(missing) == c.WAITING_FOR_SCHEDULER
    assert reason(Situation(gangs=(placed,), untied=0), was) == c.DEGRADED
    assert reason(Situation(gangs=(placed,)), was) == c.DEGRADED  # pods not watched
    blocked = Situation(blocker=("DriftHeld", "Workload w differs"), gangs=(placed,), untied=1)
    assert reason(blocked) == c.DRIFT_HELD
    assert reason(Situation("suspended", untied=1)) == c.SUSPENDED


def test_admitted_gang_filling_up_is_not_degraded() -> None:
    """A gang just admitted whose pods are still being bound was never said Scheduled."""
    filling = Situation(gangs=(gang(scheduled=True, verdict="Scheduled", live=1),))
    desired = decide(filling, stored(c.WAITING_FOR_CAPACITY), NOW)
    assert desired is not None and desired.reason == c.WAITING_FOR_SCHEDULER
    assert desired.message == "gang pg-a is admitted; its pods are being bound"
    more = decide(replace_live(filling, 3), stored(c.WAITING_FOR_SCHEDULER), NOW)
    assert more == desired  # a pod bound is no write


def replace_live(situation: Situation, live: int) -> Situation:
    return Situation(
        gangs=tuple(dataclasses.replace(g, pods=Pods(live, 0)) for g in situation.gangs)
    )


def test_workers_that_succeeded_are_not_lost() -> None:
    done = Situation(gangs=(gang(scheduled=True, verdict="Scheduled", live=1, succeeded=3),))
    assert reason(done, stored(c.SCHEDULED, "True")) == c.SCHEDULED


def test_no_write_when_nothing_changed() -> None:
    desired = c.Desired("False", c.WAITING_FOR_CAPACITY, "m")
    written = c.condition(desired, None, 3, NOW)
    assert c.unchanged(written, desired)
    assert not c.unchanged(None, desired)
    assert not c.unchanged({**written, "message": "other"}, desired)
    assert not c.unchanged({**written, "reason": c.SCHEDULED}, desired)  # reverted by another


def test_last_transition_time_is_kept_unless_the_status_flips() -> None:
    was = stored(c.WAITING_FOR_SCHEDULER, at=NOW)
    same = c.condition(c.Desired("False", c.WAITING_FOR_CAPACITY, "m"), was, 2, LATER)
    assert same["lastTransitionTime"] == NOW and same["observedGeneration"] == 2
    flipped = c.condition(c.Desired("True", c.SCHEDULED, "m"), was, 2, LATER)
    assert flipped["lastTransitionTime"] == LATER


def test_the_stored_condition_is_found_among_others() -> None:
    tj = {"status": {"conditions": [{"type": "Suspended"}, stored(c.SCHEDULED, "True")]}}
    found = c.stored_condition(tj)
    assert found is not None and found["reason"] == c.SCHEDULED
    assert c.stored_condition({"status": {"conditions": "garbage"}}) is None
    assert c.stored_condition({}) is None


def test_shorten_cuts_bytes_on_a_character_boundary() -> None:
    assert c.shorten("a\n b", 10) == "a b"
    cut = c.shorten("é" * 100, 11)
    assert cut.endswith("...") and len(cut.encode()) <= 11

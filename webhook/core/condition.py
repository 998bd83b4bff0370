"""The service's own condition on a TrainJob it schedules: what it says, and whether to write it
(pure: no I/O, no clock; the caller passes the time).

One condition of type `GangScheduling` in `status.conditions`, written with server-side apply
under the service's own field manager, beside the Trainer controller's (`Suspended`, `Complete`,
`Failed`): its type is one Trainer never writes. `True` only while every gang is scheduled and
holds its pods; otherwise `False`, with a reason from `REASONS` saying why.

Whether to write is decided against the condition as stored (what the watch shows), not against
what the service last wrote: the Trainer controller writes status with a JSON merge patch of its
cached copy, which replaces the whole list and can drop or revert this condition; then the stored
one differs and is written again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

CONDITION_TYPE = "GangScheduling"
FIELD_MANAGER = "trainjob-scheduling-webhook"
MAX_MESSAGE = 1024  # bytes: enough for a person; the API server allows 32 KiB
MAX_SCHEDULER_MESSAGE = 300  # of the scheduler's own message, carried inside ours
REASON_PATTERN = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")  # metav1.Condition's

Status = Literal["True", "False"]

# --- the reasons ------------------------------------------------------------------------------

WAITING_FOR_SCHEDULER = "WaitingForScheduler"
WAITING_FOR_CAPACITY = "WaitingForCapacity"
SCHEDULER_ERROR = "SchedulerError"
SCHEDULED = "Scheduled"
DEGRADED = "Degraded"
SUSPENDED = "Suspended"
FINISHED = "Finished"
RUNTIME_NOT_FOUND = "RuntimeNotFound"
INVALID_RUNTIME = "InvalidRuntime"
GANG_API_UNAVAILABLE = "GangApiUnavailable"
FEATURE_GATE_OFF = "FeatureGateOff"
STOOD_DOWN = "StoodDown"
NAME_CONFLICT = "NameConflict"
CREATE_REFUSED = "CreateRefused"
INFEASIBLE = "Infeasible"
PODS_UNTIED = "PodsUntied"
POD_GROUP_CLEANUP_BLOCKED = "PodGroupCleanupBlocked"
DRIFT_HELD = "DriftHeld"
TRAINJOB_DELETING = "TrainJobDeleting"
PLAN_VERSION_UNKNOWN = "PlanVersionUnknown"


@dataclass(frozen=True)
class ReasonDoc:
    status: Status
    meaning: str
    todo: str


REASONS: Mapping[str, ReasonDoc] = {
    WAITING_FOR_SCHEDULER: ReasonDoc(
        "False",
        "The gang objects exist; the scheduler has not judged the gang yet (its pods are still "
        "being created, or have not reached the scheduler).",
        "Wait. If it lasts, check the pods exist (`kubectl get pods -l "
        "jobset.sigs.k8s.io/jobset-name=NAME`) and that quota (Kueue) let the job run.",
    ),
    WAITING_FOR_CAPACITY: ReasonDoc(
        "False",
        "The scheduler said the gang does not fit now (Unschedulable); its message is carried.",
        "Wait for capacity, or make the gang smaller (numNodes) or its topology wider.",
    ),
    SCHEDULER_ERROR: ReasonDoc(
        "False",
        "The scheduler reported an error (or a verdict other than Unschedulable) for the gang.",
        "Read the scheduler's message and its logs; `kubectl trainjob-scheduling explain "
        "trainjob NAME -n NS` shows more.",
    ),
    SCHEDULED: ReasonDoc(
        "True",
        "Every gang is admitted and holds at least its minCount of pods.",
        "Nothing.",
    ),
    DEGRADED: ReasonDoc(
        "False",
        "A gang was admitted and now has fewer live pods than its minCount (a pod was evicted, "
        "preempted or its node failed); the message names the gang, how many of how many, and "
        "since when.",
        "JobSet usually recreates the lost pods (then it goes back to Scheduled). If it lasts, "
        "the gang holds its other nodes while it waits: find the missing pods, or restart the "
        "job.",
    ),
    SUSPENDED: ReasonDoc(
        "False",
        "The TrainJob is suspended (spec.suspend; Kueue suspends queued jobs): no gang objects.",
        "Resume it (or wait for Kueue to admit it).",
    ),
    FINISHED: ReasonDoc(
        "False",
        "The TrainJob completed or failed: its gang objects are released.",
        "Nothing.",
    ),
    RUNTIME_NOT_FOUND: ReasonDoc(
        "False",
        "The runtime it names is gone (said only for a TrainJob the service already spoke for).",
        "Create the runtime again, or delete the TrainJob.",
    ),
    INVALID_RUNTIME: ReasonDoc(
        "False",
        "Its runtime's spec.scheduling (or the TrainJob with it) cannot be planned: no gang.",
        "Fix the runtime as the message says; `trainjob-scheduling-webhook plan -f ...` "
        "checks a runtime and a TrainJob offline.",
    ),
    GANG_API_UNAVAILABLE: ReasonDoc(
        "False",
        "The API its gang needs is not served (the scheduler's CRDs, the scheduling.k8s.io "
        "Workload API or a kind behind a feature gate), or no gang backend serves its "
        "scheduler name: the message says which. Its pods are held until the API is served "
        "(those of a scheduler no backend serves are let through, untied).",
        "Install the scheduler's CRDs or turn the feature gate on (see the message); the gang "
        "is made once discovery sees the API.",
    ),
    FEATURE_GATE_OFF: ReasonDoc(
        "False",
        "The API server dropped fields of its gang objects because a feature gate is off "
        "(topology, disruptionMode, priorityClassName, resource claims): the message names "
        "each field and its gate. The gang objects are made without them and never recreated "
        "for it. Said while the scheduler has not judged the gang yet; once it has, its "
        "verdict is the reason (WaitingForCapacity, SchedulerError, Scheduled; or Infeasible), "
        "and the message still names the dropped fields. A gang whose topology was dropped is "
        "judged for Infeasible over the whole cluster.",
        "Turn the named feature gate on in kube-apiserver and kube-scheduler (then delete and "
        "create the TrainJob again to have the fields), or accept the gang without them.",
    ),
    STOOD_DOWN: ReasonDoc(
        "False",
        "Another controller made gang objects for this TrainJob (Trainer's own Workload-Aware "
        "Scheduling): this service stands down and creates nothing.",
        "Nothing, unless both were meant to run: then turn one of them off.",
    ),
    NAME_CONFLICT: ReasonDoc(
        "False",
        "An object with the name of one of its gang objects exists and was not made by this "
        "service for this TrainJob.",
        "Delete that object (the message names it) to let this TrainJob have its gang.",
    ),
    CREATE_REFUSED: ReasonDoc(
        "False",
        "The API server refused one of its gang objects (another webhook, a quota): the "
        "message carries its answer. Tried again later.",
        "Fix what the message says (a closed queue, a quota).",
    ),
    INFEASIBLE: ReasonDoc(
        "False",
        "Feasibility says a gang can never fit in any domain of the cluster's nodes, even "
        "empty: the message has the numbers.",
        "Make the gang smaller, its topology wider, or add nodes that fit its pods.",
    ),
    PODS_UNTIED: ReasonDoc(
        "False",
        "Its gang objects exist, but some of its pending or running pods have no "
        "`spec.schedulingGroup` (they were admitted without their gang: the webhook was "
        "bypassed or down with failurePolicy Ignore, or they predate the gang). The field is "
        "immutable; the scheduler counts only the pods that reference the PodGroup, so the "
        "gang may wait for ever while the untied pods hold their nodes. The message says how "
        "many.",
        "`kubectl trainjob-scheduling explain trainjob NAME -n NS` lists them. Delete the "
        "untied pods (JobSet recreates them, through the webhook, tied), or restart the "
        "TrainJob; then find why they escaped (webhook unreachable, its failurePolicy).",
    ),
    POD_GROUP_CLEANUP_BLOCKED: ReasonDoc(
        "False",
        "A gang object it needs has the name of one that is being deleted (Terminating: its "
        "finalizer `scheduling.k8s.io/podgroup-protection` stays while pods reference it, "
        "often for their grace period); the service waits for it to go, with backoff, and "
        "then creates its own.",
        "Wait for the old pods to terminate (`kubectl get pods -l "
        "jobset.sigs.k8s.io/jobset-name=NAME`). If it lasts, find the pods still referencing "
        "the PodGroup the message names.",
    ),
    DRIFT_HELD: ReasonDoc(
        "False",
        "A stored gang object differs from the plan on a field the API server will not change "
        "in place, and pods use it: it is not deleted and created again (that would tear down "
        "a running gang). The gang goes on as stored; the message names the object.",
        "Nothing, if the running gang is fine: the new settings apply to the next run. To "
        "apply them now, restart the TrainJob (delete and create it again).",
    ),
    TRAINJOB_DELETING: ReasonDoc(
        "False",
        "The TrainJob is being deleted (it has a deletionTimestamp: a foreground delete, or "
        "another controller's finalizer holds it): nothing is created for it.",
        "Nothing; if the deletion hangs, see which finalizer the TrainJob still carries.",
    ),
    PLAN_VERSION_UNKNOWN: ReasonDoc(
        "False",
        "Its plan was frozen by a newer release of this service (its runtime snapshot names a "
        "plan version this release does not know: a rollback). Hands off: its gang objects are "
        "left exactly as they are, nothing is made or removed, and its pods are held "
        "(`PlanVersionUnknown`) rather than tied by rules that would guess.",
        "Run the release that froze it (roll forward), or delete and create the TrainJob "
        "again to have it planned by this one.",
    ),
}

# The reconciler's Event reasons that stop a TrainJob short of its gang, and what they become.
FROM_EVENT: Mapping[str, str] = {
    "RuntimeNotFound": RUNTIME_NOT_FOUND,
    "InvalidRuntime": INVALID_RUNTIME,
    "InvalidScheduling": INVALID_RUNTIME,
    "StandingDown": STOOD_DOWN,
    "NoGangBackend": GANG_API_UNAVAILABLE,
    "GangBackendUnavailable": GANG_API_UNAVAILABLE,
    "GangKindUnavailable": GANG_API_UNAVAILABLE,
    "Conflict": NAME_CONFLICT,
    "Refused": CREATE_REFUSED,
    "FeatureGateOff": FEATURE_GATE_OFF,
    "PodGroupCleanupBlocked": POD_GROUP_CLEANUP_BLOCKED,
    "DriftHeld": DRIFT_HELD,
    "TrainJobDeleting": TRAINJOB_DELETING,
    "PlanVersionUnknown": PLAN_VERSION_UNKNOWN,
    "InvalidSnapshot": INVALID_RUNTIME,
}

# --- what is known of a TrainJob --------------------------------------------------------------

Lifecycle = Literal["active", "suspended", "finished", "elsewhere"]


@dataclass(frozen=True)
class Pods:
    """A gang's pods as the pod watch counts them."""

    live: int  # bound to a node and neither finished nor being deleted
    succeeded: int  # finished well: not lost (workers of a job that is completing)


@dataclass(frozen=True)
class Gang:
    """One group of the plan: its object's status and, when the pods are watched, its pods."""

    name: str  # the group object's (PodGroup's) name
    min_count: int | None  # gang policy only
    exists: bool  # its object is stored (one being created waits for the scheduler too)
    scheduled: bool
    verdict: str  # Scheduled, NotEvaluated, Unschedulable, SchedulerError or Other
    scheduler_message: str = ""
    pods: Pods | None = None  # None: pods are not watched

    def short(self) -> int | None:
        """How many live pods it lacks (None when it is not a watched, admitted gang)."""
        if not self.scheduled or self.min_count is None or self.pods is None:
            return None
        return max(0, self.min_count - self.pods.live - self.pods.succeeded)


@dataclass(frozen=True)
class Situation:
    """What a reconcile pass found, and what the stores say of its gangs."""

    lifecycle: Lifecycle = "active"
    blocker: tuple[str, str] | None = None  # (Event reason, its note): no gang because of it
    gangs: tuple[Gang, ...] = ()
    dropped: str | None = None  # the fields the API server dropped (FeatureGateOff's note)
    infeasible: str | None = None  # feasibility's message for a gang that can never fit
    untied: int | None = None  # present pods without schedulingGroup (None: not watched)


@dataclass(frozen=True)
class Desired:
    status: Status
    reason: str
    message: str


def decide(situation: Situation, stored: Mapping[str, Any] | None, now: str) -> Desired | None:
    """The condition the TrainJob should carry; None for no write at all (a TrainJob that runs
    elsewhere, or a missing runtime for one the service has not spoken for). `stored` is the
    condition as stored; `now` the time (RFC 3339) a degradation starts at if it starts now."""
    s = situation
    if s.lifecycle == "elsewhere":
        return None  # MultiKueue dispatched it: its status is the worker cluster's copy
    if s.lifecycle == "finished":
        return _desired(FINISHED, "the TrainJob has finished: its gang is released")
    if s.lifecycle == "suspended":
        return _desired(SUSPENDED, "the TrainJob is suspended: no gang until it is resumed")
    if s.blocker is not None:
        event, note = s.blocker
        reason = FROM_EVENT.get(event, GANG_API_UNAVAILABLE)
        if reason == RUNTIME_NOT_FOUND and stored is None:
            return None  # without its runtime, nothing says the TrainJob is this service's
        return _desired(reason, note)
    if s.untied and any(g.exists for g in s.gangs):
        return _desired(PODS_UNTIED, _untied_message(s.untied, s.gangs))
    said_before = stored is not None and stored.get("reason") in (SCHEDULED, DEGRADED)
    degraded = [(g, n) for g in s.gangs if (n := g.short()) and said_before]
    if degraded:
        return _desired(DEGRADED, _degraded_message(degraded, stored, now))
    # Fields the API server dropped (a gate is off) are said with whatever else holds: the gang
    # is made without them, and a scheduled gang is still scheduled. The scheduler's own verdict
    # (or feasibility's) is what a person acts on: FeatureGateOff is the reason only while
    # nothing has judged the gang yet.
    also = f"; {s.dropped}" if s.dropped else ""
    gangs = [g for g in s.gangs if g.min_count is not None] or list(s.gangs)
    if all(g.scheduled for g in gangs):
        filling = [(g, n) for g in gangs if (n := g.short())]
        if filling:  # admitted, its pods still being bound: no count (a write per bind)
            return _desired(
                WAITING_FOR_SCHEDULER,
                f"gang {filling[0][0].name} is admitted; its pods are being bound{also}",
            )
        return _desired(SCHEDULED, _scheduled_message(gangs) + also)
    if s.infeasible is not None:
        return _desired(INFEASIBLE, f"can never fit as configured: {s.infeasible}{also}")
    waiting = [g for g in gangs if not g.scheduled]
    for verdict, reason in (
        ("SchedulerError", SCHEDULER_ERROR),
        ("Other", SCHEDULER_ERROR),
        ("Unschedulable", WAITING_FOR_CAPACITY),
    ):
        judged = next((g for g in waiting if g.verdict == verdict), None)
        if judged is not None:
            said = shorten(judged.scheduler_message, MAX_SCHEDULER_MESSAGE)
            text = (
                f"gang {judged.name}: the scheduler says {said}" if said else f"gang {judged.name}"
            )
            if reason == WAITING_FOR_CAPACITY:
                text = f"waiting for capacity: {text}" if said else f"{text} does not fit now"
            return _desired(reason, text + _more(waiting) + also)
    waits = (
        f"gang {waiting[0].name} is waiting for the scheduler (its pods are being created or "
        f"have not been judged yet){_more(waiting)}"
    )
    if s.dropped:  # nothing else to say yet: the dropped fields come first
        return _desired(FEATURE_GATE_OFF, f"{s.dropped}; {waits}")
    return _desired(WAITING_FOR_SCHEDULER, waits)


def _desired(reason: str, message: str) -> Desired:
    return Desired(REASONS[reason].status, reason, shorten(message, MAX_MESSAGE))


def _more(gangs: Sequence[Gang]) -> str:
    return f" (and {len(gangs) - 1} more gangs waiting)" if len(gangs) > 1 else ""


def _untied_message(untied: int, gangs: Sequence[Gang]) -> str:
    gang = next((g for g in gangs if g.min_count is not None and g.exists), None)
    waits = f"gang {gang.name} counts only the pods that reference it" if gang else "the gang"
    pods = (
        "1 pending or running pod has" if untied == 1 else f"{untied} pending or running pods have"
    )
    return (
        f"{pods} no spec.schedulingGroup (admitted without the gang): {waits}, and may wait "
        "for ever while those hold nodes"
    )


def _scheduled_message(gangs: Sequence[Gang]) -> str:
    if len(gangs) == 1:
        return f"gang {gangs[0].name} is scheduled"
    return f"all {len(gangs)} gangs are scheduled"


def _degraded_message(
    degraded: Sequence[tuple[Gang, int]], stored: Mapping[str, Any] | None, now: str
) -> str:
    g, short = degraded[0]
    assert g.min_count is not None and g.pods is not None
    since = degraded_since(stored, now)
    text = (
        f"gang {g.name} has {g.min_count - short} of the {g.min_count} live pods it needs "
        f"(minCount) since {since}"
    )
    if len(degraded) > 1:
        text += f"; and {len(degraded) - 1} more gangs below their minCount"
    return text


def degraded_since(stored: Mapping[str, Any] | None, now: str) -> str:
    """When the degradation began: a stored Degraded condition's lastTransitionTime (it turned
    False then, from Scheduled), else now."""
    if stored is not None and stored.get("reason") == DEGRADED:
        at = stored.get("lastTransitionTime")
        if isinstance(at, str) and at:
            return at
    return now


# --- the condition as stored, and the one to apply --------------------------------------------


def stored_condition(trainjob: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The service's condition on a stored TrainJob, if it has one."""
    status = trainjob.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for cond in conditions if isinstance(conditions, list) else ():
        if isinstance(cond, dict) and cond.get("type") == CONDITION_TYPE:
            return cond
    return None


def unchanged(stored: Mapping[str, Any] | None, desired: Desired) -> bool:
    """Whether the stored condition already says what `desired` says (then nothing is written;
    `observedGeneration` alone is not worth a write, nor waking Trainer's worker)."""
    return (
        stored is not None
        and stored.get("status") == desired.status
        and stored.get("reason") == desired.reason
        and stored.get("message") == desired.message
    )


def condition(
    desired: Desired, stored: Mapping[str, Any] | None, generation: int | None, now: str
) -> dict[str, Any]:
    """The condition to apply: `lastTransitionTime` kept unless the status flips."""
    at = stored.get("lastTransitionTime") if stored is not None else None
    if stored is None or stored.get("status") != desired.status or not isinstance(at, str):
        at = now
    cond: dict[str, Any] = {
        "type": CONDITION_TYPE,
        "status": desired.status,
        "reason": desired.reason,
        "message": desired.message,
        "lastTransitionTime": at,
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def rfc3339(unix: float) -> str:
    """A metav1.Time: seconds, UTC, with a Z."""
    return datetime.fromtimestamp(int(unix), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def shorten(text: str, limit: int) -> str:
    """`text` on one line, cut to `limit` bytes with an ellipsis."""
    flat = " ".join(text.split())
    data = flat.encode()
    if len(data) <= limit:
        return flat
    return data[: limit - 3].decode(errors="ignore").rstrip() + "..."

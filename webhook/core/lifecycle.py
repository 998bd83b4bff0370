"""Where a TrainJob is in its life, as far as its gang is concerned (pure: no I/O).

Rule 8(e): a TrainJob has its Workload and PodGroups while it is neither suspended nor finished
(nor dispatched by MultiKueue to a worker cluster, where its pods run).
"""

from __future__ import annotations

from .trainer import TrainJob
from .validation import CheckedRuntime

FINISHED_CONDITIONS = ("Complete", "Failed")
MULTIKUEUE = "kueue.x-k8s.io/multikueue"  # the job runs on a worker cluster: no local pods


def is_finished(trainjob: TrainJob) -> bool:
    conditions = trainjob.status.conditions if trainjob.status else None
    return any(c.type in FINISHED_CONDITIONS and c.status == "True" for c in conditions or [])


def runs_elsewhere(trainjob: TrainJob) -> bool:
    """MultiKueue dispatches it to a worker cluster, where a copy of it runs: here it never has
    a JobSet, pods or gang (Trainer makes `spec.managedBy` immutable), so nothing of it is
    planned or frozen here. The copy has no `managedBy` and is frozen by the worker's service."""
    return trainjob.spec.managed_by == MULTIKUEUE


def wants_gang(trainjob: TrainJob) -> bool:
    """Whether the TrainJob's gang objects should exist (given a runtime with scheduling)."""
    return no_gang_reason(trainjob) is None


def no_gang_reason(trainjob: TrainJob) -> str | None:
    """Why the TrainJob has no gang now; None when it should have one."""
    if trainjob.spec.suspend is True:
        return "the TrainJob is suspended"
    if runs_elsewhere(trainjob):
        return "the TrainJob runs on a MultiKueue worker cluster"
    if is_finished(trainjob):
        return "the TrainJob has finished"
    return None


def gang_exists(trainjob: TrainJob | None, runtime: CheckedRuntime | None) -> bool:
    """Whether a stored TrainJob has its gang now: its runtime schedules and it wants one."""
    return (
        trainjob is not None
        and runtime is not None
        and runtime.layout is not None
        and wants_gang(trainjob)
    )

"""Where a TrainJob is in its life, as far as its gang is concerned (pure: no I/O).

Rule 8(e): a TrainJob has its Workload and PodGroups while it is neither suspended nor finished.
"""

from __future__ import annotations

from .trainer import TrainJob
from .validation import CheckedRuntime

FINISHED_CONDITIONS = ("Complete", "Failed")


def is_finished(trainjob: TrainJob) -> bool:
    conditions = trainjob.status.conditions if trainjob.status else None
    return any(c.type in FINISHED_CONDITIONS and c.status == "True" for c in conditions or [])


def wants_gang(trainjob: TrainJob) -> bool:
    """Whether the TrainJob's gang objects should exist (given a runtime with scheduling)."""
    return trainjob.spec.suspend is not True and not is_finished(trainjob)


def gang_exists(trainjob: TrainJob | None, runtime: CheckedRuntime | None) -> bool:
    """Whether a stored TrainJob has its gang now: its runtime schedules and it wants one."""
    return (
        trainjob is not None
        and runtime is not None
        and runtime.layout is not None
        and wants_gang(trainjob)
    )

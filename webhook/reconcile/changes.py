"""What one reconcile pass changed, told as one Event per kind of change.

client-go's recorder aggregates similar Events after the fact; here a pass already knows all it
did, so a TrainJob whose pass creates its Workload and its PodGroup gets one `Created` Event
naming both (and one log line), not one per object: half the Event writes for a new TrainJob,
and one line for a person to read. Warnings are not gathered (each says something different),
but what the pass did before one is told first, so Events keep their order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..kube.events import MAX_NOTE

if TYPE_CHECKING:
    from ..kube.events import EventRecorder
    from .status import Outcome

JsonObject = dict[str, Any]


class Changes:
    def __init__(self) -> None:
        self._about: JsonObject | None = None
        self._done: dict[tuple[str, str], list[str]] = {}  # (reason, action) -> what was done
        self.outcome: Outcome | None = None  # what the pass found, for the TrainJob's condition
        # (kind, field, gate) the API server dropped from the gang objects the pass looked at;
        # None when it looked at none.
        self.dropped: set[tuple[str, str, str]] | None = None

    def add(self, trainjob: JsonObject, reason: str, action: str, what: str) -> None:
        self._about = trainjob
        self._done.setdefault((reason, action), []).append(what)

    def warn(
        self, events: EventRecorder, trainjob: JsonObject, reason: str, action: str, note: str
    ) -> None:
        """A Warning Event, after the changes made before it."""
        self.record(events)
        events.record(trainjob, "Warning", reason, action, note)

    def record(self, events: EventRecorder) -> None:
        """One Normal Event per reason, its note the pass's changes in the order made."""
        if self._about is None:
            return
        for (reason, action), done in self._done.items():
            events.record(self._about, "Normal", reason, action, summary(done))
        self._about, self._done = None, {}


def summary(done: list[str], limit: int = MAX_NOTE) -> str:
    """`done` joined with "; ", as much of it as an Event's note holds, then how many more."""
    note = ""
    for i, item in enumerate(done):
        longer = f"{note}; {item}" if note else item
        more = len(done) - i - 1
        if len((longer + (f"; and {more} more" if more else "")).encode()) > limit:
            left = len(done) - i
            return f"{note}; and {left} more" if note else item  # the recorder cuts it
        note = longer
    return note

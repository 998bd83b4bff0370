"""What one reconcile pass changed, told as one Event per kind of change.

client-go's recorder aggregates similar Events after the fact; here a pass already knows all it
did, so a TrainJob whose pass creates its Workload and its PodGroup gets one `Created` Event
naming both (and one log line), not one per object: half the Event writes for a new TrainJob,
and one line for a person to read. Warnings are not gathered: each says something different.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..kube.events import EventRecorder

JsonObject = dict[str, Any]


class Changes:
    def __init__(self) -> None:
        self._about: JsonObject | None = None
        self._done: dict[tuple[str, str], list[str]] = {}  # (reason, action) -> what was done

    def add(self, trainjob: JsonObject, reason: str, action: str, what: str) -> None:
        self._about = trainjob
        self._done.setdefault((reason, action), []).append(what)

    def record(self, events: EventRecorder) -> None:
        """One Normal Event per reason, its note the pass's changes in the order made."""
        if self._about is None:
            return
        for (reason, action), done in self._done.items():
            events.record(self._about, "Normal", reason, action, "; ".join(done))
        self._about, self._done = None, {}

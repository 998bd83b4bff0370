"""One webhook path's metrics, with their label children bound once.

A review must not pay for label lookups (`.labels()` hashes and locks): each path binds its
children when the app is built, and the status codes and decisions it meets on first use. The
reviews in flight are a plain count the gauge reads when scraped (two locked updates fewer a
review).
"""

from __future__ import annotations

from prometheus_client import Counter

from ..admission.review import Decision
from .registry import DECISIONS, Metrics

ERRORED_REASONS = frozenset({"BadRequest", "InternalError"})  # what `review.errored` sets


def decision_label(decision: Decision) -> str:
    """allowed (unchanged), patched (allowed with a patch), denied (a rule said no), errored
    (the review could not be judged: controller-runtime's `Errored`)."""
    if decision.allowed:
        return "patched" if decision.patch else "allowed"
    return "errored" if decision.reason in ERRORED_REASONS else "denied"


class WebhookMeter:
    def __init__(self, metrics: Metrics, path: str) -> None:
        self.path = path
        self.metrics = metrics
        self.in_flight = 0  # read by the gauge at scrape time; the event loop alone changes it
        metrics.webhook_in_flight.labels(path).set_function(lambda: self.in_flight)
        self.latency = metrics.webhook_latency.labels(path)
        self._codes: dict[int, Counter] = {}
        self._decisions: dict[tuple[str, str], Counter] = {}
        # Bound now, so the common series exist (at 0) before the first review.
        self.code(200)
        for operation in ("CREATE", "UPDATE"):
            for decision in DECISIONS:
                self._decision(operation, decision)

    def code(self, status: int) -> Counter:
        child = self._codes.get(status)
        if child is None:
            child = self._codes[status] = self.metrics.webhook_requests.labels(self.path, status)
        return child

    def answered(self, status: int, seconds: float) -> None:
        """One request answered (any status), `seconds` after it came."""
        self.latency.observe(seconds)
        self.code(status).inc()

    def decided(self, operation: str, decision: Decision) -> None:
        self._decision(operation or "unknown", decision_label(decision)).inc()
        if decision.untied:  # a ganged TrainJob's pod held, or let through without its group
            if decision.allowed:
                self.metrics.untied(decision.untied)
            else:
                self.metrics.held(decision.untied)
        if decision.regrouped:
            self.metrics.pods_regrouped.inc()

    def _decision(self, operation: str, decision: str) -> Counter:
        key = (operation, decision)
        child = self._decisions.get(key)
        if child is None:
            labels = (self.path, operation, decision)
            child = self._decisions[key] = self.metrics.admission_decisions.labels(*labels)
        return child

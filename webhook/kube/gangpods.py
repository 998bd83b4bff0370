"""How many pods each Job of a JobSet has, by state, from a watch of JobSet's pods: what gang
health after admission is judged from (`reconcile/status.py`).

No pod is kept: each watch event is reduced to its Job (namespace, JobSet, ReplicatedJob, Job
index, from the labels JobSet puts on every pod) and a state (pending, live, succeeded, lost),
then dropped. Per Job: four counts and, per pod, the hash of its namespace and name and its
state (a later event must know what the pod counted as before); per pod, its Job (a pod whose
labels are edited must leave the Job it counted in). Work per event is a few dict operations;
listeners hear (namespace, JobSet name) when a Job's live or succeeded count changed, and
coalesce what they do with it (the reconciler's work queue holds each TrainJob once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..core.plan import JOB_INDEX, JOBSET_NAME, REPLICATED_JOB_NAME
from .store import EventType

PENDING, LIVE, SUCCEEDED, LOST = 0, 1, 2, 3
SELECTOR = JOBSET_NAME  # the label selector of the watch: every pod JobSet made
MAX_PODS_PER_JOB = 100_000  # a Job's pods remembered; far above any real Job's
TrainJobKey = tuple[str, str]  # (namespace, JobSet name = TrainJob name)
JobKey = tuple[str, int]  # (ReplicatedJob, Job index)
Changed = Callable[[str, str], None]


class JobPods:
    """One Job's pods: counts by state, and each pod's state by its hash (`pod_of`)."""

    __slots__ = ("counts", "key", "states", "trainjob")

    def __init__(self, trainjob: TrainJobKey, key: JobKey) -> None:
        self.counts = [0, 0, 0, 0]  # PENDING, LIVE, SUCCEEDED, LOST
        self.states: dict[int, int] = {}
        self.trainjob = trainjob
        self.key = key

    @property
    def live(self) -> int:
        return self.counts[LIVE]

    @property
    def succeeded(self) -> int:
        return self.counts[SUCCEEDED]

    def set(self, pod: int, state: int | None) -> bool:
        """The pod is now in `state` (None: gone); whether live or succeeded changed."""
        before = self.states.pop(pod, None) if state is None else self.states.get(pod)
        if before == state:
            return False
        if before is not None:
            self.counts[before] -= 1
        if state is not None:
            if before is None and len(self.states) >= MAX_PODS_PER_JOB:
                return False
            self.counts[state] += 1
            self.states[pod] = state
        return LIVE in (before, state) or SUCCEEDED in (before, state)


def state_of(raw: Mapping[str, Any]) -> int:
    """A pod's state: succeeded, lost (failed, or being deleted), live (bound), or pending."""
    meta = raw.get("metadata")
    spec, status = raw.get("spec"), raw.get("status")
    phase = status.get("phase") if isinstance(status, dict) else None
    if phase == "Succeeded":
        return SUCCEEDED
    if phase == "Failed" or (isinstance(meta, dict) and meta.get("deletionTimestamp")):
        return LOST
    bound = isinstance(spec, dict) and bool(spec.get("nodeName"))
    return LIVE if bound else PENDING


def pod_of(raw: Mapping[str, Any]) -> int | None:
    """The hash of a pod's namespace and name: what it is known by, whatever its labels say."""
    meta = raw.get("metadata")
    if not isinstance(meta, dict):
        return None
    namespace, name = meta.get("namespace"), meta.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str):
        return None
    return hash((namespace, name))


def job_of(raw: Mapping[str, Any]) -> tuple[TrainJobKey, JobKey, int] | None:
    """(its TrainJob, its Job, `pod_of`) from a pod's labels; None for a pod that JobSet did not
    make."""
    meta = raw.get("metadata")
    if not isinstance(meta, dict):
        return None
    labels, namespace, name = meta.get("labels"), meta.get("namespace"), meta.get("name")
    if not isinstance(labels, dict) or not isinstance(namespace, str) or not isinstance(name, str):
        return None
    jobset, rj, index = (
        labels.get(JOBSET_NAME),
        labels.get(REPLICATED_JOB_NAME),
        labels.get(JOB_INDEX),
    )
    if not (isinstance(jobset, str) and isinstance(rj, str) and isinstance(index, str)):
        return None
    if not (index.isascii() and index.isdigit() and len(index) <= 10):
        return None
    return (namespace, jobset), (rj, int(index)), hash((namespace, name))


class GangPods:
    """The pod counts of every JobSet in the watched namespaces (a `Sink` for an informer)."""

    resource = "pods"

    def __init__(self) -> None:
        self.synced = False
        self.watched: tuple[str, ...] | None = None  # namespaces listed one by one, if so
        self._listed: set[str | None] = set()
        self._jobs: dict[TrainJobKey, dict[JobKey, JobPods]] = {}
        self._where: dict[int, JobPods] = {}  # each counted pod's Job
        self._listeners: list[Changed] = []
        self._pods = 0

    def __len__(self) -> int:
        return self._pods

    def subscribe(self, listener: Changed) -> None:
        self._listeners.append(listener)

    def jobs(self, namespace: str, jobset: str) -> Mapping[JobKey, JobPods]:
        """The Jobs of a JobSet with pods ({} when none are known)."""
        return self._jobs.get((namespace, jobset), {})

    def trim(self, raw: dict[str, Any]) -> dict[str, Any]:
        """A listed pod as what is counted of it (the list holds every page until its end)."""
        found = job_of(raw)
        return {"job": found, "state": state_of(raw)} if found is not None else {}

    def replace(self, items: Iterable[dict[str, Any]], namespace: str | None = None) -> None:
        """A fresh list (of trimmed pods): the namespace's counts, or all of them, start again;
        every JobSet whose counts were or are now known is told."""
        touched: set[TrainJobKey] = set()
        for key in [k for k in self._jobs if namespace is None or k[0] == namespace]:
            for job in self._jobs.pop(key).values():
                self._pods -= len(job.states)
                for pod in job.states:
                    del self._where[pod]
            touched.add(key)
        for item in items:
            found = item.get("job")
            if found is not None:
                self._set(found, item["state"])
                touched.add(found[0])
        self._listed.add(namespace)
        self.synced = self.watched is None or all(ns in self._listed for ns in self.watched)
        for key in touched:
            self._tell(key)

    def apply(self, event: EventType, raw: dict[str, Any]) -> None:
        found = job_of(raw)
        pod = found[2] if found is not None else pod_of(raw)
        if pod is not None:
            self._leave(pod, found)
        if found is not None and self._set(found, None if event == "DELETED" else state_of(raw)):
            self._tell(found[0])

    def _leave(self, pod: int, found: tuple[TrainJobKey, JobKey, int] | None) -> None:
        """A pod whose labels were edited (or that left the watch's selector) leaves the Job it
        counted in."""
        before = self._where.get(pod)
        if before is None or (found is not None and (before.trainjob, before.key) == found[:2]):
            return
        if self._set_in(before, pod, None):
            self._tell(before.trainjob)

    def _set(self, found: tuple[TrainJobKey, JobKey, int], state: int | None) -> bool:
        trainjob, job_key, pod = found
        jobs = self._jobs.get(trainjob)
        job = jobs.get(job_key) if jobs is not None else None
        if job is None:
            if state is None:
                return False
            if jobs is None:
                jobs = self._jobs[trainjob] = {}
            job = jobs[job_key] = JobPods(trainjob, job_key)
        return self._set_in(job, pod, state)

    def _set_in(self, job: JobPods, pod: int, state: int | None) -> bool:
        known = len(job.states)
        changed = job.set(pod, state)
        self._pods += len(job.states) - known
        if pod in job.states:
            self._where[pod] = job
        elif self._where.get(pod) is job:
            del self._where[pod]
        if not job.states:
            jobs = self._jobs[job.trainjob]
            del jobs[job.key]
            if not jobs:
                del self._jobs[job.trainjob]
        return changed

    def _tell(self, key: TrainJobKey) -> None:
        for listener in self._listeners:
            listener(*key)

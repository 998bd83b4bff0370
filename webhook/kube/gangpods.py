"""How many pods each Job of a JobSet has, by state, from a watch of JobSet's pods: what gang
health after admission is judged from (`reconcile/status.py`).

No pod is kept: each watch event is reduced to its Job (namespace, JobSet, ReplicatedJob, Job
index, from the labels JobSet puts on every pod) and a state (pending, live, succeeded, lost),
then dropped. Per Job: four counts. Per pod, by namespace and the hash of its name: its Job and
its state, as one tuple its Job holds (a later event must know what the pod counted as, and in
which Job: a pod whose labels are edited leaves it). Work per event is a few dict operations;
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
    """One Job's pods: counts by state."""

    __slots__ = ("counts", "key", "states", "trainjob")

    def __init__(self, trainjob: TrainJobKey, key: JobKey) -> None:
        self.counts = [0, 0, 0, 0]  # PENDING, LIVE, SUCCEEDED, LOST
        self.trainjob = trainjob
        self.key = key
        # What each of its pods is remembered as (one of these, shared: no object per pod).
        self.states = tuple((self, state) for state in (PENDING, LIVE, SUCCEEDED, LOST))

    @property
    def live(self) -> int:
        return self.counts[LIVE]

    @property
    def succeeded(self) -> int:
        return self.counts[SUCCEEDED]


Counted = tuple[JobPods, int]  # a pod's Job and its state


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


def pod_of(raw: Mapping[str, Any]) -> tuple[str, int] | None:
    """A pod's namespace and the hash of its name: what it is known by, whatever its labels
    say."""
    meta = raw.get("metadata")
    if not isinstance(meta, dict):
        return None
    namespace, name = meta.get("namespace"), meta.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str):
        return None
    return namespace, hash(name)


def job_of(raw: Mapping[str, Any]) -> tuple[TrainJobKey, JobKey, int] | None:
    """(its TrainJob, its Job, the hash of its name) from a pod's labels; None for a pod that
    JobSet did not make."""
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
    return (namespace, jobset), (rj, int(index)), hash(name)


class GangPods:
    """The pod counts of every JobSet in the watched namespaces (a `Sink` for an informer)."""

    resource = "pods"

    def __init__(self) -> None:
        self.synced = False
        self.watched: tuple[str, ...] | None = None  # namespaces listed one by one, if so
        self._listed: set[str | None] = set()
        self._jobs: dict[TrainJobKey, dict[JobKey, JobPods]] = {}
        self._pods_of: dict[str, dict[int, Counted]] = {}  # namespace -> pod -> where it counts
        self._listeners: list[Changed] = []

    def __len__(self) -> int:
        return sum(len(pods) for pods in self._pods_of.values())

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
        touched = {k for k in self._jobs if namespace is None or k[0] == namespace}
        for key in touched:
            del self._jobs[key]
        if namespace is None:
            self._pods_of.clear()
        else:
            self._pods_of.pop(namespace, None)
        for item in items:
            found = item.get("job")
            if found is not None:
                self._count(found, item["state"], tell=False)
                touched.add(found[0])
        self._listed.add(namespace)
        self.synced = self.watched is None or all(ns in self._listed for ns in self.watched)
        for key in touched:
            self._tell(key)

    def apply(self, event: EventType, raw: dict[str, Any]) -> None:
        found = job_of(raw)
        if found is not None and event != "DELETED":
            self._count(found, state_of(raw))
            return
        pod = (found[0][0], found[2]) if found is not None else pod_of(raw)
        if pod is not None:  # deleted, or its labels say no Job any more: counted nowhere
            self._uncount(*pod)

    def _count(self, found: tuple[TrainJobKey, JobKey, int], state: int, tell: bool = True) -> None:
        trainjob, job_key, pod = found
        pods = self._pods_of.setdefault(trainjob[0], {})
        before = pods.get(pod)
        if before is not None:
            job, was = before
            if job.trainjob != trainjob or job.key != job_key:
                self._uncount(trainjob[0], pod)  # its labels were edited: out of its old Job
                pods = self._pods_of.setdefault(trainjob[0], {})
            elif was == state:
                return
            else:  # the same Job, another state
                job.counts[was] -= 1
                job.counts[state] += 1
                pods[pod] = job.states[state]
                if tell and (LIVE in (was, state) or SUCCEEDED in (was, state)):
                    self._tell(trainjob)
                return
        jobs = self._jobs.setdefault(trainjob, {})
        job = jobs.get(job_key) or jobs.setdefault(job_key, JobPods(trainjob, job_key))
        if sum(job.counts) >= MAX_PODS_PER_JOB:
            return
        job.counts[state] += 1
        pods[pod] = job.states[state]
        if tell and state in (LIVE, SUCCEEDED):
            self._tell(trainjob)

    def _uncount(self, namespace: str, pod: int) -> None:
        pods = self._pods_of.get(namespace)
        counted = pods.pop(pod, None) if pods is not None else None
        if counted is None:
            return
        if not pods:
            del self._pods_of[namespace]
        job, state = counted
        job.counts[state] -= 1
        if not any(job.counts):
            jobs = self._jobs[job.trainjob]
            del jobs[job.key]
            if not jobs:
                del self._jobs[job.trainjob]
        if state in (LIVE, SUCCEEDED):
            self._tell(job.trainjob)

    def _tell(self, key: TrainJobKey) -> None:
        for listener in self._listeners:
            listener(*key)

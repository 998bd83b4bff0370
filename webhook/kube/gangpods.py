"""How many pods each Job of a JobSet has, by state, from a watch of JobSet's pods: what gang
health after admission is judged from (`reconcile/status.py`); and, per TrainJob, the newest
JobSet restart attempt its present pods belong to and how many of them have no
`spec.schedulingGroup` (untied: a gang waits for them for ever).

No pod is kept: each watch event is reduced to its Job (namespace, JobSet, ReplicatedJob, Job
index, from the labels JobSet puts on every pod), a state (pending, live, succeeded, lost), its
restart attempt (label) and the group it names (none: untied), then dropped. Per Job: four
counts. Per TrainJob: present (pending or live) pods by attempt, by the group they name (a group
in use is never deleted), and untied ones. Per pod, by namespace and the hash of its name: its
Job, state, attempt and group, as one tuple its Job holds and
shares with its other pods (a later event must know what the pod counted as, and in which Job:
a pod whose labels are edited leaves it). Work per event is a few dict operations; listeners
hear (namespace, JobSet name) when a Job's live or succeeded count changed, or the TrainJob's
attempt or untied count did, and coalesce what they do with it (the reconciler's work queue
holds each TrainJob once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..core.plan import JOB_INDEX, JOBSET_NAME, REPLICATED_JOB_NAME
from ..core.plan import attempt_of as labels_attempt
from .store import EventType

PENDING, LIVE, SUCCEEDED, LOST = 0, 1, 2, 3
PRESENT = (PENDING, LIVE)  # the states a pod holds (or waits for) a place in its gang in
SELECTOR = JOBSET_NAME  # the label selector of the watch: every pod JobSet made
MAX_PODS_PER_JOB = 100_000  # a Job's pods remembered; far above any real Job's
MAX_SHAPES_PER_JOB = 64  # shared tuples a Job keeps; past it, started again (attempts churned)
TrainJobKey = tuple[str, str]  # (namespace, JobSet name = TrainJob name)
JobKey = tuple[str, int]  # (ReplicatedJob, Job index)
Changed = Callable[[str, str], None]


class JobPods:
    """One Job's pods: counts by state, and its untied present pods."""

    __slots__ = ("_shapes", "counts", "key", "trainjob", "untied")

    def __init__(self, trainjob: TrainJobKey, key: JobKey) -> None:
        self.counts = [0, 0, 0, 0]  # PENDING, LIVE, SUCCEEDED, LOST
        self.untied = 0  # pending or live pods without spec.schedulingGroup
        self.trainjob = trainjob
        self.key = key
        # What each of its pods is remembered as, shared by its pods: no object per pod.
        self._shapes: dict[tuple[int, int, str | None], Counted] = {}

    @property
    def live(self) -> int:
        return self.counts[LIVE]

    @property
    def succeeded(self) -> int:
        return self.counts[SUCCEEDED]

    def shape(self, state: int, attempt: int, group: str | None) -> Counted:
        key = (state, attempt, group)
        found = self._shapes.get(key)
        if found is None:
            if len(self._shapes) >= MAX_SHAPES_PER_JOB:
                self._shapes.clear()  # pods keep theirs; equal ones are made anew
            found = self._shapes[key] = (self, state, attempt, group)
        return found


# A pod's Job, state, restart attempt, and the group it names (None: untied).
Counted = tuple[JobPods, int, int, str | None]


class Gang:
    """One TrainJob's Jobs, and its present pods by restart attempt, by the group they name,
    and untied."""

    __slots__ = ("attempts", "groups", "jobs", "untied")

    def __init__(self) -> None:
        self.jobs: dict[JobKey, JobPods] = {}
        self.attempts: dict[int, int] = {}  # attempt -> its present pods
        self.groups: dict[str, int] = {}  # PodGroup named -> its present pods
        self.untied = 0  # present pods without spec.schedulingGroup

    def attempt(self) -> int:
        return max(self.attempts, default=0)  # a few keys: a restart's old and new pods

    def add(self, counted: Counted, sign: int) -> bool:
        """Counts a pod in (+1) or out (-1); whether attempt(), the groups in use or untied may
        have changed."""
        job, state, attempt, group = counted
        if state not in PRESENT:
            return False
        untied = group is None
        in_use = False  # a group lost its last present pod (what was kept for it may go)
        if group is not None:
            left = self.groups.get(group, 0) + sign
            if left:
                self.groups[group] = left
            else:
                self.groups.pop(group, None)
            in_use = left == 0
        attempts = self.attempts
        had = attempts.get(attempt, 0)
        if had and had + sign:  # its attempt keeps other pods: the newest is the same
            attempts[attempt] = had + sign
            moved = False
        elif sign > 0:  # the first pod of its attempt
            moved = attempt > self.attempt()
            attempts[attempt] = 1
        else:  # the last
            del attempts[attempt]
            moved = attempt > self.attempt()
        if untied:
            self.untied += sign
            job.untied += sign
        return moved or untied or in_use


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


def attempt_of(raw: Mapping[str, Any]) -> int:
    """A pod's JobSet restart attempt (its label, read as the pod webhook reads it); 0 when
    absent or not a count JobSet writes."""
    meta = raw.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return (labels_attempt(labels) or 0) if isinstance(labels, dict) else 0


def is_untied(raw: Mapping[str, Any]) -> bool:
    """Whether a pod has no `spec.schedulingGroup` (immutable: what it was created with)."""
    spec = raw.get("spec")
    return not (isinstance(spec, dict) and spec.get("schedulingGroup"))


def group_of(raw: Mapping[str, Any]) -> str | None:
    """The PodGroup a pod names in `spec.schedulingGroup` (None: untied; immutable)."""
    spec = raw.get("spec")
    held = spec.get("schedulingGroup") if isinstance(spec, dict) else None
    name = held.get("podGroupName") if isinstance(held, dict) else None
    if isinstance(name, str) and name:
        return name
    return "" if held else None  # a group of another shape: tied, to no name we make


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


Found = tuple[TrainJobKey, JobKey, int]
NO_JOBS: Mapping[JobKey, JobPods] = {}


class GangPods:
    """The pod counts of every JobSet in the watched namespaces (a `Sink` for an informer)."""

    resource = "pods"

    def __init__(self) -> None:
        self.synced = False
        self.watched: tuple[str, ...] | None = None  # namespaces listed one by one, if so
        self._listed: set[str | None] = set()
        self._gangs: dict[TrainJobKey, Gang] = {}
        self._pods_of: dict[str, dict[int, Counted]] = {}  # namespace -> pod -> where it counts
        self._listeners: list[Changed] = []

    def __len__(self) -> int:
        return sum(len(pods) for pods in self._pods_of.values())

    def subscribe(self, listener: Changed) -> None:
        self._listeners.append(listener)

    def jobs(self, namespace: str, jobset: str) -> Mapping[JobKey, JobPods]:
        """The Jobs of a JobSet with pods ({} when none are known)."""
        gang = self._gangs.get((namespace, jobset))
        return gang.jobs if gang is not None else NO_JOBS

    def attempt(self, namespace: str, jobset: str) -> int:
        """The newest JobSet restart attempt among its pending or live pods (0 when none): a
        restart's old pods are being deleted (lost) while its new ones are created."""
        gang = self._gangs.get((namespace, jobset))
        return gang.attempt() if gang is not None else 0

    def attempts(self, namespace: str, jobset: str) -> frozenset[int]:
        """The restart attempts that have pending or live pods (a restart's old pods linger
        while they terminate)."""
        gang = self._gangs.get((namespace, jobset))
        return frozenset(gang.attempts) if gang is not None else frozenset()

    def groups_in_use(self, namespace: str, jobset: str) -> frozenset[str]:
        """The groups its pending or live pods name: never deleted under them."""
        gang = self._gangs.get((namespace, jobset))
        return frozenset(gang.groups) if gang is not None else frozenset()

    def untied(
        self, namespace: str, jobset: str, grouped: Callable[[str, int], bool] | None = None
    ) -> int:
        """Its pending or live pods that have no `spec.schedulingGroup`; with `grouped`, only
        those of the Jobs (ReplicatedJob, index) it says have a group (the plan's: pods of an
        untargeted ReplicatedJob have none, rightly). Work in its Jobs, not its pods."""
        gang = self._gangs.get((namespace, jobset))
        if gang is None or not gang.untied:
            return 0
        if grouped is None:
            return gang.untied
        return sum(job.untied for key, job in gang.jobs.items() if job.untied and grouped(*key))

    def trim(self, raw: dict[str, Any]) -> dict[str, Any]:
        """A listed pod as what is counted of it (the list holds every page until its end)."""
        found = job_of(raw)
        if found is None:
            return {}
        return {
            "job": found,
            "state": state_of(raw),
            "attempt": attempt_of(raw),
            "group": group_of(raw),
        }

    def replace(self, items: Iterable[dict[str, Any]], namespace: str | None = None) -> None:
        """A fresh list (of trimmed pods): the namespace's counts, or all of them, start again;
        every JobSet whose counts were or are now known is told."""
        touched = {k for k in self._gangs if namespace is None or k[0] == namespace}
        for key in touched:
            del self._gangs[key]
        if namespace is None:
            self._pods_of.clear()
        else:
            self._pods_of.pop(namespace, None)
        for item in items:
            found = item.get("job")
            if found is not None:
                self._count(found, item["state"], item["attempt"], item["group"], tell=False)
                touched.add(found[0])
        self._listed.add(namespace)
        self.synced = self.watched is None or all(ns in self._listed for ns in self.watched)
        for key in touched:
            self._tell(key)

    def apply(self, event: EventType, raw: dict[str, Any]) -> None:
        found = job_of(raw)
        if found is not None and event != "DELETED":
            self._count(found, state_of(raw), attempt_of(raw), raw)
            return
        pod = (found[0][0], found[2]) if found is not None else pod_of(raw)
        if pod is not None:  # deleted, or its labels say no Job any more: counted nowhere
            self._uncount(*pod)

    def _count(
        self,
        found: Found,
        state: int,
        attempt: int,
        group: str | dict[str, Any] | None,
        tell: bool = True,
    ) -> None:
        """Counts a pod where it is now; `group` is the group it names (None: untied), or the pod
        to read it from when it is not remembered yet (schedulingGroup is immutable: read
        once)."""
        trainjob, job_key, pod = found
        pods = self._pods_of.setdefault(trainjob[0], {})
        before = pods.get(pod)
        if before is not None:
            job, was, was_attempt, group = before
            if job.trainjob != trainjob or job.key != job_key:
                self._uncount(trainjob[0], pod)  # its labels were edited: out of its old Job
                pods = self._pods_of.setdefault(trainjob[0], {})
            elif was == state and was_attempt == attempt:
                return
            else:  # the same Job, another state or attempt
                gang = self._gangs[trainjob]
                moved = gang.add(before, -1)
                job.counts[was] -= 1
                job.counts[state] += 1
                pods[pod] = now = job.shape(state, attempt, group)
                moved = gang.add(now, 1) or moved
                counted = was != state and (LIVE in (was, state) or SUCCEEDED in (was, state))
                if tell and (counted or moved):
                    self._tell(trainjob)
                return
        named = group_of(group) if isinstance(group, dict) else group
        gang = self._gangs.get(trainjob) or self._gangs.setdefault(trainjob, Gang())
        job = gang.jobs.get(job_key) or gang.jobs.setdefault(job_key, JobPods(trainjob, job_key))
        if sum(job.counts) >= MAX_PODS_PER_JOB:
            return
        job.counts[state] += 1
        pods[pod] = now = job.shape(state, attempt, named)
        moved = gang.add(now, 1)
        if tell and (state in (LIVE, SUCCEEDED) or moved):
            self._tell(trainjob)

    def _uncount(self, namespace: str, pod: int) -> None:
        pods = self._pods_of.get(namespace)
        counted = pods.pop(pod, None) if pods is not None else None
        if counted is None:
            return
        if not pods:
            del self._pods_of[namespace]
        job, state = counted[0], counted[1]
        gang = self._gangs[job.trainjob]
        moved = gang.add(counted, -1)
        job.counts[state] -= 1
        if not any(job.counts):
            del gang.jobs[job.key]
            if not gang.jobs:
                del self._gangs[job.trainjob]
        if state in (LIVE, SUCCEEDED) or moved:
            self._tell(job.trainjob)

    def _tell(self, key: TrainJobKey) -> None:
        for listener in self._listeners:
            listener(*key)

"""What the bench watches, with the moment it saw each thing (this process's monotonic clock):
every pod, Job and PodGroup of the run's namespaces (one cluster-wide watch of each, filtered by
namespace), and the leader Lease. The API server's timestamps have whole seconds only; a watch
event arrives within milliseconds of the write."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tests.e2e.cluster import SCHEDULING_GROUP, Cluster, Json, api_path
from tests.e2e.recorder import Watcher
from webhook.core.plan import JOBSET_NAME, RESTART_ATTEMPT


@dataclass
class PodSeen:
    namespace: str
    name: str
    trainjob: str
    attempt: str
    group: str | None  # spec.schedulingGroup.podGroupName, as admitted
    added: float
    bound: float | None = None
    deleting: float | None = None  # deletionTimestamp first seen, or the DELETED event


@dataclass
class JobSeen:
    namespace: str
    name: str
    trainjob: str
    attempt: str
    added: float
    # Since when it has been seen not suspended (None while suspended): when the Job
    # controller may create its pods.
    running_since: float | None
    deleting: float | None = None


@dataclass
class GroupSeen:
    namespace: str
    name: str
    uid: str
    owner: str  # the controlling TrainJob's uid, or ""
    added: float
    deleting: float | None = None


@dataclass
class LeaseChange:
    at: float
    holder: str


@dataclass
class Timeline:
    """Pods, Jobs and PodGroups of `namespaces` (and the Lease `lease`, in `lease_namespace`)."""

    cluster: Cluster
    namespaces: set[str]
    lease_namespace: str | None = None
    lease: str | None = None
    clock: Callable[[], float] = time.monotonic
    pods: dict[str, PodSeen] = field(default_factory=dict)  # by uid
    jobs: dict[str, JobSeen] = field(default_factory=dict)  # by uid
    groups: dict[str, GroupSeen] = field(default_factory=dict)  # by uid
    leases: list[LeaseChange] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    watchers: list[Watcher] = field(default_factory=list)

    def start(self) -> None:
        version = self.cluster.scheduling_version
        paths: list[tuple[str, Callable[[str, Json], None]]] = [
            (api_path("", "v1", "pods"), self._pod),
            (api_path("batch", "v1", "jobs"), self._job),
            (api_path(SCHEDULING_GROUP, version, "podgroups"), self._group),
        ]
        if self.lease_namespace and self.lease:
            paths.append(
                (api_path("coordination.k8s.io", "v1", "leases", self.lease_namespace), self._lease)
            )
        for path, handle in paths:
            watcher = Watcher(self.cluster, path, handle)
            watcher.start()
            self.watchers.append(watcher)

    def stop(self) -> None:
        for watcher in self.watchers:
            watcher.stop()

    def errors(self) -> list[str]:
        return [e for w in self.watchers for e in w.errors]

    # --- handlers (watch threads) ----------------------------------------------------------

    def _ours(self, obj: Json) -> bool:
        return str((obj.get("metadata") or {}).get("namespace")) in self.namespaces

    def _pod(self, kind: str, pod: Json) -> None:
        if kind == "SYNCED" or not self._ours(pod):
            return
        now = self.clock()
        meta, spec = pod["metadata"], pod.get("spec") or {}
        labels = meta.get("labels") or {}
        uid = str(meta["uid"])
        with self.lock:
            seen = self.pods.get(uid)
            if seen is None:
                group = (spec.get("schedulingGroup") or {}).get("podGroupName")
                seen = PodSeen(
                    str(meta["namespace"]),
                    str(meta["name"]),
                    str(labels.get(JOBSET_NAME, "")),
                    str(labels.get(RESTART_ATTEMPT, "")),
                    str(group) if group else None,
                    now,
                )
                self.pods[uid] = seen
            if spec.get("nodeName") and seen.bound is None:
                seen.bound = now
            if (meta.get("deletionTimestamp") or kind == "DELETED") and seen.deleting is None:
                seen.deleting = now

    def _job(self, kind: str, job: Json) -> None:
        if kind == "SYNCED" or not self._ours(job):
            return
        now = self.clock()
        meta, spec = job["metadata"], job.get("spec") or {}
        labels = meta.get("labels") or {}
        uid = str(meta["uid"])
        suspended = bool(spec.get("suspend"))
        with self.lock:
            seen = self.jobs.get(uid)
            if seen is None:
                seen = JobSeen(
                    str(meta["namespace"]),
                    str(meta["name"]),
                    str(labels.get(JOBSET_NAME, "")),
                    str(labels.get(RESTART_ATTEMPT, "")),
                    now,
                    None if suspended else now,
                )
                self.jobs[uid] = seen
            elif suspended:
                seen.running_since = None
            elif seen.running_since is None:
                seen.running_since = now
            if (meta.get("deletionTimestamp") or kind == "DELETED") and seen.deleting is None:
                seen.deleting = now

    def _group(self, kind: str, group: Json) -> None:
        if kind == "SYNCED" or not self._ours(group):
            return
        now = self.clock()
        meta = group["metadata"]
        uid = str(meta["uid"])
        owners = [r for r in meta.get("ownerReferences") or [] if r.get("controller")]
        with self.lock:
            seen = self.groups.get(uid)
            if seen is None:
                seen = GroupSeen(
                    str(meta["namespace"]),
                    str(meta["name"]),
                    uid,
                    str(owners[0].get("uid")) if owners else "",
                    now,
                )
                self.groups[uid] = seen
            if (meta.get("deletionTimestamp") or kind == "DELETED") and seen.deleting is None:
                seen.deleting = now

    def _lease(self, kind: str, lease: Json) -> None:
        if kind == "SYNCED" or (lease.get("metadata") or {}).get("name") != self.lease:
            return
        holder = (
            "" if kind == "DELETED" else str((lease.get("spec") or {}).get("holderIdentity") or "")
        )
        with self.lock:
            if not self.leases or self.leases[-1].holder != holder:
                self.leases.append(LeaseChange(self.clock(), holder))

    # --- reads ------------------------------------------------------------------------------

    def pods_of(self, namespace: str, trainjob: str) -> list[PodSeen]:
        with self.lock:
            return [
                p for p in self.pods.values() if p.namespace == namespace and p.trainjob == trainjob
            ]

    def jobs_of(self, namespace: str, trainjob: str) -> list[JobSeen]:
        with self.lock:
            return [
                j for j in self.jobs.values() if j.namespace == namespace and j.trainjob == trainjob
            ]

    def group_named(self, namespace: str, names: Iterable[str]) -> list[GroupSeen]:
        wanted = set(names)
        with self.lock:
            return [
                g for g in self.groups.values() if g.namespace == namespace and g.name in wanted
            ]

    def holder(self) -> str:
        with self.lock:
            return self.leases[-1].holder if self.leases else ""

    def lease_changes(self, since: float) -> list[LeaseChange]:
        with self.lock:
            return [c for c in self.leases if c.at >= since]

    def counts(self) -> tuple[int, int, int]:
        """(pods, of them bound and live, PodGroups) seen now."""
        with self.lock:
            bound = sum(1 for p in self.pods.values() if p.bound is not None and p.deleting is None)
            return len(self.pods), bound, len(self.groups)

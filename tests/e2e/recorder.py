"""Watches kept for a whole test module: every pod of its namespace as the API server showed it
(so a pod that existed for a second, was bound and deleted is still judged), and the creations of
gang objects. The pod watch also plays the fake nodes' "kubelet" for deletions: a pod bound to
one of the run's fake nodes that is being deleted is force-deleted, as the harness's reaper does
(so the suite does not depend on it)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kubernetes.client.exceptions import ApiException

from webhook.core.plan import JOBSET_NAME

from .cluster import JOBSET_GROUP, JOBSET_VERSION, Cluster, Json, api_path

JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"


@dataclass
class PodRecord:
    """One pod (by uid), as first created and as last seen."""

    name: str
    uid: str
    labels: dict[str, str]
    owner: str  # the controlling Job's name, or ""
    pod_group: str | None  # spec.schedulingGroup.podGroupName at creation (immutable)
    node: str | None = None  # spec.nodeName once bound
    phase: str = ""
    deleted: bool = False
    created: str = ""
    # time.monotonic() when the watch first showed it, bound, and deleted
    seen_at: float = field(default_factory=time.monotonic)
    bound_at: float | None = None
    deleted_at: float | None = None

    @property
    def trainjob(self) -> str | None:
        return self.labels.get(JOBSET_NAME)


def _pod_group_of(pod: Json) -> str | None:
    group = (pod.get("spec") or {}).get("schedulingGroup") or {}
    name = group.get("podGroupName")
    return str(name) if name else None


class Watcher:
    """A list-then-watch loop of one collection in a thread; `handle` gets every (type, object),
    the listed objects as ADDED and then ("SYNCED", {}); resumes from the last
    resourceVersion, lists again after a 410."""

    def __init__(self, cluster: Cluster, path: str, handle: Callable[[str, Json], None]) -> None:
        self.cluster, self.path, self.handle = cluster, path, handle
        self.stop_event = threading.Event()
        self.synced = threading.Event()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"watch {path}")

    def start(self) -> None:
        self.thread.start()
        if not self.synced.wait(30):
            raise AssertionError(f"could not list {self.path}: {self.errors[-3:]}")

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=5)

    def _run(self) -> None:
        version = ""
        while not self.stop_event.is_set():
            try:
                if not version:
                    listed = self.cluster.request("GET", self.path)
                    for item in listed.get("items") or []:
                        self.handle("ADDED", item)
                    version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
                    self.handle("SYNCED", {})
                    self.synced.set()
                for event in self.cluster.watch(self.path, version, seconds=30):
                    if self.stop_event.is_set():
                        return
                    kind, obj = str(event.get("type")), event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            version = ""
                        break
                    meta = obj.get("metadata") or {}
                    version = str(meta.get("resourceVersion") or version)
                    if kind != "BOOKMARK":
                        self.handle(kind, obj)
            except ApiException as err:
                self.errors.append(f"{err.status}: {str(err.body)[:200]}")
                if err.status == 410:
                    version = ""
                time.sleep(0.5)
            except Exception as err:
                self.errors.append(repr(err)[:200])
                time.sleep(0.5)


@dataclass
class PodRecorder:
    """Every pod of a namespace, by uid; and the TrainJob uid of each JobSet uid seen."""

    cluster: Cluster
    namespace: str
    fake_nodes: Callable[[], set[str]]
    pods: dict[str, PodRecord] = field(default_factory=dict)
    jobset_owner: dict[str, str] = field(default_factory=dict)  # JobSet uid -> TrainJob uid
    lock: threading.Lock = field(default_factory=threading.Lock)
    reaped: list[str] = field(default_factory=list)
    watcher: Watcher | None = None

    def start(self) -> None:
        path = api_path("", "v1", "pods", self.namespace)
        self.watcher = Watcher(self.cluster, path, self._handle)
        self.watcher.start()

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()

    def _handle(self, kind: str, pod: Json) -> None:
        if kind == "SYNCED":
            return
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        spec = pod.get("spec") or {}
        with self.lock:
            record = self.pods.get(uid)
            if record is None:
                owners = [r for r in meta.get("ownerReferences") or [] if r.get("controller")]
                record = PodRecord(
                    name=str(meta.get("name")),
                    uid=uid,
                    labels=dict(meta.get("labels") or {}),
                    owner=str(owners[0].get("name")) if owners else "",
                    pod_group=_pod_group_of(pod),
                    created=str(meta.get("creationTimestamp") or ""),
                )
                self.pods[uid] = record
            if spec.get("nodeName"):
                record.node = str(spec["nodeName"])
                if record.bound_at is None:
                    record.bound_at = time.monotonic()
            record.phase = str((pod.get("status") or {}).get("phase") or record.phase)
            if kind == "DELETED" and not record.deleted:
                record.deleted, record.deleted_at = True, time.monotonic()
        jobset_uid = record.labels.get(JOBSET_UID)
        if jobset_uid and jobset_uid not in self.jobset_owner and record.trainjob:
            self._learn_jobset(record.trainjob, jobset_uid)
        if (
            kind != "DELETED"
            and meta.get("deletionTimestamp")
            and spec.get("nodeName") in self.fake_nodes()
        ):
            # No kubelet confirms the deletion of a pod on a fake node: as the harness's reaper
            # (and a kubelet) would, once its containers "stopped".
            with contextlib.suppress(Exception):
                if self.cluster.delete(
                    "", "v1", "pods", str(meta.get("name")), self.namespace,
                    grace_seconds=0, uid=uid,
                ):  # fmt: skip
                    self.reaped.append(str(meta.get("name")))

    def _learn_jobset(self, name: str, jobset_uid: str) -> None:
        with contextlib.suppress(Exception):
            jobset = self.cluster.get(JOBSET_GROUP, JOBSET_VERSION, "jobsets", name, self.namespace)
            if jobset is None or (jobset.get("metadata") or {}).get("uid") != jobset_uid:
                return
            for ref in jobset["metadata"].get("ownerReferences") or []:
                if ref.get("kind") == "TrainJob" and ref.get("controller"):
                    self.jobset_owner[jobset_uid] = str(ref.get("uid"))

    def of(self, trainjob: str) -> list[PodRecord]:
        with self.lock:
            return [r for r in self.pods.values() if r.trainjob == trainjob]

    def all(self) -> list[PodRecord]:
        with self.lock:
            return list(self.pods.values())


@dataclass
class CreationCounter:
    """ADDED events of one gang kind in a namespace after a point in time: how many times
    objects were (re)created (a delete/re-create loop shows as a count that keeps growing)."""

    cluster: Cluster
    path: str
    added: list[tuple[str, str]] = field(default_factory=list)  # (name, uid)
    added_at: dict[str, float] = field(default_factory=dict)  # uid -> time.monotonic() seen
    deleted: list[tuple[str, str]] = field(default_factory=list)
    watcher: Watcher | None = None
    counting: bool = False

    def start(self) -> None:
        def handle(kind: str, obj: Json) -> None:
            if kind == "SYNCED":
                self.counting = True  # what the list held existed already
                return
            if not self.counting:
                return
            meta = obj.get("metadata") or {}
            entry = (str(meta.get("name")), str(meta.get("uid")))
            if kind == "ADDED":
                self.added.append(entry)
                self.added_at[entry[1]] = time.monotonic()
            elif kind == "DELETED":
                self.deleted.append(entry)

        self.watcher = Watcher(self.cluster, self.path, handle)
        self.watcher.start()

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()

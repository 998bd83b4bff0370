"""The Jobs of ganged TrainJobs that lack pods and have lost none: what a replica that starts
wakes (`waker.py`). Their pod creations were refused while no replica answered (the pod webhook
is `failurePolicy: Fail` for them), so no replica held them to remember, and the Job controller
would make them again only on its backoff, up to a minute per Job. The same Jobs of a TrainJob
the reconciler freezes late (created while no replica answered) are woken when its snapshot
comes: at start its Jobs were not known to be ganged yet.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ..core.plan import JOB_INDEX, JOBSET_NAME, REPLICATED_JOB_NAME, RESTART_ATTEMPT
from ..core.podcounts import pods_per_job
from ..core.snapshot import SNAPSHOT_ANNOTATION
from .cache import Cache
from .gangpods import LIVE, LOST, PENDING, SUCCEEDED, GangPods
from .store import Key
from .waker import HeldPod, WakerSettings

REASON = "ServiceAway"  # the waker's reason label for these
MAX_JOBS = WakerSettings().max_per_namespace  # Jobs of one ReplicatedJob looked at


def lacking(cache: Cache, pods: GangPods) -> Iterator[HeldPod]:
    """Each running ganged TrainJob's Jobs with fewer pods than they make and none lost (a Job
    replacing failed pods goes at its own pace), as held pods to be judged and woken."""
    for (namespace, name), _ in cache.trainjobs.items():
        yield from lacking_of(cache, pods, namespace, name)


def lacking_of(cache: Cache, pods: GangPods, namespace: str, name: str) -> Iterator[HeldPod]:
    """The Jobs of one TrainJob that lack pods (see `lacking`); none unless it is frozen with a
    gang, running, and its restart attempt known."""
    lookup = cache.plan_for(namespace, name)
    plan, trainjob, checked = lookup.plan, lookup.trainjob, lookup.runtime
    if plan is None or trainjob is None or checked is None:
        return
    if cache.not_running(namespace, name) is not None:
        return
    attempt = cache.restart_attempt(namespace, name, plan.trainjob_uid)
    if attempt is None:
        return
    runtime = checked.runtime
    replicated = {rj.name: rj for rj in runtime.replicated_jobs}
    jobs = pods.jobs(namespace, name)
    for group in plan.groups:
        for rj_name in group.replicated_jobs:
            rj = replicated.get(rj_name)
            if rj is None:
                continue
            # Bounded: the waker remembers at most that many Jobs of a namespace anyway, and a
            # runtime's replicas may be anything up to int32.
            count = min(rj.replica_count, MAX_JOBS)
            indices = [group.job_index] if group.job_index is not None else range(count)
            wanted = pods_per_job(runtime, rj, trainjob.num_nodes)
            for index in indices:
                counted = jobs.get((rj_name, index))
                counts = counted.counts if counted is not None else [0, 0, 0, 0]
                if counts[LOST] or counts[PENDING] + counts[LIVE] + counts[SUCCEEDED] >= wanted:
                    continue
                labels = {
                    JOBSET_NAME: name,
                    REPLICATED_JOB_NAME: rj_name,
                    JOB_INDEX: str(index),
                    RESTART_ATTEMPT: str(attempt),
                }
                job = f"{name}-{rj_name}-{index}"  # JobSet's name for it
                yield HeldPod(namespace, job, name, labels, group.scheduler_name, REASON)


def frozen_late(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> Key | None:
    """The TrainJob (namespace, name) that a change froze: its snapshot written after it was
    stored (by the reconciler: one created while no replica answered, whose pod creations were
    refused unseen, or one the reconciler froze after a NotFrozen hold). None otherwise, and for
    one frozen at its creation (its pods come after, and are tied or held as they come)."""
    if old is None or new is None or _frozen(old) or not _frozen(new):
        return None
    meta = new.get("metadata")
    if not isinstance(meta, dict):
        return None
    namespace, name = meta.get("namespace"), meta.get("name")
    return (namespace, name) if isinstance(namespace, str) and isinstance(name, str) else None


def _frozen(raw: Mapping[str, Any]) -> bool:
    meta = raw.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    return isinstance(annotations, dict) and SNAPSHOT_ANNOTATION in annotations

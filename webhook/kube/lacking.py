"""The Jobs of ganged TrainJobs that lack pods and have lost none: what a replica that starts
wakes (`waker.py`). Their pod creations were refused while no replica answered (the pod webhook
is `failurePolicy: Fail` for them), so no replica held them to remember, and the Job controller
would make them again only on its backoff, up to a minute per Job.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..core.plan import JOB_INDEX, JOBSET_NAME, REPLICATED_JOB_NAME, RESTART_ATTEMPT
from ..core.podcounts import pods_per_job
from .cache import Cache
from .gangpods import LIVE, LOST, PENDING, SUCCEEDED, GangPods
from .waker import HeldPod

REASON = "ServiceAway"  # the waker's reason label for these


def lacking(cache: Cache, pods: GangPods) -> Iterator[HeldPod]:
    """Each running ganged TrainJob's Jobs with fewer pods than they make and none lost (a Job
    replacing failed pods goes at its own pace), as held pods to be judged and woken."""
    for (namespace, name), _ in cache.trainjobs.items():
        lookup = cache.plan_for(namespace, name)
        plan, trainjob, checked = lookup.plan, lookup.trainjob, lookup.runtime
        if plan is None or trainjob is None or checked is None:
            continue
        if cache.not_running(namespace, name) is not None:
            continue
        attempt = cache.restart_attempt(namespace, name, plan.trainjob_uid)
        if attempt is None:
            continue
        runtime = checked.runtime
        replicated = {rj.name: rj for rj in runtime.replicated_jobs}
        jobs = pods.jobs(namespace, name)
        for group in plan.groups:
            for rj_name in group.replicated_jobs:
                rj = replicated.get(rj_name)
                if rj is None:
                    continue
                indices = (
                    [group.job_index] if group.job_index is not None else range(rj.replica_count)
                )
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

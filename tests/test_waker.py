"""The waker: a Job whose pod creations the pod webhook held is woken (one annotation patched
onto it, an update the Job controller syncs on) as soon as its pods would be tied, so the Job
controller's backoff (up to a minute per Job) never decides when a gang starts; a replica that
starts wakes the ganged TrainJobs' Jobs that lack pods.

The API server is a stub over real HTTP (aiohttp) that answers Job patches; that the Job
controller then makes the pods within about a second is `make e2e`'s (tests/e2e).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from tests.harness import fixture, fixture_cache, stub_api
from webhook.admission.handlers import hold_is_moot, mutate_pod_review, would_hold
from webhook.admission.review import Review
from webhook.core.snapshot import SNAPSHOT_ANNOTATION
from webhook.kube.cache import Cache
from webhook.kube.gangpods import GangPods
from webhook.kube.lacking import lacking
from webhook.kube.metered import MeteredApiClient
from webhook.kube.waker import WAKE_ANNOTATION, HeldPod, JobWaker, WakerSettings
from webhook.server.run import wake_when_frozen_late

NS, NAME = "team-a", "my-job"
JOB = "my-job-node-0"


@dataclass
class Jobs:
    """What the stub answers a Job patch, and the patches it got."""

    status: int = 200
    patches: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)


@contextlib.asynccontextmanager
async def api_server(jobs: Jobs) -> AsyncIterator[MeteredApiClient]:
    async def patch(request: web.Request) -> web.Response:
        body = await request.json()
        jobs.patches.append((request.match_info["name"], body, request.content_type))
        if jobs.status != 200:
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                      "code": jobs.status, "message": "no"}  # fmt: skip
            return web.json_response(status, status=jobs.status)
        return web.json_response({"apiVersion": "batch/v1", "kind": "Job", "metadata": {}})

    app = web.Application()
    app.router.add_patch("/apis/batch/v1/namespaces/{ns}/jobs/{name}", patch)
    async with stub_api(app) as api:
        yield api


def held_pod(job: str = JOB, reason: str = "NotFrozen") -> HeldPod:
    labels = {"jobset.sigs.k8s.io/jobset-name": NAME}
    return HeldPod(NS, job, NAME, labels, None, reason)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.asyncio
async def test_a_held_job_is_woken_once_its_pods_would_be_tied() -> None:
    holding = {"still": True}
    woken: list[str] = []
    clock = Clock()
    jobs = Jobs()
    async with api_server(jobs) as api:
        waker = JobWaker(api, lambda _: holding["still"], on_wake=woken.append, clock=clock)
        waker.held(held_pod())
        clock.now += 3
        waker.held(held_pod())  # the Job controller's next try, held again: one Job remembered
        assert len(waker) == 1 and waker.oldest() == 3.0
        await waker.round()
        assert jobs.patches == [] and len(waker) == 1  # still held: not woken
        holding["still"] = False  # e.g. the reconciler froze the runtime
        await waker.round()
        ((name, body, content_type),) = jobs.patches
        assert (name, content_type) == (JOB, "application/merge-patch+json")
        assert list(body) == ["metadata"] and list(body["metadata"]["annotations"]) == [
            WAKE_ANNOTATION
        ]
        assert woken == ["NotFrozen"] and len(waker) == 0 and waker.oldest() == 0.0
        await waker.round()
        assert len(jobs.patches) == 1  # once


@pytest.mark.asyncio
async def test_what_a_wake_cannot_do_is_left_to_the_job_controller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    jobs = Jobs(status=404)
    async with api_server(jobs) as api:
        waker = JobWaker(api, lambda _: False)
        waker.held(held_pod("gone"))
        await waker.round()
        assert len(waker) == 0  # the Job is gone: nothing to wake
        jobs.status = 500
        waker.held(held_pod("flaky"))
        await waker.round()
        assert len(waker) == 1  # tried again next round
        jobs.status = 403
        with caplog.at_level(logging.WARNING, logger="webhook.waker"):
            await waker.round()
            waker.held(held_pod("another"))
            await waker.round()
        assert len(waker) == 0
        warned = [r for r in caplog.records if "may not patch Jobs" in r.getMessage()]
        assert len(warned) == 1  # said once


def test_what_is_remembered_is_bounded() -> None:
    clock = Clock()
    waker = JobWaker(None, lambda _: True, WakerSettings(max_jobs=3, keep_for=60), clock=clock)
    for i in range(5):
        waker.held(held_pod(f"job-{i}"))
    assert len(waker) == 3  # the oldest two forgotten
    clock.now += 61
    asyncio.run(waker.round())
    assert len(waker) == 0  # past keep_for: the Job controller's own retries have them


def test_a_hold_that_can_no_longer_end_in_a_tie_is_forgotten_and_namespaces_are_capped() -> None:
    gone = {"yes": False}
    clock = Clock()
    waker = JobWaker(
        None, lambda _: True, WakerSettings(max_per_namespace=2), moot=lambda _: gone["yes"],
        clock=clock,
    )  # fmt: skip
    waker.held(held_pod("a"))
    waker.held(held_pod("b"))
    waker.held(held_pod("c"))  # its namespace has as many as it may
    other = HeldPod("team-b", "x", NAME, {}, None, "NotFrozen")
    waker.held(other)  # another namespace's still counts
    assert len(waker) == 3
    asyncio.run(waker.round())
    assert len(waker) == 3  # still held, still remembered
    gone["yes"] = True  # its TrainJob deleted, say
    asyncio.run(waker.round())
    assert len(waker) == 3  # not yet: the cache may lag a resume
    clock.now += 31  # no pod of those Jobs held for 31 s
    asyncio.run(waker.round())
    assert len(waker) == 0 and waker.oldest() == 0.0


def test_a_hold_moot_only_in_a_lagging_cache_is_woken_once_it_catches_up() -> None:
    """A resume the cache has not seen yet: the pods are held TrainJobSuspended and the hold
    looks moot (suspended); a moment later the cache has the resume and the Job is judged and
    woken (the clock never passes the grace), not forgotten to the Job controller's backoff."""
    state = {"suspended": True}
    judged: list[str] = []

    def judge(pod: HeldPod) -> bool:
        judged.append(pod.job)
        return state["suspended"]

    waker = JobWaker(None, judge, moot=lambda _: state["suspended"], clock=Clock())
    waker.held(held_pod("a"))
    asyncio.run(waker.round())
    assert len(waker) == 1 and judged == []  # moot for now, kept through the grace
    state["suspended"] = False  # the watch brings the resume
    asyncio.run(waker.round())
    assert judged == ["a"] and len(waker) == 0  # judged tied now: woken (no API here)


def test_only_a_pod_its_job_owns_is_remembered() -> None:
    """A bare pod labelled as a Job's would have the waker patch a Job it names: only a pod
    whose controller reference is a Job is remembered."""
    cache = fixture_cache()
    unfrozen(cache)
    told: list[HeldPod] = []
    cache.on_hold = told.append
    review = pod_review()
    assert review.object is not None
    review.object["metadata"].pop("ownerReferences")
    mutate_pod_review(review, cache)
    assert told == []


def test_what_makes_a_hold_moot() -> None:
    cache = fixture_cache()
    pod = held_pod()
    assert not hold_is_moot(pod, cache)
    gone = HeldPod(NS, JOB, "no-such-trainjob", {}, None, "TrainJobGone")
    assert hold_is_moot(gone, cache)  # the API server said 404 and the cache has listed
    lagging = HeldPod(NS, JOB, "no-such-trainjob", {}, None, "TrainJobNotCached")
    assert not hold_is_moot(lagging, cache)  # the API server has it: a watch lags, a fault
    entry = cache.trainjobs.get(NS, NAME)
    assert entry is not None
    suspended = copy.deepcopy(entry.raw)
    suspended["spec"]["suspend"] = True
    cache.trainjobs.replace([suspended])
    assert hold_is_moot(pod, cache)


def pod_review() -> Review:
    doc = copy.deepcopy(fixture("pod-create-by-job-controller.mutate.json"))
    r = doc["request"]
    return Review(r["uid"], "", "v1", "Pod", "pods", "", "", NS, "CREATE", "", r["object"],
                  None, False)  # fmt: skip


def unfrozen(cache: Cache) -> None:
    entry = cache.trainjobs.get(NS, NAME)
    assert entry is not None
    raw = copy.deepcopy(entry.raw)
    raw["metadata"]["annotations"].pop(SNAPSHOT_ANNOTATION)
    cache.trainjobs.replace([raw])


def test_the_pod_webhook_tells_the_waker_what_it_holds_and_the_waker_judges_alike() -> None:
    cache = fixture_cache()
    frozen = cache.trainjobs.get(NS, NAME)
    assert frozen is not None
    frozen_raw = copy.deepcopy(frozen.raw)
    unfrozen(cache)
    told: list[HeldPod] = []
    cache.on_hold = told.append
    decision = mutate_pod_review(pod_review(), cache)
    assert not isinstance(decision, type(None)) and not getattr(decision, "allowed", True)
    (pod,) = told
    assert (pod.namespace, pod.trainjob, pod.reason) == (NS, NAME, "NotFrozen")
    assert pod.job.startswith("my-job-node-0")  # its Job (the pod's controller)
    assert would_hold(pod, cache)
    cache.trainjobs.replace([frozen_raw])  # the reconciler froze it
    assert not would_hold(pod, cache)
    # A dry run holds nothing for real: nothing to wake.
    told.clear()
    dry = pod_review()
    dry.dry_run = True
    unfrozen(cache)
    mutate_pod_review(dry, cache)
    assert told == []


def test_a_replica_that_starts_wakes_the_jobs_that_lack_pods() -> None:
    cache = fixture_cache()
    pods = GangPods()
    pods.replace([])
    (found,) = list(lacking(cache, pods))  # the fixtures' TrainJob: one Job, no pods yet
    assert (found.namespace, found.job, found.reason) == (NS, JOB, "ServiceAway")
    assert not would_hold(found, cache)  # frozen: its pods would be tied, so it is woken
    # Its pods there (or one lost: the Job replaces it at its own pace): nothing to wake.
    review = fixture("pod-create-by-job-controller.mutate.json")["request"]["object"]
    wanted = 100  # the captured TrainJob's numNodes
    many = []
    for i in range(wanted):
        pod = copy.deepcopy(review)
        pod["metadata"]["name"] = f"p-{i}"
        pod["metadata"]["uid"] = f"u-{i}"
        pod["metadata"]["namespace"] = NS
        many.append(pod)
    pods.replace([pods.trim(p) for p in many])  # (as the informer lists them)
    assert list(lacking(cache, pods)) == []


def test_a_trainjob_frozen_late_has_its_jobs_woken_when_its_snapshot_comes() -> None:
    """Created while no replica answered: at start its Jobs were not known to be a gang's (no
    snapshot), so the sweep passed them; when the reconciler's snapshot reaches the cache, its
    Jobs that lack pods are given to the waker, and they would be tied. A TrainJob that came
    frozen (the mutating webhook froze it at its creation) gives none."""
    cache = fixture_cache()
    entry = cache.trainjobs.get(NS, NAME)
    assert entry is not None
    frozen_raw = copy.deepcopy(entry.raw)
    unfrozen(cache)
    pods = GangPods()
    pods.replace([])
    waker = JobWaker(None, lambda pod: would_hold(pod, cache), clock=Clock())
    wake_when_frozen_late(cache, pods, waker)
    assert list(lacking(cache, pods)) == []  # the sweep at start: not a gang's yet
    cache.trainjobs.apply("MODIFIED", frozen_raw)  # the reconciler's snapshot, watched
    assert len(waker) == 1
    (held,) = list(lacking(cache, pods))
    assert (held.job, held.reason) == (JOB, "ServiceAway") and not would_hold(held, cache)
    asyncio.run(waker.round())
    assert len(waker) == 0  # judged tied: woken (no API here)
    again = copy.deepcopy(frozen_raw)
    again["metadata"]["labels"] = {"touched": "yes"}
    cache.trainjobs.apply("MODIFIED", again)  # frozen already: nothing more
    assert len(waker) == 0

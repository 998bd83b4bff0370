"""The pod webhook ties a ganged TrainJob's pod to its group or holds it (issue 26), over real
HTTPS reviews built from the captured pod of my-job's node Job: one test per reason it holds,
lets through untied, or ties; and the one live read, whether a TrainJob the cache lacks exists
(`webhook/kube/lookup.py`), asked once per name however many pods come."""

from __future__ import annotations

import asyncio
import base64
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.harness import served
from webhook.admission.handlers import HOLD_CODE
from webhook.backends.base import MANAGED_BY, MANAGED_BY_LABEL
from webhook.backends.native import POD_GROUP
from webhook.core import naming
from webhook.core.defaults import GANG_LABEL
from webhook.core.plan import RESTART_ATTEMPT
from webhook.core.snapshot import SNAPSHOT_ANNOTATION, snapshot
from webhook.kube.cache import Cache
from webhook.kube.lookup import MAX_REMEMBERED, TTL, TrainJobLookup

from .harness import RunningServer, fixture, fixture_cache, running_server

POD_PATH = "/mutate--v1-pod"
NS, NAME = "team-a", "my-job"
REVIEW = fixture("pod-create-by-job-controller.mutate.json")


def trainjob_raw(cache: Cache) -> dict[str, Any]:
    entry = cache.trainjobs.get(NS, NAME)
    assert entry is not None
    return copy.deepcopy(entry.raw)


def uid_of(cache: Cache) -> str:
    uid: str = trainjob_raw(cache)["metadata"]["uid"]
    return uid


def freeze(cache: Cache, text: str | None = None) -> None:
    """What the reconciler does first: the runtime frozen into the cached TrainJob."""
    raw = trainjob_raw(cache)
    if text is None:
        ref = raw["spec"]["runtimeRef"]
        checked = cache.runtime(ref.get("kind"), NS, ref["name"])
        assert checked is not None and checked.layout is not None
        text = snapshot(checked.runtime)
    raw["metadata"].setdefault("annotations", {})[SNAPSHOT_ANNOTATION] = text
    cache.trainjobs.replace([raw])


def ganged_cache() -> Cache:
    """The fixtures' cache, its TrainJob not frozen yet (the reconciler has not passed)."""
    cache = fixture_cache()
    served(cache, "native")
    raw = trainjob_raw(cache)
    raw["metadata"].get("annotations", {}).pop(SNAPSHOT_ANNOTATION, None)
    cache.trainjobs.replace([raw])
    return cache


def review(attempt: str | None = "0", scheduler: str | None = None) -> dict[str, Any]:
    doc = copy.deepcopy(REVIEW)
    pod = doc["request"]["object"]
    if attempt is None:
        pod["metadata"]["labels"].pop(RESTART_ATTEMPT)
    else:
        pod["metadata"]["labels"][RESTART_ATTEMPT] = attempt
    if scheduler is not None:
        pod["spec"]["schedulerName"] = scheduler
    return doc


def answer(client: httpx.Client, doc: dict[str, Any]) -> dict[str, Any]:
    response: dict[str, Any] = client.post(POD_PATH, content=orjson.dumps(doc)).json()["response"]
    return response


def tied_to(response: dict[str, Any]) -> str | None:
    assert response["allowed"] is True, response
    if "patch" not in response:
        return None
    (op,) = orjson.loads(base64.b64decode(response["patch"]))
    assert op["path"] == "/spec/schedulingGroup"
    name: str = op["value"]["podGroupName"]
    return name


def held(response: dict[str, Any], words: str) -> None:
    assert response["allowed"] is False, response
    status = response["status"]
    assert (status["code"], status["reason"]) == (HOLD_CODE, "Forbidden")
    assert status["message"].startswith("SchedulingBlocked: "), status
    assert words in status["message"], status["message"]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    with running_server(ganged_cache(), tmp_path / "certs") as srv:
        yield srv


def test_a_frozen_trainjobs_pod_is_tied_to_its_incarnations_group(server: RunningServer) -> None:
    cache = server.cache
    freeze(cache)
    with server.client() as client:
        name = naming.workload_name(NS, NAME, uid_of(cache))  # level 1: the Workload's name
        assert tied_to(answer(client, review())) == name
        assert tied_to(answer(client, review(attempt=None))) == name  # no label: attempt 0
        # A pod that claims another attempt than its JobSet's (forged, or of one that is over)
        # is held: it would make, or join, a gang of its own.
        held(answer(client, review(attempt="2")), "says attempt 2, its JobSet is at attempt 0")
        # A JobSet restart (its status.restarts counts it): its own PodGroup, never the
        # previous attempt's.
        cache.jobsets.replace([jobset(uid_of(cache), restarts=2)])
        assert tied_to(answer(client, review(attempt="2"))) == naming.for_attempt(name, 2)
        assert naming.for_attempt(name, 2) != name
        held(answer(client, review()), "says attempt 0, its JobSet is at attempt 2")


def jobset(trainjob_uid: str, restarts: int) -> dict[str, Any]:
    """The TrainJob's JobSet as the cache keeps it (`kube/jobsets.py`)."""
    owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": NAME,
             "uid": trainjob_uid, "controller": True}  # fmt: skip
    return {
        "metadata": {"name": NAME, "namespace": NS, "uid": "js", "ownerReferences": [owner]},
        "status": {"restarts": restarts},
    }


def test_a_version_1_snapshot_keeps_the_names_of_the_release_that_froze_it(
    server: RunningServer,
) -> None:
    cache = server.cache
    ref = trainjob_raw(cache)["spec"]["runtimeRef"]
    runtime = cache.cluster_runtimes.get("", ref["name"])
    assert runtime is not None
    freeze(cache, orjson.dumps(runtime.raw).decode())  # the bare runtime: version 1
    with server.client() as client:
        legacy = naming.workload_name(NS, NAME)
        assert tied_to(answer(client, review())) == legacy
        assert tied_to(answer(client, review(attempt="3"))) == legacy  # as that release did


def counted(server: RunningServer, family: str, reason: str) -> float:
    value = server.service.metrics.registry.get_sample_value(f"{family}_total", {"reason": reason})
    return value or 0.0


def test_a_pod_is_held_until_the_runtime_is_frozen_and_each_hold_is_counted(
    server: RunningServer,
) -> None:
    with server.client() as client:
        held(answer(client, review()), "not frozen into the TrainJob yet")
        held(answer(client, review()), "not frozen into the TrainJob yet")
        assert counted(server, "trainjob_scheduling_pods_held", "NotFrozen") == 2
        freeze(server.cache)
        assert tied_to(answer(client, review())) is not None
        assert counted(server, "trainjob_scheduling_pods_held", "NotFrozen") == 2
        freeze(server.cache, snapshot(None))
        assert tied_to(answer(client, review())) is None
        assert counted(server, "trainjob_scheduling_pods_untied", "FrozenNoGang") == 1


@pytest.mark.parametrize("state", ["not-served", "unknown"])
def test_a_pod_is_held_while_the_gang_api_is_not_served(server: RunningServer, state: Any) -> None:
    freeze(server.cache)
    server.cache.apis["native"] = state
    with server.client() as client:
        held(answer(client, review()), "scheduling.k8s.io/v1beta1 or v1alpha2 is not")


def test_a_pod_naming_another_scheduler_is_held(server: RunningServer) -> None:
    freeze(server.cache)
    with server.client() as client:
        held(answer(client, review(scheduler="my-scheduler")), "names the scheduler 'my-scheduler'")


def test_a_restart_attempt_that_is_not_a_count_is_held(server: RunningServer) -> None:
    freeze(server.cache)
    with server.client() as client:
        for bad in ("-1", "x", "99999999999", "²"):
            held(answer(client, review(attempt=bad)), "is not a restart count")


def test_a_pod_of_a_trainjob_being_deleted_is_held_and_counted(server: RunningServer) -> None:
    """A foreground delete keeps the TrainJob while its Jobs still make pods: none is let loose,
    none tied to a gang that is not made again."""
    freeze(server.cache)
    raw = trainjob_raw(server.cache)
    raw["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z"
    server.cache.trainjobs.replace([raw])
    with server.client() as client:
        held(answer(client, review()), "the TrainJob is being deleted")
    assert counted(server, "trainjob_scheduling_pods_held", "TrainJobDeleting") == 1


def test_a_plan_a_newer_release_froze_is_hands_off(server: RunningServer) -> None:
    """A rollback leaves snapshots of a plan version this release does not know: its pods are
    held, never tied by rules that would guess; an unreadable snapshot too."""
    freeze(server.cache, '{"planVersion": 99, "runtime": {"future": true}}')
    with server.client() as client:
        held(answer(client, review()), "frozen by a newer release (plan version 99")
        assert counted(server, "trainjob_scheduling_pods_held", "PlanVersionUnknown") == 1
        freeze(server.cache, "{not json")
        held(answer(client, review()), "the runtime snapshot does not parse")


def pod_group(name: str, uid: str, labelled: bool = True, **meta: Any) -> dict[str, Any]:
    """A PodGroup named `name`, controlled by the TrainJob with `uid` ("": by nothing)."""
    owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": NAME,
             "uid": uid, "controller": True}  # fmt: skip
    metadata: dict[str, Any] = {"name": name, "namespace": NS, "uid": f"pg-{uid}", **meta}
    metadata["labels"] = {MANAGED_BY_LABEL: MANAGED_BY} if labelled else {}
    metadata["ownerReferences"] = [owner] if uid else []
    spec = {"schedulingPolicy": {"gang": {"minCount": 1}}}
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": metadata,
            "spec": spec}  # fmt: skip


def test_a_pod_is_never_tied_to_a_terminating_or_foreign_pod_group(server: RunningServer) -> None:
    cache = server.cache
    freeze(cache)
    uid = uid_of(cache)
    name = naming.workload_name(NS, NAME, uid)
    store = cache.store(POD_GROUP)
    with server.client() as client:
        store.replace([pod_group(name, uid)])
        assert tied_to(answer(client, review())) == name  # its own, live
        store.replace([pod_group(name, uid, deletionTimestamp="2026-12-05T00:00:00Z")])
        held(answer(client, review()), "of an earlier gang is still terminating")
        store.replace([pod_group(name, "an-earlier-trainjob")])  # a leftover
        held(answer(client, review()), "exists but is not this TrainJob's")
        store.replace([pod_group(name, "", labelled=False)])  # forged by a tenant
        held(answer(client, review()), "exists but is not this TrainJob's")
        # Another attempt's PodGroup name is free: the restart's pods are tied.
        cache.jobsets.replace([jobset(uid, restarts=1)])
        assert tied_to(answer(client, review(attempt="1"))) == naming.for_attempt(name, 1)
        cache.jobsets.replace([])
        # Controlled by the TrainJob but made by another controller (Trainer's own workload-
        # aware scheduling): the service stands down, its pods are let through and counted.
        store.replace([pod_group(name, uid, labelled=False)])
        assert tied_to(answer(client, review())) is None


def test_a_trainjob_frozen_without_a_gang_gets_its_pods_untied(server: RunningServer) -> None:
    freeze(server.cache, snapshot(None))
    with server.client() as client:
        assert tied_to(answer(client, review())) is None
        # Its Job's template named a group before the freeze said "no gang" (the Job webhook
        # does that for a TrainJob not frozen yet): nobody makes it, so it is taken off.
        doc = review()
        doc["request"]["object"]["spec"]["schedulingGroup"] = {"podGroupName": "never-made"}
        response = answer(client, doc)
        assert response["allowed"] is True
        ops = orjson.loads(base64.b64decode(response["patch"]))
        assert ops == [{"op": "remove", "path": "/spec/schedulingGroup"}]


def test_a_runtime_without_scheduling_ties_nothing_and_holds_nothing(
    server: RunningServer,
) -> None:
    cache = server.cache
    raw = trainjob_raw(cache)
    ref = raw["spec"]["runtimeRef"]
    runtime = cache.cluster_runtimes.get("", ref["name"])
    assert runtime is not None
    plain = copy.deepcopy(runtime.raw)
    plain["spec"].pop("scheduling", None)
    cache.cluster_runtimes.replace([plain])
    with server.client() as client:
        assert tied_to(answer(client, review())) is None


# --- a TrainJob the cache lacks ------------------------------------------------------------------


class Asked:
    """A stand-in for the API server's answer to `get trainjob`, counting the questions."""

    def __init__(self, exists: bool | None, delay: float = 0.0) -> None:
        self.exists = exists
        self.delay = delay
        self.calls = 0

    async def __call__(self, namespace: str, name: str) -> bool:
        self.calls += 1
        await asyncio.sleep(self.delay)
        if self.exists is None:
            raise ConnectionError("the API server is away")
        return self.exists


@pytest.mark.parametrize(
    ("exists", "words"),
    [(True, "not in this replica's cache yet"), (None, "the API server could not be asked")],
)
def test_a_pod_whose_trainjob_is_not_cached_is_held_unless_it_has_none(
    server: RunningServer, exists: bool | None, words: str
) -> None:
    cache = server.cache
    cache.trainjobs.replace([])  # this replica's watch has not brought it
    cache.trainjob_lookup = TrainJobLookup(Asked(exists))
    with server.client() as client:
        held(answer(client, review()), words)
    cache.trainjob_lookup = TrainJobLookup(Asked(False))  # a plain JobSet's pod
    with server.client() as client:
        assert tied_to(answer(client, review())) is None


def test_a_pod_of_a_deleted_trainjobs_jobset_is_held(server: RunningServer) -> None:
    """Trainer can make a TrainJob's JobSet again just before a foreground delete ends (seen on
    a real control plane); its Jobs then make pods whose TrainJob is gone. A plain JobSet's pods
    pass: only the gang label its runtime stamps, or a JobSet a TrainJob controls, say it was a
    TrainJob's (the label only while the JobSet is not cached). Held, never admitted loose."""
    cache = server.cache
    uid = str(trainjob_raw(cache)["metadata"]["uid"])
    cache.trainjobs.replace([])
    cache.trainjob_lookup = TrainJobLookup(Asked(False))
    labelled = review()
    labelled["request"]["object"]["metadata"]["labels"][GANG_LABEL] = "true"
    plain = review()
    plain["request"]["object"]["metadata"]["labels"].pop(GANG_LABEL, None)
    with server.client() as client:
        held(answer(client, labelled), f'TrainJob "{NAME}" is gone')
        assert tied_to(answer(client, plain)) is None  # a plain JobSet of the name
        cache.jobsets.replace([jobset(uid, restarts=0)])  # the orphan JobSet, still cached
        held(answer(client, plain), f'TrainJob "{NAME}" is gone')
        # A JobSet no TrainJob controls (made from a runtime's template, or orphaned by
        # `--cascade=orphan`): its owner, not a label anyone can copy, decides. Passed.
        orphan = jobset(uid, restarts=0)
        orphan["metadata"].pop("ownerReferences")
        cache.jobsets.replace([orphan])
        assert tied_to(answer(client, review())) is None
        labelled = review()
        labelled["request"]["object"]["metadata"]["labels"][GANG_LABEL] = "true"
        assert tied_to(answer(client, labelled)) is None


@pytest.mark.asyncio
async def test_one_question_per_trainjob_however_many_pods_come() -> None:
    asked = Asked(True, delay=0.05)
    now = [0.0]
    lookup = TrainJobLookup(asked, clock=lambda: now[0])
    answers = await asyncio.gather(*(lookup.exists(NS, NAME) for _ in range(50)))
    assert answers == [True] * 50 and asked.calls == 1
    assert await lookup.exists(NS, NAME) is True and asked.calls == 1  # kept
    now[0] += TTL + 1  # and asked again once the answer is old
    assert await lookup.exists(NS, NAME) is True and asked.calls == 2
    failing = TrainJobLookup(Asked(None))
    assert await failing.exists(NS, NAME) is None
    assert await failing.exists(NS, NAME) is None  # a failure is not kept: asked again


@pytest.mark.asyncio
async def test_the_names_remembered_are_bounded() -> None:
    lookup = TrainJobLookup(Asked(False))
    for i in range(MAX_REMEMBERED + 100):
        assert await lookup.exists(NS, f"jobset-{i}") is False
    assert len(lookup) == MAX_REMEMBERED

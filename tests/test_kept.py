"""The cache keeps of a TrainJob only what its readers read, and of a finished one a tombstone
(issue 27 part 4, issue 37 part 2, `webhook/core/kept.py`). Pinned here: every sample and
fixture TrainJob, in every state, as a real API server stores it (the trainer's image, command
and env, Trainer's jobsStatus and other conditions, owners, finalizers), plans, checks, is
judged and gets the same condition kept as whole; a finished one is answered for as before
(its gang released whenever the whole one's was), and tombstones alike share their parts. A
reader of a field the allowlist drops fails here.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.bench.cache_bench import trainjob as bench_trainjob
from tests.bench.reconcile_bench import cluster_runtime as bench_runtime
from tests.harness import served
from webhook.backends.base import Context
from webhook.core import condition as cond
from webhook.core.feasibility import gangs_of
from webhook.core.fields import parse
from webhook.core.kept import finished, kept_trainjob
from webhook.core.lifecycle import is_finished, no_gang_reason
from webhook.core.plan import PlanningError, build_plan
from webhook.core.snapshot import SNAPSHOT_ANNOTATION, from_text, snapshot, snapshot_of
from webhook.core.trainer import Runtime, TrainJob
from webhook.core.validation import check_stored_runtime, check_trainjob
from webhook.kube.cache import FINISHED, Cache
from webhook.kube.events import EventRecorder
from webhook.kube.store import LAST_APPLIED, Store, without_bookkeeping
from webhook.kube.trainjobstore import TrainJobStore
from webhook.reconcile.status import Outcome, StatusWriter, lifecycle_of

from .harness import fixture, frozen
from .paths import SAMPLES

Json = dict[str, Any]
NOW = "2026-12-05T10:00:00Z"
TIME = "2026-12-01T09:00:00Z"


def _yaml(path: Path) -> Json:
    doc: Json = yaml.safe_load(path.read_text())
    return doc


def runtimes() -> list[Json]:
    found = [_yaml(p) for p in sorted(SAMPLES.glob("*.runtime.yaml"))]
    for name in (
        "clustertrainingruntime-update-server-side-apply.validate.json",
        "clustertrainingruntime-create-level2.validate.json",
        "clustertrainingruntime-create-level3-server-side-apply.validate.json",
        "trainingruntime-create.validate.json",
    ):
        found.append(fixture(name)["request"]["object"])
    bench = bench_runtime()
    bench["metadata"]["name"] = "torch-distributed-bench"
    return [*found, bench]


def trainjobs() -> Iterator[tuple[str, Json]]:
    for path in sorted(SAMPLES.glob("*.trainjob.yaml")):
        yield path.name, _yaml(path)
    for name in (
        "trainjob-create.validate.json",
        "trainjob-create-namespaced-runtime.validate.json",
    ):
        yield name, fixture(name)["request"]["object"]
    bench = bench_trainjob(7, bench_runtime())
    bench["spec"]["runtimeRef"]["name"] = "torch-distributed-bench"
    bench["metadata"]["annotations"].pop(SNAPSHOT_ANNOTATION)  # frozen below, like the rest
    yield "cache_bench", bench


def as_stored(raw: Json) -> Json:
    """As an API server stores it after Trainer, kubectl and this service wrote to it: fields
    no reader reads (they must go) and fields some reader reads (they must stay)."""
    obj = copy.deepcopy(raw)
    meta = obj.setdefault("metadata", {})
    meta.setdefault("namespace", "team-a")
    meta.setdefault("uid", "0c7a1d2e-0000-4000-8000-000000000001")
    meta.update(resourceVersion="4242", generation=3, creationTimestamp=TIME)
    meta["finalizers"] = ["example.com/keep"]
    meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u"}]
    meta["labels"] = {
        **(meta.get("labels") or {}),
        "kueue.x-k8s.io/queue-name": "team-a",
        "kai.scheduler/queue": "research",
        "volcano.sh/queue-name": "q1",
    }
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        LAST_APPLIED: "{}",
        "kai.scheduler/topology": "rack",
        "team/owner": "alice",
    }
    meta["managedFields"] = [{"manager": "kubectl", "operation": "Update", "fieldsV1": {}}]
    spec = obj.setdefault("spec", {})
    trainer = spec.setdefault("trainer", {})
    trainer.update(
        image="docker.io/kubeflow/pytorch-dist-mnist:latest",
        command=["torchrun", "/workspace/mnist.py"],
        args=["--epochs", "10"],
        env=[{"name": "NCCL_DEBUG", "value": "INFO"}],
    )
    spec["initializer"] = {"dataset": {"storageUri": "hf://tatsu-lab/alpaca"}}
    spec["labels"] = {"propagated": "yes"}
    obj["status"] = {
        "conditions": [
            {"type": "Created", "status": "True", "reason": "JobsCreationSucceeded",
             "message": "Succeeded to create Jobs", "lastTransitionTime": TIME},
            {"type": cond.CONDITION_TYPE, "status": "False", "reason": "WaitingForScheduler",
             "message": "0 of 1 PodGroup scheduled", "lastTransitionTime": TIME,
             "observedGeneration": 2},
        ],
        "jobsStatus": [{"name": "node", "ready": 1, "succeeded": 0, "failed": 0, "active": 1}],
    }  # fmt: skip
    return obj


def _condition(kind: str) -> Json:
    return {"type": kind, "status": "True", "reason": kind, "message": kind,
            "lastTransitionTime": NOW}  # fmt: skip


def variants(raw: Json) -> Iterator[tuple[str, Json]]:
    """The states a reader treats differently."""
    yield "running", raw
    for kind in ("Complete", "Failed"):
        done = copy.deepcopy(raw)
        done["status"]["conditions"].append(_condition(kind))
        yield kind, done
    not_done = copy.deepcopy(raw)
    not_done["status"]["conditions"].append({**_condition("Complete"), "status": "False"})
    yield "complete-false", not_done
    suspended = copy.deepcopy(raw)
    suspended["spec"]["suspend"] = True
    yield "suspended", suspended
    elsewhere = copy.deepcopy(raw)
    elsewhere["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    yield "multikueue", elsewhere
    going = copy.deepcopy(raw)
    going["metadata"]["deletionTimestamp"] = NOW
    yield "deleting", going
    patched = copy.deepcopy(raw)
    pod = {"schedulerName": "default-scheduler", "nodeSelector": {"pool": "a100"},
           "tolerations": [{"key": "gpu", "operator": "Exists"}]}  # fmt: skip
    jobs = [{"name": n, "template": {"spec": {"template": {"spec": pod}}}} for n in ("node", "x")]
    patched["spec"]["runtimePatches"] = [
        {"manager": "kueue.x-k8s.io/manager",
         "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": jobs}}}}
    ]  # fmt: skip
    yield "runtime-patches", patched
    for name, value in (("zero-nodes", 0), ("many-nodes", 3)):
        sized = copy.deepcopy(raw)
        sized["spec"]["trainer"]["numNodes"] = value
        yield name, sized
    bad = copy.deepcopy(raw)
    bad["spec"]["trainer"]["resourcesPerNode"] = {"requests": {"nvidia.com/gpu": "lots"}}
    yield "bad-quantity", bad
    invalid_done = copy.deepcopy(bad)  # a tombstone plans: said Finished (it had no gang)
    invalid_done["status"]["conditions"].append(_condition("Complete"))
    yield "bad-quantity-complete", invalid_done


def cases() -> Iterator[Any]:
    for source, raw in trainjobs():
        stored = as_stored(raw)
        for state, obj in variants(stored):
            yield pytest.param(obj, id=f"{source}-{state}")


def caches() -> tuple[Cache, Cache]:
    """Two caches of the same runtimes: one keeps TrainJobs whole (as before), one kept."""
    whole, kept = Cache(connected=True), Cache(connected=True)
    whole.trainjobs = Store("trainjobs")
    for cache in (whole, kept):
        for runtime in runtimes():
            store = cache.cluster_runtimes
            if runtime["kind"] == "TrainingRuntime":
                store = cache.training_runtimes
            store.apply("ADDED", runtime)
        served(cache, "native")
    assert isinstance(kept.trainjobs, TrainJobStore)
    return whole, kept


WHOLE, KEPT = caches()


def planned(trainjob: TrainJob, raw: Json) -> Any:
    """What planning from the snapshot says: the plan, None, or its errors."""
    text = snapshot_of(raw)
    read = from_text(text) if text is not None else None
    if read is None or read.runtime is None:
        return ("no snapshot", read)
    checked = check_stored_runtime(read.runtime)
    try:
        return build_plan(trainjob, checked, read.version), checked
    except PlanningError as err:
        return tuple(str(e) for e in err.errors), checked


def regarding(raw: Json) -> Json:
    """What an Event says of the TrainJob it is about."""
    event = EventRecorder(None, "c", "i")._event(raw, "Normal", "R", "A", "n")
    out: Json = event["regarding"]
    return out


def condition_of(cache: Cache, raw: Json) -> Any:
    """The GangScheduling condition the status writer decides for what a pass over `raw` found
    (the reconciler's outcome for a planned TrainJob: its lifecycle, or its gang)."""
    trainjob, _ = parse(TrainJob, raw)
    assert trainjob is not None
    plan, checked = planned(trainjob, raw)
    writer = StatusWriter(cache, None, None)  # type: ignore[arg-type]  # decides, never writes
    if isinstance(plan, tuple) or plan is None:
        outcome = Outcome(blocker=("InvalidScheduling", f"cannot plan its gang: {plan}"))
    elif no_gang_reason(trainjob) is not None:
        outcome = Outcome(lifecycle_of(trainjob))
    else:
        backend = cache.backends.for_plan(plan)
        outcome = Outcome(plan=plan, backend=backend, trainjob=trainjob, runtime=checked)
    situation = writer.situation(raw, outcome)
    stored = cond.stored_condition(raw)
    desired = cond.decide(situation, stored, NOW)
    generation = raw["metadata"].get("generation")
    return desired, desired and cond.condition(desired, stored, generation, NOW)


@pytest.mark.parametrize("stored", list(cases()))
def test_planning_from_what_the_cache_keeps_equals_planning_from_the_whole(stored: Json) -> None:
    whole = frozen(WHOLE, without_bookkeeping(stored))
    kept = kept_trainjob(whole)
    assert kept is not whole and whole == frozen(WHOLE, without_bookkeeping(stored))  # unchanged
    assert kept_trainjob(kept) == kept  # the informer's trimmed items are trimmed again
    assert "jobsStatus" not in kept.get("status", {})
    assert {"image", "command", "args", "env"}.isdisjoint(kept["spec"].get("trainer", {}))
    a, _ = parse(TrainJob, whole)
    b, _ = parse(TrainJob, kept)
    assert a is not None and b is not None
    # What the reconciler and the pod webhook read, and plan from.
    assert snapshot_of(whole) == snapshot_of(kept)
    assert (a.runtime_kind, a.spec.runtime_ref, a.namespace) == (
        b.runtime_kind, b.spec.runtime_ref, b.namespace
    )  # fmt: skip
    assert (is_finished(a), no_gang_reason(a), lifecycle_of(a)) == (
        is_finished(b), no_gang_reason(b), lifecycle_of(b)
    )  # fmt: skip
    assert finished(whole) == is_finished(a)
    for key in ("uid", "resourceVersion", "generation", "deletionTimestamp"):
        assert whole["metadata"].get(key) == kept["metadata"].get(key), key
    assert regarding(whole) == regarding(kept)
    assert cond.stored_condition(whole) == cond.stored_condition(kept)
    if is_finished(a):
        _a_tombstone_answers_as_the_whole_did(whole, kept, a, b)
        return
    assert planned(a, whole) == planned(b, kept)
    for runtime in runtimes():
        checked = check_stored_runtime(parse_runtime(runtime))
        assert check_trainjob(a, checked) == check_trainjob(b, checked)
    assert whole["metadata"].get("creationTimestamp") == kept["metadata"]["creationTimestamp"]
    # What the status writer decides.
    assert condition_of(WHOLE, whole) == condition_of(KEPT, kept)
    # What the gang backends read (queues, topology), and feasibility.
    assert Context.of(whole) == Context.of(kept)
    plan = planned(a, whole)[0]
    if not isinstance(plan, tuple) and plan is not None:
        runtime = planned(a, whole)[1].runtime
        assert gangs_of(plan, runtime, a) == gangs_of(plan, runtime, b)
        for rj in runtime.replicated_jobs:
            assert a.pod_patches(rj.name) == b.pod_patches(rj.name)
            assert a.scheduler_of(rj) == b.scheduler_of(rj)


def _a_tombstone_answers_as_the_whole_did(
    whole: Json, kept: Json, a: TrainJob, b: TrainJob
) -> None:
    """A finished TrainJob's tombstone: its identity, snapshot and what decides whether the
    reconciler's pass releases its gang, nothing else (issue 37). Its gang is released whenever
    the whole one's was; one whose plan failed only on what the tombstone drops (resources,
    runtime patches: it never had a gang) is said Finished rather than InvalidScheduling."""
    meta = kept["metadata"]
    assert {"labels", "creationTimestamp"}.isdisjoint(meta)
    assert set(meta.get("annotations", {})) <= {SNAPSHOT_ANNOTATION}
    assert set(kept["spec"]) <= {"runtimeRef", "trainer", "suspend", "managedBy"}
    assert set(kept["spec"].get("trainer", {})) <= {"numNodes"}
    before, after = planned(a, whole)[0], planned(b, kept)[0]
    if isinstance(before, tuple):  # the whole did not plan: errors only go away
        assert not isinstance(after, tuple) or set(after) <= set(before), (before, after)
    else:
        assert not isinstance(after, tuple), after  # planned, so released, as the whole was
        assert (before is None) == (after is None)
        if before is not None and after is not None:
            assert (before.workload_name, before.trainjob_uid) == (
                after.workload_name, after.trainjob_uid
            )  # fmt: skip
    said_before, said_now = condition_of(WHOLE, whole), condition_of(KEPT, kept)
    if isinstance(before, tuple) and not isinstance(after, tuple):
        assert said_now[0] == cond.decide(cond.Situation("finished"), None, NOW)
    else:
        assert said_now == said_before


def parse_runtime(raw: Json) -> Runtime:
    runtime, _ = parse(Runtime, raw)
    assert runtime is not None
    return runtime


@pytest.mark.parametrize("stored", list(cases()))
def test_the_cache_plans_a_kept_trainjob_as_a_whole_one_and_a_finished_one_not_at_all(
    stored: Json,
) -> None:
    whole = frozen(WHOLE, stored)
    key = (whole["metadata"]["namespace"], whole["metadata"]["name"])
    WHOLE.trainjobs.apply("ADDED", whole)
    KEPT.trainjobs.apply("ADDED", whole)
    before, after = WHOLE.plan_for(*key), KEPT.plan_for(*key)
    entry = KEPT.trainjobs.get(*key)
    assert entry is not None
    if finished(whole) and before.state in ("ok", "invalid"):
        assert after.state == "finished" and after.plan is None
        assert entry.memo is FINISHED  # no plan memoised for a tombstone, only the verdict
    else:
        assert (after.state, after.plan, after.detail) == (before.state, before.plan, before.detail)
    for cache in (WHOLE, KEPT):
        cache.trainjobs.apply("DELETED", whole)


def test_finished_trainjobs_are_judged_once_not_per_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """More finished TrainJobs of distinct snapshots than the cache keeps parsed snapshots of:
    a second round of lookups (a feasibility scrape, the pod webhook) parses none again."""
    cache = caches()[1]
    done = frozen(cache, as_stored(fixture("trainjob-create.validate.json")["request"]["object"]))
    done["status"]["conditions"].append(_condition("Complete"))
    text = done["metadata"]["annotations"][SNAPSHOT_ANNOTATION]
    names = [f"done-{i}" for i in range(1100)]
    for i, name in enumerate(names):
        raw = copy.deepcopy(done)
        raw["metadata"]["name"] = name
        raw["metadata"]["annotations"][SNAPSHOT_ANNOTATION] = text + " " * i  # distinct texts
        cache.trainjobs.apply("ADDED", raw)
    namespace = done["metadata"]["namespace"]
    assert {cache.plan_for(namespace, n).state for n in names} == {"finished"}
    parses: list[str] = []

    def counted(text: str) -> Any:
        parses.append(text)
        return from_text(text)

    monkeypatch.setattr("webhook.kube.cache.from_text", counted)
    assert {cache.plan_for(namespace, n).state for n in names} == {"finished"}
    assert parses == []


def test_a_shape_the_parser_refuses_is_kept_as_it_is() -> None:
    """Too many conditions (the CRD's maxItems): refused whole, so refused kept."""
    raw = as_stored(fixture("trainjob-create.validate.json")["request"]["object"])
    raw["status"]["conditions"] += [_condition(f"Other{i}") for i in range(8)]
    assert parse(TrainJob, raw)[0] is None
    assert kept_trainjob(raw) is raw


def test_a_malformed_condition_is_kept_so_the_trainjob_is_refused_as_before() -> None:
    raw = as_stored(fixture("trainjob-create.validate.json")["request"]["object"])
    raw["status"]["conditions"].append({"type": "Created"})  # no status
    assert parse(TrainJob, raw)[0] is None
    assert parse(TrainJob, kept_trainjob(raw))[0] is None


def test_a_trainjob_un_finished_by_a_later_event_is_whole_again() -> None:
    """Trimmed per event: a Complete condition that goes away brings the labels back."""
    store = TrainJobStore("trainjobs")
    raw = as_stored(fixture("trainjob-create.validate.json")["request"]["object"])
    done = copy.deepcopy(raw)
    done["status"]["conditions"].append(_condition("Complete"))
    store.apply("ADDED", done)
    entry = store.get("team-a", "my-job")
    assert entry is not None and "labels" not in entry.raw["metadata"]
    store.apply("MODIFIED", raw)
    entry = store.get("team-a", "my-job")
    assert entry is not None
    assert entry.raw["metadata"]["labels"] == raw["metadata"]["labels"]
    assert entry.raw["metadata"]["annotations"]["team/owner"] == "alice"


def test_trainjobs_frozen_from_one_runtime_share_one_copy_of_its_snapshot() -> None:
    raw = frozen(WHOLE, as_stored(fixture("trainjob-create.validate.json")["request"]["object"]))
    one, other = (orjson.loads(orjson.dumps(raw)) for _ in range(2))  # as two watch events
    assert snapshot_of(one) is not snapshot_of(other)
    assert snapshot_of(kept_trainjob(one)) is snapshot_of(kept_trainjob(other))


def test_a_finished_condition_keeps_what_is_read_of_it() -> None:
    raw = as_stored(fixture("trainjob-create.validate.json")["request"]["object"])
    raw["status"]["conditions"].append(_condition("Failed"))
    conditions = kept_trainjob(raw)["status"]["conditions"]
    assert [c["type"] for c in conditions] == [cond.CONDITION_TYPE, "Failed"]
    assert conditions[0] == raw["status"]["conditions"][1]  # the service's own, whole
    assert conditions[1] == {"type": "Failed", "status": "True"}


def _done(name: str, raw: Json, said: bool = False) -> Json:
    """`raw` as a finished TrainJob named `name`, as a watch brings it (its own JSON); `said`:
    the service's condition says Finished already."""
    done: Json = orjson.loads(orjson.dumps(raw))
    done["metadata"].update(name=name, uid=f"uid-{name}")
    done["status"]["conditions"].append(_condition("Complete"))
    if said:
        (gang,) = [c for c in done["status"]["conditions"] if c["type"] == cond.CONDITION_TYPE]
        desired = cond.decide(cond.Situation("finished"), gang, NOW)
        assert desired is not None
        gang.update(cond.condition(desired, gang, 3, NOW))
    return done


def test_tombstones_alike_share_their_parts_and_keep_their_identity() -> None:
    """Finished TrainJobs of one runtime and size share one spec, one snapshot annotation and
    one status; each keeps its own name, uid and resourceVersion."""
    store = TrainJobStore("trainjobs")
    raw = frozen(WHOLE, as_stored(fixture("trainjob-create.validate.json")["request"]["object"]))
    for i in range(3):
        store.apply("ADDED", _done(f"done-{i}", raw, said=True))
    other = copy.deepcopy(raw)
    other["spec"]["trainer"]["numNodes"] = 7
    store.apply("ADDED", _done("other-size", other, said=True))
    tombstones = [e.raw for _, e in store.items()]
    first, *alike, different = tombstones
    for t in alike:
        assert t["spec"] is first["spec"] and t["status"] is first["status"]
        assert t["metadata"]["annotations"] is first["metadata"]["annotations"]
        assert t["metadata"] is not first["metadata"]
    assert different["spec"] is not first["spec"] and different["status"] is first["status"]
    assert [t["metadata"]["uid"] for t in tombstones] == [
        "uid-done-0", "uid-done-1", "uid-done-2", "uid-other-size"
    ]  # fmt: skip
    # Once Finished is said, only what the status writer compares is kept, and it still
    # finds nothing to write.
    gang = cond.stored_condition(first)
    assert gang is not None and set(gang) == {"type", "status", "reason", "message"}
    desired = cond.decide(cond.Situation("finished"), gang, NOW)
    assert desired is not None and cond.unchanged(gang, desired)


def test_the_shared_parts_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("webhook.kube.trainjobstore.SHARED_PARTS", 8)
    store = TrainJobStore("trainjobs")
    raw = frozen(WHOLE, as_stored(fixture("trainjob-create.validate.json")["request"]["object"]))
    for i in range(50):  # 50 sizes: 50 specs, one snapshot, one status
        sized = copy.deepcopy(raw)
        sized["spec"]["trainer"]["numNodes"] = i + 1
        store.apply("ADDED", _done(f"done-{i}", sized))
    assert len(store._parts) == 8  # private: what the store remembers
    assert {e.raw["spec"]["trainer"]["numNodes"] for _, e in store.items()} == set(range(1, 51))


@pytest.mark.parametrize("gang", [True, False], ids=["frozen-gang", "frozen-no-gang"])
def test_a_tombstone_still_tells_a_frozen_gang_from_a_frozen_no_gang(gang: bool) -> None:
    """The pod webhook holds the pods of a finished TrainJob whose gang was frozen
    (TrainJobFinished) and admits those of one frozen without a gang: the shared snapshot
    tells them apart, in one store."""
    cache = caches()[1]
    raw = frozen(cache, as_stored(fixture("trainjob-create.validate.json")["request"]["object"]))
    no_gang = copy.deepcopy(raw)
    no_gang["metadata"]["annotations"][SNAPSHOT_ANNOTATION] = snapshot(None)
    cache.trainjobs.apply("ADDED", _done("with-gang", raw))
    cache.trainjobs.apply("ADDED", _done("without-gang", no_gang))
    name = "with-gang" if gang else "without-gang"
    lookup = cache.plan_for(raw["metadata"]["namespace"], name)
    assert lookup.state == ("finished" if gang else "frozen-no-gang")

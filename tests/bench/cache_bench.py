"""Cache memory benchmark: what the watch cache keeps per TrainJob and per foreign PodGroup.

Run with `make bench` or `python -m tests.bench.cache_bench [--trainjobs 10000]
[--podgroups 10000]`. Numbers, not pass/fail (exit 0 unless the run broke).

Objects are what a watch brings, as JSON bytes decoded the way the informer decodes them:

* a TrainJob as Trainer's own examples write it (`kubectl apply` of a torch-distributed job:
  image, command, numNodes, resourcesPerNode), stored the way a real API server stores it: the
  `last-applied-configuration` annotation, managedFields of `kubectl-client-side-apply`, of
  Trainer's status writes and of this service's snapshot patch and condition apply, the runtime
  snapshot (about 1 KB) and a running status (conditions, jobsStatus);
* a foreign PodGroup (`scheduling.k8s.io/v1beta1`, a Job's own, as 1.38's per-Job gangs are:
  not a TrainJob's), with the managedFields its controller and the scheduler leave.

Each is measured with tracemalloc: kept whole (a plain dict by key), with only the bookkeeping
dropped (managedFields and the last-applied annotation: what the cache kept of a TrainJob before
`core/kept.py`), and in the service's own stores (a TrainJob as its readers read it, a finished
one as a tombstone; anyone else's gang objects as stubs, `kube/gangstore.py`). For the running
TrainJobs, the plan each one memoises when the pod webhook or reconciler first asks is measured
too; a finished one (Trainer's Complete condition, its jobs succeeded) memoises none. A running
TrainJob's own gang objects (the native backend's Workload and PodGroup, as the API server
stores them) are measured too: the per-running-TrainJob figure of the sizing rule is the three.

Last, a relist after every TrainJob changed (an API server restart): the peak beyond the store
while the informer lists in pages, as it does (each page into the store as it comes), and as
it did before (the whole list built beside the store, then swapped in).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import tracemalloc
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson

from tests.bench.reconcile_bench import cluster_runtime, snapshot_annotations
from webhook.backends.base import Context
from webhook.backends.native import POD_GROUP, WORKLOAD
from webhook.core.condition import FIELD_MANAGER
from webhook.kube import informer as informer_module
from webhook.kube import rest
from webhook.kube.cache import Cache
from webhook.kube.informer import Informer, Resource
from webhook.kube.store import LAST_APPLIED, EventType, Store, key_of

Json = dict[str, Any]
TIME = "2026-12-01T09:00:00Z"


def _fields(**fields: Any) -> Json:
    """A managedFields entry's fieldsV1 for these top-level paths."""
    return {f"f:{k}": v for k, v in fields.items()}


def trainjob(i: int, runtime_obj: Json) -> Json:
    """A torch-distributed TrainJob as `kubectl apply` of Trainer's example makes it, after this
    service and Trainer have written to it."""
    applied: Json = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": f"pytorch-mnist-{i:05d}", "namespace": f"team-{i % 20}"},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {
                "image": "docker.io/kubeflow/pytorch-dist-mnist:latest",
                "command": ["torchrun", "/workspace/mnist.py", "--epochs", "10", "--lr", "0.01"],
                "numNodes": 4,
                "resourcesPerNode": {
                    "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
                    "limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
                },
            },
        },
    }
    meta = applied["metadata"]
    annotations = {
        LAST_APPLIED: orjson.dumps(applied).decode() + "\n",
        **snapshot_annotations(runtime_obj),
    }
    spec_fields = {
        ".": {},
        "f:runtimeRef": {".": {}, "f:name": {}},
        "f:trainer": {
            ".": {},
            "f:command": {},
            "f:image": {},
            "f:numNodes": {},
            "f:resourcesPerNode": {
                ".": {},
                "f:limits": {".": {}, "f:cpu": {}, "f:memory": {}, "f:nvidia.com/gpu": {}},
                "f:requests": {".": {}, "f:cpu": {}, "f:memory": {}, "f:nvidia.com/gpu": {}},
            },
        },
    }
    condition_fields: Json = {
        ".": {},
        "f:lastTransitionTime": {},
        "f:message": {},
        "f:reason": {},
        "f:status": {},
        "f:type": {},
    }
    managed = [
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "fieldsType": "FieldsV1",
            "fieldsV1": _fields(
                metadata={"f:annotations": {".": {}, f"f:{LAST_APPLIED}": {}}}, spec=spec_fields
            ),
            "manager": "kubectl-client-side-apply",
            "operation": "Update",
            "time": TIME,
        },
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "fieldsType": "FieldsV1",
            "fieldsV1": _fields(
                metadata={"f:annotations": {"f:trainjob-scheduling.dev/runtime-snapshot": {}}}
            ),
            "manager": "OpenAPI-Generator",
            "operation": "Update",
            "time": TIME,
        },
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "fieldsType": "FieldsV1",
            "fieldsV1": _fields(
                status={
                    ".": {},
                    "f:conditions": {".": {}, 'k:{"type":"Created"}': condition_fields},
                    "f:jobsStatus": {},
                }
            ),
            "manager": "trainer-controller-manager",
            "operation": "Update",
            "subresource": "status",
            "time": TIME,
        },
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "fieldsType": "FieldsV1",
            "fieldsV1": _fields(
                status={"f:conditions": {'k:{"type":"GangScheduling"}': condition_fields}}
            ),
            "manager": FIELD_MANAGER,
            "operation": "Apply",
            "subresource": "status",
            "time": TIME,
        },
    ]
    obj = copy.deepcopy(applied)
    obj["metadata"] = {
        **meta,
        "uid": f"0c7a1d2e-0000-4000-8000-{i:012d}",
        "resourceVersion": str(100_000 + i),
        "generation": 1,
        "creationTimestamp": TIME,
        "annotations": annotations,
        "managedFields": managed,
    }
    obj["spec"]["managedBy"] = "trainer.kubeflow.org/trainjob-controller"
    obj["spec"]["runtimeRef"].update(apiGroup="trainer.kubeflow.org", kind="ClusterTrainingRuntime")
    obj["status"] = {
        "conditions": [
            {
                "type": "Created",
                "status": "True",
                "reason": "JobsCreationSucceeded",
                "message": "Succeeded to create Jobs",
                "lastTransitionTime": TIME,
            },
            {
                "type": "GangScheduling",
                "status": "True",
                "reason": "Scheduled",
                "message": "1 of 1 PodGroup scheduled: 4 of 4 pods",
                "lastTransitionTime": TIME,
                "observedGeneration": 1,
            },
        ],
        "jobsStatus": [
            {"name": "node", "ready": 1, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}
        ],
    }
    return obj


def finished_trainjob(i: int, runtime_obj: Json) -> Json:
    """The same TrainJob once Trainer says Complete (and the service, Finished)."""
    obj = trainjob(i, runtime_obj)
    conditions = obj["status"]["conditions"]
    conditions[1].update(status="False", reason="Finished", message="the TrainJob has finished")
    conditions.append(
        {
            "type": "Complete",
            "status": "True",
            "reason": "JobsCompleted",
            "message": "jobs have been completed",
            "lastTransitionTime": TIME,
        }
    )
    obj["status"]["jobsStatus"][0].update(ready=0, active=0, succeeded=1)
    return obj


def foreign_podgroup(i: int) -> Json:
    """A Job's own PodGroup (another controller's gang), with its managedFields."""
    name = f"batch-{i:05d}"
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": name,
            "namespace": f"batch-{i % 50}",
            "uid": f"7f3b9c10-0000-4000-8000-{i:012d}",
            "resourceVersion": str(200_000 + i),
            "generation": 1,
            "creationTimestamp": TIME,
            "finalizers": ["scheduling.k8s.io/podgroup-protection"],
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": f"5e2d8a40-0000-4000-8000-{i:012d}",
                    "controller": True,
                    "blockOwnerDeletion": True,
                },
            ],
            "managedFields": [
                {
                    "apiVersion": "scheduling.k8s.io/v1beta1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": _fields(
                        metadata={
                            "f:ownerReferences": {".": {}, 'k:{"uid":"x"}': {}},
                            "f:finalizers": {
                                ".": {},
                                'v:"scheduling.k8s.io/podgroup-protection"': {},
                            },
                        },
                        spec={
                            ".": {},
                            "f:schedulingPolicy": {".": {}, "f:gang": {".": {}, "f:minCount": {}}},
                            "f:workloadRef": {".": {}, "f:workloadName": {}, "f:templateName": {}},
                        },
                    ),
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "time": TIME,
                },
                {
                    "apiVersion": "scheduling.k8s.io/v1beta1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": _fields(status={".": {}, "f:conditions": {}}),
                    "manager": "kube-scheduler",
                    "operation": "Update",
                    "subresource": "status",
                    "time": TIME,
                },
            ],
        },
        "spec": {
            "workloadRef": {"workloadName": name, "templateName": "main"},
            "schedulingPolicy": {"gang": {"minCount": 8}},
            "disruptionMode": {"single": {}},
            "priority": 0,
        },
        "status": {
            "conditions": [
                {
                    "type": "PodGroupScheduled",
                    "status": "True",
                    "reason": "Scheduled",
                    "message": "",
                    "lastTransitionTime": TIME,
                    "observedGeneration": 1,
                },
            ]
        },
    }


def own_gang_objects(found: Cache, i: int, runtime_obj: Json) -> list[Json]:
    """The Workload and PodGroup the native backend makes for `trainjob(i)`, as the API server
    stores them (uid, resourceVersion, the service's managedFields, a scheduled status)."""
    raw = trainjob(i, runtime_obj)
    namespace, name = raw["metadata"]["namespace"], raw["metadata"]["name"]
    found.trainjobs.apply("ADDED", raw)
    plan = found.plan_for(namespace, name).plan
    found.trainjobs.apply("DELETED", raw)
    assert plan is not None, name
    backend = found.backends.named("native")
    assert backend is not None
    objects = backend.render(plan, Context.of(raw))
    for n, obj in enumerate(objects):
        meta = obj["metadata"]
        meta.update(uid=f"9a1b2c3d-0000-4000-8000-{i:010d}{n:02d}", generation=1,
                    resourceVersion=str(300_000 + 2 * i + n), creationTimestamp=TIME)  # fmt: skip
        meta["managedFields"] = [
            {"apiVersion": obj["apiVersion"], "fieldsType": "FieldsV1", "manager": FIELD_MANAGER,
             "operation": "Update", "time": TIME,
             "fieldsV1": _fields(spec={".": {}}, metadata={"f:labels": {}})}
        ]  # fmt: skip
        if obj["kind"] == "PodGroup":
            obj["status"] = {"conditions": [{"type": "PodGroupScheduled", "status": "True",
                             "reason": "Scheduled", "message": "", "lastTransitionTime": TIME,
                             "observedGeneration": 1}]}  # fmt: skip
    return objects


class PagedServer:
    """`rest.get_json` of an informer listing TrainJobs in pages, as the API server answers:
    each page's JSON made beforehand (the server's memory, not the informer's) and decoded when
    asked for, as the client decodes an answer. `version` 2 has every TrainJob changed."""

    def __init__(self, objects: Callable[[int, int], Json], n: int, page_size: int) -> None:
        self.pages: dict[tuple[int, int], bytes] = {}
        for version in (1, 2):
            for start in range(0, n, page_size):
                items = [objects(i, version) for i in range(start, min(start + page_size, n))]
                more = {"continue": str(start + page_size)} if start + page_size < n else {}
                page = {"kind": "TrainJobList", "apiVersion": "trainer.kubeflow.org/v1alpha1",
                        "metadata": {"resourceVersion": str(version), **more},
                        "items": items}  # fmt: skip
                self.pages[version, start] = orjson.dumps(page)
        self.version = 1
        self.asked = 0

    async def __call__(
        self, api: Any, path: str, query: list[tuple[str, Any]] | None = None, timeout: float = 10
    ) -> Json:
        self.asked += 1
        start = int(dict(query or []).get("continue") or 0)
        answer: Json = orjson.loads(self.pages[self.version, start])
        return answer


def changed(make: Callable[[int, Json], Json], runtime_obj: Json) -> Callable[[int, int], Json]:
    """`make(i)` at a version: its resourceVersion and its condition's message differ."""

    def at(i: int, version: int) -> Json:
        obj = make(i, runtime_obj)
        obj["metadata"]["resourceVersion"] = f"{version}{i:06d}"
        obj["status"]["conditions"][1]["message"] += f" (written {version} times)"
        return obj

    return at


class WholeList:
    """A store as the informer filled it before pages went in as they came: the whole list
    built (trimmed), then swapped in (it has no `relist`)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.resource = store.resource

    def __len__(self) -> int:
        return len(self.store)

    def trim(self, raw: Json) -> Json:
        return self.store.trim(raw)

    def replace(self, items: Iterable[Json], namespace: str | None = None) -> None:
        self.store.replace(items, namespace)

    def apply(self, event: EventType, raw: Json) -> None:
        self.store.apply(event, raw)


def relist_peak(server: PagedServer, paged: bool, page_size: int) -> tuple[int, int]:
    """(the store's bytes after the first list, the peak beyond them while a relist of every
    object changed runs), with `paged` as now or (False) as before."""
    store = Cache(connected=True).trainjobs
    resource = Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs")
    sink: Any = store if paged else WholeList(store)
    informer = Informer(None, resource, sink, page_size=page_size)  # type: ignore[arg-type]
    saved = rest.get_json
    rest.get_json = server
    try:
        server.version = 1
        gc.collect()
        tracemalloc.start()
        empty = tracemalloc.get_traced_memory()[0]
        asyncio.run(informer._list())  # private: one list, without a watch after it
        gc.collect()
        filled = tracemalloc.get_traced_memory()[0]
        server.version = 2
        tracemalloc.reset_peak()
        asyncio.run(informer._list())
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    finally:
        rest.get_json = saved
    return filled - empty, peak - filled


def measured(fill: Callable[[], Any]) -> tuple[int, Any]:
    """Bytes still allocated after `fill()` (what it returned keeps), and what it returned."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = fill()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return after - before, kept


def as_watched(objects: Iterator[Json]) -> Iterator[Json]:
    """Each object as the informer has it: decoded from the JSON bytes of a watch event."""
    for obj in objects:
        yield orjson.loads(orjson.dumps(obj))


def whole(objects: Iterator[Json]) -> dict[Any, Json]:
    return {key_of(obj): obj for obj in as_watched(objects)}


def stored(store: Store, objects: Iterator[Json]) -> Store:
    for obj in as_watched(objects):
        store.apply("ADDED", obj)
    return store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trainjobs", type=int, default=10_000)
    parser.add_argument("--podgroups", type=int, default=10_000)
    parser.add_argument("--relist", type=int, default=10_000, help="TrainJobs relisted")
    parser.add_argument("--page-size", type=int, default=informer_module.PAGE_SIZE)
    args = parser.parse_args()
    runtime_obj = cluster_runtime()
    runtime_obj["metadata"]["name"] = "torch-distributed"
    n, m = args.trainjobs, args.podgroups
    sample = trainjob(0, runtime_obj)
    print(f"cache memory: {n} TrainJobs, {m} foreign PodGroups (tracemalloc; KB = 1,000 bytes)")
    print(
        f"  a TrainJob as stored: {len(orjson.dumps(sample)):,} bytes of JSON, of which "
        f"managedFields {len(orjson.dumps(sample['metadata']['managedFields'])):,} and "
        f"last-applied {len(sample['metadata']['annotations'][LAST_APPLIED]):,}"
    )

    def jobs() -> Iterator[Json]:
        return (trainjob(i, runtime_obj) for i in range(n))

    def done() -> Iterator[Json]:
        return (finished_trainjob(i, runtime_obj) for i in range(n))

    def cache(kept: bool = True) -> Cache:
        found = Cache(connected=True)
        found.jobsets.replace([])  # listed, none: restart attempt 0
        if not kept:  # as before core/kept.py: only the bookkeeping dropped
            found.trainjobs = Store("trainjobs")
        found.cluster_runtimes.apply("ADDED", runtime_obj)
        return found

    def plans(found: Cache) -> int:
        planned = 0
        for (ns, name), _ in found.trainjobs.items():
            planned += found.plan_for(ns, name).plan is not None
        return planned

    def per(total: float) -> str:
        return f"{total / n / 1000:.2f} KB"

    old = cache(kept=False)
    full, _ = measured(lambda: whole(jobs()))
    before, _ = measured(lambda: stored(old.trainjobs, jobs()))
    planned_before, found = measured(lambda: plans(old))
    assert found == n, f"{found} of {n} running TrainJobs have a plan"
    running = cache()
    kept, _ = measured(lambda: stored(running.trainjobs, jobs()))
    planned, found = measured(lambda: plans(running))
    assert found == n, f"{found} of {n} running TrainJobs have a plan"
    print("  a running TrainJob (each):")
    print(f"    kept whole:                    {per(full)}")
    print(f"    before (bookkeeping dropped):  {per(before)} + its plan {per(planned_before)}"
          f" = {per(before + planned_before)}")  # fmt: skip
    print(f"    in the cache (fields read):    {per(kept)} "
          f"({100 * (1 - kept / full):.0f}% less than whole, "
          f"{100 * (1 - kept / before):.0f}% less than before)")  # fmt: skip
    print(f"    + the plan it memoises:        {per(planned)}")
    print(f"    = per running TrainJob:        {per(kept + planned)}")

    finished = cache()
    full_done, _ = measured(lambda: whole(done()))
    before_done, _ = measured(lambda: stored(Store("trainjobs"), done()))
    kept_done, _ = measured(lambda: stored(finished.trainjobs, done()))
    memo_done, found = measured(lambda: plans(finished))
    assert found == 0, f"{found} of {n} finished TrainJobs have a plan"
    print("  a finished TrainJob (Complete; each):")
    print(f"    kept whole:                    {per(full_done)}")
    print(f"    before (bookkeeping dropped):  {per(before_done)} + its plan {per(planned_before)}"
          f" = {per(before_done + planned_before)}")  # fmt: skip
    print(f"    in the cache (tombstone):      {per(kept_done)}, "
          f"no plan ({per(memo_done)} after the lookups)")  # fmt: skip

    def gang_objects() -> Iterator[Json]:
        for i in range(n):
            yield from own_gang_objects(running, i, runtime_obj)

    def own(found: Cache) -> Cache:
        for obj in as_watched(gang_objects()):
            found.store(WORKLOAD if obj["kind"] == "Workload" else POD_GROUP).apply("ADDED", obj)
        return found

    gangs = cache()
    own_gangs, _ = measured(lambda: own(gangs))
    print(f"  its own Workload + PodGroup:     {per(own_gangs)} (kept whole, less bookkeeping)")
    print(f"  = per running TrainJob, all in:  {per(kept + planned + own_gangs)}")

    def groups() -> Iterator[Json]:
        return (foreign_podgroup(i) for i in range(m))

    sample_pg = foreign_podgroup(0)
    print(f"  a foreign PodGroup as stored: {len(orjson.dumps(sample_pg)):,} bytes of JSON")
    full_pg, _ = measured(lambda: whole(groups()))
    kept_pg, _ = measured(lambda: stored(running.store(POD_GROUP), groups()))
    saved = 100 * (1 - kept_pg / full_pg)
    print(f"  foreign PodGroups kept whole:    {full_pg / m / 1000:6.2f} KB each, "
          f"{full_pg / 1e6:.1f} MB for {m}")  # fmt: skip
    print(f"  foreign PodGroups in the cache:  {kept_pg / m / 1000:6.2f} KB each, "
          f"{kept_pg / 1e6:.1f} MB for {m} ({saved:.0f}% less)")  # fmt: skip

    r, page = args.relist, args.page_size
    print(f"  a relist of {r} TrainJobs, every one changed (pages of {page}; the peak beyond the"
          " store):")  # fmt: skip
    for label, make in (("running", trainjob), ("finished", finished_trainjob)):
        server = PagedServer(changed(make, runtime_obj), r, page)
        for paged in (False, True):
            held, extra = relist_peak(server, paged, page)
            how = "pages into the store (now)" if paged else "whole list, then swap (before)"
            print(f"    {label:8} {how:31} store {held / 1e6:6.1f} MB, peak +{extra / 1e6:6.1f} MB"
                  f" ({extra / held:.2f}x the store)")  # fmt: skip


if __name__ == "__main__":
    main()

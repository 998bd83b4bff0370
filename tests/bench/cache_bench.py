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
too; a finished one (Trainer's Complete condition, its jobs succeeded) memoises none.
"""

from __future__ import annotations

import argparse
import copy
import gc
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from tests.bench.reconcile_bench import cluster_runtime, snapshot_annotations
from webhook.backends.native import POD_GROUP
from webhook.core.condition import FIELD_MANAGER
from webhook.kube.cache import Cache
from webhook.kube.store import LAST_APPLIED, Store, key_of

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


if __name__ == "__main__":
    main()

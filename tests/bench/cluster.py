"""The reconcile bench's other API server: a real cluster, named on purpose by a kubeconfig.

`reconcile_bench --kubeconfig PATH` (`make bench BENCH_KUBECONFIG=PATH` runs it after the
emulator's run) measures the reconciler and the ceiling against that cluster's kube-apiserver
instead of the emulator. Each size gets namespaces and a ClusterTrainingRuntime of its own
(`wasched-bench-<random>`), made here and deleted afterwards (`--keep` keeps them); the TrainJobs
are the end-to-end tests' (`tests/e2e/objects.py`): numNodes 4, pods pinned to a node label no
node has. The cluster needs what the end-to-end tests
need (tests/e2e/README.md): scheduling.k8s.io/v1beta1 served, Trainer's CRDs declaring
`spec.scheduling`, no other copy of this service reconciling those namespaces, and better no
Trainer controller running (it would make a JobSet and Pending pods for every TrainJob).

The API server's own CPU is not seen from here: the emulator's columns say nan.
"""

from __future__ import annotations

import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client import ApiClient, Configuration, V1DeleteOptions, V1Preconditions
from kubernetes.client.exceptions import ApiException
from kubernetes.config import kube_config

from tests.e2e.cluster import TRAINER_GROUP, TRAINER_VERSION, Cluster, check_apis
from tests.e2e.objects import cluster_runtime, trainjob

Json = dict[str, Any]
PRELOAD_THREADS = 16  # TrainJobs created at once (the client's pool is sized to match)


@dataclass
class ClusterRun:
    """What one size made in the cluster."""

    run_id: str
    namespaces: list[str]
    runtime: Json
    preload_seconds: float = 0.0
    made: list[str] = field(default_factory=list)  # namespaces created, to delete
    runtime_uid: str | None = None  # set once the runtime is created (so it is ours to delete)


def open_cluster(kubeconfig: str, check_crd: bool) -> Cluster:
    """The cluster, checked to be able to run the bench; raises `tests.e2e.cluster.Skip` with
    what is missing (the end-to-end tests' own checks and messages)."""
    cfg = Configuration()
    load: Any = kube_config.load_kube_config  # untyped in the client
    load(config_file=kubeconfig, client_configuration=cfg, persist_config=False)
    cfg.connection_pool_maxsize = PRELOAD_THREADS
    cluster = Cluster(kubeconfig, ApiClient(cfg), str(cfg.host))
    check_apis(cluster, check_crd)
    return cluster


def new_run(namespaces: int) -> ClusterRun:
    """Names for one size's namespaces and runtime (nothing is made yet)."""
    run_id = f"wasched-bench-{secrets.token_hex(3)}"
    return ClusterRun(run_id, [f"{run_id}-{i}" for i in range(namespaces)], cluster_runtime(run_id))


def prepare(
    cluster: Cluster, run: ClusterRun, n: int, annotations: dict[str, str] | None = None
) -> None:
    """The run's namespaces, its runtime and N TrainJobs (round-robin over the namespaces),
    each with `annotations` if given; `run.made` says what to delete, even after a failure."""
    namespaces, run_id = len(run.namespaces), run.run_id
    started = time.perf_counter()
    for ns in run.namespaces:
        cluster.create_namespace(ns, {"app.kubernetes.io/created-by": run_id})
        run.made.append(ns)
    created = cluster.create(TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", run.runtime)
    run.runtime_uid = str(created["metadata"]["uid"])

    def create(i: int) -> None:
        ns = run.namespaces[i % namespaces]
        obj = trainjob(f"job-{i:05d}", ns, run_id)
        if annotations:
            obj["metadata"]["annotations"] = dict(annotations)
        cluster.create(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", obj, namespace=ns)

    with ThreadPoolExecutor(PRELOAD_THREADS) as pool:
        for _ in pool.map(create, range(n)):  # the first failure stops the bench
            pass
    run.preload_seconds = time.perf_counter() - started


def cleanup(cluster: Cluster, run: ClusterRun) -> list[str]:
    """Deletes what the run made, and only that: its namespaces (the garbage collector takes
    what is in them) and its runtime (by uid: a runtime of that name made by someone else stays);
    does not wait for them to go, and never raises: the answer lists what may be left."""
    left = []
    for ns in run.made:
        try:
            cluster.core.delete_namespace(ns, propagation_policy="Background")
        except ApiException as err:
            if err.status != 404:
                left.append(f"namespace {ns} ({err.status})")
        except Exception as err:  # unreachable, timed out: say so and go on with the rest
            left.append(f"namespace {ns} ({type(err).__name__})")
    if run.runtime_uid is not None:
        try:
            cluster.objects.delete_cluster_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", run.run_id,
                body=V1DeleteOptions(preconditions=V1Preconditions(uid=run.runtime_uid)),
                propagation_policy="Background",
            )  # fmt: skip
        except ApiException as err:
            if err.status not in (404, 409):  # gone, or another of that name (not ours)
                left.append(f"clustertrainingruntime {run.run_id} ({err.status})")
        except Exception as err:
            left.append(f"clustertrainingruntime {run.run_id} ({type(err).__name__})")
    return left

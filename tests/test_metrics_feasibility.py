"""Feasibility metrics: TrainJobs and PodGroups through a real cache, read back from the registry.

The nodes are the issue's example (zone-b: 24 nodes, 48 pods of 4 GPUs; zone-a: 6 nodes, 12)."""

from __future__ import annotations

from typing import Any

from tests.builders import Json, trainjob
from tests.harness import freeze
from tests.test_feasibility_admission import CLUSTER, zone_runtime
from tests.test_metrics_gangs import pod_group, waiting
from webhook.backends.base import TRAINJOB_LABEL
from webhook.backends.native import POD_GROUP
from webhook.core.naming import workload_name
from webhook.kube.cache import Cache
from webhook.metrics.feasibility import FeasibilityCollector
from webhook.metrics.registry import Metrics


def stored(name: str, pods: int, finished: bool = False) -> Json:
    job = trainjob(name, num_nodes=pods, uid=f"uid-{name}")
    if finished:
        job["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    return job


def waiting_group(job: str) -> dict[str, Any]:
    """The PodGroup of a level-1 TrainJob (named as its Workload, by its uid: plan version 2),
    waiting as Unschedulable."""
    group = pod_group(workload_name("team-a", job, f"uid-{job}"), waiting("Unschedulable"))
    group["metadata"]["labels"][TRAINJOB_LABEL] = job
    return group


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_gangs_that_can_never_fit_and_the_waiting_gangs_headroom() -> None:
    metrics, cache = Metrics(), Cache(connected=True)
    FeasibilityCollector(metrics, cache)
    cache.cluster_runtimes.replace([zone_runtime()])
    cache.trainjobs.replace(
        [stored("fits", 48), stored("never", 64), stored("never-but-done", 100, finished=True)]
    )
    freeze(cache)  # as the reconciler does: a TrainJob is planned from its snapshot
    infeasible = "trainjob_scheduling_gangs_infeasible"
    # Before the Nodes are listed nothing is judged: zeros, every reason exported.
    assert sample(metrics, infeasible, backend="native", reason="DomainTooSmall") == 0
    assert sample(metrics, "trainjob_scheduling_feasibility_nodes") == 0

    cache.nodes.replace(CLUSTER)
    assert sample(metrics, infeasible, backend="native", reason="DomainTooSmall") == 1
    for reason in ("NoMatchingNodes", "NoTopologyLabel", "PodTooLarge"):
        assert sample(metrics, infeasible, backend="native", reason=reason) == 0
    assert sample(metrics, "trainjob_scheduling_feasibility_nodes") == 30
    assert sample(metrics, "trainjob_scheduling_feasibility_node_shapes") == 2  # one per zone

    # No waiting gang: no headroom sample. Both waiting: the tightest, 48 - 64 = -16.
    headroom = "trainjob_scheduling_gangs_waiting_headroom_pods"
    assert sample(metrics, headroom, backend="native") is None
    groups = cache.store(POD_GROUP)
    groups.replace([waiting_group("fits"), waiting_group("never")])
    assert sample(metrics, headroom, backend="native") == -16
    groups.replace([waiting_group("fits")])
    assert sample(metrics, headroom, backend="native") == 0  # it needs all of zone-b free

    # A node more in zone-b (2 pods) and the 64 still do not fit; the 48 have 2 to spare.
    cache.nodes.apply("ADDED", {**CLUSTER[0], "metadata": {**CLUSTER[0]["metadata"], "name": "x"}})
    assert sample(metrics, headroom, backend="native") == 2
    assert sample(metrics, infeasible, backend="native", reason="DomainTooSmall") == 1

    # --feasibility=off: nothing judged.
    cache.feasibility.mode = "off"
    assert sample(metrics, infeasible, backend="native", reason="DomainTooSmall") == 0
    assert sample(metrics, headroom, backend="native") is None

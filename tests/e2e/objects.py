"""What the end-to-end tests apply, and what they expect back (computed by the planner, so no
name is written by hand)."""

from __future__ import annotations

from typing import Any

from webhook.core.fields import parse
from webhook.core.plan import Plan, build_plan
from webhook.core.trainer import ANCESTOR_LABEL, Runtime, TrainJob

Json = dict[str, Any]

NUM_NODES = 4
ZONE = "topology.kubernetes.io/zone"
# No node has this label: if a Trainer controller is installed and makes pods, they stay Pending
# (nothing runs, nothing is pulled, and the TrainJob never finishes on its own).
NO_NODE = {"trainjob-scheduling.dev/e2e-no-such-node": "true"}
IMAGE = "registry.k8s.io/pause:3.10"
CREATED_BY = {"app.kubernetes.io/created-by": "trainjob-scheduling-e2e"}


def cluster_runtime(name: str) -> Json:
    """Level 1: one gang of every pod of the TrainJob, in one zone, disrupted all together
    (the shape of tests/test_reconciler.py's `cluster_runtime()`)."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch",
                                               **CREATED_BY}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "scheduling": {
                "schedulingPolicy": {"gang": {}},
                "schedulingConstraints": {"topology": [{"key": ZONE}]},
                "disruptionMode": {"all": {}},
            },
            "template": {"spec": {"replicatedJobs": [{
                "name": "node",
                "template": {
                    "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
                    "spec": {"template": {"spec": {
                        "nodeSelector": NO_NODE,
                        "containers": [{"name": "node", "image": IMAGE}],
                    }}},
                },
            }]}},
        },
    }  # fmt: skip


def trainjob(name: str, namespace: str, runtime: str, *, suspend: bool = False) -> Json:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(CREATED_BY)},
        "spec": {
            "runtimeRef": {"apiGroup": "trainer.kubeflow.org",
                           "kind": "ClusterTrainingRuntime", "name": runtime},
            "trainer": {"numNodes": NUM_NODES},
            "suspend": suspend,
        },
    }  # fmt: skip


def plan_for(trainjob_obj: Json, runtime_obj: Json) -> Plan:
    """The plan the service makes for the stored TrainJob and runtime."""
    job, errors = parse(TrainJob, trainjob_obj)
    assert job is not None, errors
    runtime, errors = parse(Runtime, runtime_obj)
    assert runtime is not None, errors
    plan = build_plan(job, runtime)
    assert plan is not None, "the runtime has no spec.scheduling"
    return plan


def controller_of(obj: Json) -> Json | None:
    refs = [r for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")]
    assert len(refs) <= 1, f"more than one controller reference: {refs}"
    return refs[0] if refs else None


def trainjob_owner(trainjob_obj: Json) -> Json:
    """The controller ownerReference the Workload and PodGroups must carry (was-api.md 4)."""
    meta = trainjob_obj["metadata"]
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }

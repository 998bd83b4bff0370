"""Small builders for raw Trainer objects, in the JSON shape the API server stores."""

from __future__ import annotations

from typing import Any

from webhook.core.trainer import ANCESTOR_LABEL, Runtime, TrainJob

Json = dict[str, Any]

# The uid of the captured TrainJob team-a/my-job (tests/fixtures), the builders' default: plan
# version 2 qualifies gang names by it (webhook/core/naming.py).
TRAINJOB_UID = "cc796b1d-9ea6-4b50-811c-c860fd20eaa5"


def rj(
    name: str,
    *,
    ancestor: str | None = None,
    replicas: int | None = None,
    parallelism: int | None = None,
    depends: list[tuple[str, str]] | None = None,
    priority_class: str | None = None,
    scheduler: str | None = None,
    job_scheduling: Json | None = None,
    scheduling_group: Json | None = None,
) -> Json:
    pod_spec: Json = {"containers": [{"name": name, "image": "example/trainer:latest"}]}
    if priority_class is not None:
        pod_spec["priorityClassName"] = priority_class
    if scheduler is not None:
        pod_spec["schedulerName"] = scheduler
    if scheduling_group is not None:
        pod_spec["schedulingGroup"] = scheduling_group
    job_spec: Json = {"template": {"spec": pod_spec}}
    if parallelism is not None:
        job_spec["parallelism"] = parallelism
    if job_scheduling is not None:
        job_spec["scheduling"] = job_scheduling
    template: Json = {"spec": job_spec}
    if ancestor is not None:
        template["metadata"] = {"labels": {ANCESTOR_LABEL: ancestor}}
    out: Json = {"name": name, "template": template}
    if replicas is not None:
        out["replicas"] = replicas
    if depends:
        out["dependsOn"] = [{"name": n, "status": s} for n, s in depends]
    return out


def runtime(
    *replicated_jobs: Json,
    scheduling: Json | None = None,
    ml: Json | None = None,
    kind: str = "ClusterTrainingRuntime",
    name: str = "rt",
    namespace: str | None = None,
    **spec_extra: Any,
) -> Json:
    spec: Json = {
        "mlPolicy": ml if ml is not None else {"numNodes": 1, "torch": {}},
        "template": {"spec": {"replicatedJobs": list(replicated_jobs)}},
    }
    if scheduling is not None:
        spec["scheduling"] = scheduling
    spec.update(spec_extra)
    meta: Json = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": kind,
        "metadata": meta,
        "spec": spec,
    }


def trainjob(
    name: str = "my-job",
    *,
    namespace: str = "team-a",
    runtime_name: str = "rt",
    runtime_kind: str | None = None,
    num_nodes: int | None = None,
    uid: str | None = TRAINJOB_UID,
) -> Json:
    ref: Json = {"name": runtime_name}
    if runtime_kind:
        ref["kind"] = runtime_kind
    spec: Json = {"runtimeRef": ref}
    if num_nodes is not None:
        spec["trainer"] = {"numNodes": num_nodes}
    meta: Json = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": meta,
        "spec": spec,
    }


def torch_node(**kw: Any) -> Json:
    return rj("node", ancestor="trainer", **kw)


def parsed(raw_runtime: Json, raw_trainjob: Json) -> tuple[Runtime, TrainJob]:
    return Runtime.model_validate(raw_runtime), TrainJob.model_validate(raw_trainjob)

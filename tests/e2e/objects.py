"""What the end-to-end tests apply (runtimes, TrainJobs, fake nodes), and what they expect back:
gang names always come from the planner (`webhook.core.plan.build_plan`), never by hand."""

from __future__ import annotations

import datetime
from typing import Any

from webhook.core.fields import parse
from webhook.core.plan import Plan, attempt_of, build_plan, pod_group_for_labels
from webhook.core.snapshot import PLAN_VERSION
from webhook.core.trainer import ANCESTOR_LABEL, Runtime, TrainJob

from .cluster import JOBSET_GROUP, JOBSET_VERSION, TRAINER_GROUP, TRAINER_VERSION

Json = dict[str, Any]

NUM_NODES = 4
ZONE = "topology.kubernetes.io/zone"
RACK = "trainjob-scheduling-e2e.dev/rack"
# No node has this label: pods of the reconciler-only checks stay Pending (nothing binds).
NO_NODE = {"trainjob-scheduling.dev/e2e-no-such-node": "true"}
IMAGE = "registry.invalid/trainjob-scheduling-e2e:never-pulled"  # fake nodes run nothing
CREATED_BY = {"app.kubernetes.io/created-by": "trainjob-scheduling-e2e"}
# The run's fake nodes: each test's own pool, labelled and tainted with this key, so its pods
# land on its nodes only and nothing else lands there.
POOL_KEY = "trainjob-scheduling-e2e.dev/pool"
FAKE_NODE_ANNOTATION = "harness.local/fake-node"  # the harness's reaper knows these
TRAINER_STACK_LABEL = "trainer-stack.harness.local/enabled"  # the harness scopes Trainer/JobSet
API_VERSION = f"{TRAINER_GROUP}/{TRAINER_VERSION}"


# --- runtimes ---------------------------------------------------------------------------------


def pod_spec(pool: str | None, container: str = "node", cpu: str = "1", **more: Any) -> Json:
    """A pod template's spec: on the pool's nodes (or on none), one container asking `cpu`."""
    spec: Json = {
        "containers": [{"name": container, "image": IMAGE,
                        "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}],
        "terminationGracePeriodSeconds": 1,
    }  # fmt: skip
    if pool is None:
        spec["nodeSelector"] = dict(NO_NODE)
    else:
        spec["nodeSelector"] = {POOL_KEY: pool}
        spec["tolerations"] = [{"key": POOL_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    spec.update(more)
    return spec


def replicated_job(
    name: str,
    pool: str | None,
    *,
    ancestor: str | None = None,
    container: str = "node",
    replicas: int | None = None,
    parallelism: int | None = None,
    depends_on: tuple[tuple[str, str], ...] = (),
    cpu: str = "1",
    backoff_limit: int | None = None,
    **pod: Any,
) -> Json:
    job: Json = {"template": {"spec": pod_spec(pool, container, cpu, **pod)}}
    if parallelism is not None:
        job.update(parallelism=parallelism, completions=parallelism, completionMode="Indexed")
    if backoff_limit is not None:
        job["backoffLimit"] = backoff_limit
    template: Json = {"spec": job}
    if ancestor:
        template["metadata"] = {"labels": {ANCESTOR_LABEL: ancestor}}
    entry: Json = {"name": name, "template": template}
    if replicas is not None:
        entry["replicas"] = replicas
    if depends_on:
        entry["dependsOn"] = [{"name": n, "status": s} for n, s in depends_on]
    return entry


def runtime(
    name: str,
    scheduling: Json | None,
    replicated_jobs: list[Json],
    *,
    namespace: str | None = None,
    ml_policy: Json | None = None,
    labels: dict[str, str] | None = None,
    jobset: Json | None = None,
) -> Json:
    """A TrainingRuntime in `namespace`, or a ClusterTrainingRuntime when it is None."""
    spec: Json = {
        "mlPolicy": ml_policy or {"numNodes": 1, "torch": {}},
        "template": {"spec": {"replicatedJobs": replicated_jobs, **(jobset or {})}},
    }
    if scheduling is not None:
        spec["scheduling"] = scheduling
    meta: Json = {"name": name, "labels": {**CREATED_BY, **(labels or {})}}
    if namespace is not None:
        meta["namespace"] = namespace
    kind = "TrainingRuntime" if namespace is not None else "ClusterTrainingRuntime"
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": meta, "spec": spec}


def cluster_runtime(name: str, labels: dict[str, str] | None = None) -> Json:
    """Level 1 for the reconciler-only checks: one gang of every pod, in one zone, disrupted
    all together; pods on no node (the shape of tests/test_reconciler.py's `cluster_runtime()`)."""
    return runtime(
        name,
        {
            "schedulingPolicy": {"gang": {}},
            "schedulingConstraints": {"topology": [{"key": ZONE}]},
            "disruptionMode": {"all": {}},
        },
        [replicated_job("node", None, ancestor="trainer")],
        labels={"trainer.kubeflow.org/framework": "torch", **(labels or {})},
    )


def level1(name: str, pool: str, namespace: str | None, **more: Any) -> Json:
    """Level 1 (TrainJob): every pod of the TrainJob in one gang, the trainer's `node` pods
    and a `param-server` (no dependency between them)."""
    return runtime(
        name,
        {"schedulingPolicy": {"gang": {}}, **more},
        [
            replicated_job("node", pool, ancestor="trainer"),
            replicated_job("param-server", pool, container="ps"),
        ],
        namespace=namespace,
    )


def level2_torchtune(name: str, pool: str, namespace: str | None) -> Json:
    """Level 2 (ReplicatedJobs), torchtune-like: both initializers pod by pod (basic), the
    trainer's `node` pods as one gang; `node` starts once both initializers are Complete."""
    return runtime(
        name,
        {"replicatedJobs": [
            {"targetReplicatedJobs": ["dataset-initializer", "model-initializer"],
             "schedulingPolicy": {"basic": {}}},
            {"targetReplicatedJobs": ["node"], "schedulingPolicy": {"gang": {}}},
        ]},
        [
            replicated_job("dataset-initializer", pool, ancestor="dataset-initializer",
                           container="dataset-initializer"),
            replicated_job("model-initializer", pool, ancestor="model-initializer",
                           container="model-initializer"),
            replicated_job("node", pool, ancestor="trainer",
                           depends_on=(("dataset-initializer", "Complete"),
                                       ("model-initializer", "Complete"))),
        ],
        namespace=namespace,
    )  # fmt: skip


def level3(name: str, pool: str, namespace: str | None) -> Json:
    """Level 3 (Jobs): each of the 2 Jobs of `slice` (2 pods each) is a gang of its own; the
    trainer's `node` pods are one gang (level 2) beside them."""
    return runtime(
        name,
        {"replicatedJobs": [
            {"targetReplicatedJobs": ["node"], "schedulingPolicy": {"gang": {}}},
            {"targetReplicatedJobs": ["slice"], "job": {"schedulingPolicy": {"gang": {}}}},
        ]},
        [
            replicated_job("node", pool, ancestor="trainer"),
            replicated_job("slice", pool, container="slice", replicas=2, parallelism=2),
        ],
        namespace=namespace,
    )  # fmt: skip


def deepspeed(name: str, pool: str, namespace: str | None) -> Json:
    """MPI (DeepSpeed), the built-in runtime's shape: `runLauncherAsNode`, the launcher starts
    once the `node` pods are Ready and shares their gang (rule 8(c): minCount counts the node
    pods only; the launcher joins the admitted gang)."""
    return runtime(
        name,
        {"replicatedJobs": [
            {"targetReplicatedJobs": ["launcher", "node"], "schedulingPolicy": {"gang": {}}},
        ]},
        [  # JobSet wants a prerequisite listed before its dependents
            replicated_job("node", pool),
            replicated_job("launcher", pool, ancestor="trainer",
                           depends_on=(("node", "Ready"),)),
        ],
        namespace=namespace,
        ml_policy={"numNodes": 1, "mpi": {"numProcPerNode": 1, "runLauncherAsNode": True,
                                         "mpiImplementation": "OpenMPI",
                                         "sshAuthMountPath": "/root/.ssh"}},
    )  # fmt: skip


def trainjob(
    name: str,
    namespace: str,
    runtime_obj_or_name: Json | str,
    *,
    num_nodes: int | None = NUM_NODES,
    suspend: bool = False,
) -> Json:
    if isinstance(runtime_obj_or_name, str):
        kind, runtime_name = "ClusterTrainingRuntime", runtime_obj_or_name
    else:
        kind = str(runtime_obj_or_name["kind"])
        runtime_name = str(runtime_obj_or_name["metadata"]["name"])
    spec: Json = {
        "runtimeRef": {"apiGroup": TRAINER_GROUP, "kind": kind, "name": runtime_name},
        "suspend": suspend,
    }
    if num_nodes is not None:
        spec["trainer"] = {"numNodes": num_nodes}
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(CREATED_BY)},
        "spec": spec,
    }


# --- what is no gang's: plain pods, Jobs and JobSets ------------------------------------------


def plain_pod(name: str, pool: str, labels: dict[str, str] | None = None) -> Json:
    """A bare pod on the pool's nodes (no owner: nothing makes it again)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {**CREATED_BY, **(labels or {})}},
        "spec": {**pod_spec(pool, "plain"), "restartPolicy": "Never"},
    }  # fmt: skip


def plain_job(name: str, pool: str) -> Json:
    """A batch/v1 Job of one pod on the pool's nodes."""
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": dict(CREATED_BY)},
        "spec": {"template": {"spec": {**pod_spec(pool, "work"), "restartPolicy": "Never"}}},
    }  # fmt: skip


def plain_jobset(name: str, pool: str, pods: int = 2) -> Json:
    """A JobSet of no TrainJob: one Job of `pods` pods on the pool's nodes."""
    job = replicated_job("worker", pool, container="worker", parallelism=pods)
    job["template"]["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": f"{JOBSET_GROUP}/{JOBSET_VERSION}", "kind": "JobSet",
        "metadata": {"name": name, "labels": dict(CREATED_BY)},
        "spec": {"replicatedJobs": [{**job, "replicas": 1}]},
    }  # fmt: skip


# --- nodes --------------------------------------------------------------------------------------


def fake_node(
    name: str,
    pool: str,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> Json:
    """A Node no kubelet runs (pods bound to it stay Pending), for the pool's pods only."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", POOL_KEY: pool, **CREATED_BY,
                       **(labels or {})},
            "annotations": {FAKE_NODE_ANNOTATION: "true", **(annotations or {})},
        },
        "spec": {"taints": [{"key": POOL_KEY, "value": pool, "effect": "NoSchedule"}]},
    }  # fmt: skip


def node_status(cpu: int) -> Json:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    resources = {"cpu": str(cpu), "memory": "256Gi", "pods": "110"}

    def condition(kind: str, status: str, reason: str) -> Json:
        return {"type": kind, "status": status, "reason": reason, "message": "e2e fake node",
                "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip

    return {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady"),
            ],
            "nodeInfo": {"kubeletVersion": "v1.36.2", "kubeProxyVersion": "v1.36.2",
                         "architecture": "amd64", "operatingSystem": "linux",
                         "containerRuntimeVersion": "fake://0", "osImage": "e2e fake node",
                         "kernelVersion": "", "machineID": "", "systemUUID": "", "bootID": ""},
        }
    }  # fmt: skip


# --- plans ----------------------------------------------------------------------------------------


def plan_for(trainjob_obj: Json, runtime_obj: Json, plan_version: int = PLAN_VERSION) -> Plan:
    """The plan the service makes for the stored TrainJob and runtime (the names of the plan
    version this release writes)."""
    job, errors = parse(TrainJob, trainjob_obj)
    assert job is not None, errors
    parsed, errors = parse(Runtime, runtime_obj)
    assert parsed is not None, errors
    plan = build_plan(job, parsed, plan_version)
    assert plan is not None, "the runtime has no spec.scheduling"
    return plan


def planned_pod_group(plan: Plan, labels: dict[str, str]) -> str | None:
    """The PodGroup a pod with these labels must name (its JobSet restart attempt's)."""
    attempt = attempt_of(labels)
    assert attempt is not None, f"restart-attempt label not a count: {labels}"
    return pod_group_for_labels(plan.at_attempt(attempt), labels)


def uid(obj: Json) -> str:
    return str(obj["metadata"]["uid"])


def placement(pods: list[Json]) -> dict[str, str]:
    """Each pod's node, by the pod's uid: a running gang that moved (a pod deleted and made
    again, or bound elsewhere) compares unequal."""
    return {uid(p): str(p["spec"].get("nodeName")) for p in pods}


def controller_of(obj: Json) -> Json | None:
    refs = [r for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")]
    assert len(refs) <= 1, f"more than one controller reference: {refs}"
    return refs[0] if refs else None


def trainjob_owner(trainjob_obj: Json) -> Json:
    """The controller ownerReference the Workload and PodGroups must carry (was-api.md 4)."""
    meta = trainjob_obj["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


# --- the gang objects, whatever the version -----------------------------------------------------


def min_count(obj_spec: Json) -> int | None:
    gang = (obj_spec.get("schedulingPolicy") or {}).get("gang")
    return None if gang is None else gang.get("minCount")


def template_ref(pod_group: Json) -> tuple[str, str]:
    """(Workload name, template name) of a PodGroup: v1beta1 `workloadRef`, v1alpha2
    `podGroupTemplateRef.workload`."""
    spec = pod_group.get("spec") or {}
    if "workloadRef" in spec:
        ref = spec["workloadRef"]
        return str(ref.get("workloadName")), str(ref.get("templateName"))
    ref = (spec.get("podGroupTemplateRef") or {}).get("workload") or {}
    return str(ref.get("workloadName")), str(ref.get("podGroupTemplateName"))


def disruption(obj_spec: Json) -> str | None:
    """`all` / `single` (v1beta1 union; v1alpha2's PodGroup / Pod), None when unset."""
    mode = obj_spec.get("disruptionMode")
    if mode is None:
        return None
    if isinstance(mode, dict):
        return "all" if "all" in mode else "single" if "single" in mode else str(mode)
    return {"PodGroup": "all", "Pod": "single"}.get(str(mode), str(mode))

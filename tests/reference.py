"""The spec's rules written again, from the raw JSON and apart from the service's code, so that
property tests compare the planner with an independent reading of was-api.md."""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"


def pods_per_job(raw_runtime: Json, num_nodes: int | None) -> dict[str, tuple[int, int]]:
    """was-api.md section 3: ReplicatedJob name -> (pods per Job P, replicas)."""
    spec = raw_runtime["spec"]
    ml = spec.get("mlPolicy")
    nodes = num_nodes if num_nodes is not None else (ml or {}).get("numNodes", 1)
    out = {}
    for job in spec["template"]["spec"]["replicatedJobs"]:
        template = job.get("template", {})
        parallelism = template.get("spec", {}).get("parallelism", 1)
        ancestor = template.get("metadata", {}).get("labels", {}).get(ANCESTOR)
        if ml is not None and "mpi" in ml:
            if job["name"] == "launcher":
                per_job = 1
            elif job["name"] == "node":
                per_job = max(nodes - 1, 1) if ml["mpi"].get("runLauncherAsNode") else nodes
            else:
                per_job = parallelism
        elif ml is not None and ancestor == "trainer":
            per_job = nodes
        else:
            per_job = parallelism
        out[job["name"]] = (per_job, job.get("replicas", 1))
    return out


def group_pods(counts: dict[str, tuple[int, int]], members: tuple[str, ...], job: bool) -> int:
    """Pods of a group: one Job of its target (level 3) or every Job of its targets."""
    if job:
        return counts[members[0]][0]
    return sum(per_job * replicas for per_job, replicas in (counts[m] for m in members))


def group_settings(raw_runtime: Json, members: tuple[str, ...], job: bool) -> Json:
    """The four group fields the runtime asks for the group holding `members`."""
    scheduling: Json = raw_runtime["spec"]["scheduling"]
    entries = scheduling.get("replicatedJobs")
    if entries is None:
        return scheduling
    for entry in entries:
        if job and entry.get("job") is not None and entry["targetReplicatedJobs"] == [members[0]]:
            return entry["job"]  # type: ignore[no-any-return]
        if (
            not job
            and entry.get("job") is None
            and set(entry["targetReplicatedJobs"]) == set(members)
        ):
            return entry  # type: ignore[no-any-return]
    raise AssertionError(f"no entry for {members}")


def expected_template_fields(settings: Json) -> Json:
    """What a PodGroupTemplate should carry for these settings (minCount aside)."""
    policy = settings.get("schedulingPolicy") or {}
    out: Json = {"policy": "basic" if "basic" in policy and "gang" not in policy else "gang"}
    topology = (settings.get("schedulingConstraints") or {}).get("topology")
    out["schedulingConstraints"] = {"topology": topology} if topology else None
    out["disruptionMode"] = settings.get("disruptionMode")
    out["resourceClaims"] = settings.get("resourceClaims") or None
    return out

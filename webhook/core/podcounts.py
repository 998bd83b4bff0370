"""How many pods each ReplicatedJob of a TrainJob runs (was-api.md section 3).

pods(r) = P(r) x replicas(r), where P is what Trainer writes into each Job's `parallelism`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .layout import GroupKind, GroupLayout
from .trainer import ANCESTOR_TRAINER, ReplicatedJob, Runtime

MPI_NODE = "node"
MPI_LAUNCHER = "launcher"


def effective_num_nodes(runtime: Runtime, trainjob_num_nodes: int | None) -> int:
    """The TrainJob's numNodes, else the runtime's mlPolicy.numNodes, else 1."""
    if trainjob_num_nodes is not None:
        return trainjob_num_nodes
    ml = runtime.spec.ml_policy
    return ml.num_nodes if ml and ml.num_nodes is not None else 1


def uses_num_nodes(runtime: Runtime, rj: ReplicatedJob) -> bool:
    """Whether Trainer sizes this ReplicatedJob from numNodes (only with an mlPolicy)."""
    ml = runtime.spec.ml_policy
    if ml is None:
        return False
    if ml.mpi is not None:
        return rj.name == MPI_NODE
    return rj.ancestor == ANCESTOR_TRAINER


def pods_per_job(runtime: Runtime, rj: ReplicatedJob, trainjob_num_nodes: int | None) -> int:
    """P(r): pods in one Job of the ReplicatedJob."""
    ml = runtime.spec.ml_policy
    mpi = ml.mpi if ml is not None else None
    if mpi is not None and rj.name == MPI_LAUNCHER:
        return 1  # one MPI launcher, whatever numNodes or its template says
    if not uses_num_nodes(runtime, rj):
        return rj.parallelism
    nodes = effective_num_nodes(runtime, trainjob_num_nodes)
    if mpi is not None and mpi.run_launcher_as_node:
        return max(nodes - 1, 1)  # the launcher counts as one of the nodes
    return nodes


@dataclass(frozen=True)
class GroupSize:
    pods: int
    """Every pod the group ever holds, including those that join after admission."""
    min_count: int
    """Pods the gang waits for before admission (was-api.md section 3); unused for basic."""


def group_size(group: GroupLayout, runtime: Runtime, trainjob_num_nodes: int | None) -> GroupSize:
    rjs = {rj.name: rj for rj in runtime.replicated_jobs}
    if group.kind is GroupKind.JOB:
        per_job = pods_per_job(runtime, rjs[group.targets[0]], trainjob_num_nodes)
        return GroupSize(per_job, per_job)
    counts = {
        t: pods_per_job(runtime, rjs[t], trainjob_num_nodes) * rjs[t].replica_count
        for t in group.targets
    }
    return GroupSize(sum(counts.values()), sum(counts[t] for t in group.counted))


def counted_pods(
    group: GroupLayout, runtime: Runtime, rj: ReplicatedJob, trainjob_num_nodes: int | None
) -> int:
    """Pods of one of a group's targets that count towards its minCount: one Job's at level 3,
    every Job's otherwise."""
    per_job = pods_per_job(runtime, rj, trainjob_num_nodes)
    return per_job if group.kind is GroupKind.JOB else per_job * rj.replica_count

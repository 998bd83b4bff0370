"""The scheduling plan of one TrainJob: its gangs, their policies, sizes, names and members.

The plan is the single description every other part of the service works from: the pod webhook
reads a pod's PodGroup name from it, the reconciler and the `plan` command render it into objects.
Pure: no I/O, no clock, no globals.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from . import naming, resources
from .errors import FieldError
from .layout import (
    Child,
    Claim,
    CompositeKind,
    CompositeLayout,
    DisruptionModeName,
    GroupKind,
    GroupLayout,
    Layout,
    Policy,
)
from .podcounts import counted_pods, group_size
from .snapshot import PLAN_VERSION
from .trainer import DEFAULT_SCHEDULER, Runtime, TrainJob
from .validation import CheckedRuntime, check_stored_runtime, check_trainjob

JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_NAME = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
MAX_ATTEMPT = 2**31 - 1  # JobSet counts restarts in an int32


class PlanningError(ValueError):
    """The inputs do not validate; `errors` says why (validation would have said the same)."""

    def __init__(self, errors: tuple[FieldError, ...]) -> None:
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = errors


@dataclass(frozen=True)
class GroupPlan:
    """One PodGroupTemplate of the Workload and the PodGroup made from it."""

    template_name: str
    pod_group_name: str
    kind: GroupKind
    replicated_jobs: tuple[str, ...]
    job_index: int | None
    """Level 3: only the pods of this Job (replica) belong to the group."""
    policy: Policy
    min_count: int | None
    """Gang only: pods kube-scheduler waits for before admitting the group."""
    pod_count: int
    topology_key: str | None
    disruption_mode: DisruptionModeName | None
    resource_claims: tuple[Claim, ...]
    priority_class_name: str | None
    joins_later: tuple[str, ...]
    """ReplicatedJobs whose pods join after admission (Ready dependents), outside minCount."""
    scheduler_name: str = DEFAULT_SCHEDULER
    """The scheduler every pod of the group names (the runtime's, or the TrainJob's patch)."""
    counted: tuple[tuple[str, int], ...] = ()
    """Gang only: the pods each ReplicatedJob has before admission (they make up minCount)."""
    min_resources: tuple[tuple[str, str], ...] = ()
    """Gang only: what those pods request together, by resource name (quantities)."""
    parent_name: str | None = None
    """In a tree: the CompositePodGroup it belongs to."""


@dataclass(frozen=True)
class CompositePlan:
    """A group of groups (a CompositePodGroupTemplate and its CompositePodGroup)."""

    template_name: str
    name: str
    kind: CompositeKind
    replicated_jobs: tuple[str, ...]
    policy: Policy
    min_group_count: int | None
    """Gang only: the child groups admitted together (those that can exist before admission)."""
    topology_key: str | None
    disruption_mode: DisruptionModeName | None
    priority_class_name: str | None
    children: tuple[str, ...]
    """Template names of its children (composites and PodGroup templates), in order."""
    joins_later: tuple[str, ...] = ()
    parent_template: str | None = None
    parent_name: str | None = None


@dataclass(frozen=True)
class Plan:
    namespace: str
    trainjob_name: str
    trainjob_uid: str | None
    workload_name: str
    groups: tuple[GroupPlan, ...]
    untargeted: tuple[str, ...]
    """ReplicatedJobs that get default scheduling (no group)."""
    warnings: tuple[str, ...]
    scheduler_name: str = DEFAULT_SCHEDULER
    """The scheduler of every group's pods: it chooses the gang backend."""
    composites: tuple[CompositePlan, ...] = ()
    """A multi-level runtime's tree of groups of groups, parents first; `groups` are its
    leaves. Empty for a single level."""
    plan_version: int = PLAN_VERSION
    """How names are made (core/snapshot.py): 1 without incarnation or restart attempts, 2
    with the TrainJob's uid, 3 also with its run (generation)."""
    attempt: int = 0
    """The JobSet restart attempt whose PodGroups this plan names (`at_attempt`)."""
    _restarted: list[Plan] = field(init=False, repr=False, compare=False, hash=False)
    _members: dict[tuple[str, int | None], GroupPlan] = field(
        init=False, repr=False, compare=False, hash=False
    )

    def __post_init__(self) -> None:
        # The last restart attempt's plan (`at_attempt`): a restarted gang's pods ask for it
        # one review after another; one slot, whatever attempts a label claims.
        object.__setattr__(self, "_restarted", [])
        members: dict[tuple[str, int | None], GroupPlan] = {}
        for g in self.groups:
            for rj in g.replicated_jobs:
                members[(rj, g.job_index)] = g
        object.__setattr__(self, "_members", members)

    def group_for(self, replicated_job: str, job_index: int) -> GroupPlan | None:
        """The group of the pods of Job `job_index` of a ReplicatedJob; None if untargeted."""
        return self._members.get((replicated_job, None)) or self._members.get(
            (replicated_job, job_index)
        )

    def pod_group_for(self, replicated_job: str, job_index: int) -> str | None:
        group = self.group_for(replicated_job, job_index)
        return group.pod_group_name if group else None

    def at_attempt(self, attempt: int) -> Plan:
        """The plan of JobSet restart attempt `attempt`: the same Workload, and PodGroups (and
        CompositePodGroups) of their own, so that a restarted JobSet is admitted as a whole
        again and never waits on its previous attempt's Terminating objects. Plan version 1
        keeps one set of names for every attempt, as the releases that wrote it did."""
        if self.plan_version < 2 or attempt == self.attempt:
            return self
        if self.attempt:  # names of attempt k are not renamed again
            raise ValueError("at_attempt is asked of the plan of attempt 0")
        restarted: list[Plan] = self._restarted
        if restarted and restarted[0].attempt == attempt:
            return restarted[0]
        renamed = {c.name: naming.for_attempt(c.name, attempt) for c in self.composites}

        def parent(name: str | None) -> str | None:
            return renamed.get(name, name) if name is not None else None

        groups = tuple(
            dataclasses.replace(
                g,
                pod_group_name=naming.for_attempt(g.pod_group_name, attempt),
                parent_name=parent(g.parent_name),
            )
            for g in self.groups
        )
        composites = tuple(
            dataclasses.replace(c, name=renamed[c.name], parent_name=parent(c.parent_name))
            for c in self.composites
        )
        plan = dataclasses.replace(self, groups=groups, composites=composites, attempt=attempt)
        restarted[:] = [plan]
        return plan


def group_for_labels(plan: Plan, labels: Mapping[str, str]) -> GroupPlan | None:
    """A pod's group from the labels JobSet puts on every pod, or None if not this plan's."""
    if labels.get(JOBSET_NAME) != plan.trainjob_name:
        return None
    rj = labels.get(REPLICATED_JOB_NAME)
    index = labels.get(JOB_INDEX, "")
    # An int32 index in ASCII digits (isdigit alone admits "²", which int() refuses); webhooks
    # see labels before the API server validates them, so either may be any JSON value.
    if not (isinstance(rj, str) and isinstance(index, str)):
        return None
    if not (index.isascii() and index.isdigit() and len(index) <= 10):
        return None
    return plan.group_for(rj, int(index))


def attempt_of(labels: Mapping[str, object]) -> int | None:
    """The JobSet restart attempt a pod's labels name: 0 without the label, None when the label
    is not an int32 in ASCII digits (a pod the webhook cannot place)."""
    value = labels.get(RESTART_ATTEMPT)
    if value is None:
        return 0
    if not (isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 10):
        return None
    attempt = int(value)
    return attempt if attempt <= MAX_ATTEMPT else None


def pod_group_for_labels(plan: Plan, labels: Mapping[str, str]) -> str | None:
    """A pod's group's name (the native PodGroup's and the plan's for every backend)."""
    group = group_for_labels(plan, labels)
    return group.pod_group_name if group else None


def build_plan(
    trainjob: TrainJob, runtime: Runtime | CheckedRuntime, plan_version: int = PLAN_VERSION
) -> Plan | None:
    """The plan of a TrainJob under its runtime; None when the runtime has no spec.scheduling.

    Raises PlanningError exactly when validation rejects the runtime or the TrainJob. Pass a
    `CheckedRuntime` (`check_stored_runtime`) to check a runtime once for all of its TrainJobs.
    `plan_version` is the snapshot's (core/snapshot.py): from 2 on, the names carry the
    TrainJob's uid (when it has one: `plan` from files shows the names without it).
    """
    checked = runtime if isinstance(runtime, CheckedRuntime) else check_stored_runtime(runtime)
    layout, verdict = checked.layout, checked.verdict
    if layout is None:
        return None
    if not verdict.allowed:
        raise PlanningError(verdict.errors)
    tj_verdict = check_trainjob(trainjob, checked)
    if not tj_verdict.allowed:
        raise PlanningError(tj_verdict.errors)

    ns = trainjob.namespace
    tj = trainjob.metadata.name or ""
    incarnation = _incarnation(trainjob, plan_version)
    workload = naming.workload_name(ns, tj, incarnation)
    names = {c.key: _composite_names(c, ns, tj, workload, incarnation) for c in layout.composites}
    groups = tuple(
        _group_plan(g, checked.runtime, trainjob, ns, tj, workload, names, incarnation)
        for g in layout.groups
    )
    composites = tuple(_composite_plan(c, layout, groups, names) for c in layout.composites)
    scheduler = groups[0].scheduler_name if groups else DEFAULT_SCHEDULER
    return Plan(
        ns,
        tj,
        trainjob.metadata.uid,
        workload,
        groups,
        layout.untargeted,
        verdict.warnings,
        scheduler,
        composites,
        plan_version,
    )


def _incarnation(trainjob: TrainJob, plan_version: int) -> str:
    """What qualifies the gang's names (core/snapshot.py): nothing (version 1), the TrainJob's
    uid (2), and its run, the generation, once past the first (3)."""
    if plan_version < 2:
        return ""
    uid = trainjob.metadata.uid or ""
    generation = trainjob.metadata.generation
    if plan_version >= 3 and generation is not None and generation > 1:
        return f"{uid}/run/{generation}"
    return uid


def _composite_names(
    c: CompositeLayout, ns: str, tj: str, workload: str, incarnation: str
) -> tuple[str, str]:
    """(template, object) names: the root is named as the Workload (as a level-1 template),
    an entry's composite as that entry's level-2 template and PodGroup would be."""
    if c.kind is CompositeKind.TRAINJOB:
        return workload, workload
    template = naming.group_template_name(ns, tj, c.targets)
    return template, naming.pod_group_name(tj, template, incarnation)


def _composite_plan(
    c: CompositeLayout,
    layout: Layout,
    groups: tuple[GroupPlan, ...],
    names: Mapping[str, tuple[str, str]],
) -> CompositePlan:
    def name_of(child: Child) -> str:
        return groups[child].template_name if isinstance(child, int) else names[child][0]

    parent = names.get(c.parent) if c.parent else None
    return CompositePlan(
        template_name=names[c.key][0],
        name=names[c.key][1],
        kind=c.kind,
        replicated_jobs=c.targets,
        policy=c.policy,
        min_group_count=len(c.counted) if c.policy == "gang" else None,
        topology_key=c.topology_key,
        disruption_mode=c.disruption_mode,
        priority_class_name=c.priority_class_name,
        children=tuple(name_of(child) for child in c.children),
        joins_later=tuple(name_of(child) for child in c.deferred),
        parent_name=parent[1] if parent else None,
    )


def _template_name(group: GroupLayout, ns: str, tj: str, workload: str) -> str:
    if group.kind is GroupKind.TRAINJOB:
        return workload
    if group.kind is GroupKind.SPLIT:
        return naming.split_template_name(ns, tj, group.targets[0])
    if group.kind is GroupKind.JOB:
        assert group.job_index is not None
        return naming.job_template_name(ns, tj, group.targets[0], group.job_index)
    return naming.group_template_name(ns, tj, group.targets)


def _group_plan(
    group: GroupLayout,
    runtime: Runtime,
    trainjob: TrainJob,
    ns: str,
    tj: str,
    workload: str,
    composites: Mapping[str, tuple[str, str]],
    incarnation: str,
) -> GroupPlan:
    template = _template_name(group, ns, tj, workload)
    pod_group = (
        template
        if group.kind is GroupKind.TRAINJOB
        else naming.pod_group_name(tj, template, incarnation)
    )
    num_nodes = trainjob.num_nodes
    size = group_size(group, runtime, num_nodes)
    rjs = {rj.name: rj for rj in runtime.replicated_jobs}
    counted: tuple[tuple[str, int], ...] = ()
    total: resources.Resources = {}
    if group.policy == "gang":
        counted = tuple((t, counted_pods(group, runtime, rjs[t], num_nodes)) for t in group.counted)
        for name, pods in counted:
            for resource, value in resources.times(
                resources.replicated_job_requests(runtime, trainjob, rjs[name]), pods
            ).items():
                total[resource] = total.get(resource, Decimal(0)) + value
    return GroupPlan(
        template_name=template,
        pod_group_name=pod_group,
        kind=group.kind,
        replicated_jobs=group.targets,
        job_index=group.job_index,
        policy=group.policy,
        min_count=size.min_count if group.policy == "gang" else None,
        pod_count=size.pods,
        topology_key=group.topology_key,
        disruption_mode=group.disruption_mode,
        resource_claims=group.resource_claims,
        priority_class_name=group.priority_class_name,
        joins_later=group.deferred,
        scheduler_name=trainjob.scheduler_of(rjs[group.targets[0]]),
        counted=counted,
        min_resources=tuple((k, resources.text(v)) for k, v in sorted(total.items())),
        parent_name=composites[group.parent][1] if group.parent else None,
    )

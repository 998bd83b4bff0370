"""Validation of runtimes and TrainJobs into field errors and warnings (pure: no I/O).

Every message says what is wrong and what to do about it: admins read them at `kubectl apply`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import errors as fe
from . import limits, resources
from .errors import FieldError, Path
from .fields import check_group_settings, parse, unknown_fields
from .layout import (
    SCHEDULING,
    SHOWN_NAMES,
    GroupKind,
    GroupLayout,
    Layout,
    pod_field,
    resolve_layout,
)
from .limits import MAX_INT32, within_int32
from .naming import is_dns_label
from .podcounts import counted_pods, effective_num_nodes, group_size, uses_num_nodes
from .startup import REPLICATED_JOBS
from .trainer import CLUSTER_RUNTIME_KIND, Runtime, Scheduling, TrainJob

MAX_RJ_NAME = 20  # Trainer v2.4 (#4391)
OWNED = "must not be set, it is owned by the TrainJob controller"

_RFC1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class Verdict:
    errors: tuple[FieldError, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return not self.errors


# --- runtimes ----------------------------------------------------------------------------------


def runtime_layout(
    runtime: Runtime, old: Runtime | None = None, stored: bool = False
) -> tuple[Layout | None, Verdict]:
    """All rules for a parsed runtime, with the layout they were checked against.

    `old` is the runtime an update replaces; `stored` judges a runtime already in the cluster,
    whose template was accepted before (rule 8(g) only applies to template changes).
    """
    errs: list[FieldError] = []
    warnings: list[str] = []
    template_changed = not stored and (
        old is None or old.spec.template.dump() != runtime.spec.template.dump()
    )
    seen: set[str] = set()
    for i, rj in enumerate(runtime.replicated_jobs):
        npath = REPLICATED_JOBS.index(i).child("name")
        if rj.name in seen:
            errs.append(fe.duplicate(npath, rj.name, "ReplicatedJob names must be unique"))
        seen.add(rj.name)
        if template_changed and len(rj.name) > MAX_RJ_NAME:
            errs.append(
                fe.too_long(npath, MAX_RJ_NAME, "Trainer v2.4 caps ReplicatedJob names; shorten it")
            )
        elif not is_dns_label(rj.name):
            errs.append(
                fe.invalid(npath, rj.name, "must be a DNS label: lower-case alphanumerics and '-'")
            )

    scheduling = runtime.spec.scheduling
    if scheduling is None:
        return None, Verdict(tuple(errs))

    if runtime.spec.pod_group_policy is not None:
        errs.append(
            fe.forbidden(
                SCHEDULING,
                "scheduling and podGroupPolicy are mutually exclusive; remove podGroupPolicy "
                "(coscheduling/volcano) or remove scheduling",
            )
        )
    errs += _check_levels(scheduling)
    errs += _owned_fields(runtime)
    errs += _restart_errors(runtime)
    if not stored:
        errs += _jobset_order_errors(runtime, old)
    layout = resolve_layout(runtime)
    assert layout is not None
    errs += layout.errors
    errs += _size_errors(runtime, layout)
    unknown = unknown_fields(scheduling, SCHEDULING)
    if errs:  # how a denied runtime would be scheduled is moot; an unknown field may be the
        return layout, Verdict(tuple(errs), tuple(unknown))  # typo behind an error
    warnings += layout.warnings
    warnings += [
        f'scheduling: replicatedJob "{name}" is not targeted; it gets default scheduling'
        for name in layout.untargeted
    ]
    return layout, Verdict((), tuple(warnings + unknown))


def _check_levels(scheduling: Scheduling) -> list[FieldError]:
    errs = check_group_settings(scheduling, SCHEDULING)
    for i, entry in enumerate(scheduling.replicated_jobs or []):
        where = SCHEDULING.child("replicatedJobs").index(i)
        errs += check_group_settings(entry, where)
        if entry.job is not None:
            errs += check_group_settings(entry.job, where.child("job"))
    return errs


def _owned_fields(runtime: Runtime) -> list[FieldError]:
    """Rule 8(h): with spec.scheduling the service owns every other scheduling field."""
    errs: list[FieldError] = []
    jobset = runtime.spec.template.spec
    if jobset.scheduling is not None:
        errs.append(
            fe.forbidden(
                Path("spec", "template", "spec", "scheduling"),
                f"JobSet scheduling {OWNED}; remove it and configure spec.scheduling",
            )
        )
    for i, rj in enumerate(runtime.replicated_jobs):
        job_spec = rj.template.spec if rj.template else None
        jpath = REPLICATED_JOBS.index(i).child("template", "spec")
        if job_spec is not None and job_spec.scheduling is not None:
            errs.append(
                fe.forbidden(
                    jpath.child("scheduling"),
                    f"Job scheduling {OWNED}; remove it and configure spec.scheduling",
                )
            )
        if rj.pod_spec.scheduling_group is not None:
            errs.append(
                fe.forbidden(
                    pod_field(i, "schedulingGroup"),
                    f"Pod schedulingGroup {OWNED}; remove it, the service sets it on each pod",
                )
            )
    return errs


# JobSet failure-policy actions that recreate one Job inside a running JobSet (alpha gate
# RestartJob): its new pods would join a gang kube-scheduler already admitted, one by one.
ONE_JOB_RESTARTS = ("RestartJob", "RestartJobAndIgnoreMaxRestarts")


def _restart_errors(runtime: Runtime) -> list[FieldError]:
    """A gang restarts whole: with spec.scheduling, JobSet's RestartJob actions are refused.
    (RestartJobSet restarts every Job, a gang of its own per restart attempt; InPlaceRestart
    restarts containers in pods that stay bound, so the admitted gang keeps its nodes.)"""
    policy = runtime.spec.template.spec.failure_policy
    errs: list[FieldError] = []
    for i, rule in enumerate((policy.rules or []) if policy is not None else []):
        if rule.action in ONE_JOB_RESTARTS:
            where = Path("spec", "template", "spec", "failurePolicy", "rules").index(i)
            errs.append(
                fe.invalid(
                    where.child("action"),
                    rule.action,
                    f"{rule.action} recreates one Job of a running gang, whose new pods would "
                    "join a gang the scheduler already admitted, not all or nothing; with "
                    "spec.scheduling use RestartJobSet (each restart is a gang of its own, "
                    "admitted whole) or FailJobSet",
                )
            )
    return errs


def _jobset_order_errors(runtime: Runtime, old: Runtime | None = None) -> list[FieldError]:
    """JobSet's webhook refuses a JobSet whose first ReplicatedJob has dependsOn ("DependsOn
    can't be set for the first ReplicatedJob") or one of whose ReplicatedJobs depends on one
    listed after it ("replicatedJob: X cannot depend on replicatedJob: Y"). Trainer builds the
    JobSet from the template in its order, so no TrainJob of such a runtime would ever start.
    (A name the template lacks, and a ReplicatedJob naming itself, are start-up rules:
    `startup.py`.) Ratcheted: an update is denied only for an error the runtime it replaces
    did not have, so a runtime stored before this rule can still be edited (relabelled, its
    scheduling changed, or its order fixed)."""
    if old is not None:
        had = _jobset_order_errors(old)
        return [e for e in _jobset_order_errors(runtime) if e not in had]
    rjs = runtime.replicated_jobs
    names = {rj.name for rj in rjs}
    earlier: set[str] = set()
    errs: list[FieldError] = []
    for i, rj in enumerate(rjs):
        deps = rj.depends_on or []
        where = REPLICATED_JOBS.index(i).child("dependsOn")
        if i == 0 and deps:
            errs.append(
                fe.forbidden(
                    where,
                    f'the first ReplicatedJob ("{rj.name}") cannot have dependsOn: JobSet '
                    'refuses the JobSet ("DependsOn can\'t be set for the first ReplicatedJob"), '
                    "so no TrainJob of this runtime would start; list the ReplicatedJobs it "
                    "depends on before it, or remove its dependsOn",
                )
            )
        else:
            for j, dep in enumerate(deps):
                if dep.name in names and dep.name != rj.name and dep.name not in earlier:
                    errs.append(
                        fe.invalid(
                            where.index(j).child("name"),
                            dep.name,
                            f'"{dep.name}" is listed after "{rj.name}": a ReplicatedJob may '
                            "depend only on those listed before it (JobSet refuses the JobSet: "
                            f'"replicatedJob: {rj.name} cannot depend on replicatedJob: '
                            f'{dep.name}"), so no TrainJob of this runtime would start; move '
                            f'"{dep.name}" above "{rj.name}" in spec.template.spec.replicatedJobs',
                        )
                    )
        earlier.add(rj.name)
    return errs


def _size_errors(runtime: Runtime, layout: Layout) -> list[FieldError]:
    """Pod counts must be int32 counts, fit a PodGroup's int32 and give every gang a pod to wait
    for (checked with numNodes at its floor of 1; each TrainJob's numNodes is checked on its own).
    A group with a count already said to be wrong is not judged again: one mistake, one cause."""
    errs: list[FieldError] = []
    miscounted: set[str] = set()
    for i, rj in enumerate(runtime.replicated_jobs):
        where = REPLICATED_JOBS.index(i)
        found = int32_errors(where.child("template", "spec", "parallelism"), rj.parallelism)
        if rj.replicas is not None:
            found = int32_errors(where.child("replicas"), rj.replicas) + found
        if found:
            miscounted.add(rj.name)
        errs += found
    ml = runtime.spec.ml_policy
    if ml is not None and ml.num_nodes is not None:
        errs += int32_errors(Path("spec", "mlPolicy", "numNodes"), ml.num_nodes)
    rjs = runtime.replicated_jobs
    index = {rj.name: i for i, rj in enumerate(rjs)}  # the last of a duplicated name, as layout
    for group in layout.groups:
        if miscounted.intersection(group.targets):
            continue
        pods = {t: counted_pods(group, runtime, rjs[index[t]], 1) for t in group.targets}
        if sum(pods.values()) > MAX_INT32:
            errs.append(_overflow_error(group, runtime, index, pods))
        if group.policy == "gang" and group.counted and group_size(group, runtime, 1).min_count < 1:
            errs.append(_no_pod_error(group, runtime, index))  # (none counted: a cycle, said)
    return errs


def _overflow_error(
    group: GroupLayout, runtime: Runtime, index: dict[str, int], pods: dict[str, int]
) -> FieldError:
    """A group past a PodGroup's int32, said of the one ReplicatedJob that fills it, else of
    the group, naming each ReplicatedJob with its pods."""
    total = sum(pods.values())
    limit = f"more than a PodGroup can count ({MAX_INT32}); lower replicas or parallelism"
    running = [t for t in group.targets if pods[t]]
    if len(running) == 1:
        (name,) = running
        return fe.invalid(
            REPLICATED_JOBS.index(index[name]),
            name,
            f"runs {total} pods in one group, {limit}",
        )
    each = ", ".join(f'"{t}" {pods[t]}' for t in running[:SHOWN_NAMES])
    if len(running) > SHOWN_NAMES:
        each += f" and {len(running) - SHOWN_NAMES} more"
    return fe.invalid(
        _group_path(group, runtime),
        list(group.targets),
        f"together they run {total} pods in one group ({each}), {limit}, or split them into "
        "several replicatedJobs entries",
    )


def _no_pod_error(group: GroupLayout, runtime: Runtime, index: dict[str, int]) -> FieldError:
    """A gang none of whose counted ReplicatedJobs runs a pod, said at the count that is 0 (of
    each, when there are several)."""
    zero: dict[str, tuple[Path, str]] = {}
    for name in group.counted:
        i = index[name]
        rj = runtime.replicated_jobs[i]
        if rj.replica_count == 0:
            zero[name] = (REPLICATED_JOBS.index(i).child("replicas"), "replicas")
        else:
            where = REPLICATED_JOBS.index(i).child("template", "spec", "parallelism")
            zero[name] = (where, "parallelism")
    fix = "raise it, or make the gang schedulingPolicy basic"
    if len(zero) == 1:
        ((name, (path, _)),) = zero.items()
        return fe.invalid(
            path,
            0,
            f'must be at least 1: "{name}" is in a gang, and a gang needs a pod to wait for; '
            + fix,
        )
    names = list(zero)[:SHOWN_NAMES]
    each = ", ".join(f'"{t}" {zero[t][1]} 0' for t in names)
    return fe.invalid(
        _group_path(group, runtime),
        list(group.counted),
        f"a gang needs at least one pod, but these ReplicatedJobs run none ({each}); raise one "
        "of them, or make the gang schedulingPolicy basic",
    )


def _group_path(group: GroupLayout, runtime: Runtime) -> Path:
    """Where a group of several ReplicatedJobs is made: its replicatedJobs entry's targets, or
    spec.scheduling for the whole TrainJob."""
    scheduling = runtime.spec.scheduling
    entries = scheduling.replicated_jobs if scheduling is not None else None
    if group.kind is GroupKind.REPLICATED_JOBS and entries:
        first = group.targets[0]
        i = next(i for i, e in enumerate(entries) if first in (e.target_replicated_jobs or []))
        return SCHEDULING.child("replicatedJobs").index(i).child("targetReplicatedJobs")
    return SCHEDULING


def int32_errors(path: Path, value: int) -> list[FieldError]:
    """A count the JobSet and Trainer schemas type int32: 0 to 2147483647."""
    if within_int32(value):
        return []
    if value < 0:
        return [fe.invalid(path, value, "must be >= 0")]
    return [fe.invalid(path, value, f"must be at most {MAX_INT32} (an int32)")]


def validate_runtime(raw: Mapping[str, Any], old_raw: Mapping[str, Any] | None = None) -> Verdict:
    return judge_runtime(raw, old_raw)[1]


def judge_runtime(
    raw: Mapping[str, Any], old_raw: Mapping[str, Any] | None = None
) -> tuple[Runtime | None, Verdict]:
    """The runtime as parsed (None when it does not parse) and its verdict."""
    runtime, errs = parse(Runtime, raw)
    if runtime is None:
        return None, Verdict(tuple(errs))
    old = parse(Runtime, old_raw)[0] if old_raw is not None else None
    return runtime, runtime_layout(runtime, old)[1]


# --- TrainJobs ---------------------------------------------------------------------------------


def validate_trainjob(
    raw: Mapping[str, Any],
    runtime: Runtime | CheckedRuntime | None,
    old_raw: Mapping[str, Any] | None = None,
    gang_exists: bool = False,
) -> Verdict:
    """Rules for a TrainJob given its runtime (None: not found) and, on update, its old version."""
    trainjob, errs = parse(TrainJob, raw)
    if trainjob is None:
        return Verdict(tuple(errs))
    old = parse(TrainJob, old_raw)[0] if old_raw is not None else None
    return check_trainjob(trainjob, runtime, old, gang_exists)


@dataclass(frozen=True)
class CheckedRuntime:
    """A stored runtime with its layout and verdict, worked out once for all its TrainJobs."""

    runtime: Runtime
    layout: Layout | None
    verdict: Verdict


def check_stored_runtime(runtime: Runtime) -> CheckedRuntime:
    """Judges a runtime already in the cluster (rule 8(g) only applies to template changes)."""
    layout, verdict = runtime_layout(runtime, stored=True)
    return CheckedRuntime(runtime, layout, verdict)


def check_trainjob(
    trainjob: TrainJob,
    runtime: Runtime | CheckedRuntime | None,
    old: TrainJob | None = None,
    gang_exists: bool = False,
) -> Verdict:
    """`validate_trainjob` on parsed objects.

    On update the runtime is not judged again: it may have been deleted or edited since the
    TrainJob was created, and that must not block suspend/resume or metadata changes. For the
    same reason an update is denied only for errors the stored TrainJob did not have.
    """
    found: list[FieldError] = []
    npath = Path("spec", "trainer", "numNodes")
    num_nodes = trainjob.num_nodes
    if old is not None and gang_exists and old.num_nodes != num_nodes:
        found.append(
            fe.forbidden(
                npath,
                f"may not change from {old.num_nodes} to {num_nodes} while the TrainJob's "
                "gang exists; delete and recreate the TrainJob instead",
            )
        )
    ref = Path("spec", "runtimeRef", "name")
    if runtime is None:
        if old is not None:
            return Verdict(tuple(found))
        where = (
            ""
            if trainjob.runtime_kind == CLUSTER_RUNTIME_KIND
            else f' in namespace "{trainjob.namespace}"'
        )
        detail = (
            f"no {trainjob.runtime_kind} of that name{where}; create the runtime first or fix "
            "spec.runtimeRef"
        )
        return Verdict((fe.not_found(ref, trainjob.spec.runtime_ref.name, detail),))
    checked = runtime if isinstance(runtime, CheckedRuntime) else check_stored_runtime(runtime)
    layout, verdict = checked.layout, checked.verdict
    if layout is None:  # no spec.scheduling: nothing of the service's to check
        return Verdict(tuple(found))
    if not verdict.allowed:
        if old is not None:
            return Verdict(tuple(found))
        detail = f"the {checked.runtime.kind} is invalid ({verdict.errors[0]}); fix the runtime"
        return Verdict((fe.invalid(ref, trainjob.spec.runtime_ref.name, detail),))

    errors = _spec_errors(trainjob, checked.runtime, layout)
    if old is not None:
        # Ratcheted, as Kubernetes ratchets a CRD's validation: an update is denied only for
        # an error the stored TrainJob did not have (the very same: a value changed to another
        # wrong one is denied). A runtime edited since must not block a label edit, the
        # service's own writes or Kueue's suspend: such a denial would hold them for ever.
        had = _spec_errors(old, checked.runtime, layout)
        errors = [e for e in errors if e not in had]
    found += errors
    return Verdict(tuple(found), verdict.warnings)


def _spec_errors(trainjob: TrainJob, runtime: Runtime, layout: Layout) -> list[FieldError]:
    """What is wrong with a TrainJob under a valid runtime with spec.scheduling."""
    found: list[FieldError] = []
    name = trainjob.metadata.name
    if not name or not _RFC1035.match(name):
        found.append(
            fe.invalid(
                Path("metadata", "name"),
                name,
                "must be a lower-case RFC 1035 label of at most 63 characters; Workload and "
                "PodGroup names derive from it",
            )
        )
    found += _num_nodes_errors(trainjob, runtime, layout)
    found += _scheduler_errors(trainjob, runtime, layout)
    found += _resources_per_node_errors(trainjob)
    return found


def _resources_per_node_errors(trainjob: TrainJob) -> list[FieldError]:
    """Each of resourcesPerNode's requests and limits must be a quantity the API server can
    hold: the gang backends add them up into the gang's minResources."""
    per_node = trainjob.resources_per_node
    if not isinstance(per_node, dict):
        return []
    where = Path("spec", "trainer", "resourcesPerNode")
    found: list[FieldError] = []
    for part in ("requests", "limits"):
        values = per_node.get(part)
        if not isinstance(values, dict):
            continue
        for name, value in list(values.items())[: limits.MAX_SCHEDULING_LIST + 1]:
            if resources.parse(value) is None:
                shown = value if isinstance(value, (str, int, float)) else type(value).__name__
                found.append(
                    fe.invalid(
                        where.child(part).key(str(name)),
                        shown,
                        f"must be a quantity from 0 to {resources.MAX_QUANTITY} (e.g. 8, 500m, "
                        "64Gi)",
                    )
                )
    return found


def _scheduler_errors(trainjob: TrainJob, runtime: Runtime, layout: Layout) -> list[FieldError]:
    """The TrainJob's runtime patches may name another scheduler for some pods: all of its
    groups' pods must still name one (the runtime was checked the same way without them)."""
    if not trainjob.spec.runtime_patches:
        return []
    by_name = {rj.name: rj for rj in runtime.replicated_jobs}
    chosen = {t: trainjob.scheduler_of(by_name[t]) for g in layout.groups for t in g.targets}
    if len(set(chosen.values())) <= 1:
        return []
    shown = ", ".join(f"{t}={s}" for t, s in list(chosen.items())[:8])
    return [
        fe.invalid(
            Path("spec", "runtimePatches"),
            sorted(set(chosen.values())),
            f"these patches make the gangs' pods name different schedulers ({shown}); one "
            "TrainJob's gangs are made for one scheduler: patch every scheduled ReplicatedJob "
            "alike",
        )
    ]


def _num_nodes_errors(trainjob: TrainJob, runtime: Runtime, layout: Layout) -> list[FieldError]:
    npath = Path("spec", "trainer", "numNodes")
    num_nodes = trainjob.num_nodes
    if num_nodes is not None and (errs := int32_errors(npath, num_nodes)):
        return errs
    fallback = " (unset, so the runtime's mlPolicy.numNodes applies)" if num_nodes is None else ""
    by_name = {rj.name: rj for rj in runtime.replicated_jobs}
    gangs = [g for g in layout.groups if g.policy == "gang"]
    sized = any(uses_num_nodes(runtime, by_name[t]) for g in gangs for t in g.targets)
    if (sized and effective_num_nodes(runtime, num_nodes) < 1) or any(
        group_size(g, runtime, num_nodes).min_count < 1 for g in gangs
    ):
        return [
            fe.invalid(
                npath,
                num_nodes,
                f"must be at least 1{fallback}: the runtime schedules the training nodes as a "
                "gang, which needs at least one pod",
            )
        ]
    biggest = max((group_size(g, runtime, num_nodes).pods for g in layout.groups), default=0)
    if biggest > MAX_INT32:
        return [
            fe.invalid(
                npath,
                num_nodes,
                f"too large: a group would hold {biggest} pods, more than a PodGroup can count "
                f"({MAX_INT32})",
            )
        ]
    return []

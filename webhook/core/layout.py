"""Which pods of a runtime's TrainJobs form which scheduling group, and why.

The layout depends on the runtime alone (not on a TrainJob), so runtime admission can check it once
and the planner can reuse it for every TrainJob. It also gathers the structural errors that make a
layout impossible; validation reports them and the planner refuses to plan around them, so the two
can never disagree.
"""

from __future__ import annotations

import enum
import functools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from . import errors as fe
from .errors import FieldError, Path
from .graph import IN_ORDER, Names, Ordering, build_edges, ordering
from .limits import within_int32
from .startup import REPLICATED_JOBS, dependency_errors, progress_errors
from .trainer import (
    GROUP_SETTING_FIELDS,
    GroupSettings,
    ReplicatedJob,
    ReplicatedJobEntry,
    Runtime,
    Scheduling,
)

MAX_TEMPLATES = 8  # WorkloadMaxPodGroupTemplates; also the cap of each list in a tree
MAX_TARGETS = 8
MAX_ENTRIES = 8
MAX_TREE_LEAVES = MAX_TEMPLATES * MAX_TEMPLATES  # 8 composites of 8 PodGroups each
ROOT = "trainjob"  # the key of a tree's root composite

SCHEDULING = Path("spec", "scheduling")


class GroupKind(enum.Enum):
    """What one scheduling group stands for."""

    TRAINJOB = "trainjob"  # level 1: every pod of the TrainJob
    SPLIT = "split"  # level 1 split by a Complete dependency: one ReplicatedJob
    REPLICATED_JOBS = "replicated-jobs"  # level 2: the targets of one replicatedJobs entry
    JOB = "job"  # level 3: one Job (replica) of the entry's single target


Policy = Literal["gang", "basic"]
DisruptionModeName = Literal["single", "all"]


@dataclass(frozen=True)
class Claim:
    name: str
    resource_claim_name: str | None
    resource_claim_template_name: str | None


@dataclass(frozen=True)
class GroupLayout:
    kind: GroupKind
    targets: tuple[str, ...]
    job_index: int | None
    """Level 3: the one Job (replica) of the single target this group holds."""
    policy: Policy
    topology_key: str | None
    disruption_mode: DisruptionModeName | None
    resource_claims: tuple[Claim, ...]
    priority_class_name: str | None
    deferred: tuple[str, ...] = ()
    """Targets whose pods appear only after the gang is admitted (Ready dependents)."""
    parent: str | None = None
    """In a multi-level runtime, the key of the composite it belongs to."""

    @functools.cached_property
    def counted(self) -> tuple[str, ...]:
        deferred = frozenset(self.deferred)
        return tuple(t for t in self.targets if t not in deferred)


class CompositeKind(enum.Enum):
    """What a composite (a group of groups, the API's CompositePodGroup) stands for."""

    TRAINJOB = "trainjob"  # the root: every group of the TrainJob (implied basic when unset)
    REPLICATED_JOB = "replicated-job"  # an entry with job and its own fields: its Jobs' groups


Child = int | str  # a child of a composite: a group (its index in Layout.groups) or a composite


@dataclass(frozen=True)
class CompositeLayout:
    key: str  # ROOT, or "entry-<i>"
    kind: CompositeKind
    targets: tuple[str, ...]
    """The ReplicatedJobs whose pods are under it."""
    parent: str | None
    policy: Policy
    topology_key: str | None
    disruption_mode: DisruptionModeName | None
    priority_class_name: str | None
    children: tuple[Child, ...]
    deferred: tuple[Child, ...] = ()
    """Children that can only exist once the others run (a Ready dependency): a gang counts
    only the others, these join it after admission."""

    @property
    def counted(self) -> tuple[Child, ...]:
        return tuple(c for c in self.children if c not in self.deferred)


@dataclass(frozen=True)
class Layout:
    groups: tuple[GroupLayout, ...]
    untargeted: tuple[str, ...]
    warnings: tuple[str, ...]
    errors: tuple[FieldError, ...]
    composites: tuple[CompositeLayout, ...] = ()
    """A multi-level runtime's tree, parents first (empty for a single level)."""


def policy_kind(settings: GroupSettings) -> Policy:
    sp = settings.scheduling_policy
    return "basic" if sp is not None and sp.basic is not None and sp.gang is None else "gang"


@dataclass(frozen=True)
class Settings:
    """The four group fields of one level, read leniently (validation reports what is off)."""

    policy: Policy
    topology_key: str | None
    disruption_mode: DisruptionModeName | None
    resource_claims: tuple[Claim, ...]


def resolve_settings(settings: GroupSettings) -> Settings:
    topology = settings.scheduling_constraints.topology if settings.scheduling_constraints else None
    dm = settings.disruption_mode
    disruption: DisruptionModeName | None = None
    if dm is not None:
        disruption = "all" if dm.all is not None else "single" if dm.single is not None else None
    return Settings(
        policy=policy_kind(settings),
        topology_key=topology[0].key if topology else None,
        disruption_mode=disruption,
        resource_claims=tuple(
            Claim(c.name or "", c.resource_claim_name, c.resource_claim_template_name)
            for c in settings.resource_claims or []
        ),
    )


def set_group_fields(settings: GroupSettings) -> list[str]:
    """The JSON names of the group fields an object sets."""
    return [json for json, attr in GROUP_SETTING_FIELDS if getattr(settings, attr) is not None]


@dataclass
class _Builder:
    runtime: Runtime
    rjs: dict[str, ReplicatedJob]
    order: Ordering
    index: dict[str, int]
    """Where each ReplicatedJob is in the template (as `rjs`, the last of a duplicated name)."""
    groups: list[GroupLayout] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[FieldError] = field(default_factory=list)
    templates: int = 0
    """Templates the runtime resolves to, counted before any is built: groups are made only
    while the count stays within MAX_TEMPLATES (a level-3 entry may ask for 2**31 of them)."""

    widest_job: tuple[int, str, int] = (0, "", 0)
    """The level-3 target with the most replicas: that count, its name and its entry's index,
    for the too-many message."""
    multi: bool = False  # a multi-level runtime: groups go into a tree of composites
    composites: list[CompositeLayout] = field(default_factory=list)
    at_root: int = 0
    """Children of a tree's root, counted like `templates` (including groups never built)."""

    def room(self, count: int, parent: str | None = None) -> bool:
        self.templates += max(count, 0)
        if parent == ROOT:
            self.at_root += max(count, 0)
        return self.templates <= (MAX_TREE_LEAVES if self.multi else MAX_TEMPLATES)

    @property
    def leaf_parent(self) -> str | None:
        """Where a group of an entry without a composite of its own goes."""
        return ROOT if self.multi else None

    def group(
        self,
        kind: GroupKind,
        targets: tuple[str, ...],
        settings: GroupSettings,
        named: Mapping[str, Path] | None = None,
        job_index: int | None = None,
        parent: str | None = None,
    ) -> None:
        """One group; `named` is where its entry names each target (None at level 1)."""
        resolved = resolve_settings(settings)
        deferred: tuple[str, ...] = ()
        if resolved.policy == "gang" and len(targets) > 1:
            members = self.order.of(targets)
            deferred = tuple(t for t in targets if self.order.ancestors(t) & members)
            for t in deferred:
                if self.order.complete_before(t) & members:
                    continue  # rejected as a deadlock instead (_reject_complete_inside)
                first = (self.order.ancestors(t) & members).first()
                self.warnings.append(
                    f'scheduling: "{t}" starts after "{first}": it joins its gang later, '
                    "outside minCount"
                )
        self.groups.append(
            GroupLayout(
                kind=kind,
                targets=targets,
                job_index=job_index,
                policy=resolved.policy,
                topology_key=resolved.topology_key,
                disruption_mode=resolved.disruption_mode,
                resource_claims=resolved.resource_claims,
                priority_class_name=self._consistent_priority_class(targets, named),
                deferred=deferred,
                parent=parent,
            )
        )

    def pod_field(self, name: str, field_name: str) -> Path:
        return pod_field(self.index[name], field_name)

    def _consistent_priority_class(
        self, targets: tuple[str, ...], named: Mapping[str, Path] | None
    ) -> str | None:
        """Pods of one PodGroup must share priority and preemption policy (KEP-5710; their
        scheduler is checked runtime-wide, `_one_scheduler`); returns their priority class,
        which the template copies. Each ReplicatedJob that differs from what most share
        (`_usual`) is named, as JobSet's webhook does: at its entry's target, or at level 1 its
        pod template's field."""
        specs = {t: self.rjs[t].pod_spec for t in targets}
        fields: dict[str, dict[str, str]] = {
            "priorityClassName": {t: s.priority_class_name or "" for t, s in specs.items()},
            "preemptionPolicy": {t: s.preemption_policy or "" for t, s in specs.items()},
        }
        for what, values in fields.items():
            usual = _usual(values)
            expected = _quoted(values[usual])
            for t, value in values.items():
                if value == values[usual]:
                    continue
                if named is None:
                    self.errors.append(
                        fe.invalid(
                            self.pod_field(t, what),
                            value,
                            f'must match {expected} of "{usual}": the whole TrainJob is one '
                            f"PodGroup, whose pods share one {what}; give them the same one or "
                            "group them with spec.scheduling.replicatedJobs entries",
                        )
                    )
                else:
                    self.errors.append(
                        fe.invalid(
                            named[t],
                            t,
                            f"its pods' {what} {_quoted(value)} must match {expected} of "
                            f'"{usual}": pods of one PodGroup share one {what}; give them the '
                            f'same one or put "{t}" in an entry of its own',
                        )
                    )
        return fields["priorityClassName"][targets[0]] or None


def pod_field(index: int, name: str) -> Path:
    """A field of the pod template of the ReplicatedJob at `index`."""
    return REPLICATED_JOBS.index(index).child("template", "spec", "template", "spec", name)


def _quoted(value: str) -> str:
    return f'"{value}"' if value else "(unset)"


def _names(names: list[str], more: int = 0) -> str:
    """Quoted names for a message; `more` says how many were left out of `names`."""
    text = ", ".join(f'"{n}"' for n in names)
    return f"{text} and {more} more" if more else text


SHOWN_NAMES = 5  # names a message lists before "and N more"


def _some(names: Names) -> str:
    return _names(names.sorted(SHOWN_NAMES), max(len(names) - SHOWN_NAMES, 0))


def resolve_layout(runtime: Runtime) -> Layout | None:
    """The groups of a runtime with `spec.scheduling`, or None when it has none."""
    scheduling = runtime.spec.scheduling
    if scheduling is None:
        return None
    rj_list = runtime.replicated_jobs
    rjs = {rj.name: rj for rj in rj_list}
    startup = runtime.spec.template.spec.startup_policy
    in_order = bool(startup and startup.startup_policy_order == IN_ORDER)
    edges = build_edges(rj_list, in_order)
    b = _Builder(runtime, rjs, ordering(edges), {rj.name: i for i, rj in enumerate(rj_list)})
    dependency_problems, has_cycle = dependency_errors(rj_list, edges, in_order)
    b.errors += dependency_problems
    if not rj_list:
        b.errors.append(
            fe.required(
                REPLICATED_JOBS,
                "spec.scheduling needs at least one ReplicatedJob in the template to schedule",
            )
        )

    untargeted: tuple[str, ...] = ()
    b.multi = is_multi_level(scheduling)
    if scheduling.replicated_jobs is None:
        _level_one(scheduling, rj_list, b)
    else:
        untargeted = _entries(scheduling, rj_list, b)

    entries = scheduling.replicated_jobs
    where = SCHEDULING.child("replicatedJobs") if entries is not None else SCHEDULING
    count = b.templates
    if b.multi:
        _tree(scheduling, b)
    elif count > MAX_TEMPLATES and len(entries or []) <= MAX_ENTRIES:
        b.errors.append(_templates_error(count, entries is None, b))
    b.errors += _one_scheduler(b)
    counts_valid = all(within_int32(rj.replica_count) for rj in rj_list)  # else said by validation
    if count == 0 and rj_list and counts_valid and not b.errors:
        b.errors.append(
            fe.invalid(
                where,
                "(no groups)",
                "spec.scheduling yields no PodGroup: its job entries target only ReplicatedJobs "
                "with replicas 0; target a ReplicatedJob that runs, or remove spec.scheduling",
            )
        )
    if not has_cycle:
        gangs = [
            (frozenset(g.targets), frozenset(g.counted)) for g in b.groups if g.policy == "gang"
        ]
        gangs += [
            (frozenset(c.targets), _counted_targets(c, b)) for c in b.composites
            if c.policy == "gang"
        ]  # fmt: skip
        b.errors += progress_errors(edges, gangs, where)
    return Layout(
        tuple(b.groups), untargeted, tuple(b.warnings), tuple(b.errors), tuple(b.composites)
    )


def _templates_error(count: int, split: bool, b: _Builder) -> FieldError:
    """More PodGroup templates than a Workload holds, said of the list that makes them."""
    if split:  # one gang per ReplicatedJob: the template's list is what is counted
        return fe.too_many(
            REPLICATED_JOBS,
            count,
            MAX_TEMPLATES,
            f"spec.scheduling splits into {count} gangs, one per ReplicatedJob (a Complete "
            "dependency), and a Workload holds at most 8: group them with "
            "spec.scheduling.replicatedJobs entries instead",
        )
    replicas, name, entry = b.widest_job
    if replicas > MAX_TEMPLATES:  # that job entry alone is too many
        return fe.too_many_in(
            SCHEDULING.child("replicatedJobs").index(entry).child("job"),
            replicas,
            "PodGroup templates",
            "a Workload",
            MAX_TEMPLATES,
            f'a job entry makes one per Job, and "{name}" has replicas {replicas}: lower its '
            "replicas, or remove job to make one group of its Jobs",
        )
    return fe.too_many_in(
        SCHEDULING.child("replicatedJobs"),
        count,
        "PodGroup templates",
        "a Workload",
        MAX_TEMPLATES,
        "these entries make one each, and a job entry one per Job "
        f'("{name}" has replicas {replicas}): merge entries or lower replicas',
    )


def _one_scheduler(b: _Builder) -> list[FieldError]:
    """One TrainJob's groups are made for one scheduler (its gang backend): each scheduled
    ReplicatedJob whose pods name another than most (`_usual`) is named at its pod template's
    schedulerName, the only place where that can be fixed."""
    schedulers = {t: b.rjs[t].scheduler for g in b.groups for t in g.targets}
    if not schedulers:
        return []
    usual = _usual(schedulers)
    expected = schedulers[usual]
    return [
        fe.invalid(
            b.pod_field(t, "schedulerName"),
            scheduler,
            f'must match "{expected}" of "{usual}": one TrainJob\'s groups are made for one '
            "scheduler (its gang backend), so the pods of every scheduled ReplicatedJob name "
            "the same schedulerName",
        )
        for t, scheduler in schedulers.items()
        if scheduler != expected
    ]


def _usual(values: Mapping[str, str]) -> str:
    """The first name whose value most of `values` share: those that differ from it are named,
    so one odd ReplicatedJob out is one error (with two, the second is the odd one, as in
    JobSet's webhook)."""
    most = Counter(values.values()).most_common(1)[0][0]  # the first seen, on a tie
    return next(name for name, value in values.items() if value == most)


def is_multi_level(scheduling: Scheduling) -> bool:
    """Levels combined: TrainJob-level fields beside replicatedJobs entries, or an entry with
    `job` that has fields of its own (a gang of its Jobs). Needs CompositePodGroup."""
    entries = scheduling.replicated_jobs
    if entries is None:
        return False
    return bool(set_group_fields(scheduling)) or any(
        e.job is not None and set_group_fields(e) for e in entries
    )


def _tree(scheduling: Scheduling, b: _Builder) -> None:
    """The root composite over every group and entry composite, each composite's counted and
    deferred children, and the API's limits on a tree (8 per list)."""
    entries_path = SCHEDULING.child("replicatedJobs")
    for composite in list(b.composites):  # the entry composites, made by _job_entry
        index = int(composite.key.removeprefix("entry-"))
        children: tuple[Child, ...] = tuple(
            i for i, g in enumerate(b.groups) if g.parent == composite.key
        )
        b.composites[b.composites.index(composite)] = _with_children(
            composite, children, entries_path.index(index), b
        )
    root_children: tuple[Child, ...] = (
        *(i for i, g in enumerate(b.groups) if g.parent == ROOT),
        *(c.key for c in b.composites),
    )
    if b.at_root > MAX_TEMPLATES:
        b.errors.append(
            fe.too_many_in(
                entries_path,
                b.at_root,
                "groups at the TrainJob level of this tree",
                "a composite",
                MAX_TEMPLATES,
                "it holds one per entry, and one per Job of a job entry without fields of its "
                "own: merge entries, or give a job entry fields of its own (a gang of its Jobs)",
            )
        )
    explicit = bool(set_group_fields(scheduling))
    resolved = resolve_settings(scheduling)
    if explicit and scheduling.resource_claims:
        b.errors.append(
            fe.forbidden(
                SCHEDULING.child("resourceClaims"),
                "the TrainJob level of a multi-level runtime is a CompositePodGroup, which holds "
                "no resource claims; move them to the entries' groups (or their job)",
            )
        )
    root = CompositeLayout(
        key=ROOT,
        kind=CompositeKind.TRAINJOB,
        targets=tuple(dict.fromkeys(t for g in b.groups for t in g.targets)),
        parent=None,
        policy=resolved.policy if explicit else "basic",
        topology_key=resolved.topology_key,
        disruption_mode=resolved.disruption_mode,
        priority_class_name=_shared({g.priority_class_name for g in b.groups}),
        children=(),
    )
    b.composites.insert(0, _with_children(root, root_children, SCHEDULING, b))


def _shared(values: set[str | None]) -> str | None:
    """The one value all groups share, if they do (a composite copies its pods' class)."""
    return next(iter(values)) if len(values) == 1 else None


def _with_children(
    composite: CompositeLayout, children: tuple[Child, ...], where: Path, b: _Builder
) -> CompositeLayout:
    """A composite with its children, those that join later, and the rule that a gang of
    groups never holds a group that can only start once another of them has finished."""
    members = {c: _child_targets(c, b) for c in children}
    deferred: list[Child] = []
    for child, all_targets in members.items():
        others = b.order.of(t for c, ts in members.items() if c != child for t in ts)
        # A child counts as admitted once its own gang is: only the pods that gang waits for
        # matter here (its late joiners may wait for a sibling; they join after it). A basic
        # child needs just one of its pods to start.
        targets, all_needed = _admitted_with(child, b)
        targets = targets or all_targets
        needed: Callable[[Iterable[object]], bool] = any if all_needed else all
        waits = [b.order.ancestors(t) & others for t in targets]
        if composite.policy != "gang" or not needed(waits):
            continue
        deferred.append(child)
        done = [b.order.complete_before(t) & others for t in targets]
        if needed(done):
            first = next(d for d in done if d).first()
            b.errors.append(
                fe.invalid(
                    where,
                    sorted(targets),
                    f'"{targets[0]}" starts only after "{first}" is Complete, so these groups '
                    "never run together and this gang of groups would wait forever; make it "
                    "schedulingPolicy basic (its topology still holds)",
                )
            )
        else:
            b.warnings.append(
                f'scheduling: the group of "{targets[0]}" starts after "{_first(waits)}": it '
                "joins its gang of groups later"
            )
    if children and len(deferred) == len(children):
        # Each child waits for another: nothing could be admitted first (the start-up rules
        # reject most such runtimes before this; never render a gang of no groups).
        b.errors.append(
            fe.invalid(
                where,
                sorted(t for ts in members.values() for t in ts),
                "every group of this gang of groups starts only after another of them, so it "
                "could never be admitted; make it schedulingPolicy basic (its topology still "
                "holds)",
            )
        )
    return CompositeLayout(
        key=composite.key,
        kind=composite.kind,
        targets=composite.targets or tuple(dict.fromkeys(t for ts in members.values() for t in ts)),
        parent=composite.parent,
        policy=composite.policy,
        topology_key=composite.topology_key,
        disruption_mode=composite.disruption_mode,
        priority_class_name=composite.priority_class_name,
        children=children,
        deferred=tuple(deferred),
    )


def _first(waits: list[Names]) -> str:
    return next(w for w in waits if w).first()


def _child_targets(child: Child, b: _Builder) -> tuple[str, ...]:
    if isinstance(child, int):
        return b.groups[child].targets
    return next(c.targets for c in b.composites if c.key == child)


def _admitted_with(child: Child, b: _Builder) -> tuple[tuple[str, ...], bool]:
    """The ReplicatedJobs whose pods `child` is admitted with, and whether it needs all of
    them (a gang) or any one (basic)."""
    if isinstance(child, int):
        group = b.groups[child]
        return group.counted, group.policy == "gang"
    nested = next(c for c in b.composites if c.key == child)
    counted = _counted_targets(nested, b)
    return tuple(t for t in nested.targets if t in counted), nested.policy == "gang"


def _counted_targets(composite: CompositeLayout, b: _Builder) -> frozenset[str]:
    """The ReplicatedJobs whose pods a gang of groups waits for: those its counted children
    wait for, down to the PodGroups."""
    found: set[str] = set()
    for child in composite.counted:
        if isinstance(child, int):
            found |= set(b.groups[child].counted)
        else:
            nested = next(c for c in b.composites if c.key == child)
            found |= _counted_targets(nested, b)
    return frozenset(found)


def _level_one(scheduling: GroupSettings, rj_list: list[ReplicatedJob], b: _Builder) -> None:
    names = tuple(rj.name for rj in rj_list)
    who = next((n for n in names if b.order.complete_before(n)), None)
    if policy_kind(scheduling) == "gang" and who is not None:
        waits = b.order.complete_before(who)
        b.warnings.append(
            f'scheduling: gang split per ReplicatedJob: "{who}" waits for "{waits.first()}" to '
            "Complete"
        )
        if scheduling.resource_claims:
            b.errors.append(
                fe.forbidden(
                    SCHEDULING.child("resourceClaims"),
                    f'"{who}" waits for {_some(waits)} to Complete, so this runtime gets one '
                    "gang per ReplicatedJob and a TrainJob-wide claim cannot be shared by "
                    "them; move the claims into spec.scheduling.replicatedJobs entries",
                )
            )
        if b.room(len(names)):
            for name in names:
                b.group(GroupKind.SPLIT, (name,), scheduling)
        return
    if names and b.room(1):
        b.group(GroupKind.TRAINJOB, names, scheduling)


def _entries(scheduling: Scheduling, rj_list: list[ReplicatedJob], b: _Builder) -> tuple[str, ...]:
    entries_path = SCHEDULING.child("replicatedJobs")
    entries = scheduling.replicated_jobs or []
    if not entries:
        b.errors.append(
            fe.required(
                entries_path,
                "replicatedJobs needs at least one entry; remove it to schedule the whole "
                "TrainJob as one group",
            )
        )
    if len(entries) > MAX_ENTRIES:
        b.errors.append(fe.too_many(entries_path, len(entries), MAX_ENTRIES))

    targeted: dict[str, int] = {}
    group_names: dict[str, int] = {}
    for i, entry in enumerate(entries):
        where = entries_path.index(i)
        tpath = where.child("targetReplicatedJobs")
        raw_targets = entry.target_replicated_jobs or []
        if not raw_targets:
            b.errors.append(
                fe.required(tpath, "name the ReplicatedJobs this entry schedules as one group")
            )
            continue
        if len(raw_targets) > MAX_TARGETS:
            b.errors.append(fe.too_many(tpath, len(raw_targets), MAX_TARGETS))
        targets: list[str] = []
        named: dict[str, Path] = {}  # where the entry names each of its targets
        for j, name in enumerate(raw_targets):
            if name in targets:
                b.errors.append(
                    fe.duplicate(tpath.index(j), name, "list each ReplicatedJob once per entry")
                )
            elif name not in b.rjs:
                known = ", ".join(rj.name for rj in rj_list[:10]) or "none"
                if len(rj_list) > 10:
                    known += f", and {len(rj_list) - 10} more"
                b.errors.append(
                    fe.invalid(
                        tpath.index(j),
                        name,
                        f"no ReplicatedJob of that name in spec.template (it has: {known}); "
                        "fix the name",
                    )
                )
            elif name in targeted:
                b.errors.append(
                    fe.duplicate(
                        tpath.index(j),
                        name,
                        "a ReplicatedJob must not be targeted by more than one replicatedJobs "
                        f"entry (entry {targeted[name]} already targets it); remove it from "
                        "one of them",
                    )
                )
            else:
                targeted[name] = i
                targets.append(name)
                named[name] = tpath.index(j)
        if entry.job is not None:
            _job_entry(entry, i, raw_targets, targets, b)
            continue
        group = "-".join(raw_targets)
        clean = len(targets) == len(raw_targets)  # else a target is wrong, and said above
        if clean and group in group_names:
            b.errors.append(
                fe.duplicate(
                    tpath,
                    raw_targets,
                    f"entry {group_names[group]} already yields the group name "
                    f'"{group}" (targets joined by "-"); rename a ReplicatedJob',
                )
            )
        elif clean:
            group_names[group] = i
        if not targets:
            continue
        if policy_kind(entry) == "gang":
            _reject_complete_inside(targets, tpath, b)
        if b.room(1, b.leaf_parent):
            b.group(GroupKind.REPLICATED_JOBS, tuple(targets), entry, named, parent=b.leaf_parent)

    return tuple(rj.name for rj in rj_list if rj.name not in targeted)


def _reject_complete_inside(targets: list[str], tpath: Path, b: _Builder) -> None:
    members = b.order.of(targets)
    for t in targets:
        waits = b.order.complete_before(t) & members
        if waits:
            b.errors.append(
                fe.invalid(
                    tpath,
                    targets,
                    f'"{t}" starts only after {_some(waits)} is Complete, so their pods never '
                    "run together and one gang would wait forever; give "
                    f"{_some(waits)} its own replicatedJobs entry (typically basic)",
                )
            )


def _job_entry(
    entry: ReplicatedJobEntry, i: int, raw: list[str], targets: list[str], b: _Builder
) -> None:
    where = SCHEDULING.child("replicatedJobs").index(i)
    own = set_group_fields(entry)  # a gang of its Jobs' groups (a composite)
    if own and entry.resource_claims:
        b.errors.append(
            fe.forbidden(
                where.child("resourceClaims"),
                "with job, this entry is a CompositePodGroup over its Jobs' groups, which holds "
                "no resource claims; move them under job",
            )
        )
    if len(raw) != 1:
        b.errors.append(
            fe.invalid(
                where.child("targetReplicatedJobs"),
                raw,
                "an entry with job must target exactly one ReplicatedJob; split it into one "
                "entry per ReplicatedJob",
            )
        )
        return
    if not targets:
        return
    assert entry.job is not None
    rj = b.rjs[targets[0]]
    if not within_int32(rj.replica_count):
        return  # validation says so: counting its Jobs here would say it twice
    if rj.replica_count == 0 and policy_kind(entry.job) == "gang":
        b.errors.append(
            fe.invalid(
                REPLICATED_JOBS.index(b.index[rj.name]).child("replicas"),
                0,
                f"must be at least 1: the job entry spec.scheduling.replicatedJobs[{i}] makes a "
                "gang of each Job, and a gang needs a pod to wait for; raise replicas or make "
                "that entry's job schedulingPolicy basic",
            )
        )
    b.widest_job = max(b.widest_job, (rj.replica_count, rj.name, i))
    parent = b.leaf_parent
    if own:
        parent = f"entry-{i}"
        if rj.replica_count > MAX_TEMPLATES:
            b.errors.append(
                fe.too_many_in(
                    where.child("job"),
                    rj.replica_count,
                    "Job groups",
                    "a composite",
                    MAX_TEMPLATES,
                    f'this entry is a gang of "{rj.name}"\'s Jobs, one group each: lower its '
                    "replicas",
                )
            )
        resolved = resolve_settings(entry)
        b.at_root += 1
        b.composites.append(
            CompositeLayout(
                key=parent,
                kind=CompositeKind.REPLICATED_JOB,
                targets=(rj.name,),
                parent=ROOT,
                policy=resolved.policy,
                topology_key=resolved.topology_key,
                disruption_mode=resolved.disruption_mode,
                priority_class_name=rj.pod_spec.priority_class_name or None,
                children=(),
            )
        )
    if b.room(rj.replica_count, parent):  # counted first: replicas may be 2**31 - 1
        for index in range(rj.replica_count):
            b.group(GroupKind.JOB, (rj.name,), entry.job, None, index, parent)

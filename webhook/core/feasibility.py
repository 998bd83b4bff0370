"""Could a TrainJob's gangs ever fit? Per gang, per domain of its topology key (pure: no I/O).

For each gang of a plan: the nodes its pods may use (`placement.py`), grouped by their value of
the gang's topology key (the whole cluster is the one domain of a gang without a key; nodes
without the label are left out), and in each domain how many of the gang's pods fit, whole
pods per node, summed over the domain's nodes, as if the cluster were empty. A gang that fits
in no domain can never be scheduled as configured. The pods counted are its minCount's (a
ReplicatedJob that joins later, like an MPI launcher, is not).

A gang whose pods differ (several ReplicatedJobs): packing different pods exactly is a
bin-packing problem, so a domain is ruled out only by conditions every placement must meet,
never by a guess:
1. each ReplicatedJob's counted pods alone fit in it (whole pods per node, on the nodes those
   pods may use), and
2. the gang's total request of each resource, and its pod count, are within what the domain's
   usable nodes have together.
A gang said not to fit cannot; one said to fit may still not (it then waits, as for capacity).
A domain's capacity is the gang's minCount scaled by the tightest of these ratios, rounded
down: exact for a gang of one pod shape, an upper bound for a mixed one.

A gang of gangs (a gang CompositePodGroup) is judged as one mixed gang of all the pods of its
counted leaves, in its own topology key, besides each leaf on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from fractions import Fraction
from typing import Literal

from . import resources
from .layout import GroupKind
from .nodes import NodeShape
from .placement import Exclusion, PodNeeds, Unjudged, needs_of
from .plan import CompositePlan, GroupPlan, Plan
from .podcounts import uses_num_nodes
from .trainer import Runtime, TrainJob

Reason = Literal["NoMatchingNodes", "NoTopologyLabel", "PodTooLarge", "DomainTooSmall"]
REASONS: tuple[Reason, ...] = (
    "NoMatchingNodes",
    "NoTopologyLabel",
    "PodTooLarge",
    "DomainTooSmall",
)
UNLABELLED = "unlabelled"


@dataclass(frozen=True)
class Part:
    """The counted pods of one ReplicatedJob in a gang."""

    replicated_job: str
    needs: PodNeeds
    count: int


@dataclass(frozen=True)
class Demand:
    """What a gang asks of one domain: its parts, and the label key of its domains."""

    parts: tuple[Part, ...]
    topology_key: str | None

    @property
    def pods(self) -> int:
        return sum(p.count for p in self.parts)


@dataclass(frozen=True)
class Gang:
    label: str  # how messages name it: its ReplicatedJobs
    demand: Demand
    groups: tuple[str, ...]
    """Its PodGroups (several: the alike Jobs of a level-3 entry), or its CompositePodGroup."""
    sized_by_num_nodes: bool = False  # a denial points at spec.trainer.numNodes


@dataclass(frozen=True)
class DomainFit:
    value: str | None  # the label value; None: the whole cluster
    nodes: int  # nodes in the domain
    usable: int  # of them, nodes some pod of the gang may use
    capacity: int  # pods of the gang the domain holds (see the module's docstring)
    ratio: Fraction = field(repr=False)
    binding: tuple[str, str] = ("", "")
    """What limits it: ("part", rj), ("resource", r) or ("pods", "")."""
    have: Decimal = Decimal(0)  # how much of the binding resource the usable nodes have
    part_pods: Mapping[str, int] = field(default_factory=dict, compare=False)
    """Per ReplicatedJob: how many of its pods the domain holds alone."""
    part_has: Mapping[tuple[str, str], Decimal] = field(default_factory=dict, compare=False)
    """Per (ReplicatedJob, resource): what the nodes its pods may use have together (kept for
    the best domain only: its message needs them)."""


@dataclass(frozen=True)
class Fit:
    """The judgement of one demand against the nodes."""

    fits: bool
    reason: Reason | None
    nodes: int  # every node of the summary
    domains: tuple[DomainFit, ...]  # best first
    left_out: Mapping[str, int]  # nodes no pod of the gang may use, by why (and unlabelled)
    detail: str = ""  # for a reason: the sentence after the gang's name

    @property
    def best(self) -> DomainFit | None:
        return self.domains[0] if self.domains else None

    def headroom(self, demand: Demand) -> int:
        """Pods the largest domain holds beyond the gang (negative: it can never fit)."""
        best = self.best
        return (best.capacity if best else 0) - demand.pods


Verdict = tuple[Exclusion | None, int]  # (why a pod is kept off a shape, pods per node)


class Nodes:
    """What judging reads: the node shapes with their counts, the label keys shapes drop, and
    (optionally) memos: each pod's verdict per shape (shapes are values that never change, so
    a verdict holds for as long as the dropped keys do, across node changes and reviews), and
    tallies per node version."""

    def __init__(
        self,
        shapes: Mapping[NodeShape, int],
        dropped_keys: frozenset[str] | None,
        memo: dict[PodNeeds, dict[NodeShape, Verdict]] | None = None,
        tallies: dict[tuple[tuple[PodNeeds, ...], str | None], Tally] | None = None,
    ) -> None:
        self.shapes = shapes
        self.dropped_keys = dropped_keys
        self.memo = memo
        self.tallies = tallies
        """Tallies of these very shapes and counts (the owner clears them when a node changes)."""

    def tally(self, needs: Sequence[PodNeeds], key: str | None) -> Tally:
        if self.tallies is None:
            return tally(needs, key, self)
        memo_key = (tuple(needs), key)
        found = self.tallies.get(memo_key)
        if found is None:
            found = self.tallies[memo_key] = tally(needs, key, self)
        return found

    def verdicts(self, needs: PodNeeds) -> Callable[[NodeShape], Verdict]:
        """`shape -> (why excluded, pods per node)` for one pod, memoised when there is a memo."""
        dropped = self.dropped_keys

        def verdict(shape: NodeShape) -> Verdict:
            why = needs.excluded(shape, dropped)
            return why, (needs.per_node(shape) if why is None else 0)

        if self.memo is None:
            return verdict
        known = self.memo.setdefault(needs, {})

        def remembered(shape: NodeShape) -> Verdict:
            found = known.get(shape)
            if found is None:
                found = known[shape] = verdict(shape)
            return found

        return remembered


# --- the gangs of a plan -----------------------------------------------------------------------


def gangs_of(
    plan: Plan, runtime: Runtime, trainjob: TrainJob, *, topology: bool = True
) -> tuple[list[Gang], list[str]]:
    """The gangs of a plan to judge, and notes on those that cannot be judged. With
    `topology=False` (a backend whose domains are not node labels) every gang is judged over
    the whole cluster."""
    rjs = {rj.name: rj for rj in runtime.replicated_jobs}
    needs: dict[str, PodNeeds | str] = {}

    def needs_for(name: str) -> PodNeeds | str:
        if name not in needs:
            rj = rjs[name]
            requests = resources.replicated_job_requests(runtime, trainjob, rj)
            try:
                needs[name] = needs_of(requests, rj.pod_spec.dump(), trainjob.pod_patches(name))
            except Unjudged as why:
                needs[name] = f"its {name} pods: {why}"
        return needs[name]

    gangs: list[Gang] = []
    notes: list[str] = []
    jobs: dict[tuple[Demand, str], int] = {}  # a level-3 entry (its demand, target): its gang
    counts: dict[int, int] = {}  # that gang: how many Jobs it stands for
    leaves: dict[str, tuple[Part, ...]] = {}
    for group in plan.groups:
        if group.policy != "gang":
            continue
        parts: list[Part] = []
        for name, count in group.counted:
            if count <= 0:
                continue
            found = needs_for(name)
            if isinstance(found, str):
                notes.append(f"gang {_label(group)} is not judged: {found}")
                break
            parts.append(Part(name, found, count))
        else:
            if not parts:
                continue
            demand = Demand(tuple(parts), group.topology_key if topology else None)
            leaves[group.template_name] = demand.parts
            same_entry = (demand, group.replicated_jobs[0])
            if group.kind is GroupKind.JOB and same_entry in jobs:
                index = jobs[same_entry]  # its Jobs are alike: judged (and told) once
                counts[index] += 1
                first = gangs[index]
                groups = (*first.groups, group.pod_group_name)
                gangs[index] = Gang(first.label, demand, groups, first.sized_by_num_nodes)
                continue
            if group.kind is GroupKind.JOB:
                jobs[same_entry], counts[len(gangs)] = len(gangs), 1
            sized = any(uses_num_nodes(runtime, rjs[p.replicated_job]) for p in parts)
            gangs.append(Gang(_label(group), demand, (group.pod_group_name,), sized))
    for index, count in counts.items():
        if count > 1:
            gang = gangs[index]
            name = gang.label.split(" Job ")[0]
            label = f"{name} (each of {count} Jobs)"
            gangs[index] = Gang(label, gang.demand, gang.groups, gang.sized_by_num_nodes)
    for composite in plan.composites:
        whole = _composite_gang(composite, plan, leaves, topology)
        if whole is not None:
            gangs.append(whole)
    return gangs, notes


def _label(group: GroupPlan) -> str:
    jobs = "+".join(group.replicated_jobs)
    return f"{jobs} Job {group.job_index}" if group.job_index is not None else jobs


def _composite_gang(
    composite: CompositePlan, plan: Plan, leaves: Mapping[str, tuple[Part, ...]], topology: bool
) -> Gang | None:
    """All the counted pods under a gang composite, as one mixed gang (None when a leaf under
    it is not judged, or it holds one leaf: that leaf says it all)."""
    below = {c.template_name: c for c in plan.composites}
    merged: dict[tuple[str, PodNeeds], int] = {}
    count = 0

    def walk(names: Iterable[str], later: Sequence[str]) -> bool:
        nonlocal count
        for name in names:
            if name in later:
                continue
            if name in below:
                child = below[name]
                if not walk(child.children, child.joins_later):
                    return False
            elif name in leaves:
                count += 1
                for part in leaves[name]:
                    merged[(part.replicated_job, part.needs)] = (
                        merged.get((part.replicated_job, part.needs), 0) + part.count
                    )
            else:
                return False  # a basic or unjudged group: the composite is not judged
        return True

    if composite.policy != "gang" or not walk(composite.children, composite.joins_later):
        return None
    if count < 2:
        return None
    parts = tuple(Part(rj, needs, n) for (rj, needs), n in merged.items())
    label = f"{'+'.join(composite.replicated_jobs)} ({count} gangs together)"
    key = composite.topology_key if topology else None
    return Gang(label, Demand(parts, key), (composite.name,))


# --- judging ------------------------------------------------------------------------------------


@dataclass
class _Domain:
    parts: int
    nodes: int = 0
    usable: int = 0
    slots: int = 0  # pods allocatable of the usable nodes
    fit: list[int] = field(default_factory=list)
    members: dict[NodeShape, tuple[int, tuple[bool, ...]]] = field(default_factory=dict)
    """Its usable shapes: their node counts, and which parts each may take."""
    has: dict[str, Decimal] = field(default_factory=dict)  # (a mixed gang's) resource sums

    def __post_init__(self) -> None:
        self.fit = [0] * self.parts


@dataclass
class Tally:
    """What the nodes offer some pods in each domain of a key: everything but the gang's pod
    counts, so one tally serves every size of a gang, and a node event updates it in place
    (`add` of the shape it left with -1, of the shape it has now with +1)."""

    needs: tuple[PodNeeds, ...]
    key: str | None
    resources: frozenset[str]  # summed per domain when the pods differ
    total_nodes: int = 0
    domains: dict[str | None, _Domain] = field(default_factory=dict)
    left: dict[str, int] = field(default_factory=dict)
    part_left: list[dict[Exclusion, int]] = field(default_factory=list)
    usable_anywhere: list[int] = field(default_factory=list)
    usable_labelled: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.part_left = [{} for _ in self.needs]
        self.usable_anywhere = [0] * len(self.needs)
        self.usable_labelled = [0] * len(self.needs)

    def add(self, shape: NodeShape, count: int, verdicts: Sequence[Verdict]) -> None:
        """`count` nodes of `shape` more (fewer, when negative)."""
        self.total_nodes += count
        for i, (why, _) in enumerate(verdicts):
            if why is not None:
                self.part_left[i][why] = self.part_left[i].get(why, 0) + count
            else:
                self.usable_anywhere[i] += count
        key = self.key
        value = shape.label(key) if key else None
        takes = tuple(why is None for why, _ in verdicts)
        if key and value is None:  # no domain: left out, first for why its pods would not go
            out = UNLABELLED if any(takes) else next(w for w, _ in verdicts if w is not None)
            _count(self.left, out, count)
            return
        domain = self.domains.get(value)
        if domain is None:
            domain = self.domains[value] = _Domain(len(self.needs))
        domain.nodes += count
        if not any(takes):
            _count(self.left, next(w for w, _ in verdicts if w is not None), count)
        else:
            domain.usable += count
            domain.slots += count * int(shape.has("pods"))
            held = domain.members.get(shape, (0, takes))[0] + count
            if held:
                domain.members[shape] = (held, takes)
            else:
                del domain.members[shape]
            for i, (why, per_node) in enumerate(verdicts):
                if why is None:
                    self.usable_labelled[i] += count
                    domain.fit[i] += count * per_node
            for resource in self.resources:
                had = domain.has.get(resource, Decimal(0))
                domain.has[resource] = had + count * shape.has(resource)
        if not domain.nodes:
            del self.domains[value]


def _count(counts: dict[str, int], what: str, count: int) -> None:
    counts[what] = counts.get(what, 0) + count
    if not counts[what]:
        del counts[what]


def tally(needs: Sequence[PodNeeds], key: str | None, nodes: Nodes) -> Tally:
    """Reads each node shape once."""
    verdicts_of = [nodes.verdicts(n) for n in needs]
    mixed = len(needs) > 1  # only then do the sums bound the ratio
    resources = frozenset(r for n in needs for r, _ in n.requests) if mixed else frozenset()
    found = Tally(tuple(needs), key, resources)
    for shape, count in nodes.shapes.items():
        found.add(shape, count, [of(shape) for of in verdicts_of])
    return found


def judge(demand: Demand, nodes: Nodes) -> Fit:
    parts = demand.parts
    found = nodes.tally([p.needs for p in parts], demand.topology_key)
    wanted = _total_requests(parts)
    domains = found.domains
    fits = sorted(
        (_domain_fit(value, d, demand, wanted) for value, d in domains.items()),
        key=lambda f: (-f.ratio, -f.usable, f.value or ""),
    )
    if fits and fits[0].value in domains:  # what the best domain has, for the message
        fits[0] = _with_part_has(fits[0], domains[fits[0].value], parts)
    reason, detail = _reason(
        demand, fits, domains, found.part_left, found.usable_anywhere, found.usable_labelled
    )
    if reason == "PodTooLarge":
        detail = _too_large(demand, domains)
    left = {why: n for why, n in found.left.items() if n}
    return Fit(reason is None, reason, found.total_nodes, tuple(fits), left, detail)


def _sums(domain: _Domain, resources: Iterable[str], part: int) -> dict[str, Decimal]:
    """What the nodes of a domain that part `part` may use have of each resource."""
    out: dict[str, Decimal] = {}
    for resource in resources:
        total = Decimal(0)
        for shape, (count, takes) in domain.members.items():
            if takes[part]:
                total += count * shape.has(resource)
        out[resource] = total
    return out


def _with_part_has(fit: DomainFit, domain: _Domain, parts: Sequence[Part]) -> DomainFit:
    part_has = {
        (p.replicated_job, r): amount
        for i, p in enumerate(parts)
        for r, amount in _sums(domain, (r for r, _ in p.needs.requests), i).items()
    }
    return replace(fit, part_has=part_has)


def _total_requests(parts: Sequence[Part]) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for part in parts:
        for resource, amount in part.needs.requests:
            total[resource] = total.get(resource, Decimal(0)) + amount * part.count
    return total


def _domain_fit(
    value: str | None, d: _Domain, demand: Demand, wanted: Mapping[str, Decimal]
) -> DomainFit:
    parts = demand.parts
    terms: list[tuple[Fraction, tuple[str, str], Decimal]] = [
        (Fraction(d.fit[i], p.count), ("part", p.replicated_job), Decimal(d.fit[i]))
        for i, p in enumerate(parts)
    ]
    if len(parts) > 1:  # one shape: its whole-pod count already bounds these
        terms += [
            (
                Fraction(d.has.get(r, Decimal(0))) / Fraction(need),
                ("resource", r),
                d.has.get(r, Decimal(0)),
            )
            for r, need in wanted.items()
        ]
        terms.append((Fraction(d.slots, demand.pods), ("pods", ""), Decimal(d.slots)))
    ratio, binding, have = min(terms, key=lambda t: t[0])
    capacity = int(ratio * demand.pods)
    part_pods = {p.replicated_job: d.fit[i] for i, p in enumerate(parts)}
    return DomainFit(value, d.nodes, d.usable, capacity, ratio, binding, have, part_pods)


def _reason(
    demand: Demand,
    fits: Sequence[DomainFit],
    domains: Mapping[str | None, _Domain],
    part_left: Sequence[Mapping[Exclusion, int]],
    usable_anywhere: Sequence[int],
    usable_labelled: Sequence[int],
) -> tuple[Reason | None, str]:
    key = demand.topology_key
    for i, part in enumerate(demand.parts):
        whose = _whose(demand, part)
        if usable_anywhere[i] == 0:
            return "NoMatchingNodes", f"no node takes {whose} ({_left_out(part_left[i])})"
        if key and usable_labelled[i] == 0:
            n = usable_anywhere[i]
            return "NoTopologyLabel", (f"none of the {n} nodes {whose} may use has the label {key}")
        if all(d.fit[i] == 0 for d in domains.values()):
            return "PodTooLarge", ""
    best = fits[0] if fits else None
    if best is None or best.ratio >= 1:
        return None, ""
    return "DomainTooSmall", ""


def _whose(demand: Demand, part: Part) -> str:
    return "its pods" if len(demand.parts) == 1 else f"its {part.replicated_job} pods"


def _left_out(counts: Mapping[Exclusion, int]) -> str:
    words: dict[Exclusion, str] = {
        "cordoned": "cordoned",
        "tainted": "with taints they do not tolerate",
        "unselected": "outside their nodeSelector/affinity",
    }
    shown = [f"{counts[k]} {w}" for k, w in words.items() if counts.get(k)]
    return ", ".join(shown) or "no nodes"


def _too_large(demand: Demand, domains: Mapping[str | None, _Domain]) -> str:
    for i, part in enumerate(demand.parts):
        for resource, amount in part.needs.requests:
            most = max(
                (
                    shape.has(resource)
                    for d in domains.values()
                    for shape, (_, takes) in d.members.items()
                    if takes[i]
                ),
                default=Decimal(0),
            )
            if most < amount:
                return (
                    f"no node has room for one of {_whose(demand, part)}: each needs "
                    f"{amount_text(resource, amount)} {resource}, no node has more than "
                    f"{amount_text(resource, most)}"
                )
    part = demand.parts[0]
    return f"no node has room for one of {_whose(demand, part)} ({requests_text(part.needs)} each)"


# --- words --------------------------------------------------------------------------------------


def message(gang: Gang, fit: Fit) -> str:
    """One sentence: why the gang can never fit (empty when it fits)."""
    demand = gang.demand
    head = f"gang {gang.label} of {demand.pods} pods"
    if fit.reason is None:
        return ""
    if fit.reason != "DomainTooSmall":
        return f"{head}: {fit.detail}"
    best = fit.best
    assert best is not None
    key = demand.topology_key
    where = f"in one {key}" if key else "in the cluster"
    noun = key.rsplit("/", 1)[-1] if key else ""
    place = f"the largest {noun}" if key else "the cluster"
    nodes = _nodes_text(best)
    inside = f"({best.value}, {nodes})" if key else f"({nodes})"
    kind, what = best.binding
    if kind == "part":
        part = next(p for p in demand.parts if p.replicated_job == what)
        mixed = len(demand.parts) > 1
        who = f"gang {gang.label}: its {part.count} {what} pods" if mixed else head
        short = _short_resource(part, best)
        if short is not None:
            resource, amount, have = short
            return (
                f"{who} need{'' if mixed else 's'} {amount_text(resource, amount)} {resource} "
                f"{where}; {place} has {amount_text(resource, have)} {inside}"
            )
        held = best.part_pods.get(what, 0)
        return (
            f"{who} {'do' if mixed else 'does'} not fit {where}: {place} holds {held} of them "
            f"{inside[:-1]}; {requests_text(part.needs)} each)"
        )
    if kind == "resource":
        need = _total_requests(demand.parts)[what]
        return (
            f"{head} needs {amount_text(what, need)} {what} {where}; {place} has "
            f"{amount_text(what, best.have)} {inside}"
        )
    return (
        f"{head} needs room for {demand.pods} pods {where}; {place} has {int(best.have)} {inside}"
    )


def _nodes_text(best: DomainFit) -> str:
    return f"{best.usable} nodes" if best.usable == best.nodes else f"{best.usable} usable nodes"


def _short_resource(part: Part, best: DomainFit) -> tuple[str, Decimal, Decimal] | None:
    """The resource whose total in the best domain falls furthest short of the part's need,
    if one does (otherwise whole-pod packing, or the pods limit, keeps the gang out)."""
    found: tuple[Fraction, str, Decimal, Decimal] | None = None
    for resource, amount in part.needs.requests:
        need = amount * part.count
        have = best.part_has.get((part.replicated_job, resource), Decimal(0))
        if have >= need:
            continue
        ratio = Fraction(have) / Fraction(need)
        if found is None or ratio < found[0]:
            found = (ratio, resource, need, have)
    return None if found is None else found[1:]


BINARY = (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
BYTES = ("memory", "ephemeral-storage")


def amount_text(resource: str, value: Decimal) -> str:
    """A quantity as people read it: memory in Ki/Mi/Gi/Ti when exact, cpu in cores or m."""
    if resource in BYTES or resource.startswith("hugepages-"):
        for suffix, size in BINARY:
            if value >= size and value % size == 0:
                return f"{int(value // size)}{suffix}"
    return resources.text(value)


def requests_text(needs: PodNeeds, most: int = 3) -> str:
    """A pod's main requests: extended resources first, then cpu and memory."""
    ordered = sorted(needs.requests, key=lambda r: ("/" not in r[0], r[0] != "cpu", r[0]))
    shown = [f"{amount_text(r, v)} {r}" for r, v in ordered[:most]]
    return ", ".join(shown) or "no requests"

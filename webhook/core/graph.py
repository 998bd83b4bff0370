"""Start-up ordering between ReplicatedJobs: who waits for whom, and for what.

JobSet creates a ReplicatedJob's Jobs only after each `dependsOn` prerequisite is `Ready` (its pods
run) or `Complete` (its pods are gone). `startupPolicyOrder: InOrder` counts as a `Ready` chain in
list order. The planner needs two answers from this graph (was-api.md rule 8(c)):

* which ReplicatedJobs must exist before a given one can (its ancestors), and
* which of them must already be Complete, so can never run at the same time as it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .trainer import ReplicatedJob

READY = "Ready"
COMPLETE = "Complete"
IN_ORDER = "InOrder"


@dataclass(frozen=True)
class Edge:
    prerequisite: str
    status: str


def build_edges(replicated_jobs: list[ReplicatedJob], in_order: bool) -> dict[str, list[Edge]]:
    """Each ReplicatedJob's direct prerequisites; names that do not exist are left out."""
    names = {rj.name for rj in replicated_jobs}
    edges: dict[str, list[Edge]] = {rj.name: [] for rj in replicated_jobs}
    for i, rj in enumerate(replicated_jobs):
        for dep in rj.depends_on or []:
            if dep.name in names and dep.name != rj.name:
                edges[rj.name].append(Edge(dep.name, dep.status))
        if in_order and i > 0:
            edges[rj.name].append(Edge(replicated_jobs[i - 1].name, READY))
    return edges


def find_cycle(edges: Mapping[str, list[Edge]]) -> list[str] | None:
    """A dependency cycle as a list of names (first == last), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    for start in edges:
        if state.get(start):
            continue
        stack: list[tuple[str, int]] = [(start, 0)]
        path: list[str] = []
        while stack:
            node, i = stack.pop()
            if i == 0:
                state[node] = 1
                path.append(node)
            nexts = edges.get(node, [])
            if i < len(nexts):
                stack.append((node, i + 1))
                nxt = nexts[i].prerequisite
                if state.get(nxt) == 1:
                    return [*path[path.index(nxt) :], nxt]
                if not state.get(nxt):
                    stack.append((nxt, 0))
            else:
                state[node] = 2
                path.pop()
    return None


class Names:
    """A set of ReplicatedJob names of one `Ordering`, held as bits (bit i: the i-th name in
    sorted order), so that closing a long dependsOn chain stays cheap and the alphabetically
    first member is the lowest bit."""

    __slots__ = ("_bits", "_order")

    def __init__(self, order: Ordering, bits: int) -> None:
        self._order = order
        self._bits = bits

    def __bool__(self) -> bool:
        return self._bits != 0

    def __len__(self) -> int:
        return self._bits.bit_count()

    def __and__(self, other: Names) -> Names:
        return Names(self._order, self._bits & other._bits)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Names) and other._bits == self._bits

    def __hash__(self) -> int:
        return hash(self._bits)

    def first(self) -> str:
        """The alphabetically first name (the set must not be empty)."""
        return self._order.names[(self._bits & -self._bits).bit_length() - 1]

    def sorted(self, limit: int | None = None) -> list[str]:
        """The names in order, the first `limit` of them when given."""
        out: list[str] = []
        bits = self._bits
        while bits and (limit is None or len(out) < limit):
            low = bits & -bits
            out.append(self._order.names[low.bit_length() - 1])
            bits ^= low
        return out


@dataclass(frozen=True)
class Ordering:
    """Transitive start-up constraints of each ReplicatedJob."""

    names: tuple[str, ...]
    """Every ReplicatedJob, sorted: bit i of a `Names` stands for names[i]."""
    _bit: Mapping[str, int]
    _ancestors: Mapping[str, int]
    _complete: Mapping[str, int]

    def of(self, names: Iterable[str]) -> Names:
        bits = 0
        for name in names:
            bits |= self._bit.get(name, 0)
        return Names(self, bits)

    def ancestors(self, name: str) -> Names:
        """Everything that must be Ready or Complete before this ReplicatedJob's pods exist."""
        return Names(self, self._ancestors.get(name, 0))

    def complete_before(self, name: str) -> Names:
        """The subset that must be Complete: its pods are gone before this one's exist."""
        return Names(self, self._complete.get(name, 0))


def ordering(edges: Mapping[str, list[Edge]]) -> Ordering:
    """Closes the graph transitively. A cycle is tolerated (validation reports it): its members
    simply become each other's ancestors.

    Each strongly connected component is closed once, prerequisites first (Tarjan's order), as
    a union of bit sets: O((N + E) * N / 64) for N ReplicatedJobs and E edges.
    """
    names = tuple(sorted(edges))
    bit = {name: 1 << i for i, name in enumerate(names)}
    reach: dict[str, int] = {}  # everything reachable through at least one edge
    done: dict[str, int] = {}  # every target of a Complete edge reachable from the node
    for component in _components(edges):
        members = set(component)
        closed = 0
        complete = 0
        for node in component:
            for edge in edges.get(node, []):
                target = edge.prerequisite
                if edge.status == COMPLETE:
                    complete |= bit[target]
                if target in members:
                    closed |= bit[target]
                else:
                    closed |= bit[target] | reach[target]
                    complete |= done[target]
        for node in component:
            reach[node], done[node] = closed, complete
    return Ordering(
        names,
        bit,
        {n: reach[n] & ~bit[n] for n in names},
        {n: done[n] & ~bit[n] for n in names},
    )


def _components(edges: Mapping[str, list[Edge]]) -> list[list[str]]:
    """Strongly connected components, each after those it has edges into (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work: list[tuple[str, int]] = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            nexts = edges.get(node, [])
            if i < len(nexts):
                work.append((node, i + 1))
                target = nexts[i].prerequisite
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return out


def never_started(
    edges: Mapping[str, list[Edge]], gangs: list[tuple[frozenset[str], frozenset[str]]]
) -> frozenset[str]:
    """ReplicatedJobs that could never start, found by playing JobSet and the gangs forward.

    A ReplicatedJob's pods are created once every prerequisite runs; a gang (members, counted)
    is admitted once the pods of all its counted members exist; a member of a gang runs only once
    its gang is admitted. Whatever is not running when nothing changes any more waits forever:
    gangs that wait on each other through dependsOn, or a dependency cycle.

    A work list: each ReplicatedJob is created and started at most once, and looked at again
    only when one of its prerequisites or gangs moved on, so the cost is linear in the graph.
    """
    prerequisites = {n: {e.prerequisite for e in deps} for n, deps in edges.items()}
    dependents: dict[str, list[str]] = {n: [] for n in edges}
    for name, before in prerequisites.items():
        for prerequisite in before:
            dependents.setdefault(prerequisite, []).append(name)
    unmet = {n: len(before) for n, before in prerequisites.items()}
    gangs_of: dict[str, list[int]] = {}
    counted_in: dict[str, list[int]] = {}
    missing: list[int] = []  # counted members of each gang whose pods do not exist yet
    for g, (members, counted) in enumerate(gangs):
        missing.append(len(counted))
        for name in members:
            gangs_of.setdefault(name, []).append(g)
        for name in counted:
            counted_in.setdefault(name, []).append(g)
    created: set[str] = set()
    running: set[str] = set()
    work: list[tuple[bool, str]] = [(True, n) for n, count in unmet.items() if count == 0]
    while work:
        create, name = work.pop()
        if create:
            if name in created:
                continue
            created.add(name)
            for g in counted_in.get(name, []):
                missing[g] -= 1
                if missing[g] == 0:
                    work += [(False, member) for member in gangs[g][0]]
            work.append((False, name))
        elif (
            name in created
            and name not in running
            and all(missing[g] == 0 for g in gangs_of.get(name, []))
        ):
            running.add(name)
            for dependent in dependents.get(name, []):
                unmet[dependent] -= 1
                if unmet[dependent] == 0:
                    work.append((True, dependent))
    return frozenset(edges.keys() - running)

"""Start-up ordering between ReplicatedJobs: who waits for whom, and for what.

JobSet creates a ReplicatedJob's Jobs only after each `dependsOn` prerequisite is `Ready` (its pods
run) or `Complete` (its pods are gone). `startupPolicyOrder: InOrder` counts as a `Ready` chain in
list order. The planner needs two answers from this graph (was-api.md rule 8(c)):

* which ReplicatedJobs must exist before a given one can (its ancestors), and
* which of them must already be Complete, so can never run at the same time as it.
"""

from __future__ import annotations

from collections.abc import Mapping
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


@dataclass(frozen=True)
class Ordering:
    """Transitive start-up constraints of each ReplicatedJob."""

    ancestors: Mapping[str, frozenset[str]]
    """Everything that must be Ready or Complete before this ReplicatedJob's pods exist."""
    complete_before: Mapping[str, frozenset[str]]
    """The subset that must be Complete: its pods are gone before this one's exist."""


def ordering(edges: Mapping[str, list[Edge]]) -> Ordering:
    """Closes the graph transitively. A cycle is tolerated (validation reports it): its members
    simply become each other's ancestors."""
    ancestors: dict[str, set[str]] = {}
    complete: dict[str, set[str]] = {}
    for start in edges:
        anc: set[str] = set()
        done: set[str] = set()
        # Walk every path from `start`; a prerequisite reached after a Complete edge into it
        # is complete before `start`, whatever the edges above it were.
        todo = [start]
        seen = {start}
        while todo:
            node = todo.pop()
            for edge in edges.get(node, []):
                anc.add(edge.prerequisite)
                if edge.status == COMPLETE:
                    done.add(edge.prerequisite)
                if edge.prerequisite not in seen:
                    seen.add(edge.prerequisite)
                    todo.append(edge.prerequisite)
        anc.discard(start)
        done.discard(start)
        ancestors[start] = anc
        complete[start] = done
    return Ordering(
        ancestors={k: frozenset(v) for k, v in ancestors.items()},
        complete_before={k: frozenset(v) for k, v in complete.items()},
    )


def never_started(
    edges: Mapping[str, list[Edge]], gangs: list[tuple[frozenset[str], frozenset[str]]]
) -> frozenset[str]:
    """ReplicatedJobs that could never start, found by playing JobSet and the gangs forward.

    A ReplicatedJob's pods are created once every prerequisite runs; a gang (members, counted)
    is admitted once the pods of all its counted members exist; a member of a gang runs only once
    its gang is admitted. Whatever is not running when nothing changes any more waits forever:
    gangs that wait on each other through dependsOn, or a dependency cycle.
    """
    gangs_of: dict[str, list[frozenset[str]]] = {name: [] for name in edges}
    for members, counted in gangs:
        for name in members:
            gangs_of.setdefault(name, []).append(counted)
    running: set[str] = set()
    changed = True
    while changed:
        changed = False
        created = {n for n, deps in edges.items() if all(e.prerequisite in running for e in deps)}
        for name in created - running:
            if all(counted <= created for counted in gangs_of.get(name, [])):
                running.add(name)
                changed = True
    return frozenset(edges.keys() - running)

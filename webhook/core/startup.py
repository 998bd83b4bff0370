"""Start-up rules between ReplicatedJobs as field errors: broken dependsOn entries, cycles, and
gangs that would wait on each other forever (was-api.md rule 8(c))."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from . import errors as fe
from .errors import FieldError, Path
from .graph import COMPLETE, READY, Edge, find_cycle, never_started
from .trainer import ReplicatedJob

REPLICATED_JOBS = Path("spec", "template", "spec", "replicatedJobs")


def dependency_errors(
    rj_list: list[ReplicatedJob], edges: Mapping[str, list[Edge]], in_order: bool
) -> tuple[list[FieldError], bool]:
    """Broken dependsOn entries, and whether the start-up order has a cycle."""
    errors: list[FieldError] = []
    names = {rj.name for rj in rj_list}
    for i, rj in enumerate(rj_list):
        for j, dep in enumerate(rj.depends_on or []):
            where = REPLICATED_JOBS.index(i).child("dependsOn").index(j)
            if dep.status not in (READY, COMPLETE):
                errors.append(
                    fe.not_supported(where.child("status"), dep.status, [READY, COMPLETE])
                )
            if dep.name not in names:
                errors.append(
                    fe.not_found(
                        where.child("name"),
                        dep.name,
                        "dependsOn must name a ReplicatedJob of this template",
                    )
                )
            elif dep.name == rj.name:
                errors.append(
                    fe.invalid(
                        where.child("name"),
                        dep.name,
                        "a ReplicatedJob cannot depend on itself; remove this dependsOn entry",
                    )
                )
    cycle = find_cycle(edges)
    if cycle:
        i = next(k for k, rj in enumerate(rj_list) if rj.name == cycle[0])
        hint = " (InOrder startup also makes each wait for the one before it)" if in_order else ""
        errors.append(
            fe.invalid(
                REPLICATED_JOBS.index(i).child("dependsOn"),
                cycle,
                "dependsOn forms a cycle, so none of these Jobs could ever start; remove one "
                f"edge{hint}",
            )
        )
    return errors, bool(cycle)


def progress_errors(
    edges: Mapping[str, list[Edge]],
    gangs: Sequence[tuple[frozenset[str], frozenset[str]]],
    where: Path,
) -> list[FieldError]:
    """Gangs (members, counted members) that wait on each other would hold their pods forever."""
    stuck = never_started(edges, list(gangs))
    if not stuck:
        return []
    return [
        fe.invalid(
            where,
            sorted(stuck),
            "these ReplicatedJobs could never start: each waits, through dependsOn, for a "
            "gang that itself waits for one of them; put them in one replicatedJobs entry "
            "or remove a dependsOn",
        )
    ]

"""Requests the API server refuses without an equal limit, said as warnings (pure: no I/O).

A container may request less cpu or memory than its limit, but not less of an extended resource
(a name with a domain outside kubernetes.io, such as `nvidia.com/gpu`) or of `hugepages-*`: for
those a request needs a limit, and the two must be equal (the API server's
`IsOvercommitAllowed`); a limit alone sets the request. Trainer copies a TrainJob's
`resourcesPerNode` onto its trainer containers as written, so a request without its limit
leaves JobSet unable to create the Jobs: no pod ever starts, and the reason is only in JobSet's
Events. Said at `kubectl apply` instead.

Bounded: at most MAX_REQUESTS requests are read per object (real pods have a handful), and
MAX_WARNINGS said; what lies beyond is the API server's to refuse.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import islice
from typing import Any

from . import resources
from .errors import Path
from .fields import is_label_key
from .startup import REPLICATED_JOBS
from .trainer import Runtime, TrainJob

MAX_REQUESTS = 256  # requests read per object, over all its containers
MAX_WARNINGS = 3  # warnings said per object (each takes two or three lines of kubectl)
NO_PODS = "so the TrainJob would create no pods"
TRAINER = resources.TRAINER_CONTAINER  # whose resources resourcesPerNode replaces

Said = tuple[str, ...]
"""A warning as clauses: joined by spaces it is one sentence (`sentence`); `lines` cuts it into
lines of a width at clause ends, as an admission answer keeps each warning short."""


def not_overcommittable(name: str) -> str | None:
    """What the API server calls a resource it allows no overcommit of (None: it allows it)."""
    if name.startswith("hugepages-"):
        return "huge pages"
    if "/" not in name or "kubernetes.io/" in name:
        return None  # native: cpu, memory, ephemeral-storage, *kubernetes.io/*
    # IsExtendedResourceName: not "requests."-prefixed (quota's convention) and a qualified name
    # once prefixed so; other names the API server refuses outright, for another reason.
    if name.startswith("requests.") or not is_label_key(f"requests.{name}"):
        return None
    return "an extended resource"


def sentence(said: Said) -> str:
    return " ".join(said)


def lines(said: Said, width: int) -> list[str]:
    """The clauses packed into lines of at most `width` characters (a clause longer than that
    stands alone), each line after the first starting with "... "."""
    found = [said[0]]
    for clause in said[1:]:
        if len(found[-1]) + 1 + len(clause) <= width:
            found[-1] += " " + clause
        else:
            found.append(f"... {clause}")
    return found


# A request to judge: the path of its container's `resources`, the container's name, the
# resource's name and quantity, and the container's limits.
Request = tuple[Path, str, Any, Any, Mapping[str, Any]]


def _requests(resources_: Any, where: Path, container: str = "") -> Iterator[Request]:
    if not isinstance(resources_, Mapping):
        return
    requests = resources_.get("requests")
    limits = resources_.get("limits")
    if isinstance(requests, Mapping):
        limits = limits if isinstance(limits, Mapping) else {}
        for name, value in requests.items():
            yield where, container, name, value, limits


def _template_requests(runtime: Runtime) -> Iterator[Request]:
    """The requests of every container (and init container) of the runtime's pods."""
    for i, rj in enumerate(runtime.replicated_jobs):
        spec = rj.pod_spec
        pod = REPLICATED_JOBS.index(i).child("template", "spec", "template", "spec")
        for key, listed in (
            ("containers", spec.containers),
            ("initContainers", spec.init_containers),
        ):
            for j, container in enumerate(listed or []):
                where = pod.child(key).index(j).child("resources")
                yield from _requests(container.resources, where, container.name or "")


def _judge(request: Request, consequence: str, short: bool) -> Said | None:
    """The warning for one request the API server would refuse (no limit, or another one), if
    it would. `short` names the limit to set by its key alone (its path was just said)."""
    where, _, name, value, limits = request
    kind = not_overcommittable(name) if isinstance(name, str) else None
    quantity = resources.parse(value) if kind is not None else None
    if quantity is None:
        return None
    shown = value if isinstance(value, str) else str(value)
    limit = limits.get(name)
    if limit is None:
        problem = f"requests {shown} without a limit;"
        rule = f"the API server refuses pods that request {kind} without an equal limit,"
    elif resources.parse(limit) in (quantity, None):  # not a quantity: the schema refuses it
        return None
    else:
        problem = f"requests {shown} but limits {limit};"
        rule = f"the API server refuses pods whose request for {kind} differs from its limit,"
    target = f"its limits[{name}]" if short else str(where.child("limits").key(name))
    return (
        f"{where.child('requests').key(name)}:",
        problem,
        rule,
        f"{consequence}: set {target} to {shown}",
    )


def _first(said: Iterator[Said | None]) -> list[Said]:
    """The first MAX_WARNINGS warnings, and one saying when there are more."""
    found = list(islice((s for s in said if s is not None), MAX_WARNINGS + 1))
    if len(found) > MAX_WARNINGS:
        found[MAX_WARNINGS:] = [
            (
                f"more requests than these {MAX_WARNINGS} lack an equal limit;",
                "fix these, then apply again to see the rest",
            )
        ]
    return found


def runtime_warnings(runtime: Runtime) -> list[Said]:
    """At the runtime's own apply: the requests of its pod templates the API server refuses."""

    def judged(request: Request) -> Said | None:
        whose = "its TrainJobs" + (" without resourcesPerNode" if request[1] == TRAINER else "")
        return _judge(request, f"so {whose} would create no pods", short=True)

    return _first(map(judged, islice(_template_requests(runtime), MAX_REQUESTS)))


def trainjob_warnings(trainjob: TrainJob, runtime: Runtime | None) -> list[Said]:
    """At a TrainJob's apply: its resourcesPerNode, then its runtime's pod templates (but the
    trainer containers when resourcesPerNode replaces their resources, as Trainer does when it
    has `requests` or `limits`)."""
    per_node = trainjob.resources_per_node
    replaced = isinstance(per_node, Mapping) and any(
        per_node.get(part) is not None for part in ("requests", "limits")
    )
    named = f'{runtime.kind} "{runtime.metadata.name}":' if runtime is not None else ""

    def judged() -> Iterator[Said | None]:
        requests = _requests(per_node, Path("spec", "trainer", "resourcesPerNode"))
        kept = (
            r
            for r in (_template_requests(runtime) if runtime is not None else ())
            if not (replaced and r[1] == TRAINER)
        )
        for request in islice(requests, MAX_REQUESTS):
            yield _judge(request, NO_PODS, short=False)
        for request in islice(kept, MAX_REQUESTS):
            said = _judge(request, NO_PODS, short=True)
            yield (named, *said[:-1], f"{said[-1]} in the runtime") if said else None

    return _first(judged())

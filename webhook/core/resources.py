"""What one pod of each ReplicatedJob requests, the way kube-scheduler counts it (pure: no I/O).

A pod's request for a resource is the larger of what its app containers need together with its
sidecars (init containers with `restartPolicy: Always`) and what the heaviest init container
needs beside the sidecars started before it, plus the pod's `overhead`. A container without
`requests` but with `limits` requests its limits (the API server's defaulting). The TrainJob's
`spec.trainer.resourcesPerNode` replaces the resources of the trainer container (`node`) of
the ReplicatedJobs Trainer sizes from numNodes, as Trainer does.

Quantities are parsed by the Kubernetes client (`kubernetes.utils.quantity`), imported on first
use: the package costs 0.4 s to import and the core must stay quick to import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import ROUND_CEILING, Decimal
from typing import Any

from .podcounts import uses_num_nodes
from .trainer import Container, ReplicatedJob, Runtime, TrainJob

TRAINER_CONTAINER = "node"  # the container resourcesPerNode applies to (Trainer's constant)
Resources = dict[str, Decimal]


# The API server keeps a quantity as an int64 of its unit or finer; nothing larger is a
# request any node could meet. Bounding it also bounds the cost of printing one: int() of
# Decimal("1e1000000") takes most of a minute, on the loop that answers every pod.
MAX_QUANTITY = Decimal(2**63 - 1)
MAX_QUANTITY_TEXT = 64  # characters: the longest real quantity is far shorter


def parse(value: Any) -> Decimal | None:
    """A quantity as a number (None when it is not one, or beyond MAX_QUANTITY)."""
    if isinstance(value, bool) or (isinstance(value, str) and len(value) > MAX_QUANTITY_TEXT):
        return None
    from kubernetes.utils.quantity import parse_quantity

    parse_it: Any = parse_quantity  # untyped in the client
    try:
        number = Decimal(parse_it(value))
    except (ValueError, TypeError, ArithmeticError):
        return None
    # adjusted(): the exponent of the leading digit, read without arithmetic (which could
    # overflow the decimal context).
    if not number.is_finite() or number.adjusted() > 18 or abs(number) > MAX_QUANTITY:
        return None
    return number


def text(value: Decimal) -> str:
    """A quantity as the API server would accept it: whole numbers plain, else milli- or
    nano-units (rounded up: a request is never understated)."""
    if value == value.to_integral_value():
        return str(int(value))
    milli = value * 1000
    if milli == milli.to_integral_value():
        return f"{int(milli)}m"
    return f"{int((value * 10**9).to_integral_value(rounding=ROUND_CEILING))}n"


def _requests(container: Container, override: Mapping[str, Any] | None = None) -> Resources:
    resources = override if override is not None else container.resources
    if not isinstance(resources, Mapping):
        return {}
    requests = resources.get("requests")
    limits = resources.get("limits")
    merged: dict[str, Any] = dict(limits) if isinstance(limits, Mapping) else {}
    if isinstance(requests, Mapping):
        merged.update(requests)  # an explicit request wins over the limit it defaults from
    out: Resources = {}
    for name, value in merged.items():
        number = parse(value)
        if isinstance(name, str) and number is not None and number > 0:
            out[name] = number
    return out


def _add(into: Resources, more: Mapping[str, Decimal]) -> None:
    for name, value in more.items():
        into[name] = into.get(name, Decimal(0)) + value


def _max(into: Resources, other: Mapping[str, Decimal]) -> None:
    for name, value in other.items():
        if value > into.get(name, Decimal(0)):
            into[name] = value


def pod_requests(
    containers: Iterable[Container],
    init_containers: Iterable[Container] = (),
    overhead: Mapping[str, Any] | None = None,
    override: Mapping[str, Mapping[str, Any]] | None = None,
) -> Resources:
    """One pod's effective requests; `override` replaces the resources of named containers."""
    override = override or {}
    running: Resources = {}
    for c in containers:
        _add(running, _requests(c, override.get(c.name or "")))
    sidecars: Resources = {}
    peak: Resources = {}
    for c in init_containers:
        need = _requests(c, override.get(c.name or ""))
        if c.restart_policy == "Always":  # a sidecar: runs beside everything after it
            _add(sidecars, need)
            continue
        during = dict(sidecars)
        _add(during, need)
        _max(peak, during)
    _add(running, sidecars)
    _max(running, peak)
    for name, value in (overhead or {}).items():
        number = parse(value)
        if isinstance(name, str) and number is not None and number > 0:
            running[name] = running.get(name, Decimal(0)) + number
    return running


def replicated_job_requests(runtime: Runtime, trainjob: TrainJob, rj: ReplicatedJob) -> Resources:
    """What one pod of `rj` requests under this TrainJob."""
    spec = rj.pod_spec
    per_node = trainjob.resources_per_node
    override = (
        {TRAINER_CONTAINER: per_node}
        if per_node is not None and uses_num_nodes(runtime, rj)
        else None
    )
    return pod_requests(spec.containers or [], spec.init_containers or [], spec.overhead, override)


def times(resources: Mapping[str, Decimal], count: int) -> Resources:
    return {name: value * count for name, value in resources.items()}

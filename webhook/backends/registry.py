"""Which gang backend serves a TrainJob: the one made for the scheduler its pods name.

Users already choose a scheduler per pod template (`schedulerName` in the runtime, or a
TrainJob's runtime patch); the backend follows from it. `default-scheduler` (or no name) is
kube-scheduler with the native Workload API. The names each backend answers to are settings,
so a cluster that runs a second kube-scheduler profile or a renamed Volcano can say so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..core.plan import Plan
from ..core.trainer import DEFAULT_SCHEDULER
from .base import GangBackend, Kind
from .coscheduling import CoschedulingBackend, CoschedulingSettings
from .kai import KaiBackend, KaiSettings
from .native import NativeBackend
from .volcano import VolcanoBackend, VolcanoSettings

DEFAULT_SCHEDULERS: Mapping[str, tuple[str, ...]] = {
    "native": (DEFAULT_SCHEDULER,),
    # scheduler-plugins installed as a second scheduler, and Slinky's Slurm Bridge, which
    # schedules coscheduling PodGroups too
    "coscheduling": ("scheduler-plugins-scheduler", "slurm-bridge-scheduler"),
    "volcano": ("volcano",),
    "kai": ("kai-scheduler",),
}


@dataclass(frozen=True)
class Backends:
    """The backends this service runs, and the scheduler names each one serves."""

    backends: tuple[GangBackend, ...]
    schedulers: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: dict(DEFAULT_SCHEDULERS)
    )

    def __post_init__(self) -> None:
        owner: dict[str, str] = {}
        for backend in self.backends:
            for name in self.schedulers.get(backend.name, ()):
                if owner.setdefault(name, backend.name) != backend.name:
                    raise ValueError(
                        f"scheduler {name!r} is given to both {owner[name]} and {backend.name}"
                    )

    def for_scheduler(self, scheduler: str) -> GangBackend | None:
        for backend in self.backends:
            if scheduler in self.schedulers.get(backend.name, ()):
                return backend
        return None

    def for_plan(self, plan: Plan) -> GangBackend | None:
        """The backend of a plan's scheduler; None when no backend here serves it."""
        return self.for_scheduler(plan.scheduler_name)

    def named(self, name: str) -> GangBackend | None:
        return next((b for b in self.backends if b.name == name), None)

    def of_kind(self, kind: Kind) -> GangBackend | None:
        return next((b for b in self.backends if kind in b.kinds), None)

    @property
    def kinds(self) -> tuple[Kind, ...]:
        """Every kind any backend makes (the cache watches each while its API is served)."""
        return tuple(k for b in self.backends for k in b.kinds)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.backends)


def all_backends(
    *,
    coscheduling: CoschedulingSettings | None = None,
    kai: KaiSettings | None = None,
    volcano: VolcanoSettings | None = None,
) -> tuple[GangBackend, ...]:
    """Every backend there is, each with its settings (their defaults when not given)."""
    return (
        NativeBackend(),
        CoschedulingBackend(coscheduling),
        VolcanoBackend(volcano),
        KaiBackend(kai),
    )


def default_backends(
    schedulers: Mapping[str, Sequence[str]] | None = None,
    enabled: Sequence[str] | None = None,
    *,
    coscheduling: CoschedulingSettings | None = None,
    kai: KaiSettings | None = None,
    volcano: VolcanoSettings | None = None,
) -> Backends:
    """The backends to run: all, or those `enabled` names (a cluster without a scheduler need
    not grant the RBAC for its objects), answering to the default scheduler names or
    `schedulers`, each with its own settings. Raises ValueError for a name no backend has."""
    known = all_backends(coscheduling=coscheduling, kai=kai, volcano=volcano)
    names = [b.name for b in known]
    unknown = sorted(set(enabled or ()) - set(names))
    if unknown:
        raise ValueError(f"no gang backend {', '.join(unknown)}: choose from {', '.join(names)}")
    chosen = dict(DEFAULT_SCHEDULERS)
    for name, given in (schedulers or {}).items():
        chosen[name] = tuple(given)
    running = tuple(b for b in known if enabled is None or b.name in enabled)
    return Backends(running, chosen)

"""Feasibility for the service: the Node summary the Node watch keeps up to date, judged from
the cache alone (no API call), with each judgement reused until a node changes.

It degrades quietly: until the Nodes are listed (the watch has not synced yet, or RBAC forbids
it), or while the cluster has no nodes (one that scales up from zero, say), nothing is judged,
which is logged once; readiness never waits for it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ..backends.base import Context, GangBackend
from ..backends.kai import KaiBackend, topology_of
from ..core.feasibility import (
    Demand,
    Fit,
    Gang,
    Nodes,
    Tally,
    Verdict,
    gangs_of,
    judge,
    message,
)
from ..core.nodes import NodeShape, NodeSummary
from ..core.placement import PodNeeds
from ..core.plan import Plan
from ..core.trainer import Runtime, TrainJob

log = logging.getLogger("webhook.feasibility")

Mode = Literal["warn", "deny", "off"]
MODES: tuple[Mode, ...] = ("warn", "deny", "off")
MODE_ANNOTATION = "trainjob-scheduling.dev/feasibility"
"""On a (Cluster)TrainingRuntime: warn, deny or off for its TrainJobs (wins over the flag)."""
MAX_MEMO = 4096  # distinct gang demands remembered per node version
MAX_PODS = 64  # pod shapes whose verdict per node shape is remembered (then forgotten at once)
MAX_TALLIES = 256  # (pods, topology key) tallies kept up to date by every node event


@dataclass(frozen=True)
class Judged:
    gang: Gang
    fit: Fit

    @property
    def message(self) -> str:
        return message(self.gang, self.fit)


def domains_by_node_labels(
    backend: GangBackend, context: Context, topology_kept: bool | None = None
) -> bool:
    """Whether the backend keeps a gang in one domain of its topology key's node label (then
    that is judged); otherwise only the whole cluster is: Volcano's domains are HyperNodes,
    KAI without a Topology ignores the key, and the native backend's constraint is dropped by
    an API server with `TopologyAwareWorkloadScheduling` off (`topology_kept` False: see
    `constraints.py`; None, not known, judges it as kept)."""
    if isinstance(backend, KaiBackend):
        return bool(topology_of(context, backend.settings))
    return backend.name == "native" and topology_kept is not False


def mode_of(runtime: Runtime, default: Mode) -> tuple[Mode, str | None]:
    """The runtime's mode (its annotation), else `default`; and a note for a value that is not
    a mode (then `default` holds)."""
    value = (runtime.metadata.annotations or {}).get(MODE_ANNOTATION)
    if value is None:
        return default, None
    if value in MODES:
        return value, None
    shown = value if len(value) <= 40 else value[:37] + "..."
    note = f"the runtime's {MODE_ANNOTATION} annotation {shown!r} is not one of {', '.join(MODES)}"
    return default, note


class Feasibility:
    """Judges gangs against the nodes the cache has; every read is of the summary in memory."""

    def __init__(self, summary: NodeSummary | None = None, mode: Mode = "warn") -> None:
        self.summary = summary or NodeSummary()
        self.mode = mode
        self._memo: dict[Demand, Fit] = {}
        self._verdicts: dict[PodNeeds, dict[NodeShape, Verdict]] = {}
        self._tallies: dict[tuple[tuple[PodNeeds, ...], str | None], Tally] = {}
        self._dropped: frozenset[str] | None = frozenset()
        self._version = -1
        self._said: set[str] = set()
        self.summary.subscribe(self._shape_changed)

    def _shape_changed(self, shape: NodeShape, count: int) -> None:
        """A node event: each tally is updated in place (a review then reads its domains)."""
        if self.summary.dropped_keys != self._dropped:
            return  # every verdict is judged again on the next review (see `judge`)
        view = self._view()
        for tally in self._tallies.values():
            tally.add(shape, count, [view.verdicts(n)(shape) for n in tally.needs])

    def _view(self) -> Nodes:
        summary = self.summary
        return Nodes(summary.shapes, summary.dropped_keys, self._verdicts, self._tallies)

    def unavailable(self) -> str | None:
        """Why nothing can be judged now; None when the nodes are known."""
        if not self.summary.synced:
            return "the Nodes are not listed (yet, or the service may not list them)"
        if not len(self.summary):
            return "the cluster has no nodes"
        return None

    def judge(self, demand: Demand) -> Fit:
        summary = self.summary
        if summary.version != self._version:
            self._memo.clear()  # the tallies were kept up to date node by node
            self._version = summary.version
            if summary.dropped_keys != self._dropped:
                self._verdicts.clear()  # judged with other dropped keys: start again
                self._tallies.clear()
                self._dropped = summary.dropped_keys
        fit = self._memo.get(demand)
        if fit is None:
            if len(self._verdicts) > MAX_PODS:
                self._verdicts.clear()
            if len(self._tallies) > MAX_TALLIES:
                self._tallies.clear()
            fit = judge(demand, self._view())
            if len(self._memo) >= MAX_MEMO:
                self._memo.pop(next(iter(self._memo)))
            self._memo[demand] = fit
        return fit

    def plan(
        self, plan: Plan, runtime: Runtime, trainjob: TrainJob, *, topology: bool = True
    ) -> tuple[list[Judged], list[str]] | None:
        """Every gang of the plan judged, and notes on the gangs that cannot be; None when the
        nodes are not known (said once in the log)."""
        why = self.unavailable()
        if why is not None:
            self._once(why)
            return None
        gangs, notes = gangs_of(plan, runtime, trainjob, topology=topology)
        return [Judged(g, self.judge(g.demand)) for g in gangs], notes

    def _once(self, why: str) -> None:
        if why not in self._said:
            self._said.add(why)
            log.info(f"feasibility is not judged: {why}")

    def stats(self) -> Mapping[str, int]:
        return {"nodes": len(self.summary), "shapes": len(self.summary.shapes)}

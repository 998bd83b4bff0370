"""Feasibility signals, computed at scrape time from the cache (judgements are reused until a
node changes, so a scrape costs a dict lookup per TrainJob):

* `trainjob_scheduling_gangs_infeasible{backend, reason}`: gangs of the TrainJobs in the cache
  (not finished) that can never fit on the nodes as they are, by why (`NoMatchingNodes`,
  `NoTopologyLabel`, `PodTooLarge`, `DomainTooSmall`); every combination, zeros too. Each
  PodGroup counts once (the Jobs of a level-3 entry are judged once, counted each).
* `trainjob_scheduling_gangs_waiting_headroom_pods{backend}`: of the group objects waiting to be
  scheduled, the smallest headroom: pods the gang's largest domain could hold beyond its
  minCount, as if empty (0: it needs a whole domain free; negative: it never fits). No sample
  while no judged gang waits.
* `trainjob_scheduling_feasibility_nodes`, `..._node_shapes`: the nodes summarised, and the
  distinct shapes they collapse into (what a judgement's cost grows with).

A native gang with topology is judged over the whole cluster while the API server drops the
constraint (`kube/constraints.py`). With `--feasibility=off`, or before the Nodes are listed,
nothing is judged: the counts are 0.
A runtime's own `trainjob-scheduling.dev/feasibility` annotation is not read here (the plans
come from the frozen runtime snapshot, which keeps no annotations).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..backends.base import TRAINJOB_LABEL, Context, is_managed
from ..core.feasibility import REASONS, Gang, gangs_of
from ..core.lifecycle import is_finished
from ..kube.feasibility import domains_by_node_labels
from .registry import Metrics

if TYPE_CHECKING:
    from ..kube.cache import Cache, PlanLookup


class FeasibilityCollector(Collector):
    def __init__(self, metrics: Metrics, cache: Cache) -> None:
        self.cache = cache
        # TrainJob -> (the lookup and whether the topology constraint is kept, its gangs)
        self._gangs: dict[tuple[str, str], tuple[PlanLookup, bool | None, list[Gang]]] = {}
        metrics.registry.register(self)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        infeasible, headroom, nodes, shapes = self._families()
        names = self.cache.backends.names
        counts: dict[tuple[str, str], int] = {(b, r): 0 for b in names for r in REASONS}
        tightest: dict[str, int] = {}
        feasibility = self.cache.feasibility
        if feasibility.mode != "off" and feasibility.unavailable() is None:
            self._count(counts)
            self._headroom(tightest)
        for (backend, reason), count in counts.items():
            infeasible.add_metric([backend, reason], count)
        for backend, pods in tightest.items():
            headroom.add_metric([backend], pods)
        stats = feasibility.stats()
        nodes.add_metric([], stats["nodes"])
        shapes.add_metric([], stats["shapes"])
        yield from (infeasible, headroom, nodes, shapes)

    def _gangs_of(self, namespace: str, name: str, raw: dict[str, Any]) -> list[Gang] | None:
        lookup = self.cache.plan_for(namespace, name)
        if lookup.plan is None or lookup.trainjob is None or lookup.runtime is None:
            return None
        kept = self.cache.topology.kept  # (the API server may drop the constraint)
        memo = self._gangs.get((namespace, name))
        if memo is not None and memo[0] is lookup and memo[1] == kept:
            return memo[2]
        backend = self.cache.backends.for_plan(lookup.plan)
        if backend is None:
            return None
        topology = domains_by_node_labels(backend, Context.of(raw), kept)
        gangs, _ = gangs_of(lookup.plan, lookup.runtime.runtime, lookup.trainjob, topology=topology)
        self._gangs[(namespace, name)] = (lookup, kept, gangs)
        return gangs

    def _count(self, counts: dict[tuple[str, str], int]) -> None:
        seen: set[tuple[str, str]] = set()
        for (namespace, name), entry in self.cache.trainjobs.items():
            seen.add((namespace, name))
            gangs = self._gangs_of(namespace, name, entry.raw)
            lookup = self.cache.plan_for(namespace, name)
            if not gangs or lookup.plan is None or lookup.trainjob is None:
                continue
            if is_finished(lookup.trainjob):
                continue
            backend = self.cache.backends.for_plan(lookup.plan)
            assert backend is not None  # gangs_of found one
            for gang in gangs:
                fit = self.cache.feasibility.judge(gang.demand)
                if fit.reason is not None:
                    counts[(backend.name, fit.reason)] += len(gang.groups)
        for gone in set(self._gangs) - seen:
            del self._gangs[gone]

    def _headroom(self, tightest: dict[str, int]) -> None:
        for backend in self.cache.backends.backends:
            for kind in backend.kinds:
                for (namespace, name), entry in self.cache.store(kind).items():
                    status = backend.status(kind, entry.raw) if is_managed(entry.raw) else None
                    if status is None or status.scheduled or status.policy != "gang":
                        continue
                    labels = entry.raw.get("metadata", {}).get("labels") or {}
                    owner = self.cache.trainjobs.get(namespace, labels.get(TRAINJOB_LABEL, ""))
                    if owner is None:
                        continue
                    gangs = self._gangs_of(namespace, owner.raw["metadata"]["name"], owner.raw)
                    gang = next((g for g in gangs or () if name in g.groups), None)
                    if gang is None:
                        continue
                    pods = self.cache.feasibility.judge(gang.demand).headroom(gang.demand)
                    tightest[backend.name] = min(tightest.get(backend.name, pods), pods)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily(
                "trainjob_scheduling_gangs_infeasible",
                "Gangs of unfinished TrainJobs that can never fit on the nodes as they are, by "
                "backend and reason (NoMatchingNodes, NoTopologyLabel, PodTooLarge, "
                "DomainTooSmall).",
                labels=["backend", "reason"],
            ),
            GaugeMetricFamily(
                "trainjob_scheduling_gangs_waiting_headroom_pods",
                "Smallest headroom of the waiting gangs, by backend: pods their largest domain "
                "could hold beyond minCount if empty (0: a whole domain must be free; <0: never).",
                labels=["backend"],
            ),
            GaugeMetricFamily(
                "trainjob_scheduling_feasibility_nodes",
                "Nodes in the feasibility summary (the Node watch).",
            ),
            GaugeMetricFamily(
                "trainjob_scheduling_feasibility_node_shapes",
                "Distinct node shapes (labels, allocatable, taints, cordon) the nodes collapse "
                "into: what judging a gang reads.",
            ),
        )

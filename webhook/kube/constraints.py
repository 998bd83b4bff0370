"""Whether the API server keeps a gang's topology constraint, learnt from what it stores.

With `TopologyAwareWorkloadScheduling` off, kube-apiserver drops `schedulingConstraints` from a
Workload's templates, a PodGroup and a CompositePodGroup when it stores them, without an error
(the captures in tests/fixtures/gang-objects/): kube-scheduler then places the gang across
domains. Whatever judges a gang's topology (feasibility at admission, the TrainJob's
`GangScheduling` condition, the feasibility metrics) judges such a gang over the whole cluster
instead, and says that its topology is not enforced.

Nothing is configured; two kinds of evidence, the newest winning:

* a **dry-run create** (`dryRun=All`: admitted, validated and answered as it would be stored,
  never stored) of a PodGroup with a topology constraint, by every replica: once discovery
  finds the native API served (in discovery's first check, before the replica is ready, so the
  first TrainJob is judged with it), again when the served version changes, and every
  `REPROBE` seconds (a kube-apiserver restarted with the gate turned on or off). A probe without
  an answer is tried again at discovery's next check. It needs no RBAC of its own: a dry run is
  authorised as a `create`, which the service has for PodGroups (in its own namespace, or in
  the first watched namespaces with `--watch-namespaces`);
* what the API server **stored of the gang objects** the reconciler makes and reads (the
  leader), each dated by its creationTimestamp: an object made before the gate was turned on
  (never made again for it) does not outweigh a newer probe, and one just made does.

Until either has said, the constraint is taken as kept: a gang is judged per domain, as the
runtime asks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from kubernetes.aio.client import ApiClient, CustomObjectsApi
from kubernetes.aio.client.exceptions import ApiException

from ..backends.base import GangBackend, JsonObject, spec_of
from ..backends.native import GATES, GROUP, POD_GROUP, NativeBackend
from ..backends.native_versions import V1BETA1, Shapes
from ..core.nodes import HOSTNAME
from ..core.plan import Plan

if TYPE_CHECKING:
    from .cache import Cache

log = logging.getLogger("webhook.constraints")

FIELD = "schedulingConstraints"
GATE = GATES[FIELD]  # TopologyAwareWorkloadScheduling
REPROBE = 600.0  # seconds between probes of a version that answered
PROBE_PREFIX = "trainjob-scheduling-topology-probe-"  # generateName: a dry run names it too
PROBE_KEY = HOSTNAME  # any valid label key: the probe is never scheduled
PROBE_NAMESPACES = 3  # namespaces tried per probe (the watched ones may not all exist)
_CHILDREN = ("podGroupTemplates", "compositePodGroupTemplates")


@dataclass(frozen=True)
class Evidence:
    kept: bool
    at: float  # unix time it holds from: the probe's, or the stored object's creation
    source: str  # what said it, for the log


class TopologyKept:
    """What the service knows of whether the API server keeps a gang's topology constraint."""

    def __init__(self) -> None:
        self.evidence: Evidence | None = None
        self.probing = False  # a probe is asking (readiness at start waits for its answer)

    @property
    def kept(self) -> bool | None:
        """True: kept; False: dropped (the gate is off); None: not known yet."""
        return None if self.evidence is None else self.evidence.kept

    def observe(self, kept: bool, at: float, source: str) -> None:
        """One piece of evidence; one older than what is known is ignored."""
        known = self.evidence
        if known is not None and at < known.at:
            return
        self.evidence = Evidence(kept, at, source)
        if known is not None and known.kept == kept:
            return
        fields = {"field": FIELD, "gate": GATE, "from": source}
        if kept:
            log.info("the API server keeps a gang's topology constraint", extra={"fields": fields})
        else:
            log.warning(
                "the API server drops a gang's topology constraint (its feature gate is off): "
                "kube-scheduler may place a gang across domains, and feasibility judges such "
                "gangs over the whole cluster",
                extra={"fields": fields},
            )


def sets_constraint(obj: Mapping[str, Any]) -> bool:
    """Whether a rendered gang object sets a topology constraint (its spec, or a template of a
    Workload or of a tree)."""
    return _sets(spec_of(obj))


def _sets(part: Mapping[str, Any]) -> bool:
    if part.get(FIELD):
        return True
    for key in _CHILDREN:
        children = part.get(key)
        if isinstance(children, list) and any(isinstance(c, dict) and _sets(c) for c in children):
            return True
    return False


def created_at(obj: Mapping[str, Any]) -> float | None:
    """An object's creationTimestamp as unix time; None without a readable one."""
    meta = obj.get("metadata")
    value = meta.get("creationTimestamp") if isinstance(meta, dict) else None
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def topology_keys(plan: Plan) -> list[str]:
    """The topology keys a plan's groups and composites ask for, sorted."""
    keys = {g.topology_key for g in plan.groups if g.topology_key}
    keys |= {c.topology_key for c in plan.composites if c.topology_key}
    return sorted(keys)


def unenforced(plan: Plan, backend: GangBackend, kept: bool | None, judged: bool) -> str | None:
    """What to say of a native plan with topology on a cluster whose API server drops the
    constraint (None otherwise); `judged`: feasibility judged its gangs (over the whole
    cluster)."""
    keys = topology_keys(plan)
    if kept is not False or backend.name != "native" or not keys:
        return None
    text = (
        f"topology not enforced: the API server drops schedulingConstraints (feature gate "
        f"{GATE} is off); kube-scheduler may place a gang across {', '.join(keys)} domains"
    )
    return text + ("; feasibility judged its gangs over the whole cluster" if judged else "")


def probe_object(shapes: Shapes, namespace: str) -> JsonObject:
    """The PodGroup a probe sends: a gang of one with a topology constraint, in the shape of the
    version discovery chose (no Workload: a PodGroup's reference to one is optional)."""
    return shapes.outgoing(
        {
            "apiVersion": f"{GROUP}/{V1BETA1}",
            "kind": POD_GROUP.kind,
            "metadata": {"generateName": PROBE_PREFIX, "namespace": namespace},
            "spec": {
                "schedulingPolicy": {"gang": {"minCount": 1}},
                FIELD: {"topology": [{"key": PROBE_KEY}]},
            },
        }
    )


class TopologyProbe:
    """Discovery's hook after each check of a backend: for the native backend, while its API is
    served, a dry-run create of a PodGroup with a topology constraint when none has answered
    for the version served, or the last answer is `period` seconds old."""

    def __init__(
        self,
        api: ApiClient,
        cache: Cache,
        namespaces: Sequence[str],
        *,
        period: float = REPROBE,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.objects = CustomObjectsApi(api)
        self.cache = cache
        self.namespaces = tuple(namespaces)[:PROBE_NAMESPACES]
        self.period = period
        self.timeout = timeout
        self.clock = clock
        self._answered: tuple[str, float] | None = None  # (version, when) of the last answer
        self._failing: str | None = None  # why the last probe got no answer
        self._stamp: float | None = None  # the last answer's creationTimestamp (server time)

    async def __call__(self, backend: GangBackend) -> None:
        if not isinstance(backend, NativeBackend) or self.cache.api(backend) != "served":
            return
        now = self.clock()
        last = self._answered
        if last is not None and last[0] == backend.version and now - last[1] < self.period:
            return
        self.cache.topology.probing = True
        try:
            kept = await self.ask(backend.shapes)
        finally:
            self.cache.topology.probing = False
        if kept is not None:
            self._answered = (backend.version, now)
            # Dated by the API server's clock, as the stored objects it is weighed against are
            # (their creationTimestamp): a local clock running behind must not outweigh them.
            when = self._stamp if self._stamp is not None else now
            self.cache.topology.observe(kept, when, "a dry-run create of a PodGroup")

    async def ask(self, shapes: Shapes) -> bool | None:
        """Whether the API server keeps the probe's constraint; None without an answer (said
        once while it lasts)."""
        failures: list[str] = []
        for namespace in self.namespaces:
            try:
                answer = await self.objects.create_namespaced_custom_object(
                    GROUP, shapes.version, namespace, POD_GROUP.plural,
                    probe_object(shapes, namespace), dry_run="All",
                    _request_timeout=self.timeout,
                )  # fmt: skip
            except asyncio.CancelledError:
                raise
            except ApiException as err:
                failures.append(f"{namespace}: {err.status} {err.reason}")
                continue
            except Exception as err:  # timeouts, dropped connections
                failures.append(f"{namespace}: {type(err).__name__}: {err}")
                continue
            if not isinstance(answer, dict):
                failures.append(f"{namespace}: the answer is not an object")
                continue
            if self._failing is not None:
                log.info("the topology probe answers again")
                self._failing = None
            self._stamp = created_at(answer)
            return bool(spec_of(answer).get(FIELD))
        why = "; ".join(failures) or "no namespace to ask in"
        if why != self._failing:
            log.warning(
                "cannot learn whether the API server keeps a gang's topology constraint (a "
                "dry-run create of a PodGroup failed): tried again at discovery's next check",
                extra={"fields": {"error": why}},
            )
        self._failing = why
        return None

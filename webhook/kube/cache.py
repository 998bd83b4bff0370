"""The in-process cache of TrainJobs and runtimes, fed by watches (see `informer.py`).

The admission handlers read only from here, never from the API server, so a review costs dict
lookups. Derived values (a parsed and checked runtime, a TrainJob's plan) are memoised on the
cache entry they came from: an update replaces the entry, and with it the memo.
"""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..backends.base import ClusterFacts, GangBackend, Kind
from ..backends.registry import Backends, default_backends
from ..core.fields import parse
from ..core.kept import finished
from ..core.lifecycle import MULTIKUEUE
from ..core.memo import Memo
from ..core.plan import Plan, PlanningError, build_plan
from ..core.snapshot import PLAN_VERSION, Frozen, from_text, newer_version, snapshot, snapshot_of
from ..core.trainer import CLUSTER_RUNTIME_KIND, NAMESPACED_RUNTIME_KIND, Runtime, TrainJob
from ..core.validation import CheckedRuntime, Verdict, check_stored_runtime
from .constraints import TopologyKept
from .feasibility import Feasibility
from .gangstore import GangStore
from .index import OwnerIndex
from .jobsets import JobSetStore, restart_attempt
from .lookup import RuntimeFetch, TrainJobLookup
from .store import Entry, EventType, Key, Listener, Store, key_of
from .trainjobstore import TrainJobStore
from .waker import HeldPod

__all__ = ["Cache", "Entry", "EventType", "GangApi", "Key", "Listener", "PlanLookup", "Store"]
__all__ += ["key_of"]


@dataclass(frozen=True)
class PlanLookup:
    """A TrainJob's plan as the cache sees it; `state` says why there is none."""

    state: Literal[
        "ok",
        "no-trainjob",
        "no-runtime",
        "no-scheduling",
        "unfrozen",
        "frozen-no-gang",
        "elsewhere",
        "invalid",
        "unknown-version",
        "finished",
    ]
    """`unfrozen`: the runtime schedules but the reconciler has not frozen it into the TrainJob
    yet (its pods are held until it has); `frozen-no-gang`: the TrainJob started without a gang
    and keeps none, whatever its runtime says now; `elsewhere`: MultiKueue runs it on a worker
    cluster, so it has no gang (and is never frozen) here; `finished`: its gang was released
    (Complete or Failed), and none is planned for it again."""
    plan: Plan | None = None
    detail: str = ""
    trainjob: TrainJob | None = None  # with a plan: what it was made from (feasibility reads it)
    runtime: CheckedRuntime | None = None


# A runtime's versions before its current one whose snapshots still count as the service's:
# a TrainJob another replica froze a moment before this replica's watch brought the change.
EARLIER_VERSIONS = 4  # per runtime
EARLIER_RUNTIMES = 1024  # runtimes (the least recently changed forgotten)
EARLIER_SECONDS = 60.0  # since the version was replaced: a race's length, no more

FINISHED = PlanLookup("finished", detail="the TrainJob has finished: its gang is released")

# Whether a backend's API group/version serves its kinds (discovery says).
GangApi = Literal["unknown", "served", "not-served"]


class Cache:
    """TrainJobs, TrainingRuntimes and ClusterTrainingRuntimes (the webhooks and the reconciler
    read them), and the objects of every gang backend (what the reconciler writes).

    `connected` is False when the service runs without a cluster: the stores stay empty and
    count as synced, so the webhooks still answer (and say they know nothing).
    """

    def __init__(
        self,
        connected: bool,
        backends: Backends | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.connected = connected
        self._clock = clock
        self.backends = backends or default_backends()
        # Each TrainJob as planning reads it; a finished one as a tombstone (`core/kept.py`).
        self.trainjobs: Store = TrainJobStore("trainjobs")
        self.training_runtimes = Store("trainingruntimes")
        self.cluster_runtimes = Store("clustertrainingruntimes")
        # Not needed for readiness: admission checks a plan's classes only once it is listed.
        self.priority_classes = Store("priorityclasses")
        # Each JobSet's owner and restart attempt (`jobsets.py`): a gang's attempt is read there.
        self.jobsets: Store = JobSetStore("jobsets")
        # Anyone else's gang objects are kept as stubs (`gangstore.py`).
        self.gang_stores: dict[Kind, Store] = {
            kind: GangStore(f"{kind.plural}.{kind.group}") for kind in self.backends.kinds
        }
        self.apis: dict[str, GangApi] = {name: "unknown" for name in self.backends.names}
        self.kind_states: dict[Kind, GangApi] = {}  # optional kinds (CompositePodGroup)
        self.owners: dict[Kind, OwnerIndex] = {
            k: OwnerIndex(s) for k, s in self.gang_stores.items()
        }
        # Each backend's indexes by its name, for the pod webhook (a Kind hashes in Python).
        self._owners_of: dict[str, tuple[tuple[Kind, OwnerIndex], ...]] = {
            b.name: tuple((k, self.owners[k]) for k in b.kinds) for b in self.backends.backends
        }
        self._snapshots: dict[str, tuple[int, CheckedRuntime | None]] = {}
        # Asks the API server whether a TrainJob the cache lacks exists (the pod webhook's one
        # live read); None without a cluster.
        self.trainjob_lookup: TrainJobLookup | None = None
        # Runtime reviews' verdicts by content (the admission handler's; bounded).
        self.runtime_verdicts: Memo[tuple[Verdict, str | None]] = Memo(256)
        # Fed by the Node watch; not needed for readiness (feasibility waits for it quietly).
        self.feasibility = Feasibility()
        self.nodes = self.feasibility.summary
        # Whether the API server keeps a gang's topology constraint (`constraints.py`): a
        # dry-run probe's answer, or what it stored of the reconciler's objects.
        self.topology = TopologyKept()
        # The username the service's own API requests carry (`--service-account`, else learned
        # at start): the only requester whose writes of a TrainJob's runtime snapshot are
        # allowed; empty: no one's.
        self.service_username = ""
        # Snapshots of the versions each runtime had before its current one (a few each): a
        # TrainJob frozen by another replica a moment before this one saw the runtime change.
        self._earlier: OrderedDict[tuple[str, str, str], tuple[tuple[str, float], ...]]
        self._earlier = OrderedDict()
        for kind, store in (
            (CLUSTER_RUNTIME_KIND, self.cluster_runtimes),
            (NAMESPACED_RUNTIME_KIND, self.training_runtimes),
        ):
            store.subscribe(functools.partial(self._runtime_changed, kind))
        # The runtime as the API server has it now (the snapshot guard's one live read, for a
        # snapshot frozen from a version this replica has not seen); None without a cluster.
        self.runtime_fetch: RuntimeFetch | None = None
        # Told of each pod the pod webhook holds (the waker, `waker.py`); None: no one is.
        self.on_hold: Callable[[HeldPod], None] | None = None
        if not connected:
            for store in (*self.stores, *self.gang_stores.values()):
                store.synced = True

    @property
    def stores(self) -> tuple[Store, ...]:
        """The stores the webhooks need synced before they are ready."""
        return (self.trainjobs, self.training_runtimes, self.cluster_runtimes, self.jobsets)

    def restart_attempt(self, namespace: str, name: str, trainjob_uid: str | None) -> int | None:
        """The JobSet restart attempt TrainJob namespace/name is at (its JobSet's
        status.restarts; 0 before it has a JobSet); None while the JobSets are not listed, or
        when the JobSet of its name is another TrainJob's."""
        if not self.jobsets.synced:
            return None
        entry = self.jobsets.get(namespace, name)
        return restart_attempt(entry.raw if entry is not None else None, trainjob_uid)

    def store(self, kind: Kind) -> Store:
        return self.gang_stores[kind]

    def api(self, backend: GangBackend | str) -> GangApi:
        """What discovery says of a backend's API."""
        return self.apis.get(backend if isinstance(backend, str) else backend.name, "unknown")

    def facts(self) -> ClusterFacts:
        """What admission may check a plan against (only what the cache has listed)."""
        classes = None
        if self.connected and self.priority_classes.synced:
            classes = frozenset(name for (_, name), _ in self.priority_classes.items())
        return ClusterFacts(priority_classes=classes)

    def owned(self, kind: Kind, uid: str | None) -> list[dict[str, Any]]:
        """The stored objects of `kind` whose controller is the TrainJob with this uid."""
        return self.owners[kind].owned_by(uid)

    def foreign(self, backend: GangBackend, uid: str | None) -> tuple[Kind, dict[str, Any]] | None:
        """An object of the backend's kinds that the TrainJob controls but another controller
        made (it lacks this service's label): then this service stands down for the TrainJob."""
        for kind, index in self._owners_of[backend.name]:
            obj = index.foreign_of(uid)
            if obj is not None:
                return kind, obj
        return None

    def discovered(self) -> bool:
        """Discovery has said, of every backend's API and every optional kind, whether it is
        served: until then the webhooks cannot tell which gangs can be made (not ready)."""
        return all(self.api(b) != "unknown" for b in self.backends.backends) and all(
            self.kind_states.get(k) in ("served", "not-served")
            for k in self.backends.kinds
            if k.optional
        )

    def missing_kind(self, backend: GangBackend, plan: Plan) -> Kind | None:
        """The optional kind the plan needs (a tree's CompositePodGroups) that discovery has not
        found served; None when nothing is missing. The reconciler and the pod webhook both ask
        this, so a pod is never tied to a group the reconciler will not make."""
        if not plan.composites:
            return None
        return next((k for k in backend.kinds if k.optional and not self.kind_served(k)), None)

    def kind_served(self, kind: Kind) -> bool:
        """A required kind with its backend; an optional one once discovery found it."""
        return not kind.optional or self.kind_states.get(kind) == "served"

    def backend_ready(self, backend: GangBackend) -> bool:
        """Served, and its objects listed: what the cache says of them is the cluster's."""
        return self.api(backend) == "served" and all(
            self.store(k).synced for k in backend.kinds if self.kind_served(k)
        )

    def unlisted_gang_stores(self) -> list[Store]:
        """The stores of the gang kinds discovery found served whose objects are not listed."""
        return [
            self.store(kind)
            for backend in self.backends.backends
            if self.api(backend) == "served"
            for kind in backend.kinds
            if self.kind_served(kind) and not self.store(kind).synced
        ]

    def gangs_listed(self) -> bool:
        """Discovery has said which gang kinds are served, and the objects of each served one
        are listed: what the cache says of gang objects is the cluster's."""
        return self.discovered() and not self.unlisted_gang_stores()

    @property
    def synced(self) -> bool:
        return all(store.synced for store in self.stores)

    def knows_runtimes(self, kind: str) -> bool:
        """Whether a runtime of this kind missing from the cache is missing from the cluster."""
        if not self.connected:
            return False
        return (self._runtime_store(kind) or self.cluster_runtimes).synced

    def runtime(self, kind: str | None, namespace: str, name: str) -> CheckedRuntime | None:
        """A runtime, checked once per version; `kind` as in a TrainJob's runtimeRef."""
        entry = self._runtime_entry(kind, namespace, name)
        return None if entry is None else _checked_runtime(entry)

    def earlier_snapshots(self, kind: str | None, namespace: str, name: str) -> tuple[str, ...]:
        """The snapshots of the runtime's last few versions before its current one, each
        replaced within EARLIER_SECONDS: what another replica may have frozen a moment ago."""
        kind = kind or CLUSTER_RUNTIME_KIND
        key = (kind, namespace if kind == NAMESPACED_RUNTIME_KIND else "", name)
        since = self._clock() - EARLIER_SECONDS
        return tuple(text for text, replaced in self._earlier.get(key, ()) if replaced >= since)

    def _runtime_changed(
        self, kind: str, event: EventType, old: dict[str, Any] | None, new: Any
    ) -> None:
        if event == "ADDED" or old is None:
            return
        runtime = parse(Runtime, old)[0]
        if runtime is None or runtime.spec.scheduling is None:
            return  # it froze nothing
        meta = old.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        namespace = str(meta.get("namespace") or "") if kind == NAMESPACED_RUNTIME_KIND else ""
        key = (kind, namespace, str(meta.get("name") or ""))
        text = snapshot(runtime)
        kept = self._earlier.pop(key, ())
        self._earlier[key] = ((text, self._clock()), *(k for k in kept if k[0] != text))[
            :EARLIER_VERSIONS
        ]
        while len(self._earlier) > EARLIER_RUNTIMES:
            self._earlier.popitem(last=False)

    def not_running(self, namespace: str, name: str) -> str | None:
        """Why the cached TrainJob makes no pods now: "deleting" (a deletionTimestamp),
        "suspended" (spec.suspend), else None."""
        entry = self.trainjobs.get(namespace, name)
        raw = entry.raw if entry is not None else {}
        meta, spec = raw.get("metadata"), raw.get("spec")
        if isinstance(meta, dict) and meta.get("deletionTimestamp"):
            return "deleting"
        if isinstance(spec, dict) and spec.get("suspend") is True:
            return "suspended"
        return None

    def plan_for(self, namespace: str, name: str) -> PlanLookup:
        """The plan of TrainJob namespace/name under the runtime snapshot the reconciler froze
        into it (`core/snapshot.py`). Without a snapshot there is no plan yet: `unfrozen` when
        its runtime schedules (the reconciler freezes it when it first sees the TrainJob),
        `no-scheduling` when it does not."""
        entry = self.trainjobs.get(namespace, name)
        if entry is None:
            detail = f'no TrainJob "{namespace}/{name}" in the cache'
            return PlanLookup("no-trainjob", detail=detail)
        if _runs_elsewhere(entry.raw):  # before the snapshot: one an old release froze is moot
            detail = "the TrainJob runs on a MultiKueue worker cluster: no gang here"
            return PlanLookup("elsewhere", detail=detail)
        frozen = snapshot_of(entry.raw)
        if frozen is None:
            kind, runtime_name = _runtime_ref(entry.raw)
            runtime_entry = self._runtime_entry(kind, namespace, runtime_name)
            if runtime_entry is None:
                return PlanLookup("no-runtime", detail=f'no {kind} "{runtime_name}" in the cache')
            if _checked_runtime(runtime_entry).layout is None:
                return PlanLookup("no-scheduling", detail="the runtime has no spec.scheduling")
            detail = "its runtime is not frozen into the TrainJob yet (the reconciler does it)"
            return PlanLookup("unfrozen", detail=detail)
        if entry.memo_key is frozen:  # looked up before against this very snapshot
            memo: PlanLookup = entry.memo
            return memo
        if finished(entry.raw) and self._frozen_gang(frozen):
            lookup = FINISHED  # a tombstone: no plan, only the shared verdict kept
        else:
            lookup = self._plan_frozen(namespace, name, entry.raw, frozen)
        entry.memo, entry.memo_key = lookup, frozen
        return lookup

    def _plan_frozen(self, namespace: str, name: str, raw: Any, frozen: str) -> PlanLookup:
        read = self.snapshot_runtime(frozen)
        if read is None:
            newer = newer_version(frozen)
            if newer is not None:
                detail = (
                    f"its plan was frozen by a newer release (plan version {newer}; this one "
                    f"knows up to {PLAN_VERSION}): left as it is"
                )
                return PlanLookup("unknown-version", detail=detail)
            return PlanLookup("invalid", detail="the runtime snapshot does not parse")
        version, checked = read
        if checked is None:
            detail = "the TrainJob started without a gang and keeps none (frozen)"
            return PlanLookup("frozen-no-gang", detail=detail)
        trainjob, _ = parse(TrainJob, raw)
        if trainjob is None:
            return PlanLookup("invalid", detail=f'TrainJob "{namespace}/{name}" does not parse')
        try:
            plan = build_plan(trainjob, checked, version)
        except PlanningError as err:
            return PlanLookup("invalid", detail=str(err.errors[0]))
        if plan is None:
            return PlanLookup("no-scheduling", detail="the runtime has no spec.scheduling")
        return PlanLookup("ok", plan, trainjob=trainjob, runtime=checked)

    def _frozen_gang(self, text: str) -> bool:
        """Whether a snapshot freezes a gang (it reads, and is not a frozen "no gang"): a
        finished TrainJob's lookup says so only then, as before tombstones."""
        read = self.snapshot_runtime(text)
        return read is not None and read[1] is not None

    def snapshot_runtime(self, text: str) -> tuple[int, CheckedRuntime | None] | None:
        """A frozen runtime and its plan version, checked once per distinct snapshot (TrainJobs
        of one runtime version share the text); None when it does not parse. A runtime of None
        is a frozen "no gang"."""
        read = self._snapshots.get(text)
        if read is None:
            found: Frozen | None = from_text(text)
            if found is None:
                return None
            checked = check_stored_runtime(found.runtime) if found.runtime else None
            read = (found.version, checked)
            if len(self._snapshots) >= 1024:
                self._snapshots.pop(next(iter(self._snapshots)))
            self._snapshots[text] = read
        return read

    def _runtime_store(self, kind: str | None) -> Store | None:
        if kind in (None, "", CLUSTER_RUNTIME_KIND):
            return self.cluster_runtimes
        return self.training_runtimes if kind == NAMESPACED_RUNTIME_KIND else None

    def _runtime_entry(self, kind: str | None, namespace: str, name: str) -> Entry | None:
        store = self._runtime_store(kind)
        if store is None:
            return None
        return store.get(namespace if store is self.training_runtimes else "", name)


def _checked_runtime(entry: Entry) -> CheckedRuntime:
    if entry.memo is None:
        entry.memo = check_stored_runtime(parse(Runtime, entry.raw)[0] or Runtime())
    checked: CheckedRuntime = entry.memo
    return checked


def _runs_elsewhere(raw: Mapping[str, Any]) -> bool:
    """`core.lifecycle.runs_elsewhere` of the raw TrainJob (the pod path does not parse it)."""
    spec = raw.get("spec")
    return isinstance(spec, dict) and spec.get("managedBy") == MULTIKUEUE


def _runtime_ref(raw: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, defaulted as the CRD does; name) read from the raw TrainJob: the pod path must not
    parse a TrainJob it has planned before."""
    spec = raw.get("spec")
    ref = spec.get("runtimeRef") if isinstance(spec, dict) else None
    if not isinstance(ref, dict):
        return CLUSTER_RUNTIME_KIND, ""
    kind, name = ref.get("kind"), ref.get("name")
    return (kind if isinstance(kind, str) and kind else CLUSTER_RUNTIME_KIND), (
        name if isinstance(name, str) else ""
    )

"""Reconciler benchmark: N TrainJobs through the reconciler against the API emulator.

Run with `make bench` or `python -m tests.bench.reconcile_bench [--sizes 100,1000,10000]
[--workers 8] [--limited-size 100] [--log-level info] [--profile] [--snapshotted]`. Numbers,
not pass/fail: the exit status is 0 unless a run broke or a converged pass wrote something. The
default sizes take about 3.5 minutes on 2 cores (10,000 TrainJobs: about 2.5 of them).

With `--kubeconfig PATH` (`make bench BENCH_KUBECONFIG=PATH` adds that run) the API server is
that cluster's instead of the emulator: see `tests/bench/cluster.py` for what each size makes
there (and deletes), and what the cluster needs; the emulator's columns then say nan, and the
sizes default to 100 and 1,000.

Every size runs in two fresh processes, so that no peak carries over from one size to the next:

- the API emulator (`tests/kube_emulator.py`'s `VersionedEmulator`, with the fast path below),
  preloaded over HTTP with one ClusterTrainingRuntime (level 1: one gang of every pod) and N
  TrainJobs (numNodes 100, over `--namespaces` namespaces, none snapshotted yet; with
  `--snapshotted` each carries the runtime snapshot already, as if it had been taken when the
  TrainJob was created, which shows what the reconciler makes without its snapshot patch);
- the reconciler process as `serve` builds it: cache, informers (TrainJobs, runtimes, Workloads,
  PodGroups), `cache.gang_api = "served"`, metrics with the gang tracker, `EventRecorder`,
  `ApiWriter` and `Reconciler` (`--workers`), under uvloop, logging JSON at INFO (production's
  default) to a file. The writer's client-side limits are raised out of the way (qps 1e6); one more
  run (`--limited-size`, N=100) keeps the gang lane's default qps 100 / burst 200 (every write here
  is a gang write: Workloads, PodGroups, snapshots) to show that the limit holds.

With two or more CPUs the reconciler is pinned to CPU 0 and the emulator to CPU 1, so each
process's CPU time and memory are its own. Measured in the reconciler process:

- seconds: from starting the informers and the reconciler until every TrainJob's Workload and
  PodGroup are in the cache's stores (the informers saw them come back); "listed" is the part
  spent on the first lists; "settled" is when the work queue and the Event recorder were last
  busy (the follow-up passes, woken by the snapshot patches and the ADDED events, write nothing);
- created/s: Workloads + PodGroups created per second over those seconds; the snapshot patches
  (a merge patch on each TrainJob) are counted apart;
- peak RSS: the reconciler process's `ru_maxrss` (the whole process: interpreter, imports, cache,
  client buffers; not the Python heap alone); KiB/TJ is (peak - RSS before starting) / N; a
  table of bytes per TrainJob by structure (stores, owner indexes, queue, ...) says where it goes;
- resync: `reconciler.resync()` once settled, timed until all N passes are done and the queue is
  idle; a converged pass must write nothing: the writer's calls, the Events recorded and the
  emulator's resourceVersion (which every stored write bumps) are compared;
- ceiling: once all that is measured, N Workload + PodGroup pairs like the reconciler's created
  straight through the same writer and client, `--workers` at a time, the informers watching,
  until the stores hold them; the reconciler's TrainJobs/s against these pairs/s is the ratio
  (a figure: issue 21 withdrew the 0.8x goal; pods through a real API server are what users
  feel); each process's CPU per write (emulator) or per TrainJob and pair (reconciler)
  in the first pass and in the ceiling, and the "bound": the ratio each would allow if it ran a
  full core through the whole first pass (the ceiling's seconds over its CPU seconds);
- CPU: each process's CPU seconds over the first pass, as a share of the wall time (100% is one
  core) and per TrainJob; "noise" is the CPU other processes took on the two cores meanwhile (a
  shared machine: then the wall times are long, and the CPU per TrainJob is the steadier figure);
- stall: the longest the event loop was late to wake a 10 ms sleep, in each process; GC: time
  in the cyclic garbage collector.

Notes under the tables point out what looked wrong: writes that failed, Events dropped, a loop
that stopped running, expectations left behind.

The emulator's fast path (`FastEmulator`, this file only): kmock finds each request's handler by
testing it against every reaction, and its test is "is this request among the ones the reaction's
filter has seen", a scan of every request served so far; it also lists the served resources by
scanning every stored object, on every request. Both make a request cost O(requests + objects):
with the plain emulator N=300 took about 8 minutes, against about 5 seconds. `FastEmulator`
routes a request by its verb straight to `VersionedEmulator`'s handlers (the ones kmock's
fallbacks call: same answers, same rules) and lists the declared resources only; it serves no
reactions (fault injection), and none are used here. Its deletes and garbage collection still
scan every object (`_collect`, `_exists`): this benchmark deletes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import copy
import cProfile
import gc
import io
import itertools
import multiprocessing
import multiprocessing.connection
import os
import pstats
import resource
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
import orjson
from kmock import Server

from tests.bench.children import child_setup
from tests.harness import fixture
from tests.kube_emulator import (
    CLUSTER_RUNTIMES,
    TRAINJOBS,
    VersionedEmulator,
    create,
    declare_scheduling_resources,
    declare_service_resources,
    declare_trainer_resources,
)

Json = dict[str, Any]
Conn = multiprocessing.connection.Connection

SIZES = (100, 1_000, 10_000)
CLUSTER_SIZES = (100, 1_000)  # a shared cluster is not the place for 10,000 by default
RUNTIME = "torch-distributed"
NUM_NODES = 100  # the fixture TrainJob's: one PodGroup of minCount 100 each
RECONCILER_CPU = 0
EMULATOR_CPU = 1
UNLIMITED_QPS = 1e6
WRITES = ("create Workload", "create PodGroup", "snapshot TrainJob")  # N of each expected
# The gang lane's defaults: WriterSettings' and `serve --gang-qps/--gang-burst`.
DEFAULT_QPS, DEFAULT_BURST = 100.0, 200


# --- the emulator process ------------------------------------------------------------------------


@attrs.define(kw_only=True)
class FastEmulator(VersionedEmulator):
    """`VersionedEmulator` without kmock's per-request scans (see the module's docstring)."""

    served: int = attrs.field(default=0, init=False)
    # One reaction per handler, made but not added to the emulator's (no filter test, no scan):
    # kmock renders a handler's answer (a JSON body, a watch's stream) as for its fallbacks.
    _reactions: dict[Callable[[kmock.Request], Any], kmock.Reaction] = attrs.field(
        factory=dict, init=False
    )

    def _get_resources(self) -> list[kmock.resource]:
        # The declared ones only (kmock adds those of the stored objects, scanning them all).
        return [r for r in self.resources if isinstance(r, kmock.resource)]

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        self.served += 1
        serve = self._route(request)
        if serve is None:  # discovery and anything else: kmock's own way
            return await super()._handle(request)
        reaction = self._reactions.get(serve)
        if reaction is None:
            reaction = self._reactions[serve] = kmock.Reaction(self) << serve
        return await reaction(request)

    def _route(self, request: kmock.Request) -> Callable[[kmock.Request], Any] | None:
        if request.resource is None:
            return None
        if request.method == kmock.method.PUT:
            return self._serve_replace
        routes: dict[kmock.action | None, Callable[[kmock.Request], Any]] = {
            kmock.action.LIST: self._serve_list,
            kmock.action.WATCH: self._serve_watch,
            kmock.action.FETCH: self._serve_fetch,
            kmock.action.CREATE: self._serve_create,
            kmock.action.UPDATE: self._serve_update,
            kmock.action.DELETE: self._serve_delete,
        }
        return routes.get(request.action)


def cluster_runtime() -> Json:
    """Level 1: one gang of every pod, zone topology, disruptionMode all (as the tests')."""
    review = fixture("clustertrainingruntime-update-server-side-apply.validate.json")
    obj: Json = copy.deepcopy(review["request"]["object"])
    obj["metadata"] = {"name": RUNTIME}
    return obj


def trainjobs(n: int, namespaces: int, snapshotted: bool = False) -> Iterator[Json]:
    """N TrainJobs on the runtime, numNodes 100, round-robin over `namespaces` namespaces;
    `snapshotted`: each already carries the runtime snapshot, as if taken when it was created."""
    template: Json = fixture("trainjob-create.validate.json")["request"]["object"]
    template.pop("status", None)
    annotations = snapshot_annotations(cluster_runtime()) if snapshotted else None
    for i in range(n):
        obj = copy.deepcopy(template)
        obj["metadata"] = {"name": f"job-{i:05d}", "namespace": f"team-{i % namespaces}"}
        if annotations:
            obj["metadata"]["annotations"] = dict(annotations)
        yield obj


def snapshot_annotations(runtime_obj: Json) -> dict[str, str]:
    """The runtime snapshot annotation the reconciler writes for TrainJobs of this runtime."""
    from webhook.core.fields import parse
    from webhook.core.snapshot import SNAPSHOT_ANNOTATION, snapshot
    from webhook.core.trainer import Runtime

    runtime, _ = parse(Runtime, runtime_obj)
    assert runtime is not None
    return {SNAPSHOT_ANNOTATION: snapshot(runtime)}


def _child_setup(log_file: Path, cpu: int | None) -> None:
    child_setup(log_file, cpu)


def serve_emulator(
    n: int, namespaces: int, snapshotted: bool, cpu: int | None, conn: Conn, log_file: Path
) -> None:
    """The emulator, preloaded, until told to stop; answers "stats" on `conn` (child)."""
    _child_setup(log_file, cpu)
    import uvloop

    uvloop.run(_emulate(n, namespaces, snapshotted, conn))


async def _emulate(n: int, namespaces: int, snapshotted: bool, conn: Conn) -> None:
    loop = asyncio.get_running_loop()
    async with FastEmulator() as k, Server(k) as server:
        declare_trainer_resources(k)
        declare_service_resources(k)
        declare_scheduling_resources(k)
        started = time.perf_counter()
        await create(k, CLUSTER_RUNTIMES, cluster_runtime())
        pending: set[asyncio.Task[Json]] = set()
        for obj in trainjobs(n, namespaces, snapshotted):  # as clients would, 32 at a time
            pending.add(asyncio.create_task(create(k, TRAINJOBS, obj)))
            if len(pending) >= 32:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if pending:
            await asyncio.gather(*pending)
        preload = time.perf_counter() - started
        conn.send(
            {"url": str(server.url).rstrip("/"), "preload": preload, "rv": k.resource_version}
        )
        stalls = StallWatch()
        stalls.start()
        collector = GcWatch()
        while True:
            command = await loop.run_in_executor(None, conn.recv)
            if command != "stats":
                return
            live: collections.Counter[str] = collections.Counter(
                str(key[0].plural) for key, obj in k.objects.items() if not obj.deleted
            )
            conn.send(
                {
                    "cpu": time.process_time(),
                    "rv": k.resource_version,
                    "requests": k.served,
                    "objects": dict(live),
                    "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                    "stall": stalls.longest,
                    "gc": collector.reset(),
                }
            )


# --- the reconciler process ---------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process `pid` so far (/proc; NaN where there is none)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return float("nan")
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_kib() -> int:
    """VmRSS now (KiB); ru_maxrss is the peak."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def peak_rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def run_reconciler(cfg: Json, cpu: int | None, conn: Conn, log_file: Path) -> None:
    """The reconciler against the emulator at cfg["url"]; sends its measurements (child)."""
    _child_setup(log_file, cpu)
    import uvloop

    from webhook.server import logs

    logs.configure(cfg["log_level"])
    try:
        result = uvloop.run(_reconcile(cfg))
    except BaseException as err:
        conn.send({"error": f"{type(err).__name__}: {err}"})
        raise
    conn.send(result)


class Profiling:
    """cProfile over chosen stretches (none unless `on`); `report` prints the top functions."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.profiler: cProfile.Profile | None = None
        self.reports: dict[str, str] = {}

    def start(self) -> None:
        if self.on:
            self.profiler = cProfile.Profile()
            self.profiler.enable()

    def stop(self, name: str, top: int = 25) -> None:
        if self.profiler is None:
            return
        self.profiler.disable()
        out = io.StringIO()
        if os.environ.get("BENCH_PROFILE_DIR"):  # for pstats' callers/callees views
            self.profiler.dump_stats(f"{os.environ['BENCH_PROFILE_DIR']}/{name}.prof")
        stats = pstats.Stats(self.profiler, stream=out)
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)
        self.reports[name] = out.getvalue()
        self.profiler = None


class StallWatch:
    """The longest the event loop was late to wake a 10 ms sleep (a blocked loop, GC pauses,
    the CPU taken by others)."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.when = 0.0  # perf_counter() when the longest began
        self.due = time.perf_counter()  # when the current sleep should end
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    def reset(self) -> float:
        """The longest stall since the last reset, one still going on included."""
        now = time.perf_counter()
        self._note(now)
        self.due = max(self.due, now)  # what is counted here is not counted again
        longest, self.longest = self.longest, 0.0
        return longest

    def _note(self, now: float) -> None:
        if now - self.due > self.longest:
            self.longest, self.when = now - self.due, self.due

    async def _run(self) -> None:
        while True:
            self.due = time.perf_counter() + 0.01
            await asyncio.sleep(0.01)
            self._note(time.perf_counter())


class GcWatch:
    """Time spent in the cyclic garbage collector: in all, and the longest collection."""

    def __init__(self) -> None:
        self.total = 0.0
        self.longest = 0.0
        self.collections = 0
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def reset(self) -> tuple[float, float, int]:
        seen = (self.total, self.longest, self.collections)
        self.total, self.longest, self.collections = 0.0, 0.0, 0
        return seen

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        spent = time.perf_counter() - self._started
        self.total += spent
        self.longest = max(self.longest, spent)
        self.collections += 1


def deep_size(obj: Any, seen: set[int]) -> int:
    """Bytes of `obj` and of everything it holds (dicts, lists, tuples, sets, slotted objects),
    each object counted once over all calls sharing `seen`."""
    total, stack = 0, [obj]
    while stack:
        item = stack.pop()
        if id(item) in seen or item is None or isinstance(item, bool | int | float):
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset | collections.deque):
            stack.extend(item)
        elif hasattr(item, "__slots__") and not isinstance(item, str | bytes):
            stack.extend(getattr(item, name, None) for name in item.__slots__)
    return total


def busy_seconds(cpus: set[int] | None) -> float:
    """CPU time spent (not idle) on these cores, or on all of them, since boot (/proc/stat)."""
    labels = {"cpu"} if cpus is None else {f"cpu{c}" for c in cpus}
    total = 0.0
    with contextlib.suppress(OSError):
        for line in Path("/proc/stat").read_text().splitlines():
            parts = line.split()
            if parts and parts[0] in labels:
                ticks = [int(v) for v in parts[1:9]]  # user nice system idle iowait irq ...
                total += sum(ticks) - ticks[3] - ticks[4]
    return total / os.sysconf("SC_CLK_TCK")


def _bare_copy(obj: Json, name: str) -> Json:
    """A stored gang object as one would create it anew under `name`: no server fields, no
    owners (no TrainJob owns the ceiling's objects, so the reconciler leaves them alone)."""
    meta = obj["metadata"]
    fresh: Json = {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "spec": copy.deepcopy(obj["spec"]),
    }
    fresh["metadata"] = {
        "name": name,
        "namespace": meta["namespace"],
        "labels": meta.get("labels", {}),
    }
    return fresh


async def create_directly(
    writer: Any, workloads: Any, pod_groups: Any, n: int, workers: int, timeout: float
) -> float:
    """The ceiling: n Workload + PodGroup pairs like the reconciler's, created straight through
    the same writer and client, `workers` at a time, the informers watching as before; seconds
    until the cache stores hold them all (the reconciler's figure is measured the same way)."""
    from webhook.backends.native import POD_GROUP, WORKLOAD

    (_, wl_entry), *_ = workloads.items()
    wl = wl_entry.raw
    pg = next(
        e.raw for _, e in pod_groups.items()
        if e.raw["spec"].get("workloadRef", {}).get("workloadName") == wl["metadata"]["name"]
    )  # fmt: skip
    pairs = []
    for i in range(n):
        w = _bare_copy(wl, f"ceiling-{i}")
        p = _bare_copy(pg, f"ceiling-{i}")
        p["spec"]["workloadRef"]["workloadName"] = w["metadata"]["name"]
        pairs.append((w, p))
    before = len(workloads) + len(pod_groups)
    todo = iter(pairs)

    async def creator() -> None:
        for w, p in todo:
            await writer.create(WORKLOAD, w)
            await writer.create(POD_GROUP, p)

    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(creator() for _ in range(workers))), timeout)
    deadline = time.perf_counter() + timeout
    while len(workloads) + len(pod_groups) < before + 2 * n:
        if time.perf_counter() > deadline:
            raise TimeoutError("the ceiling's objects did not all reach the cache")
        await asyncio.sleep(0.005)
    return time.perf_counter() - start


async def _reconcile(cfg: Json) -> Json:
    from kubernetes.aio.client import ApiClient, Configuration, CustomObjectsApi
    from kubernetes.aio.client.exceptions import ApiException

    from webhook.backends.base import Kind
    from webhook.backends.native import POD_GROUP, WORKLOAD, NativeBackend
    from webhook.kube.cache import Cache, Key
    from webhook.kube.client import backend_informers, connect, informers, settle_proxy
    from webhook.kube.events import EventRecorder
    from webhook.kube.writer import ApiWriter, WriterSettings
    from webhook.metrics.gangs import GangTracker
    from webhook.metrics.registry import Metrics
    from webhook.reconcile.reconciler import CONTROLLER, Reconciler, ReconcilerSettings, Result

    class CountingWriter(ApiWriter):
        """The writer, counting its calls by what they wrote (and their failures)."""

        counts: collections.Counter[str]
        latency: collections.defaultdict[str, float]  # seconds in all, by what was written

        async def _counted(self, what: str, call: Any) -> Any:
            started = time.perf_counter()
            try:
                result = await call
            except BaseException as err:
                status = err.status if isinstance(err, ApiException) else type(err).__name__
                self.counts[f"failed {what} ({status})"] += 1
                raise
            self.latency[what] += time.perf_counter() - started
            self.counts[what] += 1
            return result

        async def create(self, r: Kind, obj: Json) -> Json:
            created: Json = await self._counted(f"create {r.kind}", super().create(r, obj))
            return created

        async def delete(self, r: Kind, namespace: str, name: str, uid: str | None) -> None:
            await self._counted(f"delete {r.kind}", super().delete(r, namespace, name, uid))

        async def json_patch(self, r: Kind, namespace: str, name: str, ops: list[Json]) -> Json:
            call = super().json_patch(r, namespace, name, ops)
            patched: Json = await self._counted(f"patch {r.kind}", call)
            return patched

        async def snapshot_runtime(
            self, namespace: str, name: str, uid: str, value: str, resource_version: str | None
        ) -> None:
            call = super().snapshot_runtime(namespace, name, uid, value, resource_version)
            await self._counted("snapshot TrainJob", call)

    class CountingReconciler(Reconciler):
        """The reconciler, counting passes (`running`: those under way), requeues, errors."""

        passes = 0
        running = 0
        requeues = 0
        errors = 0

        async def reconcile(self, key: Key) -> Result:
            self.running += 1
            try:
                result = await super().reconcile(key)
            except Exception:
                self.errors += 1
                raise
            finally:
                self.running -= 1
                self.passes += 1
            if result.requeue_after is not None:
                self.requeues += 1
            return result

        def idle(self) -> bool:
            queue = self.queue
            return (
                queue is not None
                and len(queue) == 0
                and self.running == 0
                and not queue._timers  # no retry or requeue pending (private: a bench's look)
            )

    n: int = cfg["n"]
    emulator_pid: int | None = cfg["emulator_pid"]
    namespaces: list[str] = cfg.get("namespaces") or []  # a cluster: the run's only
    if cfg.get("kubeconfig"):
        connected = await connect(cfg["kubeconfig"])  # as `serve --kubeconfig` connects
        assert connected is not None
        api = connected
    else:
        configuration = Configuration(host=cfg["url"])
        settle_proxy(configuration, os.environ)  # as connect() does for the service
        api = ApiClient(configuration=configuration)
    cache = Cache(connected=True)
    cache.jobsets.replace([])  # listed, none: restart attempt 0
    cache.apis["native"] = "served"  # what discovery says once scheduling.k8s.io/v1beta1 is
    workloads, pod_groups = cache.store(WORKLOAD), cache.store(POD_GROUP)
    metrics = Metrics()
    tracker = GangTracker(metrics, cache)
    recorded: collections.Counter[str] = collections.Counter()
    events = EventRecorder(
        api, CONTROLLER, "bench", on_event=lambda reason: recorded.update([reason])
    )
    limits = {"qps": cfg["qps"], "burst": cfg["burst"]}
    writer = CountingWriter(
        api, WriterSettings(**limits, gang_qps=limits["qps"], gang_burst=limits["burst"])
    )
    writer.counts, writer.latency = collections.Counter(), collections.defaultdict(float)
    cores: set[int] | None = set(cfg["cores"]) if cfg["cores"] else None
    profiling = Profiling(cfg["profile"])
    stalls = StallWatch()
    collector = GcWatch()
    reconciler = CountingReconciler(
        cache, writer, events, ReconcilerSettings(workers=cfg["workers"]), metrics=metrics
    )
    objects = CustomObjectsApi(api)

    def emu_cpu() -> float:
        return cpu_seconds(emulator_pid) if emulator_pid is not None else 0.0

    async def emulator_rv() -> int:
        """The emulator's resourceVersion now: every stored write (Events too) bumps it (a
        cluster's moves with everything else it stores: not read)."""
        if emulator_pid is None:
            return 0
        listing: Any = await objects.list_namespaced_custom_object(
            "coordination.k8s.io", "v1", "default", "leases"
        )
        return int(listing["metadata"]["resourceVersion"])

    async def until(check: Callable[[], bool], what: str, timeout: float) -> float:
        """Polls `check` every 5 ms; the time it first held."""
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"not within {timeout:g} s: {what}")
            await asyncio.sleep(0.005)
        return time.perf_counter()

    async def settle(quiet: float, timeout: float) -> float:
        """Waits until the reconciler stayed idle for `quiet` seconds with no Event left to
        post; returns when it was last busy (the wait itself is not counted)."""
        deadline = time.monotonic() + timeout
        last_busy = time.perf_counter()
        while time.perf_counter() - last_busy < quiet:
            if time.monotonic() > deadline:
                raise TimeoutError(f"not settled within {timeout:g} s")
            await asyncio.sleep(0.005)
            if not reconciler.idle() or not events._queue.empty():  # private: a bench's look
                last_busy = time.perf_counter()
        return last_busy

    converged = asyncio.Event()

    def stored(event: Any, old: Any, new: Any) -> None:
        if len(workloads) >= n and len(pod_groups) >= n:
            converged.set()

    workloads.subscribe(stored)
    pod_groups.subscribe(stored)

    rss_before = rss_kib()
    peak_before = peak_rss_kib()
    rv_start = await emulator_rv()
    stalls.start()
    cpu0, emu0, busy0 = own_cpu(), emu_cpu(), busy_seconds(cores)
    profiling.start()
    start = time.perf_counter()
    watches = [
        *informers(api, cache, namespaces),
        *backend_informers(api, cache, NativeBackend(), namespaces),
    ]
    tasks = [asyncio.create_task(i.run()) for i in watches]
    tasks.append(asyncio.create_task(events.run()))
    tasks.append(asyncio.create_task(reconciler.run()))
    timeout: float = cfg["timeout"]
    try:
        synced = await until(lambda: reconciler.queue is not None, "caches synced", timeout)
        await asyncio.wait_for(converged.wait(), timeout)
        done = time.perf_counter()
        cpu1, emu1, busy1 = own_cpu(), emu_cpu(), busy_seconds(cores)
        profiling.stop("first pass")
        stall_first = stalls.reset()
        stall_at = stalls.when - start
        gc_first = collector.reset()
        first_writes = collections.Counter(writer.counts)
        first_latency = dict(writer.latency)
        first_events = sum(recorded.values())
        settled = await settle(0.5, timeout)
        settle_writes = collections.Counter(writer.counts)
        passes_first = reconciler.passes
        rss_converged = rss_kib()

        # A second, idle pass over every TrainJob: it must write nothing.
        rv_before, passes_before = await emulator_rv(), reconciler.passes
        events_before, writes_before = sum(recorded.values()), sum(writer.counts.values())
        cpu2, emu2, busy2 = own_cpu(), emu_cpu(), busy_seconds(cores)
        stalls.reset()
        collector.reset()
        profiling.start()
        resync_start = time.perf_counter()
        reconciler.resync()
        resync_end = await until(
            lambda: reconciler.passes - passes_before >= n and reconciler.idle(),
            "the resync pass",
            timeout,
        )
        cpu3, emu3, busy3 = own_cpu(), emu_cpu(), busy_seconds(cores)
        profiling.stop("resync pass")
        stall_resync = stalls.reset()
        gc_resync = collector.reset()
        await settle(0.3, timeout)
        rv_after = await emulator_rv()
        # Where the memory that grows with N is: Python objects, by structure (private
        # attributes: a bench's look). Each object is counted once, in the first it is found.
        seen: set[int] = set()
        queue: Any = reconciler.queue
        structures = {
            "TrainJob store": cache.trainjobs._entries,
            "Workload store": workloads._entries,
            "PodGroup store": pod_groups._entries,
            "owner indexes": tuple((index._by_owner, index._foreign_by_owner)
                                   for index in cache.owners.values()),
            "work queue": (queue._queue, queue._dirty, queue._processing, queue._added_at,
                           queue._failures, queue._timers),
            "Event dedupe": events._recent,
            "gang tracker": tracker._waiting,
            "expectations": (reconciler._created, reconciler._deleted, reconciler._waiting),
        }  # fmt: skip
        heap = {name: deep_size(held, seen) for name, held in structures.items()}
        expected = len(reconciler._created)
        resync_writes = sum(writer.counts.values()) - writes_before  # before the ceiling's
        cpu4, emu4 = own_cpu(), emu_cpu()
        ceiling = await create_directly(writer, workloads, pod_groups, n, cfg["workers"], timeout)
        cpu5, emu5 = own_cpu(), emu_cpu()
    finally:
        if stalls.task is not None:
            tasks.append(stalls.task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        close: Any = api.close
        await close()

    def json_bytes(store: Any) -> float:
        items = store.items()
        return sum(len(orjson.dumps(e.raw)) for _, e in items) / max(1, len(items))

    wall = done - start
    result = {
        "n": n,
        "snapshotted": cfg["snapshotted"],
        "qps": cfg["qps"],
        "seconds": wall,
        "synced": synced - start,
        "settled": settled - start,
        "writes": dict(first_writes),
        "latency": {k: first_latency[k] / first_writes[k] for k in first_latency},
        "settle_writes": dict(settle_writes - first_writes),
        "events_recorded": first_events,
        "events_by_reason": dict(recorded),
        "events_dropped": events.dropped,
        "passes": passes_first,
        "requeues": reconciler.requeues,
        "errors": reconciler.errors,
        "rv_first": rv_before - rv_start,
        "cpu": cpu1 - cpu0,
        "emulator_cpu": emu1 - emu0,
        "noise": max(0.0, (busy1 - busy0) - (cpu1 - cpu0) - (emu1 - emu0)),
        "stall": stall_first,
        "stall_at": stall_at,
        "gc": gc_first,
        "rss_before_kib": rss_before,
        "peak_before_kib": peak_before,
        "rss_converged_kib": rss_converged,
        "peak_kib": peak_rss_kib(),
        "resync_seconds": resync_end - resync_start,
        "resync_passes": reconciler.passes - passes_before,
        "resync_writes": resync_writes,
        "resync_events": sum(recorded.values()) - events_before,
        "resync_rv": rv_after - rv_before,
        "resync_cpu": cpu3 - cpu2,
        "resync_emulator_cpu": emu3 - emu2,
        "resync_noise": max(0.0, (busy3 - busy2) - (cpu3 - cpu2) - (emu3 - emu2)),
        "resync_stall": stall_resync,
        "resync_gc": gc_resync,
        "profiles": profiling.reports,
        "ceiling_seconds": ceiling,
        "ceiling_cpu": cpu5 - cpu4,
        "ceiling_emulator_cpu": emu5 - emu4,
        "heap": heap,
        "expectations_left": expected,
        "json_bytes": {
            "TrainJob": json_bytes(cache.trainjobs),
            "Workload": json_bytes(workloads),
            "PodGroup": json_bytes(pod_groups),
        },
    }
    if emulator_pid is None:  # a cluster's API server: its CPU and resourceVersion are not seen
        for key in ("emulator_cpu", "resync_emulator_cpu", "ceiling_emulator_cpu", "rv_first"):
            result[key] = float("nan")
    return result


# --- the parent: one size at a time ---------------------------------------------------------------


@contextlib.contextmanager
def stopping(process: multiprocessing.process.BaseProcess) -> Iterator[None]:
    """`process` is stopped on the way out: SIGTERM, a grace period, then SIGKILL."""
    try:
        yield
    finally:
        if process.is_alive():
            process.terminate()
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join()


def receive(conn: Conn, process: multiprocessing.process.BaseProcess, timeout: float) -> Json:
    deadline = time.monotonic() + timeout
    while not conn.poll(0.1):
        if not process.is_alive():
            raise RuntimeError(f"{process.name} exited ({process.exitcode}); see its log")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{process.name}: no answer within {timeout:g} s")
    message: Json = conn.recv()
    if "error" in message:
        raise RuntimeError(f"{process.name}: {message['error']}")
    return message


def run_size(args: argparse.Namespace, n: int, qps: float, burst: int, work: Path) -> Json:
    if args.kubeconfig:
        return run_size_on_cluster(args, n, qps, burst, work)
    ctx = multiprocessing.get_context("spawn")
    pinned = {RECONCILER_CPU, EMULATOR_CPU} <= os.sched_getaffinity(0)
    tag = f"{n}-{qps:g}"
    emu_conn, emu_child = ctx.Pipe()
    emulator = ctx.Process(
        target=serve_emulator,
        args=(n, args.namespaces, args.snapshotted, EMULATOR_CPU if pinned else None,
              emu_child, work / f"emulator-{tag}.log"),
        name=f"emulator (N={n})",
        daemon=True,
    )  # fmt: skip
    emulator.start()
    with stopping(emulator):
        ready = receive(emu_conn, emulator, args.timeout)
        assert emulator.pid is not None
        target = {"url": ready["url"], "emulator_pid": emulator.pid}
        cores = [RECONCILER_CPU, EMULATOR_CPU] if pinned else []
        result = reconcile_in_child(ctx, args, n, qps, burst, target, cores, work / tag)
        emu_conn.send("stats")
        result["emulator"] = receive(emu_conn, emulator, 60)
        emu_conn.send("stop")
    result["preload"] = ready["preload"]
    return result


def run_size_on_cluster(
    args: argparse.Namespace, n: int, qps: float, burst: int, work: Path
) -> Json:
    """The same run against the cluster of `--kubeconfig` (`tests/bench/cluster.py`)."""
    from tests.bench import cluster

    api = cluster.open_cluster(args.kubeconfig, check_crd=not args.skip_crd_check)
    run = cluster.new_run(args.namespaces)
    try:
        annotations = snapshot_annotations(run.runtime) if args.snapshotted else None
        cluster.prepare(api, run, n, annotations)
        pinned = RECONCILER_CPU in os.sched_getaffinity(0)
        target = {"kubeconfig": args.kubeconfig, "namespaces": run.namespaces,
                  "emulator_pid": None}  # fmt: skip
        ctx = multiprocessing.get_context("spawn")
        result = reconcile_in_child(
            ctx, args, n, qps, burst, target, [RECONCILER_CPU] if pinned else [], work / run.run_id
        )
        result["emulator"] = None
        result["preload"] = run.preload_seconds
        result["server"] = api.server
        return result
    finally:
        try:
            made = ", ".join(run.made) or "none"
            if args.keep:
                print(f"  kept: namespaces {made}; ClusterTrainingRuntime {run.run_id}")
            else:
                for what in cluster.cleanup(api, run):
                    print(f"  NOT deleted (delete it by hand): {what}")
        finally:
            api.close()


def reconcile_in_child(
    ctx: Any,
    args: argparse.Namespace,
    n: int,
    qps: float,
    burst: int,
    target: Json,
    cores: list[int],
    log_stem: Path,
) -> Json:
    """The reconciler process against `target` (the emulator's url, or a kubeconfig and the
    namespaces to watch), until it sends its measurements; its log is read for warnings."""
    cfg = {
        **target,
        "n": n,
        "workers": args.workers,
        "qps": qps,
        "burst": burst,
        "timeout": args.timeout,
        "log_level": args.log_level,
        "profile": args.profile,
        "snapshotted": args.snapshotted,
        "cores": cores,
    }
    rec_conn, rec_child = ctx.Pipe()
    log_file = log_stem.with_name(f"reconciler-{log_stem.name}.log")
    reconciler = ctx.Process(
        target=run_reconciler,
        args=(cfg, RECONCILER_CPU if cores else None, rec_child, log_file),
        name=f"reconciler (N={n})",
        daemon=True,
    )
    reconciler.start()
    with stopping(reconciler):
        result = receive(rec_conn, reconciler, args.timeout * 3)
    lines = log_file.read_text(errors="replace").splitlines()
    result["log_lines"] = len(lines)
    warnings = [line for line in lines if '"level":"warning"' in line or '"level":"error"' in line]
    result["log_warnings"] = len(warnings)
    result["log_warning_sample"] = warnings[:3]
    return result


# --- report -----------------------------------------------------------------------------------


def created(r: Json) -> int:
    w = r["writes"]
    return int(w.get("create Workload", 0) + w.get("create PodGroup", 0))


def row_label(r: Json) -> str:
    qps = "" if r["qps"] >= UNLIMITED_QPS else f" (qps {r['qps']:g})"
    return f"{r['n']:,}{qps}"


def print_tables(results: list[Json]) -> None:
    print(
        f"{'N':>14} {'seconds':>8} {'created/s':>9} {'WL/s':>6} {'PG/s':>6} {'patch/s':>7} "
        f"{'peak RSS':>9} {'KiB/TJ':>6} {'resync s':>8} {'resync writes':>13}"
    )
    for r in results:
        w, s = r["writes"], r["seconds"]
        per_tj = (r["peak_kib"] - r["rss_before_kib"]) / r["n"]
        print(
            f"{row_label(r):>14} {s:>8.2f} {created(r) / s:>9,.0f} "
            f"{w.get('create Workload', 0) / s:>6,.0f} {w.get('create PodGroup', 0) / s:>6,.0f} "
            f"{w.get('snapshot TrainJob', 0) / s:>7,.0f} {r['peak_kib'] / 1024:>5.1f} MiB "
            f"{per_tj:>6.1f} {r['resync_seconds']:>8.3f} {r['resync_writes']:>13}"
        )
    print(
        "seconds: from starting the informers and the reconciler until every Workload and "
        "PodGroup is in its cache store; created/s: Workloads + PodGroups a second (WL/s, PG/s "
        "apart); patch/s: runtime snapshot patches on TrainJobs; peak RSS: the reconciler "
        "process's ru_maxrss (whole process); KiB/TJ: (peak RSS - RSS before starting) / N; "
        "resync: a second pass over all N once settled, and how many writes it made"
    )
    print()
    print(
        f"{'N':>14} {'rec CPU':>7} {'emu CPU':>7} {'noise':>5} {'rec ms/TJ':>9} "
        f"{'emu ms/TJ':>9} {'write ms':>8} {'stall ms':>9} {'GC s':>9} {'passes/TJ':>9} "
        f"{'requeues':>8} {'errors':>6} {'Events':>7} {'dropped':>7}"
    )
    for r in results:
        n, s = r["n"], r["seconds"]
        latency = r["latency"]
        mean_write = sum(latency.values()) / max(1, len(latency))
        api_stall = f"{r['emulator']['stall'] * 1e3:.0f}" if r["emulator"] else "-"
        stall = f"{r['stall'] * 1e3:.0f}/{api_stall}"
        collected = f"{r['gc'][0]:.2f}/{r['gc'][1]:.2f}"
        print(
            f"{row_label(r):>14} {r['cpu'] / s:>7.0%} {r['emulator_cpu'] / s:>7.0%} "
            f"{r['noise'] / s:>5.0%} {r['cpu'] / n * 1e3:>9.2f} "
            f"{r['emulator_cpu'] / n * 1e3:>9.2f} {mean_write * 1e3:>8.1f} {stall:>9} "
            f"{collected:>9} "
            f"{r['passes'] / n:>9.2f} {r['requeues']:>8} {r['errors']:>6} "
            f"{r['events_recorded']:>7,} {r['events_dropped']:>7,}"
        )
    print(
        "over the same seconds: rec/emu CPU: the reconciler's and the emulator's CPU time, "
        "100% = one core busy; noise: the CPU other processes took on their cores; ms/TJ: CPU "
        "per TrainJob; write ms: a write's mean latency as the reconciler sees it (rate limit, "
        "client, emulator, waiting for its own loop); stall: the longest the reconciler's/the "
        "emulator's event loop was late by; GC s: the reconciler's time in the cyclic garbage "
        "collector, in all / the longest collection; passes/TJ: reconcile passes per TrainJob "
        "until settled; Events: recorded; dropped: never posted (the recorder's queue was full)"
    )
    print()
    print(
        f"{'N':>14} {'listed s':>8} {'settled s':>9} {'rv/TJ':>5} {'RSS before':>10} "
        f"{'RSS settled':>11} {'TJ/WL/PG JSON B':>16} {'resync ms/TJ':>12} {'resync GC s':>11} "
        f"{'resync noise':>12} {'resync stall s':>14}"
    )
    for r in results:
        n, rs = r["n"], max(r["resync_seconds"], 1e-9)
        sizes = "/".join(f"{v:,.0f}" for v in r["json_bytes"].values())
        print(
            f"{row_label(r):>14} {r['synced']:>8.2f} {r['settled']:>9.2f} "
            f"{r['rv_first'] / n:>5.1f} {r['rss_before_kib'] / 1024:>6.1f} MiB "
            f"{r['rss_converged_kib'] / 1024:>7.1f} MiB {sizes:>16} "
            f"{r['resync_cpu'] / n * 1e3:>12.2f} {r['resync_gc'][0]:>11.2f} "
            f"{r['resync_noise'] / rs:>12.0%} {r['resync_stall']:>14.2f}"
        )
    print(
        "listed: the caches' first lists (part of seconds); settled: the queue and the Event "
        "recorder were last busy; rv/TJ: writes the emulator stored per TrainJob, Events "
        "included; RSS settled: VmRSS once settled; JSON B: mean size of a cached TrainJob, "
        "Workload, PodGroup; resync ms/TJ: the reconciler's CPU per TrainJob in the resync pass; "
        "resync GC s, noise, stall: time in the garbage collector, the CPU others took, the "
        "longest the reconciler's event loop was late by, during it"
    )


def print_heap(results: list[Json]) -> None:
    names = list(results[0]["heap"])
    print(f"{'N':>14} " + " ".join(f"{name:>{max(9, len(name))}}" for name in names))
    for r in results:
        cells = [f"{r['heap'][name] / r['n']:>{max(9, len(name))},.0f}" for name in names]
        print(f"{row_label(r):>14} " + " ".join(cells))
    print(
        "bytes per TrainJob of the Python objects each structure of the reconciler process "
        "holds once settled (sys.getsizeof, deep; shared objects counted once)"
    )


def ratio(a: float, b: float) -> str:
    return f"x{b / a:.1f}" if a > 0 else "x?"


def print_ceiling(results: list[Json]) -> None:
    print(
        f"{'N':>14} {'TrainJobs/s':>11} {'ceiling pairs/s':>15} {'ratio':>6} "
        f"{'writes/TJ':>9} {'Events/TJ':>9}"
    )
    for r in results:
        if r["qps"] < UNLIMITED_QPS:
            continue
        rate, ceiling = r["n"] / r["seconds"], r["n"] / r["ceiling_seconds"]
        writes = sum(v for k, v in r["writes"].items() if not k.startswith("failed"))
        events = r["events_recorded"] / r["n"]
        print(
            f"{row_label(r):>14} {rate:>11,.0f} {ceiling:>15,.0f} {rate / ceiling:>5.2f}x "
            f"{writes / r['n'] + events:>9.2f} {events:>9.2f}"
        )
    print(
        "TrainJobs/s: N / seconds (above); ceiling: the same Workload + PodGroup pairs created "
        "straight through the same writer and client, as many at once as the workers, the "
        "informers watching, until the stores hold them; writes/TJ: objects, patches and Events"
    )
    print()
    print(
        f"{'N':>14} {'emu ms/write':>12} {'ceiling':>8} {'rec ms/TJ':>9} {'ceiling ms/pair':>15}"
        f" {'bound: emulator':>15} {'reconciler':>10}"
    )
    for r in results:
        if r["qps"] < UNLIMITED_QPS:
            continue
        n = r["n"]
        writes = sum(v for k, v in r["writes"].items() if not k.startswith("failed"))
        per_tj = writes / n + r["events_recorded"] / n
        emu_write = r["emulator_cpu"] / (per_tj * n)
        ceiling_write = r["ceiling_emulator_cpu"] / (2 * n)
        # At a full core for the whole first pass, a process's CPU seconds are the shortest
        # that pass can be: against the ceiling's seconds, the most the ratio can reach.
        emu_bound = r["ceiling_seconds"] / r["emulator_cpu"]
        rec_bound = r["ceiling_seconds"] / r["cpu"]
        print(
            f"{row_label(r):>14} {emu_write * 1e3:>12.2f} {ceiling_write * 1e3:>8.2f} "
            f"{r['cpu'] / n * 1e3:>9.2f} {r['ceiling_cpu'] / n * 1e3:>15.2f} "
            f"{emu_bound:>14.2f}x {rec_bound:>9.2f}x"
        )
    print(
        "emu ms/write: the emulator's CPU over the writes it stored (objects, patches, Events), in "
        "the first pass (its lists included) and in the ceiling; rec ms/TJ, ceiling ms/pair: the "
        "reconciler process's CPU; bound: the ceiling's seconds over that process's CPU seconds "
        "in the first pass, the ratio it would allow at a full core all along (the lower binds)"
    )


def print_growth(results: list[Json]) -> None:
    runs = sorted((r for r in results if r["qps"] >= UNLIMITED_QPS), key=lambda r: int(r["n"]))
    for small, big in itertools.pairwise(runs):
        grown = (big["peak_kib"] - small["peak_kib"]) / (big["n"] - small["n"])
        above = [r["peak_kib"] - r["rss_before_kib"] for r in (small, big)]
        rates = [created(r) / r["seconds"] for r in (small, big)]
        print(
            f"N {small['n']:,} -> {big['n']:,} ({ratio(small['n'], big['n'])}): "
            f"seconds {ratio(small['seconds'], big['seconds'])}, "
            f"created/s {ratio(*rates)}, "
            f"reconciler CPU {ratio(small['cpu'], big['cpu'])}, "
            f"emulator CPU {ratio(small['emulator_cpu'], big['emulator_cpu'])}, "
            f"peak RSS above start {ratio(*above)} ({grown:.1f} KiB per added TrainJob), "
            f"resync {ratio(small['resync_seconds'], big['resync_seconds'])}"
        )


def check(results: list[Json]) -> list[str]:
    problems = []
    for r in results:
        label = row_label(r)
        if r["resync_writes"] or r["resync_events"] or r["resync_rv"]:
            problems.append(
                f"N={label}: the converged resync wrote {r['resync_writes']} object(s), recorded "
                f"{r['resync_events']} Event(s), moved the emulator's resourceVersion by "
                f"{r['resync_rv']}"
            )
        if r["resync_passes"] < r["n"]:
            problems.append(f"N={label}: the resync made {r['resync_passes']} passes")
    return problems


def notes(results: list[Json]) -> list[str]:
    said = []
    for r in results:
        label = row_label(r)
        w = r["writes"]
        expected = {what: r["n"] for what in WRITES}
        if r["snapshotted"]:  # preloaded with the snapshot: none to write
            expected["snapshot TrainJob"] = 0
        odd = {what: w.get(what, 0) for what, want in expected.items() if w.get(what, 0) != want}
        failed = {what: count for what, count in w.items() if what.startswith("failed")}
        if odd or failed or r["settle_writes"] or r["errors"]:
            said.append(
                f"N={label}: writes that succeeded {odd or 'as expected'} (expected {expected}), "
                f"failed {failed or 'none'}; after convergence {r['settle_writes'] or 'none'}; "
                f"{r['errors']} pass(es) failed and {r['requeues']} asked to be requeued"
            )
        if r["log_warnings"]:
            said.append(
                f"N={label}: the reconciler logged {r['log_warnings']} warning(s), e.g. "
                f"{r['log_warning_sample'][0]}"
            )
        if r["expectations_left"]:
            said.append(
                f"N={label}: once settled, the reconciler still expects {r['expectations_left']:,} "
                "created object(s) to show up (`Reconciler._created`), though the cache has them "
                "all: their ADDED event was handled before the create's answer came back"
            )
        if r["stall"] > 1.0:
            said.append(
                f"N={label}: in the first pass the reconciler's event loop did not run for up "
                f"to {r['stall']:.2f} s (from {r['stall_at']:.1f} s on): the follow-up passes, "
                "which write nothing, ran back to back (see the resync note); writes in flight "
                "meanwhile may time out on the client side"
            )
        if r["resync_stall"] > 0.1:
            said.append(
                f"N={label}: during the resync pass the reconciler's event loop did not run for "
                f"up to {r['resync_stall']:.2f} s of its {r['resync_seconds']:.2f} s (a pass that "
                "writes nothing never yields: one worker takes key after key from the queue "
                "without suspending; in `serve` the webhooks, probes, metrics, watches and the "
                "lease share that loop)"
            )
    runs = [r for r in results if r["qps"] >= UNLIMITED_QPS and r["emulator"] is not None]
    if runs:  # (a cluster's API server: its CPU is not seen, and it may share the cores)
        cpu = sum(r["cpu"] for r in runs) / sum(r["n"] for r in runs)
        emu = sum(r["emulator_cpu"] for r in runs) / sum(r["n"] for r in runs)
        side, most = ("the reconciler", cpu) if cpu >= emu else ("the emulator", emu)
        said.append(
            f"CPU per TrainJob over all sizes: reconciler {cpu * 1e3:.2f} ms, emulator "
            f"{emu * 1e3:.2f} ms: with a core each and nothing else running, {side} would bound "
            f"the first pass at about {1 / most:,.0f} TrainJobs/s ({2 / most:,.0f} objects/s)"
        )
        noisy = [f"N={row_label(r)} ({r['noise'] / r['seconds']:.0%})" for r in runs
                 if r["noise"] / r["seconds"] > 0.2]  # fmt: skip
        if noisy:
            said.append(
                "other processes took CPU from the two cores in: " + ", ".join(noisy) + "; "
                "those wall times and rates are low (the CPU per TrainJob holds better): re-run "
                "on a quiet machine"
            )
    return said


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.reconcile_bench",
        description="N TrainJobs through the reconciler against the API emulator (or a cluster).",
    )
    parser.add_argument(
        "--sizes",
        default=None,
        help="comma-separated numbers of TrainJobs (default: "
        + ",".join(str(s) for s in SIZES)
        + "; against a cluster "
        + ",".join(str(s) for s in CLUSTER_SIZES)
        + ")",
    )
    parser.add_argument(
        "--kubeconfig",
        default=None,
        help="measure against this cluster instead of the emulator (`make bench` does both when "
        "BENCH_KUBECONFIG is set); see tests/bench/cluster.py for what it makes there and needs",
    )
    parser.add_argument(
        "--skip-crd-check",
        action="store_true",
        help="with --kubeconfig: do not read the ClusterTrainingRuntime CRD",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="with --kubeconfig: keep each size's namespaces and runtime afterwards",
    )
    parser.add_argument("--workers", type=int, default=8, help="reconciler workers")
    parser.add_argument("--namespaces", type=int, default=4, help="namespaces the TrainJobs use")
    parser.add_argument(
        "--limited-size",
        type=int,
        default=100,
        help="N for one more run at the gang lane's default qps 100 / burst 200 (0: none)",
    )
    parser.add_argument("--log-level", default="info", help="the reconciler's log level")
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds allowed for each phase of a run"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the reconciler process over the first pass and the resync pass",
    )
    parser.add_argument(
        "--snapshotted",
        action="store_true",
        help="preload TrainJobs that already carry the runtime snapshot (as if it were taken "
        "when each was created): what the reconciler would make without its snapshot patch",
    )
    args = parser.parse_args(argv)
    if args.sizes is None:
        args.sizes = ",".join(str(s) for s in (CLUSTER_SIZES if args.kubeconfig else SIZES))
    try:
        args.sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error("--sizes: comma-separated integers")
    if not args.sizes or min(args.sizes) < 1 or args.workers < 1 or args.namespaces < 1:
        parser.error("need sizes >= 1, --workers >= 1, --namespaces >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    skip: tuple[type[Exception], ...] = ()  # what says a cluster cannot run the bench
    if args.kubeconfig:
        from tests.e2e.cluster import Skip  # the sync client's models: only when needed

        skip = (Skip,)
        # A timeout or a CI job's end sends SIGTERM: unwind, so what was made is deleted.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    cpus = os.sched_getaffinity(0)
    pinned = {RECONCILER_CPU, EMULATOR_CPU} <= cpus
    where = (
        f"reconciler pinned to CPU {RECONCILER_CPU}, emulator to CPU {EMULATOR_CPU}"
        if pinned
        else f"not pinned (CPUs {sorted(cpus)}): the two processes share"
    )
    if args.kubeconfig:
        where = f"reconciler pinned to CPU {RECONCILER_CPU}" if pinned else "not pinned"
        where += f"; against the cluster of {args.kubeconfig} (its API server's CPU: not seen)"
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {where}")
    trainjobs = (
        "the end-to-end tests' TrainJobs (numNodes 4) on a ClusterTrainingRuntime of each run's "
        "own (level 1: one Workload + one PodGroup each)"
        if args.kubeconfig
        else f"TrainJobs of numNodes {NUM_NODES} on ClusterTrainingRuntime {RUNTIME} (level 1: "
        "one Workload + one PodGroup each)"
    )
    print(
        f"{args.workers} workers; {trainjobs} over {args.namespaces} namespaces; writer qps "
        f"{UNLIMITED_QPS:g} (out of the way) unless shown; reconciler logging at {args.log_level}"
        + ("; TrainJobs preloaded with their runtime snapshot" if args.snapshotted else "")
    )
    runs = [(n, UNLIMITED_QPS, 1_000_000) for n in args.sizes]
    if args.limited_size:
        runs.append((args.limited_size, DEFAULT_QPS, DEFAULT_BURST))
    results: list[Json] = []
    with tempfile.TemporaryDirectory(prefix="reconcile-bench-") as tmp:
        for n, qps, burst in runs:
            started = time.perf_counter()
            try:
                r = run_size(args, n, qps, burst, Path(tmp))
            except skip as why:  # the cluster cannot run the bench: say what it lacks
                print(f"cannot run against the cluster: {why}")
                return 2
            results.append(r)
            e = r["emulator"]
            served = (
                f"emulator served {e['requests']:,} requests, holds "
                f"{sum(e['objects'].values()):,} objects, peak RSS {e['maxrss_kib'] / 1024:.0f} MiB"
                if e
                else f"API server {r['server']}"
            )
            print(
                f"  N={row_label(r)}: preload {r['preload']:.1f} s, run "
                f"{time.perf_counter() - started:.1f} s in all; {served}; reconciler log "
                f"{r['log_lines']:,} lines; reconciler's longest stall {r['stall'] * 1e3:.0f} ms "
                f"at {r['stall_at']:.2f} s",
                flush=True,
            )
            for name, report in r["profiles"].items():
                print(f"--- cProfile of the reconciler process, {name}, N={row_label(r)} ---")
                print(report)
    print()
    print_tables(results)
    print()
    print_ceiling(results)
    print()
    print_heap(results)
    print()
    print_growth(results)
    limited = [r for r in results if r["qps"] < UNLIMITED_QPS]
    for r in limited:
        writes = sum(v for k, v in r["writes"].items() if not k.startswith("failed"))
        print(
            f"at qps {r['qps']:g} / burst {DEFAULT_BURST}: {writes} writes in "
            f"{r['seconds']:.1f} s = {writes / r['seconds']:.1f} writes/s "
            f"(the limit allows {r['qps']:g}/s after the burst: expected about "
            f"{max(0, writes - DEFAULT_BURST) / r['qps']:.1f} s)"
        )
    for note in notes(results):
        print(f"note: {note}")
    problems = check(results)
    for problem in problems:
        print(f"PROBLEM: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""Gang objects first (issue 29): N TrainJobs arriving at once, the time from each TrainJob to its
PodGroup, with the GangScheduling condition writer on and off, and the order of the writes.

Run with `make bench` or `python -m tests.bench.gang_first_bench [--rounds 10] [--sizes 30,300]
[--budgets 20/30,100/200] [--workers 4]`. Numbers, not pass/fail (exit 0 unless a round broke).

Each round is a fresh API emulator (`reconcile_bench.FastEmulator`, over HTTP, in this process)
with one ClusterTrainingRuntime (one gang of every pod) and the service's reconciler as `serve`
builds it: the informers (TrainJobs, runtimes, Workloads, PodGroups, Nodes, JobSet's pods),
`ApiWriter` with its two lanes, `EventRecorder` gated by the reporting lane, `Reconciler`
(`--workers`) and, when on, its `StatusWriter`. Once the reconciler runs, N TrainJobs (numNodes
100, over 10 namespaces, none snapshotted) are POSTed at once; the emulator notes the moment it
stored each write. Per TrainJob: TrainJob stored -> its PodGroup stored. The round ends once
every PodGroup exists and (status on) every TrainJob carries its condition. One round before
the rest is not counted (it warms up).

For N=30 the rounds alternate status on / off (`--rounds` of each), and the figures pool the
rounds of each mode (p50, p99, max over every TrainJob of those rounds; and the median of the
rounds' own p99s, steadier on a shared machine): the p99 with the writer on against off says
whether the reporting delays the gangs; each round's p99 goes to stderr as it ends. Larger sizes
run one round each way. "order" is the writes as the emulator stored them, by lane, run-length
encoded: gang = runtime snapshot patches, Workload and PodGroup creates; condition = status
applies; event = Events; "gang first" says whether the last gang write came before the first
condition write. `--budgets` (gang qps/burst, comma-separated) runs the sizes again at each other
gang budget, status on: the measurement the defaults come from.

The emulator shares this process's event loop with the reconciler (its CPU is in the figures;
on a real control plane each write costs a network round trip instead).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock import Server
from kubernetes.aio.client import ApiClient, Configuration

from tests.bench.reconcile_bench import FastEmulator, cluster_runtime, trainjobs
from tests.kube_emulator import (
    CLUSTER_RUNTIMES,
    TRAINJOBS,
    create,
    declare_scheduling_resources,
    declare_service_resources,
    declare_trainer_resources,
)
from webhook.backends.base import TRAINJOB_LABEL
from webhook.backends.native import COMPOSITE
from webhook.kube.cache import Cache
from webhook.kube.client import backend_informers, informers, node_informer, pod_informers
from webhook.kube.events import EventRecorder
from webhook.kube.gangpods import GangPods
from webhook.kube.writer import ApiWriter, WriterSettings
from webhook.metrics.registry import Metrics
from webhook.reconcile.reconciler import CONTROLLER, Reconciler, ReconcilerSettings
from webhook.reconcile.status import StatusWriter

Json = dict[str, Any]
NAMESPACES = 10
GANG = ("snapshot", "create workloads", "create podgroups", "patch workloads", "patch podgroups",
        "delete workloads", "delete podgroups")  # fmt: skip
LANE = {**{w: "gang" for w in GANG}, "condition": "condition", "event": "event"}


def write_of(request: kmock.Request) -> tuple[str, str] | None:
    """(what, TrainJob name) of a write the reconciler (or the bench) makes; None otherwise."""
    resource, method = request.resource, request.method
    if resource is None or method not in (kmock.method.POST, kmock.method.PATCH,
                                          kmock.method.DELETE):  # fmt: skip
        return None
    plural = str(resource.plural)
    data: Any = request.data if method == kmock.method.POST else None
    if plural == "trainjobs":
        if method == kmock.method.POST:
            return "trainjob", str(data["metadata"]["name"])
        return ("condition" if request.subresource == "status" else "snapshot"), str(request.name)
    if plural == "events":
        return "event", str(data["regarding"]["name"])
    if plural in ("workloads", "podgroups"):
        verb = {kmock.method.POST: "create", kmock.method.PATCH: "patch"}.get(method, "delete")
        labels = (data or {}).get("metadata", {}).get("labels") or {}
        return f"{verb} {plural}", str(labels.get(TRAINJOB_LABEL, request.name))
    return None


@attrs.define(kw_only=True)
class NotingEmulator(FastEmulator):
    """The fast emulator, noting when it stored each write: (seconds, what, TrainJob)."""

    writes: list[tuple[float, str, str]] = attrs.field(factory=list, init=False)
    failed: int = attrs.field(default=0, init=False)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        response = await super()._handle(request)
        write = write_of(request)
        if write is not None:
            if response.status < 400:
                self.writes.append((time.perf_counter(), *write))
            else:
                self.failed += 1
        return response


@dataclasses.dataclass
class Round:
    n: int
    status: bool
    budget: tuple[float, int]
    latencies: list[float]  # TrainJob -> PodGroup, seconds
    order: list[str]  # lanes, in the order stored
    seconds: float  # burst to the last write awaited
    failed: int


async def until(check: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.perf_counter() + timeout
    while not check():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"no {what} within {timeout} s")
        await asyncio.sleep(0.01)


async def one_round(n: int, status_on: bool, settings: WriterSettings, workers: int) -> Round:
    async with NotingEmulator() as k, Server(k) as server:
        declare_trainer_resources(k)
        declare_service_resources(k)
        declare_scheduling_resources(k)
        await create(k, CLUSTER_RUNTIMES, cluster_runtime())
        api = ApiClient(configuration=Configuration(host=str(server.url).rstrip("/")))
        cache = Cache(connected=True)
        cache.jobsets.replace([])  # listed, none: restart attempt 0
        cache.kind_states[COMPOSITE] = "not-served"
        cache.apis["native"] = "served"  # what discovery says once scheduling.k8s.io/v1beta1 is
        native = cache.backends.named("native")
        assert native is not None
        pods = GangPods()
        metrics = Metrics()
        watches = informers(api, cache) + pod_informers(api, pods)
        watches += [node_informer(api, cache), *backend_informers(api, cache, native)]
        writer = ApiWriter(api, settings)
        events = EventRecorder(api, CONTROLLER, "bench", gate=writer.lanes.report_turn)
        status = StatusWriter(cache, writer, events, pods, metrics=metrics) if status_on else None
        reconciler = Reconciler(cache, writer, events, ReconcilerSettings(workers=workers),
                                metrics=metrics, status=status)  # fmt: skip
        tasks = [asyncio.create_task(w.run()) for w in watches]
        tasks += [asyncio.create_task(events.run()), asyncio.create_task(reconciler.run())]
        try:
            await until(lambda: reconciler.queue is not None, "reconciler", 30)
            k.writes.clear()
            started = time.perf_counter()
            await asyncio.gather(*(create(k, TRAINJOBS, tj) for tj in trainjobs(n, NAMESPACES)))

            def count(what: str) -> int:
                return sum(1 for _, w, _ in k.writes if w == what)

            def done() -> bool:
                return count("create podgroups") >= n and (not status_on or count("condition") >= n)

            await until(done, "PodGroups and conditions", 60 + n)
            seconds = time.perf_counter() - started
            await asyncio.sleep(0.2)  # the Events of the last passes
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            close: Any = api.close
            await close()
    arrived = {tj: t for t, w, tj in k.writes if w == "trainjob"}
    grouped = {tj: t for t, w, tj in reversed(k.writes) if w == "create podgroups"}  # the first
    latencies = [grouped[tj] - arrived[tj] for tj in arrived]
    order = [LANE[w] for _, w, _ in k.writes if w in LANE]
    budget = (settings.gang_qps, settings.gang_burst)
    return Round(n, status_on, budget, latencies, order, seconds, k.failed)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def runs(order: list[str], shown: int = 8) -> str:
    """`gang x90, event x30, condition x30`: the lanes, run-length encoded (the first `shown`)."""
    encoded: list[list[Any]] = []
    for lane in order:
        if encoded and encoded[-1][0] == lane:
            encoded[-1][1] += 1
        else:
            encoded.append([lane, 1])
    text = ", ".join(f"{lane} x{count}" for lane, count in encoded[:shown])
    return text + (f", ... ({len(encoded) - shown} more runs)" if len(encoded) > shown else "")


def gang_first(order: list[str]) -> bool:
    last_gang = max((i for i, lane in enumerate(order) if lane == "gang"), default=-1)
    first_condition = next((i for i, lane in enumerate(order) if lane == "condition"), None)
    return first_condition is None or last_gang < first_condition


def progress(r: Round) -> None:
    mode = "on" if r.status else "off"
    print(f"  N={r.n} gang {r.budget[0]:g}/{r.budget[1]} status {mode}: "
          f"p99 {percentile(r.latencies, 99):.3f} s", file=sys.stderr, flush=True)  # fmt: skip


def report(rounds: list[Round]) -> None:
    print(f"{'N':>5} {'gang qps/burst':>14} {'status':>6} {'rounds':>6} {'p50 s':>7} "
          f"{'p99 s':>7} {'max s':>7} {'rounds p99 median':>18} "
          f"{'gang first':>10}")  # fmt: skip
    keys = sorted({(r.n, r.budget, r.status) for r in rounds}, key=lambda x: (x[0], x[1], -x[2]))
    for n, budget, on in keys:
        these = [r for r in rounds if (r.n, r.budget, r.status) == (n, budget, on)]
        pooled = [x for r in these for x in r.latencies]
        each = f"{statistics.median(percentile(r.latencies, 99) for r in these):.3f}"
        first = "yes" if all(gang_first(r.order) for r in these) else "no"
        print(
            f"{n:>5} {f'{budget[0]:g}/{budget[1]}':>14} {'on' if on else 'off':>6} "
            f"{len(these):>6} {statistics.median(pooled):>7.3f} {percentile(pooled, 99):>7.3f} "
            f"{max(pooled):>7.3f} {each:>18} {first if on else '-':>10}"
        )
    print("\norder of the writes (the last round of each):")
    for n, budget, on in keys:
        last = [r for r in rounds if (r.n, r.budget, r.status) == (n, budget, on)][-1]
        mode = "on" if on else "off"
        print(f"  N={n} gang {budget[0]:g}/{budget[1]} status {mode}: {runs(last.order)}"
              f"  ({last.seconds:.2f} s to the last write awaited)")  # fmt: skip
    failed = sum(r.failed for r in rounds)
    if failed:
        print(f"\nnote: {failed} writes failed (the emulator answered 4xx/5xx)")


async def main(args: argparse.Namespace) -> None:
    defaults = WriterSettings()
    settings = dataclasses.replace(defaults)
    rounds: list[Round] = []
    # A round not counted: the first one pays for imports and first-call costs (the client's
    # models, the caches' first allocations), which would weigh on whichever mode came first.
    await one_round(min(args.sizes), True, settings, args.workers)
    for n in args.sizes:
        repeat = args.rounds if n <= 30 else 1
        for i in range(repeat):
            for on in (True, False) if i % 2 == 0 else (False, True):  # alternate who goes first
                rounds.append(await one_round(n, on, settings, args.workers))
                progress(rounds[-1])
        for qps, burst in args.budgets:
            other = dataclasses.replace(defaults, gang_qps=qps, gang_burst=burst)
            for _ in range(repeat):
                rounds.append(await one_round(n, True, other, args.workers))
                progress(rounds[-1])
    print(f"TrainJob -> PodGroup, N TrainJobs at once; reporting budget {defaults.qps:g}/"
          f"{defaults.burst}, default gang budget {defaults.gang_qps:g}/{defaults.gang_burst}, "
          f"{args.workers} workers\n")  # fmt: skip
    report(rounds)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="30,300", help="comma-separated N")
    parser.add_argument("--rounds", type=int, default=10, help="rounds each way for N <= 30")
    parser.add_argument("--budgets", default="", help="other gang budgets: qps/burst,...")
    parser.add_argument("--workers", type=int, default=ReconcilerSettings().workers)
    args = parser.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    args.budgets = [
        (float(b.split("/")[0]), int(b.split("/")[1])) for b in args.budgets.split(",") if b
    ]
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))

"""Gang health benchmark: the memory the pod watch keeps per gang, and the longest event-loop
stall while a burst of pod events goes through the reconciler and its status writer.

Run with `make bench` or `python -m tests.bench.status_bench [--trainjobs 1000] [--pods 100]
[--burst-trainjobs 100]`. Numbers, not pass/fail (exit 0 unless the run broke).

1. Memory: `--trainjobs` TrainJobs x `--pods` pods (defaults 1,000 x 100: 100,000 pods of about
   2.7 KB of JSON each, as a watch brings them), fed to `GangPods` as watch events; what it keeps
   (tracemalloc, after the pods themselves are gone), per gang and per pod, and the CPU per
   event.
2. Burst: the chain `serve` runs, in one process and one event loop: an `Informer` of JobSet's
   pods (label selector, pages of 500) reading a real HTTP list and watch from a server thread,
   `GangPods`, the `Reconciler` (its work queue coalesces TrainJobs) and its `StatusWriter`,
   with `--burst-trainjobs` TrainJobs (numNodes 100, snapshotted, their Workloads and PodGroups
   in the cache, every PodGroup scheduled). The list holds their 100 pods each, all running;
   once every condition says Scheduled, the watch streams 10,000 events at once: half the pods
   of each TrainJob deleted (a node pool lost), then their replacements, bound. Writes are not
   sent: a stand-in for the API server takes each condition apply and brings it back through
   the cache as the watch would (so "changed?" is decided against the stored object, as in a
   cluster). Measured: the longest the loop was late to wake a 10 ms sleep during the burst
   (goal under 50 ms), how long until settled, passes, condition writes, Events.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import logging
import threading
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from kubernetes.aio.client import ApiClient, Configuration

from tests.bench.reconcile_bench import cluster_runtime, trainjobs
from webhook.backends.base import Context
from webhook.backends.native import COMPOSITE
from webhook.core import condition as cond
from webhook.core.plan import JOB_INDEX, JOBSET_NAME, REPLICATED_JOB_NAME
from webhook.kube.cache import Cache
from webhook.kube.client import pod_informers
from webhook.kube.events import EventRecorder
from webhook.kube.gangpods import GangPods
from webhook.kube.writer import ApiWriter
from webhook.metrics.registry import Metrics
from webhook.reconcile.reconciler import CONTROLLER, Reconciler, ReconcilerSettings
from webhook.reconcile.status import StatusWriter

Json = dict[str, Any]
BURST = 10_000


def pod(ns: str, job: str, i: int, *, node: str | None = "gpu", phase: str = "Running") -> Json:
    """A JobSet pod of about 2.7 KB of JSON, as a watch brings it (managed fields and all)."""
    name = f"{job}-node-0-{i}-abcde"
    labels = {
        JOBSET_NAME: job, REPLICATED_JOB_NAME: "node", JOB_INDEX: "0",
        "batch.kubernetes.io/job-completion-index": str(i),
        "trainer.kubeflow.org/trainjob-name": job,
        "jobset.sigs.k8s.io/job-key": "0" * 40, "jobset.sigs.k8s.io/restart-attempt": "0",
    }  # fmt: skip
    env = [{"name": f"PET_VAR_{k}", "value": f"value-{k}-" + "x" * 20} for k in range(12)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name, "namespace": ns, "uid": f"{i:08d}-0000-0000-0000-{job[-12:]:>012}",
            "resourceVersion": str(1000 + i), "labels": labels,
            "annotations": {"batch.kubernetes.io/job-completion-index": str(i)},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": f"{job}-node-0",
                                 "uid": "1" * 36, "controller": True}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                               "fieldsV1": {"f:metadata": {"f:labels": {k: {} for k in labels}}}}],
        },
        "spec": {
            "containers": [{"name": "node", "image": "ghcr.io/kubeflow/trainer/torch:2.5",
                            "command": ["torchrun", "train.py"], "env": env,
                            "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
            "nodeName": f"{node}-{i}" if node else None, "restartPolicy": "Never",
            "schedulerName": "default-scheduler", "subdomain": job,
            "schedulingGroup": {"podGroupName": f"{job}-node-0-1a2b3c4d5e"},  # tied, as admitted
        },
        "status": {"phase": phase, "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": "2026-12-02T10:00:00Z"}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]},
    }  # fmt: skip


# --- 1. memory -------------------------------------------------------------------------------


def memory(n: int, per: int) -> Json:
    pods = GangPods()
    pods.replace([])
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for t in range(n):
        batch = [pod(f"team-{t % 10}", f"job-{t:05d}", i) for i in range(per)]
        for raw in batch:
            pods.apply("ADDED", raw)
    del batch
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    size = len(json.dumps(pod("team-0", "job-00000", 0)))
    # CPU apart: tracemalloc makes every allocation slower.
    timing, events = (
        GangPods(),
        [pod("team-0", f"job-{t:05d}", i) for t in range(10) for i in range(per)],
    )
    timing.replace([])
    started = time.process_time()
    for raw in events:
        timing.apply("ADDED", raw)
    cpu = (time.process_time() - started) / len(events)
    return {
        "gangs": n, "pods": len(pods), "pod_json": size, "kept": kept,
        "per_gang": kept / n, "per_pod": kept / len(pods), "us_per_event": cpu * 1e6,
    }  # fmt: skip


# --- 2. the burst ----------------------------------------------------------------------------


class StallWatch:
    """The longest the event loop was late to wake a 10 ms sleep, and how much of that interval
    this thread spent running (the loop's own work: the rest is the OS giving the CPU to other
    processes or threads, which a loaded 2-core machine does for tens of ms)."""

    def __init__(self) -> None:
        self.longest = (0.0, 0.0)  # (late by, this thread's CPU over the sleep and the lateness)
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    def reset(self) -> tuple[float, float]:
        longest, self.longest = self.longest, (0.0, 0.0)
        return longest

    async def _run(self) -> None:
        while True:
            due, cpu = time.perf_counter() + 0.01, time.thread_time()
            await asyncio.sleep(0.01)
            late = time.perf_counter() - due
            if late > self.longest[0]:
                self.longest = (late, time.thread_time() - cpu)


class PodServer:
    """A list (pages) and a watch of pods over HTTP, from a thread of its own; the watch sends
    `events` once told to, then holds the stream open."""

    def __init__(self, items: list[Json], events: list[Json]) -> None:
        self.items = [json.dumps(p).encode() for p in items]
        self.stream = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        self.go = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.port = 0
        threading.Thread(target=self._run, daemon=True).start()
        self.ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_get("/api/v1/pods", self._pods)
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = runner.addresses[0][1]
        self.ready.set()
        self.loop.run_forever()

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            start = int(request.query.get("continue") or 0)
            limit = int(request.query.get("limit") or len(self.items))
            page = self.items[start : start + limit]
            more = str(start + limit) if start + limit < len(self.items) else ""
            body = (
                b'{"kind":"PodList","metadata":{"resourceVersion":"1","continue":"%s"},'
                % (more.encode())
                + b'"items":['
                + b",".join(page)
                + b"]}"
            )
            return web.Response(body=body, content_type="application/json")
        response = web.StreamResponse()
        await response.prepare(request)
        while not self.go.is_set():
            await asyncio.sleep(0.01)
        for at in range(0, len(self.stream), 1 << 16):
            await response.write(self.stream[at : at + (1 << 16)])
        await asyncio.sleep(3600)
        return response


class LoopbackWriter(ApiWriter):
    """Takes condition applies as the API server would and brings each back through the cache
    as the watch would (a new resourceVersion); any other write is a failure of the run."""

    def __init__(self, cache: Cache) -> None:
        super().__init__(ApiClient(configuration=Configuration(host="http://unused")))
        self.cache = cache
        self.applies = 0
        self.rv = 10_000

    async def apply_condition(self, namespace: str, name: str, condition: Json) -> None:
        self.applies += 1
        entry = self.cache.trainjobs.get(namespace, name)
        assert entry is not None
        stored = copy.deepcopy(entry.raw)
        others = [c for c in stored.get("status", {}).get("conditions", [])
                  if c.get("type") != condition["type"]]  # fmt: skip
        stored["status"] = {"conditions": [*others, condition]}
        self.rv += 1
        stored["metadata"]["resourceVersion"] = str(self.rv)
        asyncio.get_running_loop().call_soon(self.cache.trainjobs.apply, "MODIFIED", stored)

    async def _call(self, method: Any, *args: Any, **kw: Any) -> Any:
        raise AssertionError(f"the reconciler wrote: {method.__name__}")


def world(n: int) -> tuple[Cache, list[Json]]:
    """The cache as a settled leader has it: runtime, TrainJobs, their gang objects (scheduled)."""
    cache = Cache(connected=True)
    cache.jobsets.replace([])  # listed, none: restart attempt 0
    cache.apis["native"] = "served"
    cache.kind_states[COMPOSITE] = "not-served"
    runtime = cluster_runtime()
    cache.cluster_runtimes.replace([runtime])
    cache.training_runtimes.replace([])
    tjs = list(trainjobs(n, 10, snapshotted=True))
    for i, tj in enumerate(tjs):
        tj["metadata"].update(uid=f"uid-{i}", resourceVersion="1", generation=1)
    cache.trainjobs.replace(tjs)
    backend = cache.backends.named("native")
    assert backend is not None
    made: dict[Any, list[Json]] = {kind: [] for kind in backend.kinds}
    for tj in tjs:
        lookup = cache.plan_for(tj["metadata"]["namespace"], tj["metadata"]["name"])
        assert lookup.plan is not None, lookup.detail
        for obj in backend.render(lookup.plan, Context.of(tj)):
            kind = next(k for k in backend.kinds if k.kind == obj["kind"])
            obj["metadata"].update(uid=f"{obj['metadata']['name']}-uid", resourceVersion="1")
            if obj["kind"] == "PodGroup":
                obj["status"] = {"conditions": [{
                    "type": "PodGroupInitiallyScheduled", "status": "True", "reason": "Scheduled",
                    "lastTransitionTime": "2026-12-02T10:00:00Z"}]}  # fmt: skip
            made[kind].append(obj)
    for kind, objs in made.items():
        cache.store(kind).replace(objs)
    return cache, tjs


def burst_events(tjs: list[Json], per: int) -> Iterator[Json]:
    """Half the pods of each TrainJob deleted, then their replacements bound: BURST events for
    100 TrainJobs of 100 pods, interleaved across TrainJobs."""
    half = per // 2
    for phase in ("DELETED", "ADDED"):
        for i in range(half):
            for tj in tjs:
                meta = tj["metadata"]
                node = "gpu" if phase == "DELETED" else "spare"
                yield {"type": phase, "object": pod(meta["namespace"], meta["name"], i, node=node)}


async def burst(n: int, per: int) -> Json:
    gc.collect()
    gc.freeze()  # as `serve` does once started: what start-up made is out of the collector's way
    cache, tjs = world(n)
    listed = [
        pod(t["metadata"]["namespace"], t["metadata"]["name"], i) for t in tjs for i in range(per)
    ]
    events = list(burst_events(tjs, per))
    # The stream's last event, so the run knows the whole burst was read (not counted).
    end = {"type": "ADDED", "object": pod("bench", "end-of-burst", 0)}
    server = PodServer(listed, [*events, end])
    del listed
    api = ApiClient(configuration=Configuration(host=f"http://127.0.0.1:{server.port}"))
    metrics = Metrics()
    pods = GangPods()
    writer = LoopbackWriter(cache)
    recorder = EventRecorder(None, CONTROLLER, "bench")
    status = StatusWriter(cache, writer, recorder, pods, metrics=metrics)
    reconciler = Reconciler(cache, writer, recorder, ReconcilerSettings(), metrics=metrics,
                            status=status)  # fmt: skip
    stall = StallWatch()
    stall.start()
    tasks = [asyncio.create_task(i.run()) for i in pod_informers(api, pods)]
    tasks.append(asyncio.create_task(reconciler.run()))

    def reasons() -> dict[str, int]:
        found: dict[str, int] = {}
        for _, entry in cache.trainjobs.items():
            said = cond.stored_condition(entry.raw)
            reason = said.get("reason", "") if said else "none"
            found[str(reason)] = found.get(str(reason), 0) + 1
        return found

    async def settled(want: str) -> float:
        started = time.perf_counter()
        while True:
            await asyncio.sleep(0.05)
            queue = reconciler.queue
            idle = queue is not None and not len(queue)
            read = not server.go.is_set() or pods.jobs("bench", "end-of-burst")
            if idle and read and reasons() == {want: n} and len(pods) >= n * per:
                return time.perf_counter() - started

    await settled(cond.SCHEDULED)
    writes_before = writer.applies
    passes = (
        metrics.registry.get_sample_value(
            "controller_runtime_reconcile_total", {"controller": CONTROLLER, "result": "success"}
        )
        or 0.0
    )
    stall.reset()
    started = time.process_time()
    server.go.set()
    took = await settled(cond.SCHEDULED)
    longest, own = stall.reset()
    cpu = time.process_time() - started
    after = (
        metrics.registry.get_sample_value(
            "controller_runtime_reconcile_total", {"controller": CONTROLLER, "result": "success"}
        )
        or 0.0
    )
    degradations = sum(
        s.value
        for m in metrics.registry.collect()
        if m.name == "trainjob_scheduling_gang_degradations"
        for s in m.samples
        if s.name.endswith("_total")
    )
    for task in [*tasks, *([stall.task] if stall.task else [])]:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    close: Any = api.close
    await close()
    return {"trainjobs": n, "events": len(events), "seconds": took, "cpu": cpu,
            "stall_ms": longest * 1000, "own_ms": own * 1000, "passes": after - passes,
            "writes": writer.applies - writes_before, "degradations": degradations}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainjobs", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--burst-trainjobs", type=int, default=BURST // 100)
    args = parser.parse_args(argv)
    logging.getLogger("webhook").setLevel(logging.ERROR)  # each Event is logged too: not here
    m = memory(args.trainjobs, args.pods)
    print(f"gang health: the pod watch's memory, {m['gangs']:,} TrainJobs x {args.pods} pods "
          f"({m['pods']:,} pods of {m['pod_json']:,} bytes of JSON each)")  # fmt: skip
    print(
        f"  kept: {m['kept'] / 2**20:.1f} MiB; {m['per_gang'] / 1024:.1f} KiB per gang, "
        f"{m['per_pod']:.0f} bytes per pod; {m['us_per_event']:.1f} us of CPU per event"
    )
    b = asyncio.run(burst(args.burst_trainjobs, 100))
    print(f"gang health: a burst of {b['events']:,} pod events over {b['trainjobs']} TrainJobs "
          "(half their pods deleted, then replaced), through the informer, the reconciler and "
          "its status writer")  # fmt: skip
    print(f"  longest event-loop stall: {b['stall_ms']:.1f} ms (goal < 50 ms), the loop's own "
          f"CPU over it {b['own_ms']:.1f} ms (the rest: other processes); settled in "
          f"{b['seconds']:.2f} s ({b['cpu']:.2f} s CPU); {b['passes']:.0f} passes (coalesced "
          f"from {b['events']:,} events), {b['writes']} condition writes, "
          f"{b['degradations']:.0f} degradations")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

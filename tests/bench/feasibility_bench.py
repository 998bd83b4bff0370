"""Feasibility benchmark: admission latency of a TrainJob with feasibility on, and the memory of
the node summary, at 100, 1,000 and 10,000 nodes (`--sizes`).

Run with `make bench` (or `python -m tests.bench.feasibility_bench`). Numbers, not pass/fail.

The nodes look like a GPU cluster's: 3 zones, racks of 16 nodes (a rack label), 2 instance
types, about 25 labels each (node-feature-discovery style), a GPU taint on every GPU node, 1 in
50 cordoned, full kubelet status (images, conditions). So the summary holds about one shape per
rack and instance type: what a review reads grows with the racks, not the nodes.

Admission: TrainJob CREATE reviews over HTTPS (TLS 1.3, keep-alive, one at a time) to the
service's own server (`tests/harness.py`), its cache holding the runtime and the nodes:
* `off`: --feasibility=off, the baseline;
* `changed`: a node changes (cordoned, uncordoned) before every review, so the per-domain tally
  is made anew each time (what each pod needs of each node shape is remembered across changes);
* `sizes`: every review a new gang size on unchanged nodes (the tally reused);
* `same`: the same TrainJob again (the whole judgement reused).
"First judgement" is the core alone with nothing remembered: a pod shape never seen before.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import orjson

from tests.builders import Json, runtime, torch_node, trainjob
from tests.harness import running_server
from tests.nodes import GPU, RACK, ZONE, node
from tests.test_backends import TRAINJOB_PATH, cache_with, review
from webhook.core.feasibility import Nodes, gangs_of, judge
from webhook.core.nodes import NodeSummary
from webhook.core.plan import build_plan
from webhook.core.trainer import Runtime, TrainJob

ZONES = ("zone-a", "zone-b", "zone-c")
FEATURES = {f"feature.node.kubernetes.io/cpu-cpuid.AVX{i}": "true" for i in range(16)}
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}


def cluster(n: int) -> list[Json]:
    found = []
    for i in range(n):
        rack = i // 16
        gpu = rack % 4 != 3  # three racks in four are GPU racks
        labels = {
            **FEATURES,
            "node.kubernetes.io/instance-type": "p5.48xlarge" if gpu else "m7i.24xlarge",
            "nvidia.com/gpu.product": "H100-SXM" if gpu else "none",
            "karpenter.sh/nodepool": "gpu" if gpu else "cpu",
            "kubernetes.io/arch": "amd64",
        }
        found.append(
            node(
                f"node-{i:05d}",
                zone=ZONES[rack % 3],
                rack=f"rack-{rack:04d}",
                gpus=8 if gpu else 0,
                cpu="192" if gpu else "96",
                memory="2000Gi" if gpu else "384Gi",
                taints=[GPU_TAINT] if gpu else None,
                cordoned=i % 50 == 49,
                labels=labels,
            )
        )
    return found


def gpu_runtime() -> Json:
    job = torch_node()
    spec = job["template"]["spec"]["template"]["spec"]
    spec["containers"] = [{"name": "node", "image": "x", "resources": {"requests": {
        GPU: 8, "cpu": "90", "memory": "1000Gi"}}}]  # fmt: skip
    spec["tolerations"] = [{"key": GPU, "operator": "Exists"}]
    spec["nodeSelector"] = {"nvidia.com/gpu.product": "H100-SXM"}
    return runtime(job, scheduling={"schedulingConstraints": {"topology": [{"key": ZONE}]}})


def memory(nodes: list[Json]) -> tuple[int, int, NodeSummary]:
    """Bytes the summary keeps, and what a store of the whole objects would."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    summary = NodeSummary()
    summary.replace(summary.trim(n) for n in nodes)
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    whole = len(orjson.dumps(nodes))  # JSON bytes; the parsed dicts take several times more
    return kept, whole, summary


def core_times(summary: NodeSummary, pods: int) -> tuple[float, float]:
    """(ms to judge the gang with nothing remembered, ms to apply one node event)."""
    rt = Runtime.model_validate(gpu_runtime())
    tj = TrainJob.model_validate(trainjob(num_nodes=pods))
    plan = build_plan(tj, rt)
    assert plan is not None
    (gang,), _ = gangs_of(plan, rt, tj)
    view = Nodes(summary.shapes, summary.dropped_keys)
    runs = 20
    start = time.perf_counter()
    for _ in range(runs):
        judge(gang.demand, view)
    judged = (time.perf_counter() - start) / runs
    one = node("node-00000", zone="zone-a", rack="rack-0000", gpus=8, cordoned=True)
    start = time.perf_counter()
    for _ in range(runs):
        summary.apply("MODIFIED", one)
    applied = (time.perf_counter() - start) / runs
    return judged * 1e3, applied * 1e3


def latencies(
    client: Any, bodies: list[bytes], before: Callable[[int], None] | None = None
) -> list[float]:
    out = []
    for i, body in enumerate(bodies):
        if before is not None:
            before(i)
        start = time.perf_counter()
        answer = client.post(TRAINJOB_PATH, content=body)
        out.append(time.perf_counter() - start)
        assert answer.status_code == 200, answer.text
    return out


def show(label: str, seconds: list[float]) -> None:
    ms = sorted(s * 1e3 for s in seconds)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    print(f"    {label:<8} p50 {statistics.median(ms):7.2f} ms   p99 {p99:7.2f} ms")


def bench(n: int, reviews: int) -> None:
    nodes = cluster(n)
    kept, whole, summary = memory(nodes)
    judged, applied = core_times(summary, pods=n // 8)
    racks = len({o["metadata"]["labels"][RACK] for o in nodes})
    print(f"{n:,} nodes ({racks} racks): {len(summary.shapes)} node shapes")
    print(f"    summary  {kept / 1e6:7.2f} MB ({kept / n:,.0f} B per node); the nodes' JSON "
          f"{whole / 1e6:,.1f} MB")  # fmt: skip
    print(f"    first judgement {judged:6.2f} ms; one node event {applied * 1e3:6.1f} us")
    with TemporaryDirectory() as tmp:
        cache = cache_with(gpu_runtime())
        cache.nodes.replace(summary.trim(o) for o in nodes)
        sizes = [1 + (i * 37) % max(n // 4, 2) for i in range(reviews)]  # mostly distinct
        bodies = [orjson.dumps(review(trainjob(num_nodes=s))) for s in sizes]
        same = [bodies[0]] * reviews
        with running_server(cache, Path(tmp) / "certs") as srv, srv.client() as client:
            latencies(client, bodies[:20])  # warm up the connection and the code paths
            cache.feasibility.mode = "off"
            show("off", latencies(client, bodies))
            cache.feasibility.mode = "warn"
            loop = srv.loop
            assert loop is not None
            states = [nodes[0], {**nodes[0], "spec": {**nodes[0]["spec"], "unschedulable": True}}]

            async def change(i: int) -> None:  # on the server's loop, as the watch would
                cache.nodes.apply("MODIFIED", summary.trim(states[i % 2]))

            def changing(i: int) -> None:
                asyncio.run_coroutine_threadsafe(change(i), loop).result()

            show("changed", latencies(client, bodies, before=changing))
            show("sizes", latencies(client, bodies))
            show("same", latencies(client, same))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--reviews", type=int, default=200)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}; TrainJob CREATE reviews over HTTPS, one at a time")
    for n in (int(s) for s in args.sizes.split(",")):
        bench(n, args.reviews)


if __name__ == "__main__":
    main()

"""Planner benchmark: prints how fast the pure core parses, validates, plans and maps pods.

Run with `make bench` (or `python -m tests.bench.plan_bench`). Numbers, not pass/fail: the
admission path will call `pod_group_for_labels` on every pod and plan once per TrainJob.
"""

from __future__ import annotations

import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from webhook.core.plan import build_plan, pod_group_for_labels
from webhook.core.trainer import Runtime, TrainJob
from webhook.core.validation import check_stored_runtime, validate_runtime

SAMPLES = Path(__file__).resolve().parent.parent.parent / "webhook" / "samples"
CASES = {
    "level 1, 100 nodes": ("torch-distributed.runtime.yaml", "torch-100-nodes.trainjob.yaml"),
    "level 2, deepspeed": ("deepspeed-distributed.runtime.yaml", "deepspeed-8-nodes.trainjob.yaml"),
    "level 3, rack": ("torch-rack.runtime.yaml", "torch-rack.trainjob.yaml"),
}


def load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((SAMPLES / name).read_text())
    return doc


def per_call(fn: Callable[[], object], seconds: float = 0.5) -> float:
    """Mean seconds per call over about `seconds` of wall time (after a warm-up)."""
    for _ in range(20):
        fn()
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(50):
            fn()
        n += 50
    return elapsed / n


def row(label: str, seconds: float) -> None:
    print(f"  {label:<34} {seconds * 1e6:9.1f} us   {1 / seconds:12,.0f} /s")


def import_cost(module: str) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout)


def bench_case(case: str, runtime_file: str, trainjob_file: str) -> None:
    raw_rt, raw_tj = load(runtime_file), load(trainjob_file)
    rt, tj = Runtime.model_validate(raw_rt), TrainJob.model_validate(raw_tj)
    checked = check_stored_runtime(rt)
    plan = build_plan(tj, rt)
    assert plan is not None
    group = plan.groups[-1]
    labels = {
        "jobset.sigs.k8s.io/jobset-name": plan.trainjob_name,
        "jobset.sigs.k8s.io/replicatedjob-name": group.replicated_jobs[0],
        "jobset.sigs.k8s.io/job-index": str(group.job_index or 0),
    }
    assert pod_group_for_labels(plan, labels) == group.pod_group_name
    print(f"{case}: {len(plan.groups)} group(s)")
    row("parse runtime (pydantic)", per_call(lambda: Runtime.model_validate(raw_rt)))
    row("validate runtime (raw)", per_call(lambda: validate_runtime(raw_rt)))
    row("build_plan", per_call(lambda: build_plan(tj, rt)))
    row("build_plan, runtime checked once", per_call(lambda: build_plan(tj, checked)))
    row("pod_group_for_labels", per_call(lambda: pod_group_for_labels(plan, labels)))


def main() -> None:
    print(f"python {sys.version.split()[0]}")
    for case, (runtime_file, trainjob_file) in CASES.items():
        bench_case(case, runtime_file, trainjob_file)

    # Memory: plans held for many TrainJobs (what a cache of plans would cost).
    rt = Runtime.model_validate(load("deepspeed-distributed.runtime.yaml"))
    jobs = [
        TrainJob.model_validate(
            {
                "metadata": {"name": f"job-{i}", "namespace": "team-a"},
                "spec": {
                    "runtimeRef": {"name": "deepspeed-distributed"},
                    "trainer": {"numNodes": 8},
                },
            }
        )
        for i in range(10_000)
    ]
    tracemalloc.start()
    start = time.perf_counter()
    plans = [build_plan(job, rt) for job in jobs]
    elapsed = time.perf_counter() - start
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"10,000 level-2 plans: {elapsed:.2f} s (under tracemalloc), "
        f"{current / len(plans):,.0f} bytes/plan held, peak {peak / 2**20:.1f} MiB"
    )
    print(
        f"import webhook.core.plan: {import_cost('webhook.core.plan') * 1e3:.0f} ms; "
        f"import webhook.backends.native: {import_cost('webhook.backends.native') * 1e3:.0f} ms"
    )


if __name__ == "__main__":
    main()

"""Part B (issue 37): N TrainJobs on fake nodes through the real Trainer, JobSet and Job
controllers and kube-scheduler, against one service process (started fresh for each N): its RSS
and CPU (from /proc), TrainJob -> PodGroup, pod admission.

Each TrainJob is a gang of 2 pods (one `node` Job of parallelism 2, numNodes 2), created at a
steady rate over a few namespaces (round-robin), its pods on fake nodes (never run). Measured:

* the service's RSS: idle (ready, before the first TrainJob), peak (VmHWM, and the highest
  sample every 0.5 s) and settled (every gang bound, then quiet for a while); CPU seconds while
  the TrainJobs came and settled, and idle CPU per second;
* TrainJob -> PodGroup: from the create's answer to the PodGroup's ADDED event (watch), per
  TrainJob; TrainJob -> all its pods bound, for reference;
* pod admission: each pod review's duration as the service logs it (`duration_ms` of its review
  log line: exact), its own histogram (`controller_runtime_webhook_latency_seconds`) and the
  API server's (`apiserver_admission_webhook_admission_duration_seconds` for the chart's pod
  webhook: the round trip, TLS and queueing included), each as the growth over the run;
* the CPU of the control plane and the Trainer stack meanwhile (from the harness's pid files),
  to show where the machine's two cores went.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.cluster import TRAINER_GROUP, TRAINER_VERSION
from tests.e2e.objects import replicated_job, runtime, trainjob

from .session import (
    Sampler,
    Session,
    apiserver_samples,
    cpu_seconds,
    harness_pids,
    rss_kib,
    session,
)
from .stats import (
    bucket_delta,
    buckets_of,
    histogram_quantile,
    summary,
)
from .timeline import Timeline

PODS_PER_TRAINJOB = 2
PODS_PER_NODE = 100  # of a fake node's 110
POD_WEBHOOK_PATH = "/mutate--v1-pod"
POD_WEBHOOK_NAME = "mutate--v1-pod"
APISERVER_POD_WEBHOOK = "pods.mutate.trainjob-scheduling.kubeflow.org"  # the chart's name
SERVICE_HISTOGRAM = "controller_runtime_webhook_latency_seconds"
APISERVER_HISTOGRAM = "apiserver_admission_webhook_admission_duration_seconds"
IDLE_SECONDS = 15.0
QUIET_SECONDS = 20.0


@dataclass
class Created:
    namespace: str
    name: str
    uid: str
    at: float


def gang_runtime(name: str, pool: str, namespace: str) -> dict[str, Any]:
    return runtime(
        name,
        {"schedulingPolicy": {"gang": {}}},
        [replicated_job("node", pool, ancestor="trainer", cpu="10m")],
        namespace=namespace,
    )


def review_durations(log_text: str, webhook: str) -> list[float]:
    """The `duration_ms` of every review line the service logged for `webhook`, in seconds."""
    found = []
    for line in log_text.splitlines():
        if f'"webhook":"{webhook}"' not in line or '"duration_ms"' not in line:
            continue
        try:
            found.append(float(json.loads(line)["duration_ms"]) / 1000)
        except (ValueError, KeyError):
            continue
    return found


@dataclass
class Progress:
    created: list[Created] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def create_at_rate(
    s: Session,
    n: int,
    rate: float,
    namespaces: list[str],
    runtimes: dict[str, Any],
    progress: Progress,
) -> None:
    """N TrainJobs, the i-th due `i / rate` seconds after the first, round-robin over the
    namespaces (8 threads, so a slow answer does not delay the next)."""
    start = time.monotonic()

    def one(i: int) -> None:
        due = start + i / rate
        time.sleep(max(0.0, due - time.monotonic()))
        ns = namespaces[i % len(namespaces)]
        name = f"scale-{i:05d}"
        body = trainjob(name, ns, runtimes[ns], num_nodes=PODS_PER_TRAINJOB)
        for attempt in range(5):
            try:
                made = s.cluster.create(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", body, ns)
                at = time.monotonic()
                with progress.lock:
                    progress.created.append(Created(ns, name, str(made["metadata"]["uid"]), at))
                return
            except Exception as err:
                if attempt == 4:
                    with progress.lock:
                        progress.errors.append(f"{ns}/{name}: {err}"[:300])
                time.sleep(1)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(n)))


def run_size(
    n: int,
    rate: float,
    workdir: Path,
    namespaces: int,
    log: Callable[[str], None] = print,
    deadline: float | None = None,
) -> dict[str, Any]:
    keys = [f"scale{i}" for i in range(namespaces)]
    with session(keys, workdir / f"scale-{n}") as s:
        service = s.replicas[0]
        assert service.process is not None
        pid = service.process.pid
        sampler = Sampler(pid)
        sampler.start()
        names = [s.namespace(k) for k in keys]
        pool = s.scenario(keys[0]).pool()
        nodes = math.ceil(n * PODS_PER_TRAINJOB / PODS_PER_NODE) + 1
        pool.add(nodes, cpu=64)
        runtimes = {
            ns: s.scenario(k).apply_runtime(gang_runtime("gang", pool.name, ns))
            for k, ns in zip(keys, names, strict=True)
        }
        timeline = Timeline(s.cluster, set(names))
        timeline.start()
        time.sleep(IDLE_SECONDS)
        idle_rss = rss_kib(pid)[0]
        idle_cpu_start = cpu_seconds(pid)
        time.sleep(5)
        idle_cpu_rate = (cpu_seconds(pid) - idle_cpu_start) / 5
        others = harness_pids()
        others_before = {k: cpu_seconds(p) for k, p in others.items()}
        service_before = service.samples()
        apiserver_before = apiserver_samples(s.cluster)
        cpu_before = cpu_seconds(pid)
        log(
            f"  N={n}: idle RSS {idle_rss / 1024:.1f} MiB, {nodes} fake nodes; creating at {rate}/s"
        )
        started = time.monotonic()
        progress = Progress()
        creator = threading.Thread(
            target=create_at_rate, args=(s, n, rate, names, runtimes, progress), daemon=True
        )
        creator.start()
        limit = deadline or max(600.0, n * 1.5)
        last_report = 0.0
        while True:
            with progress.lock:
                uids = {c.uid for c in progress.created}
            with timeline.lock:
                grouped = {g.owner for g in timeline.groups.values() if g.owner in uids}
                bound = sum(
                    1 for p in timeline.pods.values() if p.bound is not None and p.deleting is None
                )
            done = (
                not creator.is_alive()
                and len(grouped) == len(uids)
                and bound >= PODS_PER_TRAINJOB * len(uids)
            )
            now = time.monotonic()
            if done:
                break
            if now - last_report > 15:
                last_report = now
                log(
                    f"    {now - started:.0f} s: {len(uids)} created, {len(grouped)} with a "
                    f"PodGroup, {bound} pods bound, RSS {rss_kib(pid)[0] / 1024:.1f} MiB"
                )
            if now - started > limit:
                raise TimeoutError(
                    f"N={n}: after {limit:.0f} s {len(uids)} created, {len(grouped)} with a "
                    f"PodGroup, {bound} pods bound"
                )
            time.sleep(0.5)
        settled = time.monotonic()
        cpu_settled = cpu_seconds(pid)
        log(f"    settled after {settled - started:.1f} s; quiet {QUIET_SECONDS:.0f} s")
        time.sleep(QUIET_SECONDS)
        settled_rss = rss_kib(pid)[0]
        hwm = rss_kib(pid)[1]
        service_after = service.samples()
        apiserver_after = apiserver_samples(s.cluster)
        others_after = {k: cpu_seconds(p) for k, p in others.items()}
        sampler.stop()
        timeline.stop()
        created = progress.created
        by_uid = {c.uid: c for c in created}
        first_group: dict[str, float] = {}
        for g in timeline.groups.values():
            if g.owner in by_uid:
                first_group[g.owner] = min(first_group.get(g.owner, math.inf), g.added)
        to_group = [first_group[u] - c.at for u, c in by_uid.items() if u in first_group]
        pods_by_tj: dict[tuple[str, str], list[float]] = {}
        for p in timeline.pods.values():
            if p.bound is not None:
                pods_by_tj.setdefault((p.namespace, p.trainjob), []).append(p.bound)
        to_bound = [
            max(pods_by_tj[(c.namespace, c.name)]) - c.at
            for c in created
            if len(pods_by_tj.get((c.namespace, c.name), [])) >= PODS_PER_TRAINJOB
        ]
        service_pods = bucket_delta(
            buckets_of(service_after, SERVICE_HISTOGRAM, {"webhook": POD_WEBHOOK_PATH}),
            buckets_of(service_before, SERVICE_HISTOGRAM, {"webhook": POD_WEBHOOK_PATH}),
        )
        api_pods = bucket_delta(
            buckets_of(apiserver_after, APISERVER_HISTOGRAM, {"name": APISERVER_POD_WEBHOOK}),
            buckets_of(apiserver_before, APISERVER_HISTOGRAM, {"name": APISERVER_POD_WEBHOOK}),
        )
        logged = review_durations(service.log_text(), POD_WEBHOOK_NAME)
        busy = settled - started
        figures: dict[str, Any] = {
            "n": n,
            "rate": rate,
            "namespaces": namespaces,
            "fake_nodes": nodes,
            "created": len(created),
            "create_errors": progress.errors[:10],
            "seconds_to_settle": busy,
            "rss_idle_mib": idle_rss / 1024,
            "rss_settled_mib": settled_rss / 1024,
            "rss_peak_mib": max(sampler.peak(), hwm) / 1024,
            "rss_per_trainjob_kib": (settled_rss - idle_rss) / max(1, len(created)),
            "cpu_seconds": cpu_settled - cpu_before,
            "cpu_ms_per_trainjob": 1000 * (cpu_settled - cpu_before) / max(1, len(created)),
            "cpu_busy_share": (cpu_settled - cpu_before) / busy if busy else math.nan,
            "cpu_idle_per_second": idle_cpu_rate,
            "trainjob_to_podgroup": summary(to_group),
            "trainjob_to_bound": summary(to_bound),
            "pod_reviews_logged": summary(logged),
            "pod_review_service_histogram": {
                "count": max(service_pods.values(), default=0.0),
                "p50": histogram_quantile(0.5, service_pods),
                "p99": histogram_quantile(0.99, service_pods),
            },
            "pod_review_apiserver_histogram": {
                "count": max(api_pods.values(), default=0.0),
                "p50": histogram_quantile(0.5, api_pods),
                "p99": histogram_quantile(0.99, api_pods),
            },
            "others_cpu_seconds": {
                k: others_after[k] - v for k, v in others_before.items() if k in others_after
            },
            "rss_series": [(round(t - started, 1), r) for t, r in sampler.samples[::4]],
            "notes": s.notes,
        }
        log(
            f"    RSS idle {figures['rss_idle_mib']:.1f} MiB, settled "
            f"{figures['rss_settled_mib']:.1f} MiB, peak {figures['rss_peak_mib']:.1f} MiB; "
            f"CPU {figures['cpu_seconds']:.1f} s; TrainJob->PodGroup p50 "
            f"{figures['trainjob_to_podgroup']['p50']:.2f} s p99 "
            f"{figures['trainjob_to_podgroup']['p99']:.2f} s; pod review p99 (logged) "
            f"{figures['pod_reviews_logged']['p99'] * 1000:.1f} ms"
        )
        log("    cleaning up (the namespaces, their pods, the fake nodes)")
    return figures


def growth(sizes: list[dict[str, Any]]) -> dict[str, Any]:
    """From the two largest sizes: RSS per TrainJob (slope), CPU per TrainJob, and the p99s'
    exponent (p99 ~ N^a), each carried to 10,000."""
    if len(sizes) < 2:
        return {}
    small, large = sorted(sizes, key=lambda x: x["n"])[-2:]
    dn = large["n"] - small["n"]
    slope = (large["rss_settled_mib"] - small["rss_settled_mib"]) * 1024 / dn  # KiB/TrainJob
    peak_slope = (large["rss_peak_mib"] - small["rss_peak_mib"]) * 1024 / dn

    def exponent(key: str) -> float:
        a, b = small[key]["p99"], large[key]["p99"]
        if not (a > 0 and b > 0):
            return math.nan
        return math.log(b / a) / math.log(large["n"] / small["n"])

    out: dict[str, Any] = {
        "from": [small["n"], large["n"]],
        "rss_kib_per_trainjob": slope,
        "peak_rss_kib_per_trainjob": peak_slope,
        "rss_settled_at_10000_mib": large["rss_settled_mib"] + slope * (10_000 - large["n"]) / 1024,
        "rss_peak_at_10000_mib": large["rss_peak_mib"] + peak_slope * (10_000 - large["n"]) / 1024,
        "cpu_ms_per_trainjob": large["cpu_ms_per_trainjob"],
        "cpu_seconds_at_10000": large["cpu_ms_per_trainjob"] * 10,
    }
    for key in ("trainjob_to_podgroup", "pod_reviews_logged"):
        a = exponent(key)
        out[f"{key}_p99_exponent"] = a
        out[f"{key}_p99_at_10000"] = (
            large[key]["p99"] * (10_000 / large["n"]) ** a if not math.isnan(a) else math.nan
        )
    return out

"""One run of the bench against a real control plane: the end-to-end suite's machinery
(tests/e2e: the cluster client and its checks, the chart's webhook configurations registered for
a service started out of the cluster, fake nodes, runtimes and TrainJobs), with what the bench
adds: several replicas with leader election behind one address (`Front`, as a Service spreads
the API server's calls over the ready replicas), the service's RSS and CPU from /proc, the
service's and the API server's metrics.

Everything made is labelled as the end-to-end suite labels its runs (`tests/e2e/registration.py`:
a dead run's leftovers are swept by `python -m tests.e2e.registration`), and deleted at the end.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import httpx
from kubernetes.client.exceptions import ApiException

from tests.e2e.cluster import (
    JSON_PATCH,
    TRAINER_GROUP,
    TRAINER_VERSION,
    Cluster,
    Json,
    ServerFacts,
    check_apis,
    connect,
    feature_gates,
    poll,
    probe_dropped_fields,
)
from tests.e2e.objects import TRAINER_STACK_LABEL
from tests.e2e.recorder import PodRecorder
from tests.e2e.registration import (
    ADMISSION_GROUP,
    ADMISSION_VERSION,
    KINDS,
    OWNER_ANNOTATION,
    RUN_LABEL,
    Registration,
    chart_configurations,
    for_local_service,
    owner,
    register,
    sweep,
    unregister,
)
from tests.e2e.scenario import Run, Scenario
from tests.e2e.service import LocalService, Service, parse_samples
from tests.harness import free_port, make_certs

from .stats import Samples

HARNESS = Path(os.environ.get("HARNESS_DIR", Path.home() / "harness"))
LEASE = "trainjob-scheduling-bench"
APISERVER_WEBHOOK_HISTOGRAM = "apiserver_admission_webhook_admission_duration_seconds"
OUR_WEBHOOKS = ".trainjob-scheduling.kubeflow.org"  # the chart's webhook names end so


@dataclass
class Replica(LocalService):
    """A `serve` process as the end-to-end suite starts it; with `lease_namespace`, leader
    elected on the Lease `LEASE` there (the chart's default timings), and its certificates in
    `shared_certs` so that every replica answers for the one CA registered."""

    lease_namespace: str = ""
    shared_certs: Path | None = None
    extra: tuple[str, ...] = ()

    @property
    def cert_dir(self) -> Path:
        return self.shared_certs or self.workdir / "certs"

    def args(self) -> list[str]:
        args = super().args()
        if self.lease_namespace:
            args = [a for a in args if a != "--leader-elect=false"]
            args += [
                "--leader-elect=true",
                "--namespace",
                self.lease_namespace,
                "--lease-name",
                LEASE,
            ]
        return [*args, *self.extra]

    def ready(self) -> bool:
        if not self.running:
            return False
        try:
            url = f"http://127.0.0.1:{self.health_port}/readyz"
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def leading(self) -> bool:
        try:
            samples = self.metrics() or {}
        except (httpx.HTTPError, OSError):
            return False
        return any(
            name == "leader_election_master_status" and value == 1.0
            for (name, _), value in samples.items()
        )

    def samples(self) -> Samples:
        """/metrics now; empty when the process does not answer."""
        if not self.running:
            return {}
        try:
            return self.metrics() or {}
        except (httpx.HTTPError, OSError):
            return {}


class Front:
    """One address in front of the replicas, as the webhook Service is: each connection the API
    server opens goes to the next ready replica (its /readyz polled every `period` seconds, as
    the endpoints follow readiness), bytes passed through (TLS ends at the replica). No ready
    replica: the connection is closed at once (the API server's "no endpoints")."""

    def __init__(self, replicas: list[Replica], period: float = 0.25) -> None:
        self.replicas = replicas
        self.period = period
        self.port = free_port()
        self.ready: list[bool] = [False] * len(replicas)
        self.turn = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True, name="front")
        self.started = threading.Event()
        self.connections = 0
        self.refused = 0

    def start(self) -> None:
        self.thread.start()
        if not self.started.wait(10):
            raise RuntimeError("the front did not start")

    def stop(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port)
        )
        self.loop.create_task(self._probe())
        self.started.set()
        try:
            self.loop.run_forever()
        finally:
            server.close()
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.close()

    async def _probe(self) -> None:
        while True:
            states = await asyncio.gather(
                *(asyncio.to_thread(r.ready) for r in self.replicas), return_exceptions=True
            )
            self.ready = [s is True for s in states]
            await asyncio.sleep(self.period)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        count = len(self.replicas)
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        for step in range(count):
            index = (self.turn + step) % count
            if not self.ready[index]:
                continue
            with contextlib.suppress(OSError):
                upstream = await asyncio.open_connection("127.0.0.1", self.replicas[index].port)
                self.turn = index + 1
                break
        if upstream is None:
            self.refused += 1
            writer.close()
            return
        up_reader, up_writer = upstream

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while chunk := await src.read(65536):
                    dst.write(chunk)
                    await dst.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


# --- the process's RSS and CPU, from /proc -------------------------------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def proc_tree(pid: int) -> list[int]:
    """`pid` and its descendants (by /proc/<pid>/task/*/children)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                with contextlib.suppress(OSError):
                    text = Path(f"/proc/{current}/task/{task}/children").read_text()
                    todo += [int(c) for c in text.split()]
    return found


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in KiB of the process tree (0 when gone)."""
    rss = hwm = 0
    for member in proc_tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1])
                elif line.startswith("VmHWM:"):
                    hwm += int(line.split()[1])
    return rss, hwm


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of the process tree so far (0 when gone)."""
    ticks = 0
    for member in proc_tree(pid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks / CLOCK_TICKS


def harness_pids() -> dict[str, int]:
    """The control plane's and the Trainer stack's processes, from the harness's pid files."""
    found = {}
    for folder in (HARNESS / "run", HARNESS / "stack" / "run"):
        for pidfile in sorted(folder.glob("*.pid")) if folder.is_dir() else []:
            with contextlib.suppress(OSError, ValueError):
                pid = int(pidfile.read_text().split()[0])
                if Path(f"/proc/{pid}").exists():
                    found[pidfile.stem] = pid
    return found


@dataclass
class Sampler:
    """The service's RSS every `period` seconds, in a thread: (monotonic time, RSS KiB)."""

    pid: int
    period: float = 0.5
    samples: list[tuple[float, int]] = field(default_factory=list)
    stop_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True, name="sampler")
        self.thread.start()

    def _run(self) -> None:
        while not self.stop_event.is_set():
            rss, _ = rss_kib(self.pid)
            if rss:
                self.samples.append((time.monotonic(), rss))
            self.stop_event.wait(self.period)

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout=5)

    def peak(self, since: float = 0.0, until: float = float("inf")) -> int:
        return max((r for t, r in self.samples if since <= t <= until), default=0)


# --- the API server's metrics --------------------------------------------------------------------


def apiserver_samples(cluster: Cluster) -> Samples:
    """kube-apiserver's admission-webhook histogram, for this service's webhooks only."""
    status, text = cluster.get_text("/metrics")
    if status != 200:
        return {}
    lines = [
        line
        for line in text.splitlines()
        if (line.startswith(APISERVER_WEBHOOK_HISTOGRAM) and OUR_WEBHOOKS in line)
        or line.startswith(f"# TYPE {APISERVER_WEBHOOK_HISTOGRAM} ")
    ]
    return parse_samples("\n".join(lines) + "\n", (APISERVER_WEBHOOK_HISTOGRAM,))


# --- a session ------------------------------------------------------------------------------------


@dataclass
class Session:
    cluster: Cluster
    facts: ServerFacts
    run: Run
    username: str
    workdir: Path
    replicas: list[Replica]
    front: Front | None
    registration: Registration | None = None
    scenarios: dict[str, Scenario] = field(default_factory=dict)  # by namespace key
    notes: list[str] = field(default_factory=list)

    def namespace(self, key: str) -> str:
        return self.run.namespaces[key]

    def scenario(self, key: str) -> Scenario:
        """The end-to-end suite's view of one namespace (its waits, runtimes, TrainJobs, plans;
        its pod recorder is not started: the bench's Timeline watches instead)."""
        if key not in self.scenarios:
            namespace = self.namespace(key)
            recorder = PodRecorder(self.cluster, namespace, lambda: self.run.fake_nodes)
            self.scenarios[key] = Scenario(
                self.cluster, namespace, Service(), self.facts, self.run, recorder
            )
        return self.scenarios[key]

    def samples(self) -> dict[tuple[int, int], Samples]:
        """Each running replica's /metrics, by (replica, start): a restarted replica's counters
        begin again at 0."""
        return {(i, r.starts): r.samples() for i, r in enumerate(self.replicas) if r.running}

    def point_webhooks_at(self, port: int) -> None:
        """Every registered webhook's URL moved to `port` (the path kept)."""
        assert self.registration is not None
        for obj in self.registration.objects:
            kind, name = str(obj["kind"]), str(obj["metadata"]["name"])
            ops = []
            for i, hook in enumerate(obj.get("webhooks") or []):
                path = str(hook["clientConfig"]["url"]).split("/", 3)[3]
                url = f"https://127.0.0.1:{port}/{path}"
                ops.append(
                    {"op": "replace", "path": f"/webhooks/{i}/clientConfig/url", "value": url}
                )
            self.cluster.patch(
                ADMISSION_GROUP,
                ADMISSION_VERSION,
                KINDS[kind],
                None,
                name,
                ops,
                content_type=JSON_PATCH,
            )


class _Interrupted(KeyboardInterrupt):
    pass


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    del frame
    raise _Interrupted(f"signal {signum}")


def configure(kubeconfig: str) -> None:
    """The end-to-end client reads its cluster from the environment: name this one."""
    os.environ["E2E_KUBECONFIG"] = kubeconfig
    os.environ.pop("E2E", None)


@contextlib.contextmanager
def session(
    keys: list[str],
    workdir: Path,
    *,
    replicas: int = 1,
    lease_key: str | None = None,
    extra_args: tuple[str, ...] = (),
) -> Iterator[Session]:
    """The cluster, the run's namespaces (`keys`, labelled for the run's webhooks and for the
    harness's Trainer and JobSet webhooks), `replicas` service processes watching them (leader
    elected on a Lease in the namespace `lease_key` when given; behind a `Front` when more
    than one), the chart's webhook configurations registered for them. At the end, whatever
    happened: the registration deleted first, then the processes stopped, the namespaces (with
    everything in them), fake nodes and runtimes deleted."""
    cluster = connect()
    check_apis(cluster, check_crd=True)
    run_id = secrets.token_hex(3)
    run = Run(run_id, {key: f"wasched-bench-{run_id}-{key}"[:63] for key in keys})
    facts = ServerFacts(
        scheduling_version=cluster.scheduling_version,
        gates=feature_gates(cluster),
        dropped_fields=probe_dropped_fields(cluster, "default"),
        trainer_stack=True,
    )
    notes = []
    swept = sweep(cluster)
    if swept:
        notes.append(f"deleted what dead runs left: {', '.join(swept)}")
    username = cluster.whoami()
    workdir.mkdir(parents=True, exist_ok=True)
    namespaces = sorted(run.namespaces.values())
    lease_namespace = run.namespaces[lease_key] if lease_key else ""
    shared = workdir / f"certs-{run_id}"
    processes = [
        Replica(
            workdir / f"replica-{run_id}-{i}",
            cluster.kubeconfig,
            namespaces,
            username,
            lease_namespace=lease_namespace,
            shared_certs=shared,
            extra=extra_args,
        )
        for i in range(replicas)
    ]
    for process in processes:
        process.workdir.mkdir(parents=True, exist_ok=True)
    shared.mkdir(parents=True, exist_ok=True)
    make_certs(shared)  # once, before any replica starts: they must not write it at once
    front = Front(processes) if replicas > 1 else None
    handlers = {
        sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)
    }
    atexit.register(unregister, cluster, run.id)
    made = Session(cluster, facts, run, username, workdir, processes, front, notes=notes)
    try:
        for namespace in namespaces:
            cluster.create_namespace(
                namespace, {**run.labels, TRAINER_STACK_LABEL: "true"}, {OWNER_ANNOTATION: owner()}
            )
        for process in processes:
            # From this thread: a replica gets SIGTERM when the thread that started it ends
            # (the end-to-end suite's PR_SET_PDEATHSIG follows the parent thread).
            process.start()
            if not poll(process.ready, "the replica ready", 30, interval=0.2):
                raise RuntimeError(f"a replica did not start\n{process.describe()}")
            said = poll(process.identity, "the service says who it is", 20, interval=0.2)
            assert said is not None and said[0] == username, (said, username)
        if front is not None:
            front.start()
        port = front.port if front is not None else processes[0].port
        configurations = for_local_service(
            chart_configurations(namespaces, run.id),
            run=run.id,
            port=port,
            ca_pem=processes[0].ca_file.read_bytes(),
            username=username,
        )
        made.registration = register(cluster, configurations, run.id)
        yield made
    finally:
        unregister(cluster, run.id)
        for process in processes:
            process.stop()
        if front is not None:
            front.stop()
        cleanup(cluster, run)
        with contextlib.suppress(Exception):
            atexit.unregister(unregister)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        cluster.close()


def cleanup(cluster: Cluster, run: Run, wait: float = 900.0) -> list[str]:
    """The run's namespaces deleted (their pods on fake nodes force-deleted, as no kubelet
    confirms), waited for, then its fake nodes and cluster-scoped runtimes (by the run's label);
    what may be left."""
    left: list[str] = []
    for namespace in run.namespaces.values():
        with contextlib.suppress(ApiException):
            cluster.delete("", "v1", "namespaces", namespace)
    deadline = time.monotonic() + wait
    pending = set(run.namespaces.values())
    while pending and time.monotonic() < deadline:
        for namespace in sorted(pending):
            try:
                if cluster.get("", "v1", "namespaces", namespace) is None:
                    pending.discard(namespace)
                    continue
                for pod in cluster.list_objects("", "v1", "pods", namespace):
                    meta = pod["metadata"]
                    if meta.get("deletionTimestamp"):
                        with contextlib.suppress(ApiException):
                            cluster.delete(
                                "",
                                "v1",
                                "pods",
                                meta["name"],
                                namespace,
                                grace_seconds=0,
                                uid=meta["uid"],
                            )
            except Exception:  # transient: try again
                pass
        time.sleep(2)
    left += [f"namespace {n} (still terminating)" for n in sorted(pending)]
    selector = f"{RUN_LABEL}={run.id}"
    for group, version, plural in (
        ("", "v1", "nodes"),
        (TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes"),
    ):
        try:
            for obj in cluster.list_objects(group, version, plural, labels=selector):
                cluster.delete(group, version, plural, obj["metadata"]["name"])
        except Exception as err:
            left.append(f"{plural} of run {run.id} ({err})")
    return left


def force_delete_pods(cluster: Cluster, namespace: str, pods: list[Json]) -> None:
    for pod in pods:
        meta = pod["metadata"]
        with contextlib.suppress(ApiException):
            cluster.delete(
                "", "v1", "pods", meta["name"], namespace, grace_seconds=0, uid=meta["uid"]
            )


def host() -> str:
    return f"{socket.gethostname()}, {os.cpu_count()} cores"

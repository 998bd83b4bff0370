"""A real webhook server for tests: TLS on a free port, run in a thread (or a subprocess).

Tests talk to it over real HTTPS with httpx; nothing inside the server is patched.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import json
import os
import random
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from aiohttp import web
from kubernetes.aio.client import Configuration

from webhook.admission.review import Decision
from webhook.core.fields import parse
from webhook.core.snapshot import PLAN_VERSION, SNAPSHOT_ANNOTATION, snapshot, snapshot_of
from webhook.core.trainer import TrainJob
from webhook.kube.cache import Cache
from webhook.kube.lookup import TrainJobLookup
from webhook.kube.metered import MeteredApiClient
from webhook.server.app import Limits
from webhook.server.reviewlog import ReviewLog
from webhook.server.run import Service, Settings
from webhook.tls.certs import CertSpec, issue, write
from webhook.tls.reload import ReloadingContext

from .paths import FIXTURES, REPO

# The objects the fixture reviews were captured against, as the cluster stored them last.
CACHE_OBJECTS = (
    "clustertrainingruntime-update-server-side-apply.validate.json",  # torch-distributed
    "clustertrainingruntime-create-level2.validate.json",  # deepspeed-distributed
    "clustertrainingruntime-create-level3-server-side-apply.validate.json",  # torch-...-rack
    "trainingruntime-create.validate.json",  # team-a/torch-team
    "trainjob-create.validate.json",  # team-a/my-job, uid cc796b1d-...
)


def fixture(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return doc


def fixture_names() -> list[str]:
    return sorted(p.name for p in FIXTURES.glob("*.json"))


def fixture_cache(
    plan_version: int = PLAN_VERSION, clock: Callable[[], float] = time.monotonic
) -> Cache:
    """A connected, synced cache holding what the cluster held when the fixtures were taken,
    its TrainJob frozen by the reconciler (`plan_version` 1: by a release before plan
    versions, whose gang has the legacy names of was-api.md section 4)."""
    cache = Cache(connected=True, clock=clock)
    cache.jobsets.replace([])  # listed, none: restart attempt 0
    stores = {
        "TrainJob": cache.trainjobs,
        "TrainingRuntime": cache.training_runtimes,
        "ClusterTrainingRuntime": cache.cluster_runtimes,
    }
    items: dict[str, list[dict[str, Any]]] = {kind: [] for kind in stores}
    for name in CACHE_OBJECTS:
        obj = fixture(name)["request"]["object"]
        items[obj["kind"]].append(obj)
    for kind, store in stores.items():
        store.replace(items[kind])
    freeze(cache, plan_version=plan_version)  # as by the time the fixtures' pods were created
    served(cache)  # the cluster served scheduling.k8s.io/v1beta1 (discovery), none listed yet
    return cache


def served(cache: Cache, backend: str = "native") -> None:
    """As discovery and the watches leave a backend: its API served and its objects listed (the
    stores that have not listed yet, empty)."""
    cache.apis[backend] = "served"
    if not cache.jobsets.synced:  # listed, none yet: every TrainJob at restart attempt 0
        cache.jobsets.replace([])
    found = cache.backends.named(backend)
    assert found is not None, backend
    for kind in found.kinds:
        store = cache.store(kind)
        if not store.synced:
            store.replace([])


def frozen(
    cache: Cache, trainjob: dict[str, Any], plan_version: int = PLAN_VERSION
) -> dict[str, Any]:
    """Raw `trainjob` with its runtime frozen into it as the reconciler freezes it when it first
    sees it (`Reconciler._take_snapshot`): the annotation `SNAPSHOT_ANNOTATION` with
    `snapshot()` of the runtime the cache holds now. Unchanged (a copy) when the reconciler
    would leave it alone: its runtime is not in the cache, has no spec.scheduling or is
    invalid. The pod webhook plans only frozen TrainJobs and holds the pods of the others.
    `plan_version=1` writes what releases before plan versions wrote (the bare runtime JSON),
    whose gangs keep the legacy names of was-api.md section 4."""
    out = copy.deepcopy(trainjob)
    parsed, _ = parse(TrainJob, trainjob)
    if parsed is None:
        return out
    checked = cache.runtime(
        parsed.runtime_kind, parsed.namespace, parsed.spec.runtime_ref.name or ""
    )
    if checked is None or checked.layout is None or not checked.verdict.allowed:
        return out
    meta = out.setdefault("metadata", {})
    annotations = meta.get("annotations") or {}
    text = snapshot(checked.runtime)
    if plan_version == 1:
        text = json.dumps(json.loads(text)["runtime"], separators=(",", ":"))
    else:
        assert plan_version == PLAN_VERSION, f"this release writes no plan version {plan_version}"
    meta["annotations"] = {**annotations, SNAPSHOT_ANNOTATION: text}
    return out


def freeze(
    cache: Cache,
    namespace: str | None = None,
    name: str | None = None,
    plan_version: int = PLAN_VERSION,
) -> None:
    """Freezes the cache's TrainJobs (all of them, or those of `namespace`, or one) as
    `frozen` does, as the watch brings them back after the reconciler's write; one already
    frozen keeps its snapshot (the reconciler never takes a second one)."""
    for (ns, tj_name), entry in cache.trainjobs.items():
        if namespace not in (None, ns) or name not in (None, tj_name):
            continue
        if snapshot_of(entry.raw) is None:
            again = frozen(cache, entry.raw, plan_version)
            if snapshot_of(again) is not None:
                cache.trainjobs.apply("MODIFIED", again)


T = TypeVar("T")


def decided(answer: Decision | Awaitable[Decision]) -> Decision:
    """A handler's decision, awaited when the pod webhook asked the API server (`TrainJobLookup`)
    for a TrainJob its cache lacks."""
    if not inspect.isawaitable(answer):
        return answer

    async def wait() -> Decision:
        return await answer

    return asyncio.run(wait())


def held_because(response: dict[str, Any]) -> str:
    """Why a pod's creation was denied to hold it (design 26: held, never admitted loose)."""
    assert response["allowed"] is False and "patch" not in response, response
    assert (response["status"]["code"], response["status"]["reason"]) == (403, "Forbidden")
    message: str = response["status"]["message"]
    prefix = "SchedulingBlocked: the pod is held until it can join its TrainJob's gang: "
    assert message.startswith(prefix), message
    return message.removeprefix(prefix)


def answering_lookup(
    existing: Iterable[tuple[str, str]] = (),
) -> tuple[TrainJobLookup, list[tuple[str, str]]]:
    """A `TrainJobLookup` as the service makes it, asking an API server that holds the TrainJobs
    `existing` (namespace, name) and no other; and the list of what it was asked."""
    held = frozenset(existing)
    asked: list[tuple[str, str]] = []

    async def ask(namespace: str, name: str) -> bool:
        asked.append((namespace, name))
        return (namespace, name) in held

    return TrainJobLookup(ask), asked


class OnLoop:
    """Calls into an emulator whose event loop runs in a thread of its own (`self.loop`)."""

    loop: asyncio.AbstractEventLoop

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        """Runs `coroutine` on the emulator's loop (e.g. a `create`) and returns its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def call(self, fn: Callable[[], T]) -> T:
        """`fn()` on the emulator's loop: reads of kmock's request log are safe there."""

        async def call() -> T:
            return fn()

        return self.run(call())


_HANDED_OUT: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port nothing listens on, for a server a test starts, never the same twice in a run.
    Taken below the kernel's ephemeral range: a port found free in that range can be taken by
    an outgoing connection (a client's, Prometheus's) before the server binds it (a CI run lost
    a test to "Address already in use" so)."""
    low = _ephemeral_low()
    for _ in range(200):
        if low <= 10_001:
            break
        port = random.randint(10_000, low - 1)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket() as sock:  # a custom range leaves no room below it
        sock.bind(("127.0.0.1", 0))
        found: int = sock.getsockname()[1]
        return found


@contextlib.asynccontextmanager
async def stub_api(app: web.Application) -> AsyncIterator[MeteredApiClient]:
    """A client of `app` served over HTTP on a port of its own, as a stub API server (closed,
    client then server, afterwards)."""
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    api = MeteredApiClient(configuration=Configuration(host=f"http://127.0.0.1:{port}"))
    try:
        yield api
    finally:
        close: Any = api.close  # untyped in the client
        await close()
        await runner.cleanup()


def make_certs(directory: Path, **spec: Any) -> Path:
    """Writes a fresh CA and serving pair into `directory`; returns the CA file."""
    write(issue(CertSpec(**spec)), directory)
    return directory / "ca.crt"


@dataclass
class RunningServer:
    url: str
    health_url: str
    ca_file: Path
    cert_dir: Path
    cache: Cache
    service: Service
    loop: asyncio.AbstractEventLoop | None = None
    thread: threading.Thread | None = None
    errors: list[BaseException] = field(default_factory=list)

    def client(self, **kwargs: Any) -> httpx.Client:
        verify = ssl.create_default_context(cafile=str(self.ca_file))
        return httpx.Client(base_url=self.url, verify=verify, timeout=10, **kwargs)

    def stop(self) -> None:
        assert self.loop is not None and self.thread is not None
        self.loop.call_soon_threadsafe(self.service.stop)
        self.thread.join(timeout=30)


def local_settings(cert_dir: Path, **more: Any) -> tuple[Settings, ReloadingContext]:
    """`serve`'s settings on free local ports, with certificates in `cert_dir` (made if
    missing), and the TLS context they load (any other `Settings` given by name)."""
    if not (cert_dir / "tls.crt").exists():
        make_certs(cert_dir)
    settings = Settings(
        host="127.0.0.1",
        port=free_port(),
        health_port=free_port(),
        metrics_port=free_port(),
        cert_dir=cert_dir,
        **more,
    )
    tls = ReloadingContext(cert_dir / "tls.crt", cert_dir / "tls.key")
    tls.reload()
    return settings, tls


@contextlib.contextmanager
def running_server(
    cache: Cache,
    cert_dir: Path,
    limits: Limits | None = None,
    cert_poll_seconds: float = 5.0,
    shutdown_timeout: float = 5.0,
    review_log: ReviewLog | None = None,
    **more: Any,
) -> Iterator[RunningServer]:
    """The service's own `Service` (webhooks + probes) in a thread, with the given cache (and
    any other `Settings` given by name)."""
    settings, tls = local_settings(
        cert_dir,
        cert_poll_seconds=cert_poll_seconds,
        shutdown_timeout=shutdown_timeout,
        limits=limits or Limits(),
        **more,
    )
    service = Service(settings, cache, tls, review_log)
    server = RunningServer(
        url=f"https://localhost:{settings.port}",
        health_url=f"http://127.0.0.1:{settings.health_port}",
        ca_file=cert_dir / "ca.crt",
        cert_dir=cert_dir,
        cache=cache,
        service=service,
    )

    async def main() -> None:
        server.loop = asyncio.get_running_loop()
        await service.run([])

    def target() -> None:
        try:
            asyncio.run(main())
        except BaseException as err:  # surfaced by the test through `errors`
            server.errors.append(err)

    server.thread = threading.Thread(target=target, daemon=True)
    server.thread.start()
    wait_ready(server.health_url)
    try:
        yield server
    finally:
        server.stop()
    assert not server.errors, server.errors


def wait_ready(health_url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{health_url}/readyz", timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise TimeoutError(f"{health_url}/readyz never turned 200")


@dataclass
class ServerProcess:
    """`python -m webhook serve` as a real process (for signals, memory and startup)."""

    process: subprocess.Popen[bytes]
    url: str
    health_url: str
    log_file: Path
    metrics_url: str = ""

    def log_lines(self) -> list[dict[str, Any]]:
        # "\n" only: splitlines() would also cut at U+0085 or U+2028 inside a JSON string.
        lines = self.log_file.read_text().split("\n")
        return [json.loads(line) for line in lines if line.startswith("{")]

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")


@contextlib.contextmanager
def server_process(cert_dir: Path, *args: str, wait: bool = True) -> Iterator[ServerProcess]:
    port, health, metrics = free_port(), free_port(), free_port()
    log_file = cert_dir.parent / f"serve-{port}.log"
    env = {
        k: v for k, v in os.environ.items() if k != "KUBECONFIG" and not k.startswith("WEBHOOK_")
    }
    cmd = [sys.executable, "-m", "webhook", "serve", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--health-port", str(health), "--metrics-port", str(metrics)]
    cmd += ["--cert-dir", str(cert_dir), *args]
    with open(log_file, "wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    proc = ServerProcess(
        process,
        f"https://localhost:{port}",
        f"http://127.0.0.1:{health}",
        log_file,
        f"https://localhost:{metrics}",
    )
    try:
        if wait:
            wait_ready(proc.health_url)
        yield proc
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def webhook_path(review: dict[str, Any], verb: str) -> str:
    """The path of the service's webhook for a review's resource (controller-runtime naming)."""
    kind = review["request"]["kind"]
    group = kind["group"].replace(".", "-")
    return f"/{verb}-{group}-{kind['version']}-{kind['kind'].lower()}"

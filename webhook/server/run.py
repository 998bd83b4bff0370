"""`serve`: one process runs the webhooks over TLS, the metrics over TLS, the probes over plain
HTTP, the cache's watches, discovery, and (while it holds the Lease) the reconciler.

Shutdown (SIGTERM or SIGINT): /readyz turns false; after `shutdown_delay` the TLS listener
closes, in-flight reviews finish (up to `shutdown_timeout`), then the probes, the metrics, the
watches and the reconciler stop, and the Lease is released so another replica leads at once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import gc
import logging
import math
import os
import signal
import socket
import uuid
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from kubernetes.aio.client import ApiClient

from ..admission.handlers import hold_is_moot, would_hold
from ..backends.base import GangBackend
from ..backends.coscheduling import CoschedulingSettings
from ..backends.kai import KaiSettings
from ..backends.registry import default_backends
from ..backends.volcano import VolcanoSettings
from ..kube.cache import Cache, EventType, GangApi, Store
from ..kube.client import (
    connect,
    informers,
    jobset_informers,
    kind_informers,
    node_informer,
    pod_informers,
    uses_pod_token,
)
from ..kube.constraints import TopologyProbe
from ..kube.discovery import BackendApiWatch
from ..kube.events import EventRecorder
from ..kube.feasibility import Mode
from ..kube.gangpods import GangPods
from ..kube.informer import Informer
from ..kube.jobsetwatch import watch_jobsets
from ..kube.lacking import frozen_late, lacking, lacking_of
from ..kube.leader import LeaderElector, LeaseSettings
from ..kube.lookup import TrainJobLookup, api_ask, runtime_fetch
from ..kube.metered import MeteredApiClient
from ..kube.waker import JobWaker
from ..kube.whoami import TIMEOUT as WHOAMI_TIMEOUT
from ..kube.whoami import WhoAmIError, who_am_i
from ..kube.writer import ApiWriter, WriterSettings
from ..metrics.app import Checker, MetricsApp, NoCluster
from ..metrics.auth import Authorizer, AuthSettings
from ..metrics.feasibility import FeasibilityCollector
from ..metrics.gangs import GangTracker
from ..metrics.registry import Metrics
from ..reconcile.reconciler import CONTROLLER, Reconciler, ReconcilerSettings
from ..reconcile.status import StatusWriter
from ..tls.policy import TlsPolicy
from ..tls.reload import ReloadingContext
from .app import Limits, Readiness, admission_app, health_app
from .certificates import Certificates, CertSettings, certificates
from .protocol import ConnectionLimits, Drain
from .reviewlog import ReviewLog
from .servers import MAX_HEADER_BYTES, QuietServer, server

log = logging.getLogger("webhook.serve")
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


@dataclass(frozen=True)
class ReconcileSettings:
    enabled: bool = True
    namespaces: tuple[str, ...] = ()  # watched namespaces; empty: all
    workers: int = 4
    # Client-side limits on the reconciler's writes (`kube/writer.py`), as client-go's: those
    # that report (conditions, Events), and those that make gangs, which go first.
    qps: float = 20.0
    burst: int = 30
    gang_qps: float = 100.0
    gang_burst: int = 200
    discovery_period: float = 60.0
    resync_period: float = 600.0
    leader_elect: bool = True
    lease_name: str = "trainjob-scheduling-webhook"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


@dataclass(frozen=True)
class Settings:
    host: str = "0.0.0.0"
    port: int = 9443
    health_port: int = 8081
    metrics_port: int = 8443
    metrics_auth: AuthSettings | None = field(default_factory=AuthSettings)  # None: no auth
    cert_dir: Path = Path("certs")
    kubeconfig: str | None = None
    namespace: str = ""  # the service's own (the Lease's); empty: the pod's, else "default"
    # The username the service's API requests carry: only it may write a TrainJob's runtime
    # snapshot. Empty: learned at start (see learn_username).
    service_account: str = ""
    cert_poll_seconds: float = 5.0
    header_timeout: float = 10.0  # a request's headers must arrive within this (slowloris)
    max_header_bytes: int = MAX_HEADER_BYTES  # larger header sections get 431
    # A webhook connection's answer closes it after this many requests or seconds (0: no
    # bound), so that clients dial again and reviews spread over the replicas after a rollout.
    connection_max_requests: int = 1000
    connection_max_age: float = 30.0
    shutdown_timeout: float = 25.0  # under the pod's default 30 s grace period
    shutdown_delay: float = 0.0  # keep serving (not ready) this long after SIGTERM
    limits: Limits = field(default_factory=Limits)
    reconcile: ReconcileSettings = field(default_factory=ReconcileSettings)
    certs: CertSettings = field(default_factory=CertSettings)  # files (cert_dir) or self-managed
    tls: TlsPolicy = field(default_factory=TlsPolicy)  # what the TLS listeners accept
    schedulers: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: {})
    """Scheduler names per gang backend; a backend not named keeps its defaults."""
    backends: tuple[str, ...] | None = None  # the gang backends to run; None: all
    kai: KaiSettings = field(default_factory=KaiSettings)  # the KAI backend's queue and topology
    volcano: VolcanoSettings = field(default_factory=VolcanoSettings)  # its topology tiers
    coscheduling: CoschedulingSettings = field(default_factory=CoschedulingSettings)
    feasibility: Mode = "warn"  # gangs that could never fit: warn, deny, or off (no Node watch)


def _server(
    app: Any, settings: Settings, port: int, bounded: bool = False, **extra: Any
) -> QuietServer:
    """A server of the service; `bounded`: with the connection bounds (the webhooks')."""
    s = settings
    limits = ConnectionLimits(
        header_timeout=s.header_timeout,
        max_header_bytes=s.max_header_bytes,
        max_requests=s.connection_max_requests if bounded else 0,
        max_age=s.connection_max_age if bounded else 0.0,
    )
    return server(app, s.host, port, limits, **extra)


def _synced(store: Store) -> Callable[[], bool]:
    return lambda: store.synced


class GangReadiness:
    """Readiness at start waits for discovery, and for the objects of every gang kind it found
    served: until they are listed, the pod webhook could tie a pod to a PodGroup it believes
    absent that is Terminating or someone else's. A kind not served waits for nothing (a cluster
    without Volcano's CRDs is ready). It also waits for the first topology probe to answer or
    fail (`kube/constraints.py`), so the first TrainJob's feasibility knows whether the API
    server keeps its topology constraint.

    Met once, it stays met. A kind served later (a CRD installed, the native API's version
    switched) does not take the replica out of its Service, which would stop the pods of every
    other backend too; the pod webhook holds only that backend's pods until its objects are
    listed, as controller-runtime makes a read of an informer started late wait for its sync
    rather than failing the manager's readiness."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self.met = False

    def checks(self) -> dict[str, Callable[[], bool]]:
        """`discovery`, then one check per gang kind, named as the caches' (`cache:<store>`)."""
        checks: dict[str, Callable[[], bool]] = {"discovery": self._discovered}
        for store in self.cache.gang_stores.values():
            checks[f"cache:{store.resource}"] = functools.partial(self._listed, store)
        return checks

    def _discovered(self) -> bool:
        # (and the first topology probe answered or failed: the first TrainJob is judged by it)
        return self._met() or (self.cache.discovered() and not self.cache.topology.probing)

    def _listed(self, store: Store) -> bool:
        return self._met() or store not in self.cache.unlisted_gang_stores()

    def _met(self) -> bool:
        self.met = self.met or (self.cache.gangs_listed() and not self.cache.topology.probing)
        return self.met


class Service:
    def __init__(
        self,
        settings: Settings,
        cache: Cache,
        tls: ReloadingContext,
        review_log: ReviewLog | None = None,
        metrics: Metrics | None = None,
        authorizer: Checker | None = None,
        checks: Mapping[str, Callable[[], bool]] | None = None,
    ) -> None:
        self.settings = settings
        self.cache = cache
        self.tls = tls
        self.metrics = metrics or Metrics()
        self.stopping = False
        checks = {"certificate": lambda: tls.loaded, **(checks or {})}
        checks.update({f"cache:{store.resource}": _synced(store) for store in cache.stores})
        checks["not-stopping"] = lambda: not self.stopping
        self.readiness = Readiness(checks)
        s = settings
        self.drain = Drain()
        self.review_log = review_log or ReviewLog()
        self.webhooks = _server(
            admission_app(cache, s.limits, self.review_log, metrics=self.metrics),
            s,
            s.port,
            bounded=True,
            tls=tls,
            drain=self.drain,
            timeout_graceful_shutdown=math.ceil(s.shutdown_timeout),
            # Longer than the API server's idle connections (Go: 90 s), so it never sends a
            # review on a connection this end is closing.
            timeout_keep_alive=100,
        )
        self.probes = _server(health_app(self.readiness), s, s.health_port)
        self.metrics_server = _server(
            MetricsApp(self.metrics, authorizer), s, s.metrics_port, tls=tls
        )

    def stop(self) -> None:
        """Not ready at once, and every answer from now on closes its connection (clients move
        to another replica); after `shutdown_delay` (time for the endpoints to drop this pod)
        stop accepting connections, answer what arrives on open ones, and let in-flight reviews
        finish."""
        if self.stopping:
            return
        self.stopping = True
        self.drain.begin()
        delay = self.settings.shutdown_delay
        log.info("shutting down", extra={"fields": {"accepting_for_seconds": delay}})

        def close() -> None:
            log.info("closing the listener: finishing in-flight reviews")
            self.webhooks.should_exit = True

        asyncio.get_running_loop().call_later(delay, close)

    async def run(self, background: list[asyncio.Task[None]]) -> None:
        s = self.settings
        # What start-up made (modules, the client's models, the app) lives as long as the
        # process: moved out of the collector's sight, a full collection no longer walks it.
        gc.collect()
        gc.freeze()
        sockets = [listen(s.host, port) for port in (s.port, s.health_port, s.metrics_port)]
        watcher = asyncio.create_task(self._watch_certificate())
        probes = asyncio.create_task(self.probes.serve(sockets[1:2]))
        metrics = asyncio.create_task(self.metrics_server.serve(sockets[2:]))
        try:
            await self.webhooks.serve(sockets[:1])
        finally:
            self.probes.should_exit = self.metrics_server.should_exit = True
            await asyncio.gather(probes, metrics)
            for task in [watcher, *background]:
                task.cancel()
            await asyncio.gather(watcher, *background, return_exceptions=True)
            self.review_log.flush()  # the lines of the last reviews, before the last line
            log.info("stopped")

    async def _watch_certificate(self) -> None:
        while True:
            self.tls.reload()
            await asyncio.sleep(self.settings.cert_poll_seconds)


class StartupError(Exception):
    """The service cannot start (a port, a kubeconfig); the message says why."""


def listen(host: str, port: int) -> socket.socket:
    """A listening socket, bound here rather than by uvicorn (which would exit the process from
    inside a task). Made with proto IPPROTO_TCP: asyncio only sets TCP_NODELAY on connections of
    such sockets, and without it Nagle and delayed ACKs add 40 ms to every answer."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {err.strerror}") from None
    return sock


def own_namespace(configured: str, environ: Mapping[str, str] | None = None) -> str:
    """--namespace, else the pod's (downward API or service account), else "default"."""
    env = os.environ if environ is None else environ
    if configured:
        return configured
    if env.get("POD_NAMESPACE"):
        return env["POD_NAMESPACE"]
    with contextlib.suppress(OSError):
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    return "default"


def own_username(configured: str, token: Path = SERVICE_ACCOUNT_TOKEN) -> str:
    """--service-account, else the ServiceAccount of the pod the service runs in (its token's
    `sub` claim, `system:serviceaccount:<namespace>:<name>`), else empty: what is known without
    asking the API server (`learn_username` asks it)."""
    if configured:
        return configured
    try:
        payload = token.read_text().strip().split(".")[1]
        claims = orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (OSError, IndexError, ValueError):  # no token, or not a JWT (orjson's error is one)
        return ""
    subject = claims.get("sub") if isinstance(claims, dict) else None
    if isinstance(subject, str) and subject.startswith("system:serviceaccount:"):
        return subject
    return ""


async def learn_username(
    configured: str,
    api: ApiClient | None,
    pod_token: bool,
    token: Path = SERVICE_ACCOUNT_TOKEN,
    timeout: float = WHOAMI_TIMEOUT,
) -> str:
    """The username the service's API requests carry, said once in the log: --service-account;
    else, when the client authenticates with the pod's ServiceAccount token (`pod_token`), that
    token's subject; else the API server's answer to a SelfSubjectReview, the truth for whatever
    credential the kubeconfig holds; else, that failing, as `own_username` (the pod's token,
    else empty: no one may write a snapshot)."""
    username, source = configured, "--service-account"
    if not username and pod_token:
        # The client sends this very token, and the API server authenticates a ServiceAccount
        # token as its subject: the same answer, without a start-up request or waiting on it.
        username, source = own_username("", token), "the pod's ServiceAccount token"
    if not username and api is not None:
        try:
            username, source = await who_am_i(api, timeout), "SelfSubjectReview"
        except WhoAmIError as err:
            username, source = own_username("", token), "the pod's ServiceAccount token"
            consequence = (
                "trusting the pod's ServiceAccount instead"
                if username
                else "the TrainJob webhook denies every write of the runtime snapshot, this "
                "service's own included, so TrainJobs of a scheduling runtime get no gang"
            )
            log.warning(
                "the API server did not say who this service is (SelfSubjectReview): "
                f"{consequence}; set --service-account to the username the kubeconfig "
                "authenticates as (kubectl auth whoami)",
                extra={"fields": {"error": str(err)}},
            )
    elif not username:  # no cluster: no API server sends reviews, nothing to warn of
        username, source = own_username("", token), "the pod's ServiceAccount token"
    if username:
        log.info(
            "runtime snapshots are written only by this service",
            extra={"fields": {"username": username, "from": source}},
        )
    return username


def identity(environ: Mapping[str, str] | None = None) -> str:
    """This replica's name in the Lease and in Events: the pod name, made unique per start."""
    env = os.environ if environ is None else environ
    host = env.get("POD_NAME") or env.get("HOSTNAME") or socket.gethostname()
    return f"{host}_{uuid.uuid4().hex[:8]}"


def background(
    api: ApiClient,
    cache: Cache,
    settings: Settings,
    metrics: Metrics,
    me: str,
    lease: LeaseSettings | None,
) -> list[Coroutine[Any, Any, None]]:
    """The watches, discovery and (when enabled) the reconciler; with `lease`, leader-elected.
    `me` names this replica in Events."""
    r = settings.reconcile

    def restarted(resource: str) -> None:
        metrics.watch_restarts.labels(resource=resource).inc()

    def refusal_changed(resource: str, before: str | None, after: str | None) -> None:
        if before is not None:
            metrics.watches_refused.labels(resource=resource, reason=before).dec()
        if after is not None:
            metrics.watches_refused.labels(resource=resource, reason=after).inc()

    def counted(found: list[Informer]) -> list[Informer]:
        """The informers, each counting its refusals while they last."""
        for informer in found:
            informer.on_refusal = functools.partial(refusal_changed, informer.resource.plural)
        return found

    jobs: list[Coroutine[Any, Any, None]] = [
        i.run() for i in counted(informers(api, cache, r.namespaces, restarted))
    ]
    jobs.append(
        watch_jobsets(
            api,
            cache.jobsets,
            lambda: counted(jobset_informers(api, cache, r.namespaces, restarted)),
        )
    )
    # The Jobs whose pods the pod webhook holds, woken once they would be tied (`waker.py`).
    waker = JobWaker(
        api,
        functools.partial(would_hold, cache=cache),
        moot=functools.partial(hold_is_moot, cache=cache),
        on_wake=lambda reason: metrics.jobs_woken.labels(reason=reason).inc(),
        on_round=metrics.oldest_hold_age.set,
    )
    cache.on_hold = waker.held
    jobs.append(waker.run())
    if settings.feasibility != "off":
        jobs += [i.run() for i in counted([node_informer(api, cache, restarted)])]
    reconciler: Reconciler | None = None
    if r.enabled:
        writer = ApiWriter(
            api,
            WriterSettings(qps=r.qps, burst=r.burst, gang_qps=r.gang_qps, gang_burst=r.gang_burst),
        )
        events = EventRecorder(
            api,
            CONTROLLER,
            me,
            on_event=lambda reason: metrics.events.labels(reason=reason).inc(),
            on_drop=metrics.events_dropped.inc,
            on_refused=lambda reason: metrics.events_refused.labels(reason=reason).inc(),
            gate=writer.lanes.report_turn,  # Events report: after the gang writes
        )
        pods = GangPods()  # gang health after admission: JobSet's pods, counted
        jobs.append(sweep_when_listed(cache, pods, waker))
        wake_when_frozen_late(cache, pods, waker)
        jobs += [i.run() for i in counted(pod_informers(api, pods, r.namespaces, restarted))]
        reconciler = Reconciler(
            cache,
            writer,
            events,
            ReconcilerSettings(workers=r.workers, resync_period=r.resync_period),
            metrics=metrics,
            status=StatusWriter(cache, writer, events, pods, metrics=metrics),
        )
        jobs.append(events.run())

    def api_changed(backend: GangBackend, state: GangApi) -> None:
        served = 1 if state == "served" else 0
        metrics.backend_api_available.labels(backend=backend.name).set(served)
        if backend.name == "native":
            metrics.gang_api_available.set(served)
        if state == "served" and reconciler is not None:
            reconciler.resync()

    metrics.gang_api_available.set(0)
    for backend in cache.backends.backends:
        metrics.backend_api_available.labels(backend=backend.name).set(0)
    jobs.append(
        BackendApiWatch(
            api,
            cache,
            lambda kind: counted(kind_informers(api, cache, kind, r.namespaces, restarted)),
            period=r.discovery_period,
            on_change=api_changed,
            # Whether the API server keeps a gang's topology constraint: a dry-run create where
            # the service may create PodGroups (the watched namespaces, else its own).
            after_check=TopologyProbe(
                api, cache, r.namespaces or (own_namespace(settings.namespace),)
            ),
        ).run()
    )
    if reconciler is None:
        return jobs
    if lease is None:
        jobs.append(reconciler.run())
        return jobs
    leader = metrics.leader.labels(name=r.lease_name)
    leader.set(0)
    elector = LeaderElector(api, lease, on_change=lambda leading: leader.set(int(leading)))
    jobs.append(elector.run(reconciler.run))
    return jobs


async def sweep_when_listed(cache: Cache, pods: GangPods, waker: JobWaker) -> None:
    """Once what it reads is listed, the Jobs of ganged TrainJobs that lack pods are given to
    the waker (`kube/lacking.py`): their creations were refused while no replica answered."""
    while not (cache.synced and pods.synced and cache.gangs_listed()):
        await asyncio.sleep(0.2)
    found = 0
    for pod in lacking(cache, pods):
        waker.held(pod)
        found += 1
    if found:
        log.info("Jobs lacking pods at start, to be woken", extra={"fields": {"jobs": found}})


def wake_when_frozen_late(cache: Cache, pods: GangPods, waker: JobWaker) -> None:
    """A TrainJob created while no replica answered is frozen by the reconciler once one does;
    its Jobs' pod creations were refused unseen, and the sweep at start did not know them for a
    gang's: given to the waker when the snapshot comes (every replica hears it; a wake is one
    idempotent patch)."""

    def heard(_event: EventType, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        key = frozen_late(old, new)
        if key is None or not pods.synced:
            return
        for pod in lacking_of(cache, pods, *key):
            waker.held(pod)

    cache.trainjobs.subscribe(heard)


def count_requests(api: MeteredApiClient, metrics: Metrics) -> None:
    """Every request `api` makes counted in `trainjob_scheduling_api_requests_total`."""
    requests = metrics.api_requests
    api.on_answer = lambda verb, code: requests.labels(verb=verb, code=code).inc()


def lease_settings(settings: Settings, identity: str) -> LeaseSettings:
    r = settings.reconcile
    try:
        return LeaseSettings(
            namespace=own_namespace(settings.namespace),
            name=r.lease_name,
            identity=identity,
            lease_duration=r.lease_duration,
            renew_deadline=r.renew_deadline,
            retry_period=r.retry_period,
        )
    except ValueError as err:
        raise StartupError(f"leader election: {err}") from None


async def serve(settings: Settings) -> None:
    me = identity()
    r = settings.reconcile
    # Built before anything starts: bad durations stop the start, not the leader later.
    lease = lease_settings(settings, me) if r.enabled and r.leader_elect else None
    metrics = Metrics()
    try:
        backends = default_backends(
            settings.schedulers,
            settings.backends,
            coscheduling=settings.coscheduling,
            kai=settings.kai,
            volcano=settings.volcano,
        )
    except ValueError as err:
        raise StartupError(f"gang backends: {err}") from None
    try:
        api = await connect(settings.kubeconfig)
    except Exception as err:  # the client's loaders raise anything from ConfigException to OSError
        raise StartupError(f"cannot load the cluster configuration: {err}") from None
    try:
        certs = serving_certificate(settings, api, metrics)
    except StartupError:
        if api is not None:
            close: Any = api.close  # untyped in the client
            await close()
        raise
    tls = certs.tls
    if isinstance(api, MeteredApiClient):
        count_requests(api, metrics)
    cache = Cache(connected=api is not None, backends=backends)
    cache.feasibility.mode = settings.feasibility
    if api is not None:
        cache.trainjob_lookup = TrainJobLookup(api_ask(api))
        cache.runtime_fetch = runtime_fetch(api)
    cache.service_username = await learn_username(
        settings.service_account, api, uses_pod_token(settings.kubeconfig)
    )
    GangTracker(metrics, cache)
    FeasibilityCollector(metrics, cache)
    authorizer: Checker | None = None
    if settings.metrics_auth is not None:
        if api is None:
            log.warning(
                "metrics authentication is on but there is no cluster: /metrics answers 503 "
                "(for local use, --metrics-auth=false)"
            )
            authorizer = NoCluster()
        else:
            authorizer = Authorizer(api, settings.metrics_auth)
    checks = dict(certs.checks)
    if api is not None:  # which gangs can be made, and which exist, is known once listed
        checks.update(GangReadiness(cache).checks())
    service = Service(settings, cache, tls, metrics=metrics, authorizer=authorizer, checks=checks)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.stop)
    jobs = certs.jobs + (background(api, cache, settings, metrics, me, lease) if api else [])
    tasks = [asyncio.create_task(job) for job in jobs]
    try:
        await service.run(tasks)
    finally:
        certs.close()
        if api is not None:
            close = api.close
            await close()


def serving_certificate(
    settings: Settings, api: ApiClient | None, metrics: Metrics
) -> Certificates:
    """From --cert-dir, or self-managed in a Secret (see `certificates.py`)."""
    try:
        return certificates(
            settings.cert_dir,
            settings.certs,
            api,
            own_namespace(settings.namespace),
            metrics,
            settings.tls,
        )
    except ValueError as err:
        raise StartupError(f"certificates: {err}") from None

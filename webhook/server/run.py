"""`serve`: the webhooks over TLS, the probes over plain HTTP, the cache's watches; one process.

Shutdown (SIGTERM or SIGINT): /readyz turns false; after `shutdown_delay` the TLS listener
closes, in-flight reviews finish (up to `shutdown_timeout`), then the probes and the watches stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from ..kube.cache import Cache, Store
from ..kube.client import connect, informers
from ..tls.reload import ReloadingContext
from .app import Limits, Readiness, admission_app, health_app
from .protocol import with_header_timeout
from .reviewlog import ReviewLog

log = logging.getLogger("webhook.serve")


@dataclass(frozen=True)
class Settings:
    host: str = "0.0.0.0"
    port: int = 9443
    health_port: int = 8081
    cert_dir: Path = Path("certs")
    kubeconfig: str | None = None
    cert_poll_seconds: float = 5.0
    header_timeout: float = 10.0  # a request's headers must arrive within this (slowloris)
    shutdown_timeout: float = 25.0  # under the pod's default 30 s grace period
    shutdown_delay: float = 0.0  # keep serving (not ready) this long after SIGTERM
    limits: Limits = field(default_factory=Limits)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: `Service` decides when both servers stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _config(app: Any, settings: Settings, port: int, **extra: Any) -> uvicorn.Config:
    """uvicorn as both servers run it: our logs only, no lifespan, a deadline for headers."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=port,
        http=with_header_timeout(settings.header_timeout),
        log_config=None,
        access_log=False,
        lifespan="off",
        **extra,
    )


def _synced(store: Store) -> Callable[[], bool]:
    return lambda: store.synced


class Service:
    def __init__(
        self,
        settings: Settings,
        cache: Cache,
        tls: ReloadingContext,
        review_log: ReviewLog | None = None,
    ) -> None:
        self.settings = settings
        self.cache = cache
        self.tls = tls
        self.stopping = False
        checks: dict[str, Callable[[], bool]] = {"certificate": lambda: tls.loaded}
        checks.update({f"cache:{store.resource}": _synced(store) for store in cache.stores})
        checks["not-stopping"] = lambda: not self.stopping
        self.readiness = Readiness(checks)
        s = settings
        self.webhooks = _Server(
            _config(
                admission_app(cache, s.limits, review_log),
                s,
                s.port,
                ssl_context_factory=lambda config, default: tls.context,
                timeout_graceful_shutdown=math.ceil(s.shutdown_timeout),
                # Longer than the API server's idle connections (Go: 90 s), so it never sends a
                # review on a connection this end is closing.
                timeout_keep_alive=100,
                proxy_headers=False,  # the API server talks to us directly; no extra layer
            )
        )
        self.probes = _Server(_config(health_app(self.readiness), s, s.health_port))

    def stop(self) -> None:
        """Not ready at once; after `shutdown_delay` (time for the endpoints to drop this pod)
        stop accepting connections and let in-flight reviews finish."""
        if self.stopping:
            return
        self.stopping = True
        delay = self.settings.shutdown_delay
        log.info("shutting down", extra={"fields": {"accepting_for_seconds": delay}})

        def close() -> None:
            log.info("closing the listener: finishing in-flight reviews")
            self.webhooks.should_exit = True

        asyncio.get_running_loop().call_later(delay, close)

    async def run(self, background: list[asyncio.Task[None]]) -> None:
        s = self.settings
        sockets = [listen(s.host, s.port), listen(s.host, s.health_port)]
        watcher = asyncio.create_task(self._watch_certificate())
        probes = asyncio.create_task(self.probes.serve(sockets[1:]))
        try:
            await self.webhooks.serve(sockets[:1])
        finally:
            self.probes.should_exit = True
            await probes
            for task in [watcher, *background]:
                task.cancel()
            await asyncio.gather(watcher, *background, return_exceptions=True)
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


async def serve(settings: Settings) -> None:
    tls = ReloadingContext(settings.cert_dir / "tls.crt", settings.cert_dir / "tls.key")
    tls.reload()
    try:
        api = await connect(settings.kubeconfig)
    except Exception as err:  # the client's loaders raise anything from ConfigException to OSError
        raise StartupError(f"cannot load the cluster configuration: {err}") from None
    cache = Cache(connected=api is not None)
    service = Service(settings, cache, tls)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.stop)
    tasks = [asyncio.create_task(i.run()) for i in informers(api, cache)] if api else []
    try:
        await service.run(tasks)
    finally:
        if api is not None:
            close: Any = api.close  # untyped in the client
            await close()

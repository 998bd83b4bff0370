"""uvicorn as every server of the service runs it: our logs only, no lifespan, no signal
handling of its own (the service decides when its servers stop), a deadline for the TLS
handshake and for headers, a bound on header size, and (for the webhooks) bounded connections
and draining on shutdown (see `protocol.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

from ..tls.reload import ReloadingContext
from .protocol import CloseWhenDue, ConnectionLimits, Drain, Guard

MAX_HEADER_BYTES = 64 * 1024  # Go's net/http allows 1 MiB, nginx 8-32 KiB; the API server sends ~1
# How long a closing TLS connection waits for the peer's close_notify (asyncio: 30 s). Go's TLS
# server does not wait at all; a peer that never answers must not hold the connection.
TLS_SHUTDOWN_TIMEOUT = 2.0


class QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling, with a deadline for TLS handshakes and each
    connection behind a `Guard` (its limits, and the webhooks' bounds and draining)."""

    limits = ConnectionLimits()
    drain: Drain | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's start on pre-bound sockets (the only way the service starts it), with TLS
        deadlines: uvicorn leaves the handshake at asyncio's 60 s (a client that connects and
        never starts it holds the connection that long) and the shutdown at 30 s."""
        assert sockets is not None, "the service always binds its own sockets"
        await self.lifespan.startup()
        config = self.config
        loop = asyncio.get_running_loop()

        def create_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            def uvicorns(state: dict[str, Any]) -> asyncio.Protocol:
                # As uvicorn's own startup makes it, with the state its requests' scopes get.
                protocol: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
                    config=config, server_state=self.server_state, app_state=state, _loop=_loop
                )
                return protocol

            return Guard(uvicorns, self.limits, self.drain, self.lifespan.state)

        tls: dict[str, Any] = {}
        if config.ssl is not None:
            tls = {
                "ssl": config.ssl,
                "ssl_handshake_timeout": self.limits.header_timeout,
                "ssl_shutdown_timeout": TLS_SHUTDOWN_TIMEOUT,
            }
        self.servers = [
            await loop.create_server(create_protocol, sock=sock, backlog=config.backlog, **tls)
            for sock in sockets
        ]
        self.started = True


def server(
    app: Any,
    host: str,
    port: int,
    limits: ConnectionLimits,
    tls: ReloadingContext | None = None,
    drain: Drain | None = None,
    **extra: Any,
) -> QuietServer:
    """A server for `app` with these limits; with `tls`, on its certificate (new connections get
    a rotated one); with `drain`, its connections drain when `drain.begin()` is called.
    Serve it with `await server.serve([listen(host, port)])`; stop it with `should_exit`."""
    if tls is not None:
        extra["ssl_context_factory"] = lambda config, default: tls.context
    config = uvicorn.Config(
        CloseWhenDue(app),
        host=host,
        port=port,
        http="httptools",
        log_config=None,
        access_log=False,
        lifespan="off",
        proxy_headers=False,  # clients talk to us directly; no proxy layer to trust
        **extra,
    )
    quiet = QuietServer(config)
    quiet.limits, quiet.drain = limits, drain
    return quiet

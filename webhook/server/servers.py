"""uvicorn as every server of the service runs it: our logs only, no lifespan, no signal
handling of its own (the service decides when its servers stop), a deadline for headers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import uvicorn

from ..tls.reload import ReloadingContext
from .protocol import with_header_timeout


class QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def server(
    app: Any,
    host: str,
    port: int,
    header_timeout: float,
    tls: ReloadingContext | None = None,
    **extra: Any,
) -> QuietServer:
    """A server for `app`; with `tls`, on its certificate (new connections get a rotated one).
    Serve it with `await server.serve([listen(host, port)])`; stop it with `should_exit`."""
    if tls is not None:
        extra["ssl_context_factory"] = lambda config, default: tls.context
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=with_header_timeout(header_timeout),
        log_config=None,
        access_log=False,
        lifespan="off",
        proxy_headers=False,  # clients talk to us directly; no proxy layer to trust
        **extra,
    )
    return QuietServer(config)

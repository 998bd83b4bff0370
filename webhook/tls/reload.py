"""A server TLS context whose certificate follows `tls.crt`/`tls.key` on disk, without restart.

uvicorn gets one `SSLContext` for the life of the server. Its `sni_callback` runs for every new
handshake (with or without SNI) and hands the connection the context built from the newest
certificate; a new context is built whole and checked before it replaces the old one, so a
half-written or mismatched pair is never served. Connections already open keep theirs.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from .certs import expiry

if TYPE_CHECKING:
    from ..metrics.registry import Metrics

log = logging.getLogger("webhook.tls")


def server_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


class ReloadingContext:
    def __init__(self, cert_file: Path, key_file: Path, metrics: Metrics | None = None) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.metrics = metrics  # counts reads as controller-runtime's certwatcher does
        self.context = server_context()  # the one uvicorn holds
        self.context.sni_callback = self._choose
        self.current: ssl.SSLContext | None = None
        self.expires_at: datetime | None = None
        self._digest: bytes | None = None
        self._last_problem = ""  # logged once, not on every poll

    @property
    def loaded(self) -> bool:
        return self.current is not None

    def reload(self) -> bool:
        """Load the files if they changed; True when a new certificate is now served.

        The files are read, loaded, and read again: a pair that changed in between (a rotation
        caught midway) is not taken, so the digest always describes what is served.
        """
        if self.metrics is not None:
            self.metrics.cert_reads.inc()
        try:
            cert, digest = self._read()
        except OSError as err:
            self._problem("certificate not readable", str(err))
            return False
        if digest == self._digest:
            return False
        try:
            fresh = server_context()
            fresh.load_cert_chain(self.cert_file, self.key_file)
            expires = expiry(cert)
            if self._read()[1] != digest:  # changed while loading: judge it next time
                return False
            if self.current is None:  # the outer context too, for clients that skip the callback
                self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError, ValueError) as err:
            # Typically the cert and key were caught mid-rotation: keep serving the old pair.
            self._problem("certificate not loaded, keeping the previous one", str(err))
            return False
        self.current, self.expires_at, self._digest = fresh, expires, digest
        self._last_problem = ""
        if self.metrics is not None:
            self.metrics.cert_expiry.set(expires.timestamp())
        log.info(
            "certificate loaded",
            extra={"fields": {"cert": str(self.cert_file), "expires": expires.isoformat()}},
        )
        return True

    def _problem(self, message: str, error: str) -> None:
        if self.metrics is not None:
            self.metrics.cert_read_errors.inc()
        if error != self._last_problem:
            self._last_problem = error
            log.warning(message, extra={"fields": {"cert": str(self.cert_file), "error": error}})

    def _read(self) -> tuple[bytes, bytes]:
        """The certificate, and a digest of certificate and key together."""
        cert, key = self.cert_file.read_bytes(), self.key_file.read_bytes()
        return cert, hashlib.sha256(cert + b"\0" + key).digest()

    def _choose(
        self, conn: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, ctx: ssl.SSLContext
    ) -> None:
        if self.current is not None:
            conn.context = self.current

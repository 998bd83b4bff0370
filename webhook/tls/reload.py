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

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from .certs import expiry
from .policy import TlsPolicy, server_context

if TYPE_CHECKING:
    from ..metrics.registry import Metrics

log = logging.getLogger("webhook.tls")


class ReloadingContext:
    def __init__(
        self,
        cert_file: Path,
        key_file: Path,
        metrics: Metrics | None = None,
        ca_file: Path | None = None,
        missing_ok: bool = False,
        policy: TlsPolicy | None = None,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.ca_file = ca_file  # where the issuing CA is, if anywhere: only for its expiry metric
        self.missing_ok = missing_ok  # files not written yet are no problem (self-managed)
        self.metrics = metrics  # counts reads as controller-runtime's certwatcher does
        self.policy = policy or TlsPolicy()
        self.context = server_context(self.policy)  # the one uvicorn holds
        self.context.sni_callback = self._choose
        self.current: ssl.SSLContext | None = None
        self.expires_at: datetime | None = None
        self._digest: bytes | None = None
        self._last_problem = ""  # logged once, not on every poll
        self._ca_reported = False

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
            if not (self.missing_ok and isinstance(err, FileNotFoundError)):
                self._problem("certificate not readable", str(err))
            return False
        if digest == self._digest:
            return False
        try:
            fresh = server_context(self.policy)
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
            self.metrics.cert_expiry.labels(certificate="serving").set(expires.timestamp())
            self._ca_expiry(cert)
        log.info(
            "certificate loaded",
            extra={"fields": {"cert": str(self.cert_file), "expires": expires.isoformat()}},
        )
        return True

    def _ca_expiry(self, cert_pem: bytes) -> None:
        """The expiry of the CA (in `ca_file`) that issued the served certificate; no series
        when there is no such file or no issuer in it."""
        assert self.metrics is not None
        gauge = self.metrics.cert_expiry
        issuer = _issuer(self.ca_file, cert_pem) if self.ca_file is not None else None
        if issuer is not None:
            gauge.labels(certificate="ca").set(issuer.not_valid_after_utc.timestamp())
        elif self._ca_reported:
            gauge.remove("ca")
        self._ca_reported = issuer is not None

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


def _issuer(ca_file: Path, cert_pem: bytes) -> x509.Certificate | None:
    """The certificate in `ca_file` that signed the first one in `cert_pem`, if any."""
    try:
        cert = x509.load_pem_x509_certificates(cert_pem)[0]
        candidates = x509.load_pem_x509_certificates(ca_file.read_bytes())
    except (OSError, ValueError):
        return None
    for ca in candidates:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return ca
    return None

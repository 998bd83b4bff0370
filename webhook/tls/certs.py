"""Development certificates: a throwaway CA and a serving cert for the webhook Service.

The API server reaches the webhook as `<service>.<namespace>.svc`, so those names (and localhost
for running outside the cluster) go into the SAN; the CA bundle is what the webhook configuration's
`caBundle` carries. In a cluster, `serve --cert-management=self` (`selfmanaged.py`) or
cert-manager takes their place.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import pathlib
import tempfile
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import (
    CertificateIssuerPrivateKeyTypes,
    PrivateKeyTypes,
)
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CLOCK_SKEW = dt.timedelta(minutes=5)  # so a node whose clock runs slightly behind still accepts it
_CN_MAX = 64  # RFC 5280 ub-common-name; the SAN, not the CN, carries the names clients check

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"


def _unique(items: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


@dataclass(frozen=True)
class CertSpec:
    """What the serving cert must be valid for."""

    service: str = "trainjob-scheduling-webhook"
    namespace: str = "trainjob-scheduling-system"
    extra_dns: tuple[str, ...] = ()
    extra_ips: tuple[str, ...] = ()
    days: int = 365

    def __post_init__(self) -> None:
        if self.days < 1:
            raise ValueError(f"days must be at least 1, got {self.days}")
        for ip in self.extra_ips:
            ipaddress.ip_address(ip)  # fail here rather than halfway through issuing

    @property
    def dns_names(self) -> tuple[str, ...]:
        svc, ns = self.service, self.namespace
        cluster = (svc, f"{svc}.{ns}", f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local")
        return _unique(("localhost", *cluster, *self.extra_dns))

    @property
    def ip_addresses(self) -> tuple[str, ...]:
        return _unique(("127.0.0.1", "::1", *self.extra_ips))


@dataclass(frozen=True)
class IssuedCerts:
    """PEM-encoded CA and serving cert/key pairs; keys are unencrypted PKCS8."""

    ca_cert_pem: bytes
    ca_key_pem: bytes
    cert_pem: bytes
    key_pem: bytes


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:_CN_MAX])])


def key_pem(key: PrivateKeyTypes) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _key_usage(*, sign_certs: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not sign_certs,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=sign_certs,
        crl_sign=sign_certs,
        encipher_only=False,
        decipher_only=False,
    )


def new_ca(
    common_name: str, not_before: dt.datetime, not_after: dt.datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA that may sign serving certificates (and no other CA)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(sign_certs=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def new_serving(
    ca_cert: x509.Certificate,
    ca_key: CertificateIssuerPrivateKeyTypes,
    common_name: str,
    dns_names: tuple[str, ...],
    ip_addresses: tuple[str, ...],
    not_before: dt.datetime,
    not_after: dt.datetime,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A TLS server certificate for `dns_names` and `ip_addresses`, signed by the CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    san: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    san += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(sign_certs=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)
    except x509.ExtensionNotFound:
        aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    cert = builder.add_extension(aki, critical=False).sign(ca_key, hashes.SHA256())
    return cert, key


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def issue(spec: CertSpec, now: dt.datetime | None = None) -> IssuedCerts:
    """Create a fresh CA and a serving cert signed by it, valid from `now` for `spec.days`."""
    if now is None:
        now = dt.datetime.now(dt.UTC)
    elif now.tzinfo is None:
        raise ValueError("now must be timezone-aware")  # naive times would silently mean UTC
    now = now.replace(microsecond=0)  # X.509 times have one-second resolution
    not_before, not_after = now - CLOCK_SKEW, now + dt.timedelta(days=spec.days)
    ca_cert, ca_key = new_ca(f"{spec.service} dev CA", not_before, not_after)
    cert, key = new_serving(
        ca_cert,
        ca_key,
        f"{spec.service}.{spec.namespace}.svc",
        spec.dns_names,
        spec.ip_addresses,
        not_before,
        not_after,
    )
    return IssuedCerts(
        ca_cert_pem=pem(ca_cert),
        ca_key_pem=key_pem(ca_key),
        cert_pem=pem(cert),
        key_pem=key_pem(key),
    )


def write_atomic(path: pathlib.Path, data: bytes, mode: int) -> None:
    # A temp file in the same directory keeps os.replace a same-filesystem rename, so a server
    # watching the directory sees either the old file or the new one, never a partial write.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(fd, mode)  # mkstemp starts at 0o600, so a key is never readable by others
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def write(issued: IssuedCerts, out_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    """Write ca.crt, ca.key, tls.crt and tls.key into `out_dir`, each file atomically.

    The pair is not replaced as one unit: tls.key goes before tls.crt so a reloader triggered by
    the cert finds the matching key already in place.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    files = (
        (CA_CERT, issued.ca_cert_pem, 0o644),
        (CA_KEY, issued.ca_key_pem, 0o600),
        (TLS_KEY, issued.key_pem, 0o600),
        (TLS_CERT, issued.cert_pem, 0o644),
    )
    paths: dict[str, pathlib.Path] = {}
    for name, data, mode in files:
        paths[name] = out_dir / name
        write_atomic(paths[name], data, mode)
    return paths


def expiry(cert_pem: bytes) -> dt.datetime:
    """When the first certificate in `cert_pem` stops being valid (timezone-aware, UTC)."""
    return x509.load_pem_x509_certificates(cert_pem)[0].not_valid_after_utc

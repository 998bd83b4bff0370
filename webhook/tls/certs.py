"""Development certificates: a throwaway CA and a serving cert for the webhook Service.

The API server reaches the webhook as `<service>.<namespace>.svc`, so those names (and localhost
for running outside the cluster) go into the SAN; the CA bundle is what the webhook configuration's
`caBundle` carries. Production clusters should use cert-manager instead.
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


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def issue(spec: CertSpec, now: dt.datetime | None = None) -> IssuedCerts:
    """Create a fresh CA and a serving cert signed by it, valid from `now` for `spec.days`."""
    if now is None:
        now = dt.datetime.now(dt.UTC)
    elif now.tzinfo is None:
        raise ValueError("now must be timezone-aware")  # naive times would silently mean UTC
    now = now.replace(microsecond=0)  # X.509 times have one-second resolution
    not_before, not_after = now - CLOCK_SKEW, now + dt.timedelta(days=spec.days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"{spec.service} dev CA")
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    san: list[x509.GeneralName] = [x509.DNSName(name) for name in spec.dns_names]
    san += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in spec.ip_addresses]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"{spec.service}.{spec.namespace}.svc"))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    return IssuedCerts(
        ca_cert_pem=ca_cert.public_bytes(serialization.Encoding.PEM),
        ca_key_pem=_key_pem(ca_key),
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=_key_pem(key),
    )


def _write_atomic(path: pathlib.Path, data: bytes, mode: int) -> None:
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
        _write_atomic(paths[name], data, mode)
    return paths


def expiry(cert_pem: bytes) -> dt.datetime:
    """When the first certificate in `cert_pem` stops being valid (timezone-aware, UTC)."""
    return x509.load_pem_x509_certificates(cert_pem)[0].not_valid_after_utc

"""Development certs, checked by real TLS handshakes and openssl rather than by re-reading them."""

from __future__ import annotations

import datetime as dt
import ipaddress
import pathlib
import shutil
import socket
import ssl
import stat
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from webhook.tls import certs
from webhook.tls.certs import CertSpec, IssuedCerts

SPEC = CertSpec(service="gang-webhook", namespace="team-a", extra_dns=("webhook.example.test",))
NOW = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def issued() -> IssuedCerts:
    return certs.issue(SPEC)


@pytest.fixture
def files(issued: IssuedCerts, tmp_path: pathlib.Path) -> dict[str, pathlib.Path]:
    return certs.write(issued, tmp_path / "certs")


def _cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


@contextmanager
def _tls_server(cert: pathlib.Path, key: pathlib.Path) -> Iterator[int]:
    """A TLS server on 127.0.0.1 that sends b"ok" to each client completing a handshake."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)  # closing a socket does not wake a blocked accept(); polling does
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            with raw:
                raw.settimeout(5)
                try:
                    with ctx.wrap_socket(raw, server_side=True) as conn:
                        conn.sendall(b"ok")
                except (ssl.SSLError, OSError):
                    pass  # the client refused our cert; that is what some tests expect

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()
        assert not thread.is_alive()


def _connect(port: int, ca: pathlib.Path, server_hostname: str) -> bytes:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # check_hostname and CERT_REQUIRED by default
    ctx.load_verify_locations(ca)
    assert ctx.check_hostname
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname=server_hostname) as conn,
    ):
        return conn.recv(2)


@pytest.mark.parametrize(
    "hostname",
    ["localhost", "gang-webhook.team-a.svc", "webhook.example.test", "127.0.0.1"],
)
def test_tls_handshake_verifies_against_the_ca(
    files: dict[str, pathlib.Path], hostname: str
) -> None:
    with _tls_server(files["tls.crt"], files["tls.key"]) as port:
        assert _connect(port, files["ca.crt"], hostname) == b"ok"


def test_tls_handshake_rejects_a_name_not_in_the_cert(files: dict[str, pathlib.Path]) -> None:
    with (
        _tls_server(files["tls.crt"], files["tls.key"]) as port,
        pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"),
    ):
        _connect(port, files["ca.crt"], "evil.example")


def test_tls_handshake_rejects_another_ca(
    files: dict[str, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    other = certs.write(certs.issue(SPEC), tmp_path / "other")
    with (
        _tls_server(files["tls.crt"], files["tls.key"]) as port,
        pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"),
    ):
        _connect(port, other["ca.crt"], "localhost")


def test_tls_handshake_rejects_an_expired_cert(tmp_path: pathlib.Path) -> None:
    old = certs.write(certs.issue(SPEC, now=dt.datetime(2001, 1, 1, tzinfo=dt.UTC)), tmp_path)
    with (
        _tls_server(old["tls.crt"], old["tls.key"]) as port,
        pytest.raises(ssl.SSLCertVerificationError, match="expired"),
    ):
        _connect(port, old["ca.crt"], "localhost")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_openssl_verifies_the_chain(files: dict[str, pathlib.Path]) -> None:
    openssl = shutil.which("openssl")
    assert openssl is not None
    ca, leaf = str(files["ca.crt"]), str(files["tls.crt"])
    ok = subprocess.run(
        [openssl, "verify", "-x509_strict", "-purpose", "sslserver", "-CAfile", ca, leaf],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.strip() == f"{leaf}: OK"


def _signed_by_leaf(files: dict[str, pathlib.Path]) -> bytes:
    """A cert issued with the serving key, as if the serving cert were a CA."""
    leaf = _cert(files["tls.crt"].read_bytes())
    leaf_key = serialization.load_pem_private_key(files["tls.key"].read_bytes(), password=None)
    assert isinstance(leaf_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "localhost")])
    forged = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(leaf.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(leaf.not_valid_before_utc)
        .not_valid_after(leaf.not_valid_after_utc)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(leaf_key, hashes.SHA256())
    )
    return forged.public_bytes(serialization.Encoding.PEM)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_openssl_refuses_the_leaf_as_an_issuer(
    files: dict[str, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    openssl = shutil.which("openssl")
    assert openssl is not None
    forged = tmp_path / "forged.crt"
    forged.write_bytes(_signed_by_leaf(files))
    ca, leaf = str(files["ca.crt"]), str(files["tls.crt"])
    bad = subprocess.run(
        [openssl, "verify", "-CAfile", ca, "-untrusted", leaf, str(forged)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode != 0
    assert "invalid CA certificate" in bad.stdout + bad.stderr


def test_sans_are_exactly_what_the_spec_says(issued: IssuedCerts) -> None:
    san = _cert(issued.cert_pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert tuple(san.value.get_values_for_type(x509.DNSName)) == (
        "localhost",
        "gang-webhook",
        "gang-webhook.team-a",
        "gang-webhook.team-a.svc",
        "gang-webhook.team-a.svc.cluster.local",
        "webhook.example.test",
    )
    assert san.value.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]


def test_extra_names_are_appended_once() -> None:
    spec = CertSpec(extra_dns=("localhost", "a.test", "a.test"), extra_ips=("10.0.0.7", "::1"))
    assert spec.dns_names == (
        "localhost",
        "trainjob-scheduling-webhook",
        "trainjob-scheduling-webhook.trainjob-scheduling-system",
        "trainjob-scheduling-webhook.trainjob-scheduling-system.svc",
        "trainjob-scheduling-webhook.trainjob-scheduling-system.svc.cluster.local",
        "a.test",
    )
    assert spec.ip_addresses == ("127.0.0.1", "::1", "10.0.0.7")
    san = _cert(certs.issue(spec).cert_pem).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert tuple(san.value.get_values_for_type(x509.DNSName)) == spec.dns_names
    assert [str(ip) for ip in san.value.get_values_for_type(x509.IPAddress)] == list(
        spec.ip_addresses
    )


def test_spec_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="days"):
        CertSpec(days=0)
    with pytest.raises(ValueError):
        CertSpec(extra_ips=("not-an-ip",))
    with pytest.raises(ValueError, match="timezone"):
        certs.issue(SPEC, now=dt.datetime(2030, 1, 1))


def test_ca_is_a_ca_and_the_leaf_is_not(issued: IssuedCerts) -> None:
    ca, leaf = _cert(issued.ca_cert_pem), _cert(issued.cert_pem)

    ca_bc = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert ca_bc.critical and ca_bc.value.ca and ca_bc.value.path_length == 0
    ca_ku = ca.extensions.get_extension_for_class(x509.KeyUsage)
    assert ca_ku.critical and ca_ku.value.key_cert_sign and ca_ku.value.crl_sign
    assert not ca_ku.value.digital_signature
    assert ca.subject == ca.issuer
    assert ca.subject.rfc4514_string() == "CN=gang-webhook dev CA"
    ca.verify_directly_issued_by(ca)

    leaf_bc = leaf.extensions.get_extension_for_class(x509.BasicConstraints)
    assert leaf_bc.critical and not leaf_bc.value.ca
    leaf_ku = leaf.extensions.get_extension_for_class(x509.KeyUsage)
    assert leaf_ku.critical and leaf_ku.value.digital_signature and not leaf_ku.value.key_cert_sign
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
    assert leaf.subject.rfc4514_string() == "CN=gang-webhook.team-a.svc"
    assert leaf.issuer == ca.subject
    leaf.verify_directly_issued_by(ca)

    ca_ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    aki = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier == ca_ski.digest
    leaf.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    assert leaf.serial_number != ca.serial_number


@pytest.mark.parametrize(
    ("cert_attr", "key_attr"), [("cert_pem", "key_pem"), ("ca_cert_pem", "ca_key_pem")]
)
def test_keys_match_their_certs(issued: IssuedCerts, cert_attr: str, key_attr: str) -> None:
    cert = _cert(getattr(issued, cert_attr))
    key_pem: bytes = getattr(issued, key_attr)
    assert key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")  # unencrypted PKCS8
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.curve.name == "secp256r1"
    public = cert.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    signature = key.sign(b"challenge", ec.ECDSA(hashes.SHA256()))
    public.verify(signature, b"challenge", ec.ECDSA(hashes.SHA256()))  # raises on mismatch


def test_every_issue_is_fresh(issued: IssuedCerts) -> None:
    again = certs.issue(SPEC)
    assert again.ca_key_pem != issued.ca_key_pem and again.key_pem != issued.key_pem
    assert _cert(again.cert_pem).serial_number != _cert(issued.cert_pem).serial_number


def test_validity_window_follows_now_and_days() -> None:
    issued = certs.issue(CertSpec(days=10), now=NOW.replace(microsecond=123456))
    for pem in (issued.ca_cert_pem, issued.cert_pem):
        cert = _cert(pem)
        assert cert.not_valid_before_utc == NOW - dt.timedelta(minutes=5)
        assert cert.not_valid_after_utc == NOW + dt.timedelta(days=10)


def test_now_defaults_to_the_current_time(issued: IssuedCerts) -> None:
    cert = _cert(issued.cert_pem)
    current = dt.datetime.now(dt.UTC)
    assert cert.not_valid_before_utc < current
    assert current - cert.not_valid_before_utc < dt.timedelta(minutes=6)
    assert abs(cert.not_valid_after_utc - (current + dt.timedelta(days=365))) < dt.timedelta(
        minutes=1
    )


def test_expiry_reads_not_valid_after() -> None:
    issued = certs.issue(CertSpec(days=30), now=NOW)
    assert certs.expiry(issued.cert_pem) == NOW + dt.timedelta(days=30)
    # The first certificate wins when a bundle holds several (cert followed by its CA).
    other = certs.issue(CertSpec(days=90), now=NOW)
    assert certs.expiry(issued.cert_pem + other.ca_cert_pem) == NOW + dt.timedelta(days=30)
    assert certs.expiry(issued.cert_pem).tzinfo is not None


def test_write_creates_files_with_safe_modes(issued: IssuedCerts, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "nested" / "certs"
    paths = certs.write(issued, out)
    assert paths == {name: out / name for name in ("ca.crt", "ca.key", "tls.crt", "tls.key")}
    modes = {name: stat.S_IMODE(path.stat().st_mode) for name, path in paths.items()}
    assert modes == {"ca.crt": 0o644, "ca.key": 0o600, "tls.crt": 0o644, "tls.key": 0o600}
    assert paths["ca.crt"].read_bytes() == issued.ca_cert_pem
    assert paths["ca.key"].read_bytes() == issued.ca_key_pem
    assert paths["tls.crt"].read_bytes() == issued.cert_pem
    assert paths["tls.key"].read_bytes() == issued.key_pem
    assert sorted(p.name for p in out.iterdir()) == sorted(paths)  # no temp files left behind


def test_write_replaces_existing_files(issued: IssuedCerts, tmp_path: pathlib.Path) -> None:
    tmp_path.joinpath("tls.key").write_bytes(b"stale and too long " * 100)
    tmp_path.joinpath("tls.key").chmod(0o644)
    first = certs.write(issued, tmp_path)
    inodes = {name: path.stat().st_ino for name, path in first.items()}
    # A reader holding the old file keeps seeing complete old content: the file is swapped,
    # not rewritten in place.
    with first["tls.crt"].open("rb") as reader:
        second = certs.issue(SPEC)
        paths = certs.write(second, tmp_path)
        assert reader.read() == issued.cert_pem
    assert paths["tls.crt"].read_bytes() == second.cert_pem
    assert paths["tls.key"].read_bytes() == second.key_pem
    assert paths["ca.crt"].read_bytes() == second.ca_cert_pem
    assert paths["ca.key"].read_bytes() == second.ca_key_pem
    assert all(path.stat().st_ino != inodes[name] for name, path in paths.items())
    assert stat.S_IMODE(paths["tls.key"].stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(paths)


def test_write_output_loads_into_an_ssl_context(files: dict[str, pathlib.Path]) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(files["tls.crt"], files["tls.key"])  # raises if key and cert differ
    mismatched = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with pytest.raises(ssl.SSLError):
        mismatched.load_cert_chain(files["tls.crt"], files["ca.key"])

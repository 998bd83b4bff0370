"""`--tls-min-version` and `--tls-cipher-suites` over real TLS: the service as a process, its
webhook and metrics listeners probed by clients that offer only what the test allows them."""

from __future__ import annotations

import socket
import ssl
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from webhook.cli import build_parser
from webhook.tls.policy import CIPHER_SUITES, TlsPolicy

from .harness import ServerProcess, make_certs, server_process

V = ssl.TLSVersion
with warnings.catch_warnings():  # the old versions are the point of the test
    warnings.simplefilter("ignore", DeprecationWarning)
    TLS_1_1 = V.TLSv1_1


def handshake(
    url: str, *, lowest: V, highest: V, ciphers: str = "ALL:@SECLEVEL=0"
) -> tuple[str, str] | ssl.SSLError:
    """(version, cipher) the server agreed to, or the error it answered with. The client offers
    exactly `lowest`..`highest` and `ciphers` (security level 0, so it does offer weak ones)."""
    host, port = url.removeprefix("https://").split(":")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.set_ciphers(ciphers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version, ctx.maximum_version = lowest, highest
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                cipher = tls.cipher()
                assert cipher is not None
                return str(tls.version()), cipher[0]
        except ssl.SSLError as err:
            return err


def refused(result: tuple[str, str] | ssl.SSLError) -> bool:
    """The server ended the handshake: an alert, or (asyncio's TLS does not always flush it
    before closing) just the close. Not the client's own refusal to offer anything."""
    own = ("NO_PROTOCOLS_AVAILABLE", "NO_CIPHERS_AVAILABLE", "NO_CIPHER_MATCH")
    return isinstance(result, ssl.SSLError) and str(result.reason) not in own


@pytest.fixture(scope="module")
def default(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    certs = tmp_path_factory.mktemp("certs")
    make_certs(certs)
    with server_process(certs, "--metrics-auth=false") as proc:
        yield proc


def test_by_default_tls_1_1_and_weak_suites_are_refused_on_both_listeners(
    default: ServerProcess,
) -> None:
    for url in (default.url, default.metrics_url):
        old = handshake(url, lowest=TLS_1_1, highest=TLS_1_1)
        assert refused(old), old
        for weak in (
            "AES128-SHA",
            "ECDHE-ECDSA-AES128-SHA",
            "AES128-GCM-SHA256",
            "ECDHE-ECDSA-AES256-SHA384",
        ):
            # CBC, RSA key exchange (no forward secrecy): none is on the list.
            got = handshake(url, lowest=V.TLSv1_2, highest=V.TLSv1_2, ciphers=weak + ":@SECLEVEL=0")
            assert refused(got), (weak, got)
        good = handshake(url, lowest=V.TLSv1_2, highest=V.TLSv1_2)
        assert isinstance(good, tuple) and good[0] == "TLSv1.2", good
        assert good[1] in CIPHER_SUITES.values()
        assert handshake(url, lowest=V.TLSv1_2, highest=V.TLSv1_3) == (
            "TLSv1.3",
            "TLS_AES_256_GCM_SHA384",
        )


def test_min_version_1_3_and_a_narrower_suite_list(tmp_path: Path) -> None:
    make_certs(tmp_path)
    suites = "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"
    with server_process(tmp_path, "--metrics-auth=false", "--tls-min-version=VersionTLS13",
                        f"--tls-cipher-suites={suites}") as proc:  # fmt: skip
        old = handshake(proc.url, lowest=V.TLSv1_2, highest=V.TLSv1_2)
        assert refused(old), old
        new = handshake(proc.url, lowest=V.TLSv1_2, highest=V.TLSv1_3)
        assert isinstance(new, tuple) and new[0] == "TLSv1.3", new
    with server_process(tmp_path, "--metrics-auth=false", f"--tls-cipher-suites={suites}") as p:
        only = handshake(p.url, lowest=V.TLSv1_2, highest=V.TLSv1_2)
        assert only == ("TLSv1.2", "ECDHE-ECDSA-CHACHA20-POLY1305"), only
        other = handshake(
            p.url, lowest=V.TLSv1_2, highest=V.TLSv1_2, ciphers="ECDHE-ECDSA-AES128-GCM-SHA256"
        )
        assert refused(other), other


def test_the_flags_refuse_what_is_not_allowed() -> None:
    parser = build_parser()
    args = parser.parse_args(["serve"])
    assert TlsPolicy(args.tls_min_version, args.tls_cipher_suites) == TlsPolicy()
    assert parser.parse_args(["serve", "--tls-min-version=1.3"]).tls_min_version == "1.3"
    for bad in (
        ["--tls-min-version=1.1"],
        ["--tls-min-version=VersionTLS11"],
        ["--tls-cipher-suites=TLS_RSA_WITH_AES_128_CBC_SHA"],
        ["--tls-cipher-suites=TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA"],
        ["--tls-cipher-suites="],
    ):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(["serve", *bad])
        assert exit_info.value.code == 2, bad
    with pytest.raises(ValueError, match="not allowed"):
        TlsPolicy("1.2", ("TLS_RSA_WITH_RC4_128_SHA",))

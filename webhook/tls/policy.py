"""What the service's TLS listeners (webhooks and metrics) accept: the oldest protocol version
and the TLS 1.2 cipher suites (`--tls-min-version`, `--tls-cipher-suites`). Only `ssl`: the
command line imports it to check the flags.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

TLS_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}
# The TLS 1.2 suites a client may use, by their IANA names (as Kubernetes' own
# --tls-cipher-suites names them) with OpenSSL's: forward secrecy (ECDHE) and AEAD only, so no
# CBC, RSA key exchange, 3DES or RC4 can be configured at all. TLS 1.3 suites are all AEAD with
# forward secrecy and OpenSSL enables them whatever this list says.
CIPHER_SUITES = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
}


@dataclass(frozen=True)
class TlsPolicy:
    """What the TLS listeners (webhooks and metrics) accept. 1.2 by default, not 1.3: FIPS
    builds of Go before 1.24 (boringcrypto: some FIPS-mode API servers and scrapers) speak no
    TLS 1.3, and the API server is this service's most important client; with only the suites
    above, a 1.2 connection is as safe. Every Go client (API server, Prometheus) takes 1.3 when
    offered, so 1.3 is what they negotiate anyway."""

    min_version: str = "1.2"
    cipher_suites: tuple[str, ...] = tuple(CIPHER_SUITES)

    def __post_init__(self) -> None:
        if self.min_version not in TLS_VERSIONS:
            raise ValueError(f"TLS version {self.min_version!r} is not one of 1.2, 1.3")
        unknown = [name for name in self.cipher_suites if name not in CIPHER_SUITES]
        if unknown or not self.cipher_suites:
            raise ValueError(
                f"cipher suites {', '.join(unknown) or '(none)'} not allowed; choose from "
                + ", ".join(CIPHER_SUITES)
            )


def server_context(policy: TlsPolicy | None = None) -> ssl.SSLContext:
    policy = policy or TlsPolicy()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_VERSIONS[policy.min_version]
    ctx.set_ciphers(":".join(CIPHER_SUITES[name] for name in policy.cipher_suites))
    ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_NO_RENEGOTIATION
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx

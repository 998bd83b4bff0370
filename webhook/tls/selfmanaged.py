"""Self-managed webhook certificates, the pure part: what the Secret should hold given what it
holds and the time, and which caBundle each webhook should carry. No I/O; the clock is an
argument (the API side is `webhook/kube/selfcerts.py`).

The Secret is laid out as open-policy-agent/cert-controller (used by Kubeflow Trainer, Kueue and
JobSet) lays it out, type `kubernetes.io/tls`: `ca.crt` the CA bundle, `ca.key` the key of its
first CA, the one that signs, and `tls.crt`/`tls.key` the serving pair. The CA lives 10 years,
the serving certificate 1 year; each is renewed once a third of its life is left.

Unlike cert-controller, a CA change never breaks a client that trusts only what the webhook
configurations carry:

1. a new CA goes first in `ca.crt`, the CA of the serving certificate stays after it, and the
   serving certificate is left as it is (old + new are trusted, the old one is served);
2. the API side injects that bundle into every webhook;
3. once the bundle has been in place for `settle` (so every API server has seen it), the
   serving certificate is reissued by the new CA;
4. `overlap` after that, the old CA leaves the bundle.

A Secret deleted while the service knew its contents takes the same path (`lost`): a new CA and
serving certificate, without a moment when the API server trusts neither.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import (
    CertificateIssuerPrivateKeyTypes,
    PrivateKeyTypes,
)

from .certs import CA_CERT, CA_KEY, CLOCK_SKEW, TLS_CERT, TLS_KEY, key_pem, new_ca, new_serving, pem

CA_LIFETIME = dt.timedelta(days=3650)
SERVING_LIFETIME = dt.timedelta(days=365)
RENEW_WHEN_LEFT = 1 / 3  # of a certificate's life
SETTLE = dt.timedelta(seconds=30)  # a new bundle in place this long before the new CA serves
OVERLAP = dt.timedelta(hours=1)  # the old CA stays trusted this long after the switch
_SIGNING_KEYS = (
    rsa.RSAPrivateKey,
    ec.EllipticCurvePrivateKey,
    ed25519.Ed25519PrivateKey,
    ed448.Ed448PrivateKey,
    dsa.DSAPrivateKey,
)
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class Policy:
    """Whom the serving certificate is for, and how long things live."""

    service: str
    namespace: str
    ca_lifetime: dt.timedelta = CA_LIFETIME
    serving_lifetime: dt.timedelta = SERVING_LIFETIME
    settle: dt.timedelta = SETTLE
    overlap: dt.timedelta = OVERLAP

    def __post_init__(self) -> None:
        for what, value in (("service", self.service), ("namespace", self.namespace)):
            if not _LABEL.match(value):
                raise ValueError(f"the webhook {what} {value!r} is not a DNS label (RFC 1123)")

    @property
    def dns_names(self) -> tuple[str, ...]:
        svc, ns = self.service, self.namespace
        return (f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local", svc, f"{svc}.{ns}")


@dataclass(frozen=True)
class Pair:
    """A certificate and its private key, with the PEM they were read from or written as."""

    cert: x509.Certificate
    key: PrivateKeyTypes = field(compare=False)  # key objects never compare equal; the PEM does
    cert_pem: bytes = b""
    key_pem: bytes = b""


@dataclass(frozen=True)
class Stored:
    """What a Secret holds, as far as it is usable; `problems` says what is not."""

    cas: tuple[x509.Certificate, ...] = ()  # ca.crt, the signing CA first
    ca_key: Pair | None = None  # cas[0] with its key, if that is a CA whose key is here
    serving: Pair | None = None  # tls.crt with its key, if they match
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Material:
    """A complete, usable Secret: the bundle, the signing CA's key and the serving pair."""

    cas: tuple[x509.Certificate, ...]
    ca_key: Pair  # cas[0] and its key
    serving: Pair

    @property
    def bundle(self) -> bytes:
        return b"".join(pem(ca) for ca in self.cas)

    def data(self) -> dict[str, bytes]:
        return {
            CA_CERT: self.bundle,
            CA_KEY: self.ca_key.key_pem,
            TLS_CERT: self.serving.cert_pem,
            TLS_KEY: self.serving.key_pem,
        }


@dataclass(frozen=True)
class Decision:
    material: Material
    changes: tuple[str, ...] = ()  # what changed, for the logs; empty: keep the Secret as it is
    problems: tuple[str, ...] = ()  # what was unusable in the Secret (and so replaced)

    @property
    def keep(self) -> bool:
        return not self.changes


def _public(key: Any) -> bytes:
    der: bytes = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


def _pair(cert_pem: bytes, key_pem_: bytes) -> Pair:
    """Raises ValueError unless both parse and the key is the certificate's."""
    cert = x509.load_pem_x509_certificates(cert_pem)[0]
    key = serialization.load_pem_private_key(key_pem_, password=None)
    if _public(key.public_key()) != _public(cert.public_key()):
        raise ValueError("the key does not belong to the certificate")
    return Pair(cert, key, cert_pem, key_pem_)


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def read(data: Mapping[str, bytes]) -> Stored:
    """What a Secret's (decoded) data holds; never raises."""
    problems: list[str] = []
    cas: tuple[x509.Certificate, ...] = ()
    ca_key = serving = None
    try:
        cas = tuple(x509.load_pem_x509_certificates(data.get(CA_CERT, b"")))
    except ValueError as err:
        problems.append(f"{CA_CERT}: {err}")
    if cas:
        try:
            ca_key = _pair(pem(cas[0]), data.get(CA_KEY, b""))
            if not _is_ca(cas[0]) or not isinstance(ca_key.key, _SIGNING_KEYS):
                problems.append(f"{CA_CERT}: the first certificate is not a CA that can sign")
                ca_key = None
        except (ValueError, TypeError) as err:
            problems.append(f"{CA_KEY}: {err}")
    try:
        serving = _pair(data.get(TLS_CERT, b""), data.get(TLS_KEY, b""))
    except (ValueError, TypeError) as err:
        problems.append(f"{TLS_CERT}/{TLS_KEY}: {err}")
    return Stored(cas, ca_key, serving, tuple(problems))


def decode(secret_data: Mapping[str, Any] | None) -> dict[str, bytes]:
    """A Secret's `data` (base64 strings) as bytes; undecodable entries are left out."""
    decoded: dict[str, bytes] = {}
    for name, value in (secret_data or {}).items():
        if isinstance(value, str):
            try:
                decoded[name] = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                continue
    return decoded


def encode(data: Mapping[str, bytes]) -> dict[str, str]:
    return {name: base64.b64encode(value).decode() for name, value in data.items()}


# --- judging certificates at a given time -------------------------------------------------------


def valid_at(cert: x509.Certificate, now: dt.datetime) -> bool:
    return cert.not_valid_before_utc <= now < cert.not_valid_after_utc


def renewal_time(cert: x509.Certificate) -> dt.datetime:
    """When a third of its life is left."""
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return end - (end - start) * RENEW_WHEN_LEFT


def due(cert: x509.Certificate, now: dt.datetime) -> bool:
    """Time to renew: expired, or less than a third of its life left."""
    return now >= renewal_time(cert)


def signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def issuer_of(cert: x509.Certificate, cas: tuple[x509.Certificate, ...]) -> x509.Certificate | None:
    return next((ca for ca in cas if signed_by(cert, ca)), None)


def _names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(san.get_values_for_type(x509.DNSName))


def _serving_usable(
    pair: Pair, cas: tuple[x509.Certificate, ...], policy: Policy, now: dt.datetime
) -> bool:
    return (
        valid_at(pair.cert, now)
        and issuer_of(pair.cert, cas) is not None
        and set(policy.dns_names) <= _names(pair.cert)
    )


def issued_at(cert: x509.Certificate) -> dt.datetime:
    """When a certificate of ours was made (its notBefore is backdated by CLOCK_SKEW)."""
    return cert.not_valid_before_utc + CLOCK_SKEW


# --- the decision -------------------------------------------------------------------------------


@dataclass
class _Draft:
    policy: Policy
    now: dt.datetime
    cas: list[x509.Certificate] = field(default_factory=list)
    ca_key: Pair | None = None
    serving: Pair | None = None
    changes: list[str] = field(default_factory=list)

    def new_ca(self, keep: x509.Certificate | None) -> None:
        start = self.now - CLOCK_SKEW
        ca, key = new_ca(
            f"{self.policy.service} webhook CA", start, self.now + self.policy.ca_lifetime
        )
        self.cas = [ca, *([keep] if keep is not None else [])]
        self.ca_key = Pair(ca, key, pem(ca), key_pem(key))

    def new_serving(self) -> None:
        assert self.ca_key is not None
        ca = self.ca_key.cert
        key = cast(CertificateIssuerPrivateKeyTypes, self.ca_key.key)  # checked by read()
        end = min(self.now + self.policy.serving_lifetime, ca.not_valid_after_utc)
        p = self.policy
        cert, serving_key = new_serving(
            ca, key, p.dns_names[0], p.dns_names, (), self.now - CLOCK_SKEW, end
        )
        self.serving = Pair(cert, serving_key, pem(cert), key_pem(serving_key))


def decide(
    current: Stored | None,
    policy: Policy,
    now: dt.datetime,
    *,
    bundle_in_place: tuple[bytes, dt.datetime] | None = None,
    lost: Material | None = None,
) -> Decision:
    """What the Secret should hold at `now`.

    `current`: what it holds (None: there is none). `bundle_in_place`: a bundle every webhook
    carries, and since when. `lost`: what a Secret that is gone held, if known (see the module's
    docstring). Applied to its own result, with nothing due, it changes nothing.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    d = _Draft(policy, now)
    renew_ca = False
    if current is None and lost is not None:
        current = Stored(lost.cas, lost.ca_key, lost.serving)
        renew_ca = True  # a deleted Secret is made anew, through a CA change
    current = current or Stored()
    cas = current.cas
    if current.serving is not None and _serving_usable(current.serving, cas, policy, now):
        d.serving = current.serving
    d.cas, d.ca_key = list(cas), current.ca_key
    signer = current.ca_key.cert if current.ca_key is not None else None

    if signer is None or renew_ca or due(signer, now):
        keep = issuer_of(d.serving.cert, cas) if d.serving is not None else None
        d.new_ca(keep)
        d.changes.append("created the CA" if not cas and lost is None else "rotated the CA")
    elif len(d.cas) > 1:
        serving = d.serving
        switched = serving is not None and signed_by(serving.cert, signer)
        if switched and serving is not None and now >= issued_at(serving.cert) + policy.overlap:
            d.cas = d.cas[:1]
        else:  # an expired CA never helps
            d.cas = [signer, *[ca for ca in d.cas[1:] if valid_at(ca, now)]]
        if len(d.cas) < len(cas):
            d.changes.append("dropped the old CA from the bundle")

    assert d.ca_key is not None
    signer = d.ca_key.cert
    bundle = b"".join(pem(ca) for ca in d.cas)
    if d.serving is None:
        d.new_serving()
        d.changes.append("issued the serving certificate")
    elif signed_by(d.serving.cert, signer):
        if due(d.serving.cert, now):
            d.new_serving()
            d.changes.append("renewed the serving certificate")
    elif (
        bundle_in_place is not None
        and bundle_in_place[0] == bundle
        and now >= bundle_in_place[1] + policy.settle
    ):
        d.new_serving()
        d.changes.append("moved the serving certificate to the new CA")
    # else: a CA change waits for its bundle to be in place, even when the serving one is due

    assert d.serving is not None
    material = Material(tuple(d.cas), d.ca_key, d.serving)
    return Decision(material, tuple(d.changes), current.problems)


# --- the webhook configurations -----------------------------------------------------------------


def _carried(webhook: Mapping[str, Any]) -> str | None:
    client = webhook.get("clientConfig")
    value = client.get("caBundle") if isinstance(client, dict) else None
    return value if isinstance(value, str) else None


def bundle_ops(config: Mapping[str, Any], bundle: bytes) -> list[dict[str, Any]]:
    """JSON Patch operations putting `bundle` into every webhook of a Mutating- or
    ValidatingWebhookConfiguration that does not carry it; none when all do.

    Each replacement is guarded by `test`s of the webhook's name at that index and of the value
    it replaces, so a concurrent writer (another replica, a `helm upgrade`) makes the patch fail
    with 422 instead of being overwritten unseen; the caller reads again and decides again.
    """
    wanted = base64.b64encode(bundle).decode()
    ops: list[dict[str, Any]] = []
    webhooks = config.get("webhooks")
    for i, webhook in enumerate(webhooks if isinstance(webhooks, list) else []):
        if not isinstance(webhook, dict):
            continue
        carried = _carried(webhook)
        if carried is not None and decode({"b": carried}).get("b") == bundle:
            continue
        ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": webhook.get("name")})
        if carried is not None:
            path = f"/webhooks/{i}/clientConfig/caBundle"
            ops += [{"op": "test", "path": path, "value": carried}]
            ops += [{"op": "replace", "path": path, "value": wanted}]
        elif isinstance(webhook.get("clientConfig"), dict):
            path = f"/webhooks/{i}/clientConfig/caBundle"
            ops.append({"op": "add", "path": path, "value": wanted})
        else:
            path = f"/webhooks/{i}/clientConfig"
            ops.append({"op": "add", "path": path, "value": {"caBundle": wanted}})
    return ops


def carries(config: Mapping[str, Any], bundle: bytes) -> bool:
    """Every webhook of the configuration carries exactly `bundle`."""
    return not bundle_ops(config, bundle)

"""The pure part of self-managed certificates: what the Secret should hold, and which caBundle the
webhooks should carry (`webhook/tls/selfmanaged.py`), judged with real X.509 verification."""

from __future__ import annotations

import base64
import datetime as dt
import ssl
from typing import Any

import jsonpatch
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa

from webhook.tls import selfmanaged as sm
from webhook.tls.certs import CertSpec, issue, pem

POLICY = sm.Policy("trainjob-scheduling-webhook", "kubeflow-system")
T0 = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)


def stored(decision: sm.Decision) -> sm.Stored:
    """The Secret as another replica reads it back: through its (base64) data."""
    return sm.read(sm.decode(sm.encode(decision.material.data())))


def trusted(serving: sm.Pair, bundle: bytes, at: dt.datetime) -> bool:
    """Would a client that trusts only `bundle` accept this serving certificate at `at`?"""
    cas = x509.load_pem_x509_certificates(bundle)
    issuer = sm.issuer_of(serving.cert, tuple(cas))
    return issuer is not None and sm.valid_at(issuer, at) and sm.valid_at(serving.cert, at)


def test_bad_names_are_refused() -> None:
    for service, namespace in (("Bad_Name", "ns"), ("svc", ""), ("svc", "a" * 64)):
        with pytest.raises(ValueError, match="DNS label"):
            sm.Policy(service, namespace)


def test_a_first_decision_creates_a_ca_and_a_serving_certificate() -> None:
    made = sm.decide(None, POLICY, T0)
    assert made.changes == ("created the CA", "issued the serving certificate")
    m = made.material
    (ca,) = m.cas
    assert sm.signed_by(m.serving.cert, ca)
    assert ca.not_valid_after_utc - T0 == sm.CA_LIFETIME
    assert m.serving.cert.not_valid_after_utc - T0 == sm.SERVING_LIFETIME
    san = m.serving.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName)[:2] == [
        "trainjob-scheduling-webhook.kubeflow-system.svc",
        "trainjob-scheduling-webhook.kubeflow-system.svc.cluster.local",
    ]
    assert set(m.data()) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    # what another replica reads back is kept, and so is it a few months later
    for later in (T0, T0 + 200 * DAY):
        again = sm.decide(stored(made), POLICY, later)
        assert again.keep and again.material.data() == m.data()


def test_the_pair_loads_into_an_ssl_context(tmp_path: Any) -> None:
    m = sm.decide(None, POLICY, dt.datetime.now(dt.UTC)).material
    (tmp_path / "tls.crt").write_bytes(m.serving.cert_pem)
    (tmp_path / "tls.key").write_bytes(m.serving.key_pem)
    ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
        tmp_path / "tls.crt", tmp_path / "tls.key"
    )
    client = ssl.create_default_context(cadata=m.bundle.decode())
    assert client.get_ca_certs()[0]["subject"]


def test_the_serving_certificate_is_renewed_when_a_third_of_its_life_is_left() -> None:
    made = sm.decide(None, POLICY, T0)
    renew_at = T0 + sm.SERVING_LIFETIME * (2 / 3)
    assert sm.decide(stored(made), POLICY, renew_at - DAY).keep
    renewed = sm.decide(stored(made), POLICY, renew_at + DAY)
    assert renewed.changes == ("renewed the serving certificate",)
    assert renewed.material.cas == made.material.cas  # same CA: every client keeps trusting it
    assert renewed.material.serving.cert_pem != made.material.serving.cert_pem


def test_twenty_years_never_serve_an_untrusted_certificate() -> None:
    """Every ten days for twenty years, the webhooks carrying the bundle one step after the
    Secret changed (the injection): the served certificate is always trusted by what the
    webhooks carry at that moment, through two CA changes."""
    secret: sm.Stored | None = None
    carried: bytes | None = None  # what the webhook configurations hold
    since = T0
    changes: list[str] = []
    now = T0
    while now < T0 + dt.timedelta(days=20 * 365):
        decision = sm.decide(secret, POLICY, now, bundle_in_place=(carried or b"", since))
        served = decision.material.serving
        if carried is not None:
            assert trusted(served, carried, now), (now, decision.changes)
        assert len(decision.material.cas) <= 2
        changes += decision.changes
        secret = stored(decision)
        if decision.material.bundle != carried:  # injected before the next check
            carried, since = decision.material.bundle, now
            assert trusted(served, carried, now)
        now += 10 * DAY
    assert changes.count("rotated the CA") == 2  # at 6 2/3 and 13 1/3 years
    assert changes.count("moved the serving certificate to the new CA") == 2
    assert changes.count("dropped the old CA from the bundle") == 2
    assert 25 <= changes.count("renewed the serving certificate") <= 30  # every ~8 months


def test_a_ca_change_waits_for_its_bundle() -> None:
    made = sm.decide(None, POLICY, T0)
    rotate_at = T0 + sm.CA_LIFETIME * (2 / 3) + DAY
    # a serving certificate that is still fresh at that time, from the same CA
    fresh = sm.decide(stored(made), POLICY, rotate_at - 300 * DAY)
    rotated = sm.decide(stored(fresh), POLICY, rotate_at)
    assert rotated.changes == ("rotated the CA",)
    new, old = rotated.material.cas
    assert old == made.material.cas[0] and rotated.material.serving == fresh.material.serving
    assert rotated.material.ca_key.cert == new
    # until the bundle is in place (for `settle`), nothing moves, even when the serving one is due
    later = rotate_at + 30 * DAY  # the serving one is 330 days old: due, still valid
    bundle = rotated.material.bundle
    for in_place in (
        None,
        (made.material.bundle, rotate_at),
        (bundle, later - dt.timedelta(seconds=1)),
    ):
        assert sm.decide(stored(rotated), POLICY, later, bundle_in_place=in_place).keep
    moved = sm.decide(stored(rotated), POLICY, later, bundle_in_place=(bundle, later - sm.SETTLE))
    assert moved.changes == ("moved the serving certificate to the new CA",)
    assert sm.signed_by(moved.material.serving.cert, new)
    assert moved.material.cas == (new, old)
    # the old CA goes `overlap` after the switch, not before
    assert sm.decide(stored(moved), POLICY, later + sm.OVERLAP - DAY / 24 / 60).keep
    dropped = sm.decide(stored(moved), POLICY, later + sm.OVERLAP)
    assert dropped.changes == ("dropped the old CA from the bundle",)
    assert dropped.material.cas == (new,)


def test_a_lost_secret_is_made_anew_through_a_ca_change() -> None:
    made = sm.decide(None, POLICY, T0)
    again = sm.decide(None, POLICY, T0 + DAY, lost=made.material)
    assert again.changes == ("rotated the CA",)
    new, old = again.material.cas
    assert old == made.material.cas[0] and new != old
    assert again.material.serving == made.material.serving  # trusted by the old bundle


def test_unusable_contents_are_replaced_and_said_why() -> None:
    made = sm.decide(None, POLICY, T0).material
    data = made.data()
    no_ca_key = sm.decide(sm.read({**data, "ca.key": b"junk"}), POLICY, T0)
    assert no_ca_key.changes == ("rotated the CA",)  # the serving pair is kept meanwhile
    assert no_ca_key.material.serving == made.serving and len(no_ca_key.material.cas) == 2
    assert any(p.startswith("ca.key") for p in no_ca_key.problems)

    other = issue(CertSpec())  # a pair whose key is not the certificate's
    bad_pair = sm.decide(sm.read({**data, "tls.key": other.key_pem}), POLICY, T0)
    assert bad_pair.changes == ("issued the serving certificate",)
    assert bad_pair.material.cas == made.cas
    assert "does not belong" in " ".join(bad_pair.problems)

    junk = sm.decide(sm.read({"ca.crt": b"-----BEGIN CERTIFICATE-----\nAAAA"}), POLICY, T0)
    assert junk.changes == ("created the CA", "issued the serving certificate")
    assert junk.problems

    # a serving certificate for another Service is replaced, from the same CA
    wrong = sm.decide(sm.read(data), sm.Policy("other", "kubeflow-system"), T0)
    assert wrong.changes == ("issued the serving certificate",)
    assert sm.decode({"x": "not base64!"}) == {}
    with pytest.raises(ValueError, match="timezone"):
        sm.decide(None, POLICY, dt.datetime(2027, 1, 1))


def test_an_rsa_secret_from_another_tool_is_kept() -> None:
    """cert-controller writes RSA keys in PKCS#1; such a Secret is read and kept as it is."""
    from cryptography.hazmat.primitives import hashes, serialization

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(T0 - DAY)
        .not_valid_after(T0 + 3650 * DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pkcs1 = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    first = sm.decide(sm.read({"ca.crt": pem(ca), "ca.key": pkcs1}), POLICY, T0)
    assert first.changes == ("issued the serving certificate",)  # signed by the RSA CA
    assert sm.signed_by(first.material.serving.cert, ca)
    assert sm.decide(stored(first), POLICY, T0).keep


# --- the caBundle of the webhook configurations --------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def config(*bundles: str | None, client: bool = True) -> dict[str, Any]:
    hooks: list[dict[str, Any]] = []
    for i, bundle in enumerate(bundles):
        hook: dict[str, Any] = {"name": f"w{i}.example.com"}
        if client:
            hook["clientConfig"] = {"service": {"name": "svc", "namespace": "ns"}}
            if bundle is not None:
                hook["clientConfig"]["caBundle"] = bundle
        hooks.append(hook)
    return {"apiVersion": "admissionregistration.k8s.io/v1", "webhooks": hooks}


def test_bundle_ops_fill_every_webhook_and_only_those_that_differ() -> None:
    bundle = b"-----BEGIN CERTIFICATE-----\nnew\n-----END CERTIFICATE-----\n"
    cfg = config(b64(bundle), b64(b"old"), None, "")
    ops = sm.bundle_ops(cfg, bundle)
    touched = {op["path"].split("/")[2] for op in ops}
    assert touched == {"1", "2", "3"}
    patched = jsonpatch.apply_patch(cfg, ops)
    assert sm.carries(patched, bundle)
    assert sm.bundle_ops(patched, bundle) == []
    # without clientConfig at all, one is added
    bare = config(None, client=False)
    assert sm.carries(jsonpatch.apply_patch(bare, sm.bundle_ops(bare, bundle)), bundle)
    assert sm.carries({"webhooks": []}, bundle) and sm.carries({}, bundle)


def test_bundle_ops_fail_when_someone_changed_the_webhooks_meanwhile() -> None:
    bundle = b"new"
    cfg = config(b64(b"old"), b64(b"old"))
    ops = sm.bundle_ops(cfg, bundle)
    reordered = {"webhooks": list(reversed(cfg["webhooks"]))}
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(reordered, ops)
    rewritten = config(b64(b"someone else's"), b64(b"old"))
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(rewritten, ops)

"""Self-managed certificates against the API emulator over HTTP: replicas (each its own client,
`SelfManagedCerts` and served `Service`) keep a kubernetes.io/tls Secret and the caBundle of every
webhook of both configurations. Trust is judged with real TLS connections that trust only what
the MutatingWebhookConfiguration carries at that moment, as the API server does.

The decisions read an injected clock. The TLS client checks certificates against the real time,
so the clock starts at the real time and moves less than CLOCK_SKEW (5 minutes, by which
certificates are backdated): Secrets made "months ago" are seeded instead.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import hashlib
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import kmock
import orjson
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from tests.harness import ServerProcess, fixture, fixture_cache, free_port, server_process
from tests.kube_emulator import (
    MUTATING_CONFIGS,
    SECRETS,
    VALIDATING_CONFIGS,
    VersionedEmulator,
    api_client,
    create,
    delete,
    emulator,
    eventually,
    json_patch,
    kubeconfig,
    next_requests,
    status,
)
from webhook.kube.informer import Backoff
from webhook.kube.selfcerts import SelfCertSettings, SelfManagedCerts
from webhook.metrics.registry import Metrics
from webhook.server.certificates import CertSettings, resolve
from webhook.server.run import Service, Settings, StartupError, serving_certificate
from webhook.tls import selfmanaged as sm
from webhook.tls.certs import CertSpec, issue, pem
from webhook.tls.reload import ReloadingContext

NS = "kubeflow-system"
SECRET = "trainjob-scheduling-webhook-cert"
MUTATING = "trainjob-scheduling-webhook"
VALIDATING = "trainjob-scheduling-webhook"
POLICY = sm.Policy(
    "trainjob-scheduling-webhook",
    NS,
    settle=dt.timedelta(seconds=30),
    overlap=dt.timedelta(minutes=1),
)
SERVER_NAME = POLICY.dns_names[0]  # what the API server checks: <service>.<namespace>.svc
REVIEW = orjson.dumps(fixture("pod-create-by-job-controller.mutate.json"))
EXPIRY = "trainjob_scheduling_certificate_expiry_timestamp_seconds"


class Clock:
    def __init__(self) -> None:
        self.now = dt.datetime.now(dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += dt.timedelta(**delta)


def webhook_config(kind: str, *names: str, bundle: str | None = None) -> dict[str, Any]:
    hooks = []
    for name in names:
        client: dict[str, Any] = {"service": {"name": POLICY.service, "namespace": NS}}
        if bundle is not None:
            client["caBundle"] = bundle
        hooks.append({"name": name, "clientConfig": client, "sideEffects": "None"})
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": MUTATING},
        "webhooks": hooks,
    }


async def install_configs(k: VersionedEmulator) -> None:
    """As a Helm chart installs them: caBundle empty or absent."""
    mutating = webhook_config("MutatingWebhookConfiguration", "pods.x.io", "runtimes.x.io")
    validating = webhook_config(
        "ValidatingWebhookConfiguration", "a.x.io", "b.x.io", "c.x.io", bundle=""
    )
    await create(k, MUTATING_CONFIGS, mutating)
    await create(k, VALIDATING_CONFIGS, validating)


def carried(k: VersionedEmulator, resource: kmock.resource = MUTATING_CONFIGS) -> list[bytes]:
    """The caBundle of each webhook of a configuration, as stored now."""
    for (r, _, name), obj in list(k.objects.items()):
        if r == resource and name == MUTATING and not obj.deleted:
            hooks = obj.raw.get("webhooks") or []
            return [base64.b64decode(h["clientConfig"].get("caBundle") or "") for h in hooks]
    return []


def stored_secret(k: VersionedEmulator) -> dict[str, Any] | None:
    for (r, ns, name), obj in list(k.objects.items()):
        if (r, ns, name) == (SECRETS, NS, SECRET) and not obj.deleted:
            raw: dict[str, Any] = obj.raw
            return raw
    return None


def secret_data(k: VersionedEmulator) -> dict[str, bytes]:
    found = stored_secret(k)
    assert found is not None
    return sm.decode(found["data"])


def everywhere(k: VersionedEmulator, bundle: bytes) -> bool:
    hooks = carried(k, MUTATING_CONFIGS) + carried(k, VALIDATING_CONFIGS)
    return len(hooks) == 5 and all(b == bundle for b in hooks)


@dataclass
class Replica:
    name: str
    certs: SelfManagedCerts
    tls: ReloadingContext
    service: Service
    metrics: Metrics
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.service.settings.port

    @property
    def ready(self) -> bool:
        for task in self.tasks:
            if task.done():  # a crash fails the test at once, with its error
                raise AssertionError(f"{self.name} stopped: {task.exception()!r}")
        return self.tls.loaded and self.certs.bundle_ready and self.service.webhooks.started

    def served(self) -> bytes:
        assert self.certs.material is not None
        return self.certs.material.serving.cert_pem


@contextlib.asynccontextmanager
async def replica(
    url: str, tmp_path: Path, name: str, clock: Clock, check_period: float = 0.05
) -> AsyncIterator[Replica]:
    async with api_client(url, user_agent=name) as api:
        metrics = Metrics()
        directory = tmp_path / name
        tls = ReloadingContext(
            directory / "tls.crt", directory / "tls.key", metrics, directory / "ca.crt", True
        )
        settings = SelfCertSettings(SECRET, NS, MUTATING, VALIDATING, check_period)
        certs = SelfManagedCerts(
            api,
            settings,
            POLICY,
            tls,
            directory,
            clock=clock,
            backoff=lambda: Backoff(initial=0.05, maximum=0.2),
        )
        service = Service(
            Settings(
                host="127.0.0.1",
                port=free_port(),
                health_port=free_port(),
                metrics_port=free_port(),
                cert_poll_seconds=60,
                shutdown_timeout=2,
            ),
            fixture_cache(),
            tls,
            metrics=metrics,
        )
        r = Replica(name, certs, tls, service, metrics)
        r.tasks = [asyncio.create_task(certs.run()), asyncio.create_task(service.run([]))]
        try:
            yield r
        finally:
            service.stop()
            r.tasks[0].cancel()
            await asyncio.gather(*r.tasks, return_exceptions=True)


async def review(port: int, bundle: bytes) -> tuple[int, str]:
    """A review on a new TLS connection that trusts only `bundle`: the status and the presented
    certificate's fingerprint (status 0: the handshake failed)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the name
    if bundle:
        ctx.load_verify_locations(cadata=bundle.decode())
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=ctx, server_hostname=SERVER_NAME
        )
    except (ssl.SSLError, ValueError):
        return 0, ""
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True)
        head = (
            f"POST /mutate--v1-pod HTTP/1.1\r\nHost: {SERVER_NAME}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(REVIEW)}\r\n"
            "Connection: close\r\n\r\n"
        )
        writer.write(head.encode() + REVIEW)
        code = int((await reader.readline()).split()[1])
        await reader.read()
        return code, hashlib.sha256(der).hexdigest()
    finally:
        writer.close()


def fingerprint(cert_pem: bytes) -> str:
    der = x509.load_pem_x509_certificate(cert_pem).public_bytes(Encoding.DER)
    return hashlib.sha256(der).hexdigest()


class Probe:
    """Reviews in a loop, each on a new connection trusting only what the mutating webhook
    configuration carries when it starts; records every failure and every bundle used."""

    def __init__(self, k: VersionedEmulator, port: int) -> None:
        self.k, self.port = k, port
        self.failures: list[str] = []
        self.bundles: list[bytes] = []
        self.presented: list[str] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            bundle = carried(self.k)[0]
            try:
                code, presented = await review(self.port, bundle)
            except (OSError, ValueError) as err:  # e.g. the service stopped: still a failure
                code, presented = -1, repr(err)
            if code != 200:
                self.failures.append(f"{code} with a bundle of {bundle.count(b'BEGIN')} CAs")
            self.bundles.append(bundle)
            self.presented.append(presented)
            await asyncio.sleep(0.01)

    async def used(self, bundle: bytes, times: int = 3) -> None:
        """Until `times` reviews after now have trusted exactly `bundle`."""
        start = len(self.bundles)
        await eventually(
            lambda: self.bundles[start:].count(bundle) >= times, "the probe used the bundle"
        )

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def seed(k: VersionedEmulator, material: sm.Material) -> None:
    """A Secret as an earlier run of the service would have left it."""
    await create(
        k,
        SECRETS,
        {
            "metadata": {"name": SECRET, "namespace": NS},
            "type": "kubernetes.io/tls",
            "data": sm.encode(material.data()),
        },
    )


# --- first start, a second replica, two at once --------------------------------------------------


@pytest.mark.asyncio
async def test_first_start_creates_the_secret_and_injects_the_ca_everywhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="webhook.certs")
    async with emulator() as (k, url):
        await install_configs(k)
        async with replica(url, tmp_path, "a", Clock()) as a:
            await eventually(lambda: a.ready, "a ready")
            secret = stored_secret(k)
            assert secret is not None and secret["type"] == "kubernetes.io/tls"
            assert secret["metadata"]["labels"] == {
                "app.kubernetes.io/managed-by": "trainjob-scheduling-webhook"
            }
            data = secret_data(k)
            assert set(data) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
            assert everywhere(k, data["ca.crt"])
            code, presented = await review(a.port, carried(k)[0])
            assert (code, presented) == (200, fingerprint(data["tls.crt"]))
            assert (await review(a.port, issue(CertSpec()).ca_cert_pem))[0] == 0  # another CA
            # the expiry metric covers the serving certificate and its CA
            ca = x509.load_pem_x509_certificate(data["ca.crt"])
            sample = a.metrics.registry.get_sample_value
            assert sample(EXPIRY, {"certificate": "ca"}) == ca.not_valid_after_utc.timestamp()
            assert sample(EXPIRY, {"certificate": "serving"}) is not None
            assert not (tmp_path / "a" / "ca.key").exists()  # the CA key stays in the Secret
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        m.startswith("created the certificate Secret: created the CA, issued the serving")
        for m in messages
    ), messages
    assert sum("injected the CA bundle into" in m for m in messages) == 2


@pytest.mark.asyncio
async def test_a_second_replica_reuses_the_secret(tmp_path: Path) -> None:
    async with emulator() as (k, url):
        await install_configs(k)
        clock = Clock()
        async with replica(url, tmp_path, "a", clock) as a:
            await eventually(lambda: a.ready, "a ready")
            async with replica(url, tmp_path, "b", clock) as b:
                await eventually(lambda: b.ready, "b ready")
                assert a.served() == b.served() == secret_data(k)["tls.crt"]
                bundle = carried(k)[0]
                assert (await review(b.port, bundle))[0] == 200
                await asyncio.sleep(0.3)  # several passes of both: nothing more is written
        assert [kind for kind, _ in k.changes(SECRETS)] == ["ADDED"]
        assert len(k.changes(MUTATING_CONFIGS)) == 2  # created, injected once
        assert len(k[kmock.action.CREATE, SECRETS, kmock.headers({"User-Agent": "b"})]) == 0


@pytest.mark.asyncio
async def test_two_replicas_starting_at_once_end_with_one_secret(tmp_path: Path) -> None:
    async with emulator() as (k, url):
        await install_configs(k)
        clock = Clock()
        async with (
            replica(url, tmp_path, "a", clock) as a,
            replica(url, tmp_path, "b", clock) as b,
        ):
            await eventually(lambda: a.ready and b.ready, "both ready")
            await eventually(lambda: a.served() == b.served(), "both serve the same")
            data = secret_data(k)
            assert a.served() == data["tls.crt"] and everywhere(k, data["ca.crt"])
            for r in (a, b):
                assert await review(r.port, carried(k)[0]) == (200, fingerprint(data["tls.crt"]))
            await asyncio.sleep(0.3)
        assert [kind for kind, _ in k.changes(SECRETS)] == ["ADDED"]  # one create won
        assert len(k[kmock.action.CREATE, SECRETS]) == 2  # the other got 409 and read it
        assert len(k.changes(MUTATING_CONFIGS)) == 2 and len(k.changes(VALIDATING_CONFIGS)) == 2


# --- renewal and a CA change, with a client that trusts only the configuration --------------------


@pytest.mark.asyncio
async def test_the_serving_certificate_is_renewed_before_expiry(tmp_path: Path) -> None:
    clock = Clock()
    # made eight months ago, less three minutes: due in a minute or so
    made = sm.decide(
        None, POLICY, clock.now - sm.SERVING_LIFETIME * (2 / 3) + dt.timedelta(minutes=3)
    )
    async with emulator() as (k, url):
        await install_configs(k)
        await seed(k, made.material)
        async with replica(url, tmp_path, "a", clock) as a:
            await eventually(lambda: a.ready, "a ready")
            probe = Probe(k, a.port)
            old = fingerprint(made.material.serving.cert_pem)
            await probe.used(made.material.bundle)
            assert secret_data(k)["tls.crt"] == made.material.serving.cert_pem  # kept
            clock.advance(minutes=4)
            await eventually(
                lambda: secret_data(k)["tls.crt"] != made.material.serving.cert_pem, "renewed"
            )
            new = fingerprint(secret_data(k)["tls.crt"])
            await eventually(lambda: probe.presented[-3:] == [new] * 3, "the new one served")
            await probe.stop()
        assert not probe.failures, probe.failures[:5]
        assert probe.presented[0] == old and secret_data(k)["ca.crt"] == made.material.bundle


@pytest.mark.asyncio
async def test_a_ca_change_never_breaks_a_client_of_the_configuration(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="webhook.certs")
    clock = Clock()
    # a CA due in a minute (made 6 2/3 years ago), with a serving certificate it made lately
    old_ca = sm.decide(None, POLICY, clock.now - sm.CA_LIFETIME * (2 / 3) + dt.timedelta(minutes=3))
    seeded = sm.decide(sm.read(old_ca.material.data()), POLICY, clock.now - dt.timedelta(minutes=1))
    assert seeded.changes == ("issued the serving certificate",)
    a_ca = seeded.material.cas[0]
    async with emulator() as (k, url):
        await install_configs(k)
        await seed(k, seeded.material)
        async with replica(url, tmp_path, "a", clock) as a:
            await eventually(lambda: a.ready, "a ready")
            probe = Probe(k, a.port)
            await probe.used(seeded.material.bundle)

            clock.advance(minutes=2)  # the CA is due: a new one goes first, the old one stays

            def two_cas() -> bool:
                return len(x509.load_pem_x509_certificates(secret_data(k)["ca.crt"])) == 2

            await eventually(two_cas, "the CA rotated")
            both = secret_data(k)["ca.crt"]
            new_ca, kept = x509.load_pem_x509_certificates(both)
            assert kept == a_ca and new_ca != a_ca
            assert secret_data(k)["tls.crt"] == seeded.material.serving.cert_pem
            await eventually(lambda: everywhere(k, both), "old + new injected")
            await probe.used(both)  # every API server has seen it
            await asyncio.sleep(0.2)
            assert secret_data(k)["tls.crt"] == seeded.material.serving.cert_pem  # still waiting

            clock.advance(seconds=31)  # settled: the new CA signs the serving certificate
            await eventually(
                lambda: secret_data(k)["tls.crt"] != seeded.material.serving.cert_pem, "moved"
            )
            moved = x509.load_pem_x509_certificate(secret_data(k)["tls.crt"])
            assert sm.signed_by(moved, new_ca)
            new_print = fingerprint(secret_data(k)["tls.crt"])
            await eventually(lambda: probe.presented[-3:] == [new_print] * 3, "served")

            clock.advance(seconds=61)  # the overlap is over: the old CA leaves the bundle
            await eventually(lambda: everywhere(k, pem(new_ca)), "only the new CA")
            await probe.used(pem(new_ca))
            await probe.stop()
        assert not probe.failures, probe.failures[:5]
        assert len(set(probe.bundles)) == 3  # old alone, old + new, new alone
    messages = [r.getMessage() for r in caplog.records]
    for change in (
        "rotated the CA",
        "moved the serving certificate to the new CA",
        "dropped the old CA",
    ):
        assert any(change in m for m in messages), (change, messages)


@pytest.mark.asyncio
async def test_a_ca_change_waiting_for_missing_configurations_does_not_spin(
    tmp_path: Path,
) -> None:
    """Mid-change (the serving certificate due, waiting for its bundle to be injected), with the
    configurations not installed: passes come from the check period and the watches only."""
    clock = Clock()
    made = sm.decide(None, POLICY, clock.now - sm.SERVING_LIFETIME * 0.9)  # due, still valid
    mid = sm.decide(None, POLICY, clock.now, lost=made.material)
    assert mid.changes == ("rotated the CA",)
    async with emulator() as (k, url):
        await seed(k, mid.material)
        async with replica(url, tmp_path, "a", clock, check_period=10) as a:
            await eventually(lambda: a.tls.loaded, "serving")
            await asyncio.sleep(0.5)
            assert a.certs.passes <= 4, a.certs.passes  # not one every 10 ms
            assert not a.certs.bundle_ready
            assert secret_data(k)["tls.crt"] == made.material.serving.cert_pem  # waits


# --- repairs --------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_an_emptied_or_wrong_ca_bundle_is_put_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="webhook.certs")
    async with emulator() as (k, url):
        await install_configs(k)
        async with replica(url, tmp_path, "a", Clock()) as a:
            await eventually(lambda: a.ready, "a ready")
            bundle = secret_data(k)["ca.crt"]
            k.compact()  # the watches, cut, come back with 410 Gone and read again
            assert k.drop_watches() == 3
            # a `helm upgrade` empties one, a person pastes another CA into another
            ops = [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": ""}]
            await json_patch(k, MUTATING_CONFIGS, None, MUTATING, ops)
            wrong = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n").decode()
            ops = [{"op": "replace", "path": "/webhooks/2/clientConfig/caBundle", "value": wrong}]
            await json_patch(k, VALIDATING_CONFIGS, None, VALIDATING, ops)

            def injected() -> list[logging.LogRecord]:
                return [r for r in caplog.records if "injected the CA bundle" in r.getMessage()]

            await eventually(lambda: everywhere(k, bundle), "put back", timeout=5)
            await eventually(lambda: len(injected()) == 4, "each repair said")  # after its answer
            await eventually(lambda: a.ready, "ready again")
    repairs = {r.getMessage().split()[5]: r.__dict__["fields"]["was"] for r in injected()[2:]}
    assert repairs == {
        "mutatingwebhookconfigurations": "empty",
        "validatingwebhookconfigurations": "another bundle",
    }


@pytest.mark.asyncio
async def test_a_deleted_secret_is_made_anew_and_injected_without_an_outage(tmp_path: Path) -> None:
    clock = Clock()
    async with emulator() as (k, url):
        await install_configs(k)
        async with replica(url, tmp_path, "a", clock) as a:
            await eventually(lambda: a.ready, "a ready")
            before = secret_data(k)
            probe = Probe(k, a.port)
            await probe.used(before["ca.crt"])
            old_uid = stored_secret(k)["metadata"]["uid"]  # type: ignore[index]
            await delete(k, SECRETS, NS, SECRET)
            await eventually(lambda: stored_secret(k) is not None, "made anew")
            again = secret_data(k)
            assert stored_secret(k)["metadata"]["uid"] != old_uid  # type: ignore[index]
            new_ca, old_ca = x509.load_pem_x509_certificates(again["ca.crt"])
            assert pem(old_ca) == before["ca.crt"]
            assert again["tls.crt"] == before["tls.crt"]  # served on until the new bundle is in
            await eventually(lambda: everywhere(k, again["ca.crt"]), "re-injected")
            await probe.used(again["ca.crt"])
            clock.advance(seconds=31)
            await eventually(lambda: secret_data(k)["tls.crt"] != before["tls.crt"], "moved")
            assert sm.signed_by(x509.load_pem_x509_certificate(secret_data(k)["tls.crt"]), new_ca)
            await probe.used(again["ca.crt"])
            await probe.stop()
        assert not probe.failures, probe.failures[:5]


@pytest.mark.asyncio
async def test_a_missing_permission_is_one_clear_error_and_not_ready(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="webhook.certs")
    forbidden = status(
        403,
        f'secrets "{SECRET}" is forbidden: User "system:serviceaccount:{NS}:webhook" '
        f'cannot get resource "secrets" in API group "" in the namespace "{NS}"',
        "Forbidden",
    )
    async with emulator() as (k, url):
        await install_configs(k)
        k[kmock.action.FETCH, SECRETS] << forbidden
        async with replica(url, tmp_path, "a", Clock()) as a:
            gets = k[kmock.action.FETCH, SECRETS]
            await eventually(lambda: len(gets) >= 5, "retried")  # backoff 0.05 s .. 0.2 s
            assert not a.tls.loaded and not a.certs.bundle_ready
            assert not any(task.done() for task in a.tasks)  # no crash
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    (error,) = errors
    assert error.getMessage() == (
        f'forbidden to get secrets "{SECRET}" in namespace "{NS}": certificates cannot be managed'
    )
    rbac: str = error.__dict__["fields"]["rbac"]
    assert f'resources: [secrets], resourceNames: ["{SECRET}"], verbs: [get, watch, update]' in rbac
    assert stored_secret(k) is None


@pytest.mark.asyncio
async def test_no_permission_on_a_configuration_is_one_clear_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="webhook.certs")
    async with emulator() as (k, url):
        await install_configs(k)
        forbidden = status(403, "mutatingwebhookconfigurations is forbidden", "Forbidden")
        k[kmock.action.FETCH, MUTATING_CONFIGS] << forbidden
        async with replica(url, tmp_path, "a", Clock()) as a:
            gets = k[kmock.action.FETCH, MUTATING_CONFIGS]
            await eventually(lambda: len(gets) >= 4, "retried")
            await eventually(lambda: a.tls.loaded, "the certificate is served")
            assert not a.certs.bundle_ready  # so not ready
            assert everywhere(k, b"") is False and carried(k, VALIDATING_CONFIGS)[0]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        f'forbidden to get mutatingwebhookconfigurations "{MUTATING}": certificates cannot be '
        "managed"
    ]
    rbac = errors[0].__dict__["fields"]["rbac"]
    assert "resources: [mutatingwebhookconfigurations], resourceNames" in rbac
    assert "verbs: [get, watch, patch]} in a ClusterRole" in rbac


@pytest.mark.asyncio
async def test_a_secret_that_cannot_hold_the_certificates_is_one_clear_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="webhook.certs")
    async with emulator() as (k, url):
        await install_configs(k)
        opaque = {"metadata": {"name": SECRET, "namespace": NS}, "type": "Opaque", "data": {}}
        await create(k, SECRETS, opaque)  # made by hand, of another type
        async with replica(url, tmp_path, "a", Clock()) as a:
            puts = k[kmock.method.PUT, SECRETS]
            await eventually(lambda: len(puts) >= 3, "retried")
            assert not a.tls.loaded and not a.certs.bundle_ready
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert errors[0].getMessage() == (
        f'cannot update secrets "{SECRET}" in namespace "{NS}": it cannot hold the certificates'
    )
    assert "field is immutable" in errors[0].__dict__["fields"]["error"]


# --- the real serve process -----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serving_self(tmp_path: Path, url: str, *extra: str) -> AsyncIterator[ServerProcess]:
    """`python -m webhook serve --cert-management=self` against the emulator (which runs on this
    test's loop, so all waiting here is asynchronous)."""
    config = tmp_path / "kubeconfig"
    config.write_text(kubeconfig(url))
    unused = tmp_path / "unused-cert-dir"
    unused.mkdir()
    args = ["--kubeconfig", str(config), "--cert-management=self", "--namespace", NS]
    args += ["--reconcile=false", "--cert-check-period", "0.2", *extra]
    with server_process(unused, *args, wait=False) as proc:
        async with httpx.AsyncClient(timeout=5) as client:
            deadline = asyncio.get_running_loop().time() + 20
            while True:
                assert proc.process.poll() is None, proc.log_file.read_text()
                with contextlib.suppress(httpx.HTTPError):
                    await client.get(f"{proc.health_url}/healthz")
                    break
                assert asyncio.get_running_loop().time() < deadline, proc.log_file.read_text()
                await asyncio.sleep(0.05)
        try:
            yield proc
        finally:
            proc.process.terminate()
            for _ in range(600):  # the emulator must answer while the service shuts down
                if proc.process.poll() is not None:
                    break
                await asyncio.sleep(0.05)


async def failing(proc: ServerProcess) -> list[str]:
    async with httpx.AsyncClient(timeout=5) as client:
        answer = await client.get(f"{proc.health_url}/readyz")
    return [] if answer.status_code == 200 else list(answer.json()["failing"])


async def until_failing(proc: ServerProcess, expected: list[str]) -> None:
    deadline = asyncio.get_running_loop().time() + 15
    while (found := await failing(proc)) != expected:
        assert asyncio.get_running_loop().time() < deadline, (found, proc.log_file.read_text())
        await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_serve_is_ready_once_it_may_and_the_bundle_is_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real process: forbidden to read its Secret at first (one error, not ready, no crash),
    then allowed (as once the Role is fixed), then ready once the configurations exist."""
    scratch = tmp_path / "tmp"  # the container's /tmp
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    async with emulator() as (k, url):
        gets = k[kmock.action.FETCH, SECRETS]
        forbidden = status(403, f'secrets "{SECRET}" is forbidden', "Forbidden")
        next_requests(gets, 2) << forbidden
        async with serving_self(tmp_path, url) as proc:
            await until_failing(proc, ["certificate", "ca-bundle"])
            await eventually(lambda: len(gets) >= 2, "retried", timeout=15)
            assert proc.process.poll() is None
            # allowed now: the certificate comes from the Secret it made; no configurations yet
            await until_failing(proc, ["ca-bundle"])
            await install_configs(k)
            await until_failing(proc, [])
            data = secret_data(k)
            assert everywhere(k, data["ca.crt"])
            port = int(proc.url.rsplit(":", 1)[1])
            assert await review(port, carried(k)[0]) == (200, fingerprint(data["tls.crt"]))
            assert [p.name[:14] for p in scratch.iterdir()] == ["webhook-certs-"]
    assert proc.process.returncode == 0
    assert list(scratch.iterdir()) == []  # removed on the way out
    lines = proc.log_lines()
    errors = [line for line in lines if line["level"] == "error"]
    assert len(errors) == 1, errors
    assert errors[0]["msg"].startswith(f'forbidden to get secrets "{SECRET}" in namespace "{NS}"')
    assert "verbs: [get, watch, update]" in errors[0]["rbac"]
    messages = [line["msg"] for line in lines]
    assert "certificates are self-managed" in messages
    assert f'can get secrets "{SECRET}" in namespace "{NS}" again' in messages
    assert any(m.startswith("created the certificate Secret") for m in messages)
    assert any("does not exist (yet)" in m for m in messages)


def test_self_management_needs_a_cluster_and_good_names() -> None:
    """Startup errors (`serve` prints them as one `error:` line and exits 2)."""
    alone = Settings(certs=CertSettings(mode="self"))
    needs = "certificates: --cert-management=self keeps the certificate in a Secret, so it needs"
    with pytest.raises(StartupError, match=needs + " a cluster"):
        serving_certificate(alone, api=None, metrics=Metrics())
    bad = Settings(certs=CertSettings(mode="self", service="A_B"))
    with pytest.raises(StartupError, match="the webhook service 'A_B' is not a DNS label"):
        serving_certificate(bad, api=object(), metrics=Metrics())  # type: ignore[arg-type]


def test_auto_is_self_managed_only_inside_a_cluster(tmp_path: Path) -> None:
    token = tmp_path / "token"
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    assert resolve("auto", pod, token) == "files"  # no service account mounted
    token.write_text("t")
    assert resolve("auto", pod, token) == "self"
    assert resolve("auto", {}, token) == "files"
    assert resolve("files", pod, token) == "files" and resolve("self", {}, token) == "self"
    with pytest.raises(ValueError, match="must be one of auto, self, files"):
        resolve("cert-manager", {}, token)

"""The registry's families, the webhooks' instrumentation over real HTTPS, the certificate
counters, and the review cache."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from cryptography import x509

from tests.harness import fixture, fixture_cache, free_port, make_certs
from tests.kube_emulator import eventually
from webhook.admission.review import Decision
from webhook.metrics.app import metrics_server
from webhook.metrics.registry import HELD_REASONS, UNTIED_REASONS, Metrics
from webhook.metrics.ttlcache import TTLCache
from webhook.metrics.webhooks import decision_label
from webhook.server.app import admission_app
from webhook.server.run import listen
from webhook.tls.certs import CertSpec, issue, write
from webhook.tls.reload import ReloadingContext

POD = "/mutate--v1-pod"
TRAINJOB = "/validate-trainer-kubeflow-org-v1alpha1-trainjob"
RUNTIME = "/validate-trainer-kubeflow-org-v1alpha1-clustertrainingruntime"


# --- the registry -------------------------------------------------------------------------------


def test_every_family_has_its_kubernetes_name_and_labels() -> None:
    m = Metrics()
    m.webhook_requests.labels("/p", "200").inc()
    m.webhook_latency.labels("/p").observe(0.001)
    m.webhook_in_flight.labels("/p").set(0)
    m.admission_decisions.labels("/p", "CREATE", "allowed").inc()
    m.reconcile_total.labels("trainjob", "success").inc()
    m.reconcile_errors.labels("trainjob").inc()
    m.reconcile_time.labels("trainjob").observe(0.01)
    queue = ("trainjob", "trainjob")
    m.workqueue_depth.labels(*queue).set(1)
    m.workqueue_adds.labels(*queue).inc()
    m.workqueue_queue_duration.labels(*queue).observe(0.1)
    m.workqueue_work_duration.labels(*queue).observe(0.1)
    m.workqueue_unfinished_work.labels(*queue).set(0)
    m.workqueue_longest_running.labels(*queue).set(0)
    m.workqueue_retries.labels(*queue).inc()
    m.watch_restarts.labels("trainjobs").inc()
    m.cert_reads.inc()
    m.cert_read_errors.inc()
    m.cert_expiry.labels("serving").set(1)
    m.leader.labels("trainjob-scheduling-webhook").set(1)
    m.gang_api_available.set(1)
    m.events.labels("GangCreated").inc()
    got = {
        sample.name: tuple(sorted(sample.labels))
        for family in m.registry.collect()
        for sample in family.samples
    }
    queue_labels = ("controller", "name")
    expected = {
        "controller_runtime_webhook_requests_total": ("code", "webhook"),
        "controller_runtime_webhook_latency_seconds_bucket": ("le", "webhook"),
        "controller_runtime_webhook_requests_in_flight": ("webhook",),
        "trainjob_scheduling_admission_reviews_total": ("decision", "operation", "webhook"),
        "controller_runtime_reconcile_total": ("controller", "result"),
        "controller_runtime_reconcile_errors_total": ("controller",),
        "controller_runtime_reconcile_time_seconds_bucket": ("controller", "le"),
        "workqueue_depth": queue_labels,
        "workqueue_adds_total": queue_labels,
        "workqueue_queue_duration_seconds_count": queue_labels,
        "workqueue_work_duration_seconds_sum": queue_labels,
        "workqueue_unfinished_work_seconds": queue_labels,
        "workqueue_longest_running_processor_seconds": queue_labels,
        "workqueue_retries_total": queue_labels,
        "trainjob_scheduling_watch_restarts_total": ("resource",),
        "certwatcher_read_certificate_total": (),
        "certwatcher_read_certificate_errors_total": (),
        "trainjob_scheduling_certificate_expiry_timestamp_seconds": ("certificate",),
        "leader_election_master_status": ("name",),
        "trainjob_scheduling_gang_api_available": (),
        "trainjob_scheduling_events_total": ("reason",),
        "process_cpu_seconds_total": (),
        "python_gc_collections_total": ("generation",),
        "python_info": ("implementation", "major", "minor", "patchlevel", "version"),
    }
    for name, labels in expected.items():
        assert got.get(name) == labels, name
    assert not [name for name in got if name.endswith("_created")]


def test_pods_held_and_untied_by_reason_from_zero_other_reasons_as_other() -> None:
    """Every reason's series exists from the start (a rate sees the first hold); a reason the
    helpers do not know counts as Other (labels come from a fixed set)."""
    m = Metrics()

    def value(name: str, reason: str) -> float | None:
        return m.registry.get_sample_value(name, {"reason": reason})

    held, untied = "trainjob_scheduling_pods_held_total", "trainjob_scheduling_pods_untied_total"
    assert all(value(held, r) == 0 for r in HELD_REASONS)
    assert all(value(untied, r) == 0 for r in UNTIED_REASONS)
    m.held("NotFrozen")
    m.held("NotFrozen")
    m.held("made-up")
    m.untied("FrozenNoGang")
    m.untied("x" * 1000)
    assert (value(held, "NotFrozen"), value(held, "Other"), value(held, "made-up")) == (2, 1, None)
    assert (value(untied, "FrozenNoGang"), value(untied, "Other")) == (1, 1)
    m.gangs_with_untied_pods.set(3)
    assert m.registry.get_sample_value("trainjob_scheduling_gangs_with_untied_pods") == 3


def test_each_service_has_its_own_registry() -> None:
    first, second = Metrics(), Metrics()
    first.cert_reads.inc()
    assert first.registry.get_sample_value("certwatcher_read_certificate_total") == 1
    assert second.registry.get_sample_value("certwatcher_read_certificate_total") == 0


def test_decision_labels() -> None:
    assert decision_label(Decision()) == "allowed"
    assert decision_label(Decision(patch=[])) == "allowed"
    assert decision_label(Decision(patch=[{"op": "add"}])) == "patched"
    assert decision_label(Decision(allowed=False, code=422, reason="Invalid")) == "denied"
    assert decision_label(Decision(allowed=False, code=400, reason="BadRequest")) == "errored"
    assert decision_label(Decision(allowed=False, code=500, reason="InternalError")) == "errored"


# --- the webhooks, over HTTPS -------------------------------------------------------------------


@contextlib.asynccontextmanager
async def webhooks(tmp_path: Path, metrics: Metrics) -> AsyncIterator[httpx.AsyncClient]:
    """The real admission app (fixture cache) on TLS, in this loop; a client for it."""
    ca = make_certs(tmp_path)
    tls = ReloadingContext(tmp_path / "tls.crt", tmp_path / "tls.key")
    tls.reload()
    port = free_port()
    app = admission_app(fixture_cache(), metrics=metrics)
    server = metrics_server(app, "127.0.0.1", port, tls)
    task = asyncio.create_task(server.serve([listen("127.0.0.1", port)]))
    while not server.started:
        assert not task.done(), task.exception()
        await asyncio.sleep(0.01)
    verify = ssl.create_default_context(cafile=str(ca))
    try:
        async with httpx.AsyncClient(
            base_url=f"https://localhost:{port}", verify=verify, timeout=10
        ) as client:
            yield client
    finally:
        server.should_exit = True
        await task


def review(name: str, **changes: Any) -> bytes:
    doc = copy.deepcopy(fixture(name))
    for key, value in changes.items():
        doc["request"][key] = value
    return orjson.dumps(doc)


@pytest.mark.asyncio
async def test_webhook_requests_latency_in_flight_and_decisions(tmp_path: Path) -> None:
    m = Metrics()
    sample = m.registry.get_sample_value
    unknown_runtime = copy.deepcopy(fixture("trainjob-create.validate.json"))
    unknown_runtime["request"]["object"]["spec"]["runtimeRef"]["name"] = "no-such-runtime"
    async with webhooks(tmp_path, m) as client:
        start = time.monotonic()
        # bound before the first review: the common series exist at 0
        assert (
            sample("controller_runtime_webhook_requests_total", {"webhook": POD, "code": "200"})
            == 0
        )
        pod = review("pod-create-by-job-controller.mutate.json")
        for _ in range(3):
            assert (await client.post(POD, content=pod)).status_code == 200
        trainjob = review("trainjob-create.validate.json")
        assert (await client.post(TRAINJOB, content=trainjob)).status_code == 200
        denied = orjson.dumps(unknown_runtime)
        assert (await client.post(TRAINJOB, content=denied)).status_code == 200
        assert (await client.post(RUNTIME, content=pod)).status_code == 200  # errored
        assert (await client.post(POD, content=b"not json")).status_code == 400
        assert (await client.post("/mutate-nothing", content=pod)).status_code == 404
        assert (await client.get(POD)).status_code == 405
        elapsed = time.monotonic() - start

    def requests(path: str, code: int) -> float | None:
        labels = {"webhook": path, "code": str(code)}
        return sample("controller_runtime_webhook_requests_total", labels)

    def decisions(path: str, operation: str, decision: str) -> float | None:
        labels = {"webhook": path, "operation": operation, "decision": decision}
        return sample("trainjob_scheduling_admission_reviews_total", labels)

    assert (requests(POD, 200), requests(POD, 400)) == (3, 1)
    assert (requests(TRAINJOB, 200), requests(RUNTIME, 200)) == (2, 1)
    assert decisions(POD, "CREATE", "patched") == 3
    assert decisions(TRAINJOB, "CREATE", "allowed") == 1
    assert decisions(TRAINJOB, "CREATE", "denied") == 1
    assert decisions(RUNTIME, "CREATE", "errored") == 1
    latency = "controller_runtime_webhook_latency_seconds"
    assert sample(f"{latency}_count", {"webhook": POD}) == 4
    # In seconds: one after the other, the reviews took no longer than the test around them.
    assert 0 < (sample(f"{latency}_sum", {"webhook": POD}) or 0) < elapsed
    assert sample("controller_runtime_webhook_requests_in_flight", {"webhook": POD}) == 0
    # Paths that are not webhooks are not counted: a client cannot make up label values.
    webhooks_seen = {
        s.labels["webhook"]
        for family in m.registry.collect()
        for s in family.samples
        if "webhook" in s.labels
    }
    assert "/mutate-nothing" not in webhooks_seen


@pytest.mark.asyncio
async def test_in_flight_counts_a_review_being_read(tmp_path: Path) -> None:
    m = Metrics()
    gauge = "controller_runtime_webhook_requests_in_flight"
    body = review("pod-create-by-job-controller.mutate.json")
    rest = asyncio.Event()

    async def slow_body() -> AsyncIterator[bytes]:
        yield body[:100]
        await rest.wait()  # the rest of the body once the review is seen in flight
        yield body[100:]

    async with webhooks(tmp_path, m) as client:
        headers = {"content-length": str(len(body))}
        sending = asyncio.create_task(client.post(POD, content=slow_body(), headers=headers))
        await eventually(
            lambda: m.registry.get_sample_value(gauge, {"webhook": POD}) == 1,
            "the review counted in flight while its body comes",
        )
        rest.set()
        assert (await sending).status_code == 200
        assert m.registry.get_sample_value(gauge, {"webhook": POD}) == 0


# --- certificates ------------------------------------------------------------------------------


def test_certificate_reads_errors_and_expiry(tmp_path: Path) -> None:
    m = Metrics()
    make_certs(tmp_path)
    tls = ReloadingContext(tmp_path / "tls.crt", tmp_path / "tls.key", m)
    sample = m.registry.get_sample_value

    def counts() -> tuple[float | None, float | None]:
        return (
            sample("certwatcher_read_certificate_total"),
            sample("certwatcher_read_certificate_errors_total"),
        )

    expiry = "trainjob_scheduling_certificate_expiry_timestamp_seconds"
    assert tls.reload()
    assert tls.expires_at is not None
    assert sample(expiry, {"certificate": "serving"}) == tls.expires_at.timestamp()
    assert sample(expiry, {"certificate": "ca"}) is None  # no ca_file given
    assert not tls.reload()  # unchanged: read, not loaded again
    assert counts() == (2, 0)
    (tmp_path / "tls.key").write_text("not a key")
    assert not tls.reload()
    (tmp_path / "tls.key").unlink()
    assert not tls.reload()
    assert counts() == (4, 2)
    assert tls.loaded  # the old pair is still served


def test_the_expiry_of_the_issuing_ca(tmp_path: Path) -> None:
    """With a CA file (a bundle), the CA reported is the one that issued the served certificate."""
    m = Metrics()
    expiry = "trainjob_scheduling_certificate_expiry_timestamp_seconds"
    served, other = issue(CertSpec(days=30)), issue(CertSpec(days=90))
    write(served, tmp_path)
    (tmp_path / "ca.crt").write_bytes(other.ca_cert_pem + served.ca_cert_pem)
    tls = ReloadingContext(tmp_path / "tls.crt", tmp_path / "tls.key", m, tmp_path / "ca.crt")
    assert tls.reload()
    ca = x509.load_pem_x509_certificate(served.ca_cert_pem)
    assert m.registry.get_sample_value(expiry, {"certificate": "ca"}) == (
        ca.not_valid_after_utc.timestamp()
    )
    write(other, tmp_path)  # now the other CA's pair; a CA file without its issuer
    (tmp_path / "ca.crt").write_bytes(served.ca_cert_pem)
    assert tls.reload()
    assert m.registry.get_sample_value(expiry, {"certificate": "ca"}) is None
    assert m.registry.get_sample_value(expiry, {"certificate": "serving"}) is not None


# --- the review cache ---------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_ttl_cache_expires_and_evicts_the_least_recently_used() -> None:
    clock = Clock()
    cache: TTLCache[str, int] = TTLCache(max_entries=3, clock=clock)
    cache.put("a", 1, ttl=10)
    cache.put("b", 2, ttl=5)
    cache.put("c", 3, ttl=10)
    assert cache.get("a") == 1  # a is now the most recently used
    cache.put("d", 4, ttl=10)  # evicts b
    assert (cache.get("b"), cache.get("a"), cache.get("c"), cache.get("d")) == (None, 1, 3, 4)
    assert len(cache) == 3
    clock.now = 10
    assert cache.get("a") is None and len(cache) == 2
    cache.put("e", 5, ttl=0)  # not cached at all
    assert cache.get("e") is None


@pytest.mark.asyncio
async def test_ttl_cache_loads_once_for_concurrent_misses_and_never_caches_failures() -> None:
    cache: TTLCache[str, str] = TTLCache(max_entries=10)
    calls = 0
    gate = asyncio.Event()

    async def load() -> tuple[str, float]:
        nonlocal calls
        calls += 1
        await gate.wait()
        return "value", 60.0

    waiters = [asyncio.create_task(cache.get_or_load("k", load)) for _ in range(10)]
    await asyncio.sleep(0.01)
    waiters[0].cancel()  # one caller gives up: the others still get the answer
    gate.set()
    results = await asyncio.gather(*waiters[1:])
    assert (results, calls) == (["value"] * 9, 1)
    assert await cache.get_or_load("k", load) == "value" and calls == 1

    async def fail() -> tuple[str, float]:
        nonlocal calls
        calls += 1
        raise RuntimeError("API server down")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            await cache.get_or_load("x", fail)
    assert calls == 3

"""The metrics of the real service: `python -m webhook serve --kubeconfig` against the API
emulator, scraped over HTTPS on its metrics port.

The emulator (`tests.kube_emulator.emulator`) runs in a thread on its own event loop, so the
tests may wait synchronously (the harness's `server_process` does) without stalling it, and the
service can release its Lease on shutdown. kmock reactions on it answer the service's
TokenReviews and SubjectAccessReviews (`tests.test_metrics_auth.FakeReviews`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import OnLoop, ServerProcess, fixture, make_certs, server_process, webhook_path
from tests.kube_emulator import (
    CLUSTER_RUNTIMES,
    TRAINJOBS,
    VersionedEmulator,
    create,
    emulator,
    kubeconfig,
)
from tests.test_metrics_auth import (
    ACCESS_REVIEWS,
    DENIED_TOKEN,
    GOOD_TOKEN,
    INTRUDER,
    TOKEN_REVIEWS,
    UNKNOWN_TOKEN,
    FakeReviews,
)
from webhook.reconcile.reconciler import CONTROLLER

T = TypeVar("T")

LEASE = "trainjob-scheduling-webhook"  # the default --lease-name
GANG_API = "trainjob_scheduling_gang_api_available"
LEADER = "leader_election_master_status"
WEBHOOK_REQUESTS = "controller_runtime_webhook_requests_total"
RECONCILED = "controller_runtime_reconcile_total"
FAMILIES = (
    WEBHOOK_REQUESTS,
    RECONCILED,
    "workqueue_depth",
    "certwatcher_read_certificate_total",
    GANG_API,
    LEADER,
)
POD_REVIEW = "pod-create-by-job-controller.mutate.json"


# --- the API server, in a thread ----------------------------------------------------------------


@dataclass
class Cluster(OnLoop):
    """The emulator running on `loop` in its own thread; `kubeconfig` points at it."""

    k: VersionedEmulator
    url: str
    kubeconfig: Path
    reviews: FakeReviews
    loop: asyncio.AbstractEventLoop

    def requests(self, selector: str) -> int:
        """How many requests the emulator has seen matching a kmock selector string."""
        return self.call(lambda: len(self.k[selector]))


@contextlib.contextmanager
def cluster(
    directory: Path, *, scheduling: bool = True, reviews: FakeReviews | None = None
) -> Iterator[Cluster]:
    """`emulator(scheduling=...)` in a thread, answering reviews as `reviews` says."""
    reviews = reviews or FakeReviews()
    ready: concurrent.futures.Future[tuple[Cluster, asyncio.Event]] = concurrent.futures.Future()
    errors: list[BaseException] = []

    async def main() -> None:
        stop = asyncio.Event()
        async with emulator(scheduling=scheduling) as (k, url):
            reviews.install(k)
            config = directory / "kubeconfig"
            config.write_text(kubeconfig(url))
            loop = asyncio.get_running_loop()
            ready.set_result((Cluster(k, url, config, reviews, loop), stop))
            await stop.wait()

    def target() -> None:
        try:
            asyncio.run(main())
        except BaseException as err:  # surfaced in the test
            if ready.done():
                errors.append(err)
            else:
                ready.set_exception(err)

    thread = threading.Thread(target=target, name="api-emulator", daemon=True)
    thread.start()
    found, stop = ready.result(timeout=10)
    try:
        yield found
    finally:
        found.loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=10)
        assert not thread.is_alive(), "the emulator did not stop"
    assert not errors, errors


# --- the service ------------------------------------------------------------------------------


@dataclass
class Served:
    """A running `python -m webhook serve` and the CA its certificates chain to."""

    proc: ServerProcess
    ca_file: Path

    def client(self, base_url: str, token: str | None = None) -> httpx.Client:
        verify = ssl.create_default_context(cafile=str(self.ca_file))
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=base_url, verify=verify, headers=headers, timeout=10)

    def scrape(self, token: str | None = GOOD_TOKEN) -> Scrape:
        with self.client(self.proc.metrics_url, token) as client:
            return Scrape.of(client.get("/metrics"))

    def readyz(self) -> int:
        return httpx.get(f"{self.proc.health_url}/readyz", timeout=5).status_code

    def log_tail(self, chars: int = 4000) -> str:
        return self.proc.log_file.read_text(errors="replace")[-chars:]

    def eventually(self, check: Callable[[], T | None], what: str, timeout: float = 10.0) -> T:
        """`check()`'s first truthy result, polling; fails with the service's log tail."""
        deadline = time.monotonic() + timeout
        while True:
            result = check()
            if result:
                return result
            assert self.proc.process.poll() is None, f"serve exited\n{self.log_tail()}"
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout}s: {what}\n{self.log_tail()}")
            time.sleep(0.05)


@contextlib.contextmanager
def serve(tmp_path: Path, *args: str, wait: bool = True) -> Iterator[Served]:
    """`python -m webhook serve *args` on fresh certificates; `wait`: ready (/readyz 200)."""
    cert_dir = tmp_path / "certs"
    cert_dir.mkdir()
    ca_file = make_certs(cert_dir)
    with server_process(cert_dir, *args, wait=wait) as proc:
        yield Served(proc, ca_file)


@contextlib.contextmanager
def serve_with_cluster(
    tmp_path: Path, *args: str, scheduling: bool = True, wait: bool = True
) -> Iterator[tuple[Cluster, Served]]:
    """The emulator and `python -m webhook serve --kubeconfig` for it (`wait`: ready)."""
    with (
        cluster(tmp_path, scheduling=scheduling) as api,
        serve(tmp_path, "--kubeconfig", str(api.kubeconfig), *args, wait=wait) as served,
    ):
        yield api, served


@dataclass
class Scrape:
    status: int
    text: str
    families: set[str] = field(default_factory=set)  # the names on `# TYPE` lines
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = field(default_factory=dict)

    def value(self, metric: str, /, **labels: str) -> float | None:
        return self.samples.get((metric, frozenset(labels.items())))

    @classmethod
    def of(cls, response: httpx.Response) -> Scrape:
        result = cls(response.status_code, response.text)
        if response.status_code == 200:
            for line in response.text.splitlines():
                if line.startswith("# TYPE "):
                    result.families.add(line.split()[2])
            for family in text_string_to_metric_families(response.text):
                for sample in family.samples:
                    key = (sample.name, frozenset(sample.labels.items()))
                    result.samples[key] = sample.value
        return result


def cluster_runtime() -> dict[str, Any]:
    review = fixture("clustertrainingruntime-update-server-side-apply.validate.json")
    obj: dict[str, Any] = copy.deepcopy(review["request"]["object"])
    obj["metadata"] = {"name": obj["metadata"]["name"]}
    return obj


def trainjob() -> dict[str, Any]:
    obj: dict[str, Any] = copy.deepcopy(
        fixture("trainjob-create.validate.json")["request"]["object"]
    )
    obj["metadata"] = {"name": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"]}
    obj.pop("status", None)
    return obj


# --- (a) a scrape of the whole service ----------------------------------------------------------


def test_metrics_port_serves_the_whole_service_to_an_allowed_token(tmp_path: Path) -> None:
    with serve_with_cluster(tmp_path) as (api, served):
        # Refusals first: no token (no review sent), an unknown token, a user without RBAC.
        refused = served.scrape(token=None)
        assert refused.status == 401, refused.text
        assert api.requests(TOKEN_REVIEWS) == 0
        assert served.scrape(UNKNOWN_TOKEN).status == 401
        denied = served.scrape(DENIED_TOKEN)
        assert denied.status == 403 and INTRUDER in denied.text, denied.text

        # One real AdmissionReview through the webhook port.
        review = fixture(POD_REVIEW)
        path = webhook_path(review, "mutate")
        with served.client(served.proc.url) as client:
            answer = client.post(path, json=review)
        assert answer.status_code == 200, answer.text
        assert answer.json()["response"]["uid"] == review["request"]["uid"]

        # And one reconciliation: a TrainJob on its runtime, reconciled by the leader.
        api.run(create(api.k, CLUSTER_RUNTIMES, cluster_runtime()))
        api.run(create(api.k, TRAINJOBS, trainjob()))

        def settled() -> Scrape | None:
            found = served.scrape()
            assert found.status == 200, found.text
            reconciled = found.value(RECONCILED, controller=CONTROLLER, result="success")
            leading = found.value(LEADER, name=LEASE) == 1.0
            # The queue drains: the condition the pass writes comes back through the watch
            # and queues the TrainJob once more, so an empty queue is waited for, not assumed.
            idle = found.value("workqueue_depth", name=CONTROLLER, controller=CONTROLLER) == 0.0
            served_gangs = found.value(GANG_API) == 1.0
            return found if leading and reconciled and served_gangs and idle else None

        metrics = served.eventually(
            settled, "leading, gang API served, a TrainJob reconciled, the work queue empty"
        )
        assert set(FAMILIES) <= metrics.families, sorted(set(FAMILIES) - metrics.families)
        assert f"{GANG_API} 1.0" in metrics.text.splitlines()
        answered = metrics.value(WEBHOOK_REQUESTS, webhook=path, code="200")
        assert answered == 1.0, {
            k: v for k, v in metrics.samples.items() if k[0] == WEBHOOK_REQUESTS
        }
        assert (metrics.value("certwatcher_read_certificate_total") or 0) >= 1

        # Each token was reviewed once and each authenticated user's access once (then cached).
        assert api.requests(TOKEN_REVIEWS) == 3
        assert api.requests(ACCESS_REVIEWS) == 2
        sent = api.call(lambda: list(api.reviews.access_reviews))
        attributes = [r["spec"]["nonResourceAttributes"] for r in sent]
        assert attributes == [{"path": "/metrics", "verb": "get"}] * 2


# --- (b) no gang API ----------------------------------------------------------------------------


def test_without_the_gang_api_the_service_is_ready_and_says_so(tmp_path: Path) -> None:
    with serve_with_cluster(tmp_path, scheduling=False) as (_, served):

        def unavailable() -> dict[str, Any] | None:
            for line in served.proc.log_lines():
                if line["logger"] == "webhook.discovery" and line["level"] == "error":
                    return line
            return None

        line = served.eventually(unavailable, "discovery's error")
        assert "gang scheduling is unavailable" in line["msg"], line
        assert "scheduling.k8s.io/v1beta1" in line["msg"], line
        assert served.readyz() == 200
        metrics = served.scrape()
        assert metrics.status == 200, metrics.text
        assert f"{GANG_API} 0.0" in metrics.text.splitlines()

        def leading() -> bool:  # the reconciler runs all the same (and makes nothing)
            return served.scrape().value(LEADER, name=LEASE) == 1.0

        served.eventually(leading, "leading without the gang API")
        assert served.scrape().value(GANG_API) == 0.0


# --- (c) no cluster -----------------------------------------------------------------------------


def test_without_a_cluster_metrics_auth_answers_503_at_once(tmp_path: Path) -> None:
    with serve(tmp_path) as served:  # ready: the harness waited for /readyz 200
        for token in (None, GOOD_TOKEN):
            answer = served.scrape(token)
            assert answer.status == 503, answer.text
            assert "no cluster" in answer.text  # NoCluster's answer: no review attempted
        assert served.readyz() == 200
        warnings = [
            line
            for line in served.proc.log_lines()
            if line["level"] == "warning" and "--metrics-auth=false" in line["msg"]
        ]
        assert warnings, served.log_tail()


def test_without_a_cluster_metrics_auth_off_serves_anyone(tmp_path: Path) -> None:
    with serve(tmp_path, "--metrics-auth=false") as served:
        answer = served.scrape(token=None)
        assert answer.status == 200, answer.text
        assert {WEBHOOK_REQUESTS, "certwatcher_read_certificate_total"} <= answer.families

"""The secured /metrics endpoint over real HTTPS, with kmock as the API server that answers
TokenReviews and SubjectAccessReviews over HTTP (through the `kubernetes.aio` client).

The API server is kmock's `KubernetesScaffold` (discovery, no storage) plus reactions: reviews
are not stored objects, and kmock's emulator would store every create (refusing a second
nameless one with 409).

The fake review answers come from `FakeReviews` (which token is which user, who may get
/metrics); it records every review it answered, so a cache hit shows as a review not sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import httpx
import kmock
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from tests.harness import free_port, make_certs
from tests.kube_emulator import api_client, status, status_object
from tests.timing import STALL
from webhook.metrics.app import MetricsApp, metrics_server
from webhook.metrics.auth import Authorizer, AuthSettings, bearer_token
from webhook.metrics.registry import Metrics
from webhook.server.run import listen
from webhook.tls.certs import CertSpec, issue, write
from webhook.tls.reload import ReloadingContext

TOKEN_REVIEWS = "post /apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "post /apis/authorization.k8s.io/v1/subjectaccessreviews"

PROMETHEUS = "system:serviceaccount:monitoring:prometheus"
INTRUDER = "system:serviceaccount:default:intruder"
GOOD_TOKEN = "good-token-1f0c9e5e8a"
OTHER_GOOD_TOKEN = "good-token-2-77be1d"  # a second token of the same allowed user
DENIED_TOKEN = "denied-token-9b2d4c"
UNKNOWN_TOKEN = "unknown-token-3a8f0b"
SECRETS = (GOOD_TOKEN, OTHER_GOOD_TOKEN, DENIED_TOKEN, UNKNOWN_TOKEN)
FAMILIES = (
    "controller_runtime_webhook_requests_total",
    "controller_runtime_reconcile_total",
    "workqueue_depth",
    "certwatcher_read_certificate_total",
    "trainjob_scheduling_certificate_expiry_timestamp_seconds",
    "leader_election_master_status",
    "process_cpu_seconds_total",
    "python_gc_collections_total",
)


def user(name: str) -> dict[str, Any]:
    return {"username": name, "uid": f"uid-{name}", "groups": ["system:serviceaccounts"]}


@dataclass
class FakeReviews:
    """What the API server answers: `tokens` names each token's user, `allowed` the users that
    may get /metrics; `delay` slows every answer; `audiences` overrides the audiences the
    server says a token is for (default: the ones asked for); `failing` says how many of the
    next "token" or "access" reviews fail with a 500 (whose message quotes the token)."""

    tokens: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {
            GOOD_TOKEN: user(PROMETHEUS),
            OTHER_GOOD_TOKEN: user(PROMETHEUS),
            DENIED_TOKEN: user(INTRUDER),
        }
    )
    allowed: set[str] = field(default_factory=lambda: {PROMETHEUS})
    audiences: list[str] | None = None
    delay: float = 0.0
    failing: dict[str, int] = field(default_factory=dict)
    token_reviews: list[dict[str, Any]] = field(default_factory=list)
    access_reviews: list[dict[str, Any]] = field(default_factory=list)

    def install(self, k: kmock.KubernetesScaffold) -> None:
        # Failures first: kmock tries reactions in the order they were made.
        for review, count in self.failing.items():
            # An error text that quotes the request, token included, as some errors do.
            message = f"etcd timeout storing TokenReview {{token: {GOOD_TOKEN}}}"
            failure = status_object(500, "InternalError", message)
            k[TOKEN_REVIEWS if review == "token" else ACCESS_REVIEWS][0:count] << 500 << failure
        k[TOKEN_REVIEWS] << self.token_review
        k[ACCESS_REVIEWS] << self.access_review

    async def token_review(self, request: kmock.Request) -> dict[str, Any]:
        body: dict[str, Any] = request.data
        self.token_reviews.append(body)
        await asyncio.sleep(self.delay)
        spec = body["spec"]
        found = self.tokens.get(spec["token"])
        if found is None:
            status = {"authenticated": False, "error": "invalid bearer token"}
        else:
            audiences = self.audiences
            if audiences is None:
                audiences = spec.get("audiences") or ["https://kubernetes.default.svc"]
            status = {"authenticated": True, "user": found, "audiences": audiences}
        return {**body, "status": status}  # the API server echoes the spec, token included

    async def access_review(self, request: kmock.Request) -> dict[str, Any]:
        body: dict[str, Any] = request.data
        self.access_reviews.append(body)
        await asyncio.sleep(self.delay)
        allowed = body["spec"]["user"] in self.allowed
        status = {"allowed": allowed} if allowed else {"allowed": False, "reason": "no RBAC rule"}
        return {**body, "status": status}


@contextlib.asynccontextmanager
async def review_api() -> AsyncIterator[tuple[kmock.KubernetesScaffold, str]]:
    """kmock's Kubernetes API scaffold on a port, and its URL; reactions answer the reviews."""
    async with kmock.KubernetesScaffold() as k, kmock.Server(k) as server:
        yield k, str(server.url).rstrip("/")


@dataclass
class Endpoint:
    url: str
    port: int
    ca_file: Path
    cert_dir: Path
    metrics: Metrics
    tls: ReloadingContext

    def client(self, token: str | None = None, ca_file: Path | None = None) -> httpx.AsyncClient:
        verify = ssl.create_default_context(cafile=str(ca_file or self.ca_file))
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.url, verify=verify, headers=headers, timeout=10)

    async def get(self, token: str | None = None, **kwargs: Any) -> httpx.Response:
        async with self.client(token) as client:
            return await client.get("/metrics", **kwargs)


@contextlib.asynccontextmanager
async def serving(
    cert_dir: Path, authorizer: Authorizer | None, metrics: Metrics | None = None
) -> AsyncIterator[Endpoint]:
    """The metrics app on a free port, TLS from `cert_dir` (made if missing), in this loop."""
    if not (cert_dir / "tls.crt").exists():
        make_certs(cert_dir)
    metrics = metrics or Metrics()
    tls = ReloadingContext(cert_dir / "tls.crt", cert_dir / "tls.key", metrics)
    assert tls.reload()
    port = free_port()
    server = metrics_server(MetricsApp(metrics, authorizer), "127.0.0.1", port, tls)
    task = asyncio.create_task(server.serve([listen("127.0.0.1", port)]))
    while not server.started:
        assert not task.done(), task.exception()
        await asyncio.sleep(0.01)
    try:
        yield Endpoint(
            f"https://localhost:{port}", port, cert_dir / "ca.crt", cert_dir, metrics, tls
        )
    finally:
        server.should_exit = True
        await task


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def secured(
    tmp_path: Path,
    reviews: FakeReviews | None = None,
    settings: AuthSettings | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[tuple[Endpoint, FakeReviews, kmock.KubernetesScaffold]]:
    """The endpoint with authentication on, against an API server answering `reviews`."""
    reviews = reviews or FakeReviews()
    async with review_api() as (k, url), api_client(url) as api:
        reviews.install(k)
        authorizer = Authorizer(api, settings, clock)
        async with serving(tmp_path / "certs", authorizer) as endpoint:
            yield endpoint, reviews, k


def assert_no_token_logged(caplog: pytest.LogCaptureFixture) -> None:
    for record in caplog.records:
        text = f"{record.getMessage()} {getattr(record, 'fields', '')} {record.exc_text or ''}"
        for secret in SECRETS:
            assert secret not in text, record


# --- the answers --------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_no_token_is_401_without_a_review(tmp_path: Path) -> None:
    async with secured(tmp_path) as (endpoint, reviews, _):
        response = await endpoint.get()
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        for header in ("Basic dXNlcjpwYXNz", "Bearer", "Bearer a b", "Token abc"):
            response = await endpoint.get(headers={"Authorization": header})
            assert response.status_code == 401, header
        assert reviews.token_reviews == []


@pytest.mark.asyncio
async def test_unknown_token_is_401(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with secured(tmp_path) as (endpoint, reviews, _):
        response = await endpoint.get(UNKNOWN_TOKEN)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert [r["spec"]["token"] for r in reviews.token_reviews] == [UNKNOWN_TOKEN]
        assert reviews.access_reviews == []
    assert_no_token_logged(caplog)


@pytest.mark.asyncio
async def test_known_token_without_rbac_is_403_naming_the_user(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with secured(tmp_path) as (endpoint, reviews, _):
        response = await endpoint.get(DENIED_TOKEN)
        assert response.status_code == 403
        assert INTRUDER in response.text and "/metrics" in response.text
        assert "www-authenticate" not in response.headers
        (review,) = reviews.access_reviews
        assert review["spec"]["user"] == INTRUDER
        assert review["spec"]["uid"] == f"uid-{INTRUDER}"
        assert review["spec"]["groups"] == ["system:serviceaccounts"]
        assert review["spec"]["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
    assert_no_token_logged(caplog)


@pytest.mark.asyncio
async def test_allowed_token_gets_the_metrics(tmp_path: Path) -> None:
    async with secured(tmp_path) as (endpoint, _, _):
        response = await endpoint.get(GOOD_TOKEN)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        types = {
            line.split()[2] for line in response.text.splitlines() if line.startswith("# TYPE")
        }
        assert set(FAMILIES) <= types
        assert "certwatcher_read_certificate_total 1.0" in response.text
        # OpenMetrics when the scraper asks for it
        openmetrics = "application/openmetrics-text; version=1.0.0"
        response = await endpoint.get(GOOD_TOKEN, headers={"Accept": openmetrics})
        assert response.headers["content-type"].startswith("application/openmetrics-text")
        assert response.text.endswith("# EOF\n")


@pytest.mark.asyncio
async def test_other_paths_and_methods(tmp_path: Path) -> None:
    async with secured(tmp_path) as (endpoint, reviews, _), endpoint.client(GOOD_TOKEN) as client:
        assert (await client.get("/metrics/")).status_code == 404
        assert (await client.get("/healthz")).status_code == 404
        response = await client.post("/metrics", content=b"")
        assert (response.status_code, response.headers["allow"]) == (405, "GET")
        assert reviews.token_reviews == []


@pytest.mark.asyncio
async def test_authentication_off_serves_without_a_token(tmp_path: Path) -> None:
    async with serving(tmp_path / "certs", authorizer=None) as endpoint:
        response = await endpoint.get()
        assert response.status_code == 200
        assert "controller_runtime_webhook_requests_total" in response.text


# --- caching ------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_cache_hit_avoids_a_second_review(tmp_path: Path) -> None:
    async with secured(tmp_path) as (endpoint, reviews, k):
        for _ in range(3):
            assert (await endpoint.get(GOOD_TOKEN)).status_code == 200
            assert (await endpoint.get(DENIED_TOKEN)).status_code == 403
            assert (await endpoint.get(UNKNOWN_TOKEN)).status_code == 401
        assert len(reviews.token_reviews) == 3  # one per token
        assert len(reviews.access_reviews) == 2  # one per authenticated user
        assert len(k[TOKEN_REVIEWS]) == 3  # as the API server counted them
        # Another token of an allowed user: its own TokenReview, the user's cached access.
        assert (await endpoint.get(OTHER_GOOD_TOKEN)).status_code == 200
        assert (len(reviews.token_reviews), len(reviews.access_reviews)) == (4, 2)


@pytest.mark.asyncio
async def test_cache_lifetimes(tmp_path: Path) -> None:
    """Tokens 60 s, allow 300 s, deny 30 s (the defaults), on an injected clock."""
    clock = Clock()
    async with secured(tmp_path, clock=clock) as (endpoint, reviews, _):

        async def counts_after(token: str, status: int) -> tuple[int, int]:
            assert (await endpoint.get(token)).status_code == status
            return len(reviews.token_reviews), len(reviews.access_reviews)

        assert await counts_after(GOOD_TOKEN, 200) == (1, 1)
        assert await counts_after(DENIED_TOKEN, 403) == (2, 2)
        clock.now += 31  # the denial expired; tokens and the allow did not
        assert await counts_after(GOOD_TOKEN, 200) == (2, 2)
        assert await counts_after(DENIED_TOKEN, 403) == (2, 3)
        clock.now += 30  # 61 s: both tokens expired, the allow has not
        assert await counts_after(GOOD_TOKEN, 200) == (3, 3)
        clock.now += 240  # 301 s: the allow expired too
        assert await counts_after(GOOD_TOKEN, 200) == (4, 4)


@pytest.mark.asyncio
async def test_concurrent_identical_requests_share_one_review(tmp_path: Path) -> None:
    async with secured(tmp_path, FakeReviews(delay=0.3)) as (endpoint, reviews, _):
        async with endpoint.client(GOOD_TOKEN) as client:
            answers = await asyncio.gather(*(client.get("/metrics") for _ in range(20)))
        assert [a.status_code for a in answers] == [200] * 20
        assert (len(reviews.token_reviews), len(reviews.access_reviews)) == (1, 1)


@pytest.mark.asyncio
async def test_one_tokens_allow_never_serves_another(tmp_path: Path) -> None:
    async with secured(tmp_path) as (endpoint, reviews, _):
        assert (await endpoint.get(GOOD_TOKEN)).status_code == 200
        assert (await endpoint.get(DENIED_TOKEN)).status_code == 403
        assert (await endpoint.get(UNKNOWN_TOKEN)).status_code == 401
        assert (await endpoint.get(GOOD_TOKEN + "x")).status_code == 401
        assert (await endpoint.get(GOOD_TOKEN[:-1])).status_code == 401
        # concurrently, too: each answer is its own token's
        tokens = [GOOD_TOKEN, DENIED_TOKEN, UNKNOWN_TOKEN] * 5
        answers = await asyncio.gather(*(endpoint.get(t) for t in tokens))
        assert [a.status_code for a in answers] == [200, 403, 401] * 5
        assert len(reviews.token_reviews) == 5


@pytest.mark.asyncio
async def test_audiences(tmp_path: Path) -> None:
    settings = AuthSettings(audiences=("trainjob-scheduling-metrics",))
    async with secured(tmp_path, settings=settings) as (endpoint, reviews, _):
        assert (await endpoint.get(GOOD_TOKEN)).status_code == 200
        assert reviews.token_reviews[0]["spec"]["audiences"] == ["trainjob-scheduling-metrics"]
    # A token the API server authenticates for another audience only: 401.
    wrong = FakeReviews(audiences=["https://kubernetes.default.svc"])
    async with secured(tmp_path, wrong, settings) as (endpoint, reviews, _):
        assert (await endpoint.get(GOOD_TOKEN)).status_code == 401
        assert reviews.access_reviews == []


# --- the API server failing --------------------------------------------------------------------


@pytest.mark.asyncio
async def test_api_server_down_is_503_fast(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with api_client(closed) as api:
        # A refused connection is an answer at once; waiting for the review's timeout would
        # take 3 * STALL.
        authorizer = Authorizer(api, AuthSettings(timeout=3 * STALL))
        async with serving(tmp_path / "certs", authorizer) as endpoint:
            start = time.monotonic()
            response = await endpoint.get(GOOD_TOKEN)
            assert response.status_code == 503
            assert time.monotonic() - start < STALL
            assert "TokenReview failed" in response.text
    assert_no_token_logged(caplog)
    assert any(r.getMessage() == "review failed" for r in caplog.records)


@pytest.mark.asyncio
@pytest.mark.parametrize("review", ["token", "access"])
async def test_api_server_errors_are_503_and_not_cached(
    tmp_path: Path, review: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with secured(tmp_path, FakeReviews(failing={review: 2})) as (endpoint, _, k):
        for _ in range(2):
            response = await endpoint.get(GOOD_TOKEN)
            assert response.status_code == 503
            assert "500" in response.text and GOOD_TOKEN not in response.text
        assert (await endpoint.get(GOOD_TOKEN)).status_code == 200  # recovered: not cached
        path = TOKEN_REVIEWS if review == "token" else ACCESS_REVIEWS
        assert len(k[path]) == 3  # the failures were not cached: each request asked again
    assert_no_token_logged(caplog)


@pytest.mark.asyncio
async def test_api_server_hanging_is_503_within_the_timeout(tmp_path: Path) -> None:
    release = asyncio.Event()

    async def hang(request: kmock.Request) -> NoReturn:
        await release.wait()
        raise status(500)

    async with review_api() as (k, url), api_client(url) as api:
        k[TOKEN_REVIEWS] << hang
        authorizer = Authorizer(api, AuthSettings(timeout=0.5))
        try:
            async with serving(tmp_path / "certs", authorizer) as endpoint:
                start = time.monotonic()
                answers = await asyncio.gather(*(endpoint.get(GOOD_TOKEN) for _ in range(5)))
                elapsed = time.monotonic() - start
                assert [a.status_code for a in answers] == [503] * 5
                assert "no answer within 0.5s" in answers[0].text
                assert 0.4 < elapsed < STALL  # the timeout, not the (endless) hang
                assert len(k[TOKEN_REVIEWS]) == 1  # the five shared one review
        finally:
            release.set()


# --- certificates ------------------------------------------------------------------------------


def fingerprint(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest()


async def presented_certificate(endpoint: Endpoint, ca_files: list[Path]) -> tuple[int, str]:
    """A request on a new connection: the status, and the certificate the server showed."""
    ctx = ssl.create_default_context()
    for ca in ca_files:
        ctx.load_verify_locations(cafile=str(ca))
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", endpoint.port, ssl=ctx, server_hostname="localhost"
    )
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        status = int((await reader.readline()).split()[1])
        return status, fingerprint(der)
    finally:
        writer.close()


@pytest.mark.asyncio
async def test_certificate_rotation_keeps_serving(tmp_path: Path) -> None:
    cert_dir = tmp_path / "certs"
    old_ca = tmp_path / "old-ca.crt"
    old_ca.write_bytes(make_certs(cert_dir).read_bytes())
    async with serving(cert_dir, authorizer=None) as endpoint:
        status, before = await presented_certificate(endpoint, [old_ca])
        assert status == 200
        expiry_before = endpoint.metrics.registry.get_sample_value(
            "trainjob_scheduling_certificate_expiry_timestamp_seconds", {"certificate": "serving"}
        )
        new = issue(CertSpec(days=30))
        write(new, cert_dir)  # a new CA and pair, as cert-manager would rotate them
        new_ca = cert_dir / "ca.crt"
        assert endpoint.tls.reload()  # what the service's poller does every few seconds
        status, after = await presented_certificate(endpoint, [old_ca, new_ca])
        assert status == 200
        cert = x509.load_pem_x509_certificate(new.cert_pem)
        assert after == fingerprint(cert.public_bytes(Encoding.DER)) != before
        # the new CA alone is enough now
        assert (await presented_certificate(endpoint, [new_ca]))[0] == 200
        expiry = endpoint.metrics.registry.get_sample_value(
            "trainjob_scheduling_certificate_expiry_timestamp_seconds", {"certificate": "serving"}
        )
        assert expiry == cert.not_valid_after_utc.timestamp() != expiry_before
        reads = endpoint.metrics.registry.get_sample_value("certwatcher_read_certificate_total")
        assert reads == 2


# --- pieces -------------------------------------------------------------------------------------


def test_bearer_token_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer abc ") == "abc"
    for header in (None, "", "Bearer", "Bearer ", "Basic abc", "Bearer a b", "Bearerabc"):
        assert bearer_token(header) is None, header

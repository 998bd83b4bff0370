"""The service learns its own username, the only one allowed to write a TrainJob's runtime
snapshot: --service-account; else, authenticating with the pod's ServiceAccount token, that
token's subject (no request); else the API server's answer to a SelfSubjectReview (`kubectl auth
whoami`); a review that fails warns once and leaves the fallback (the pod's token, else no one).

The API server here is a tiny aiohttp app that answers only the SelfSubjectReview, over real HTTP
(the emulator has no route for it, and a stub can also stay silent); the last test runs `serve`
as a process against the emulator, which answers the review through a reaction."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kmock
import orjson
import pytest
from aiohttp import web
from kubernetes.aio.client import Configuration

from webhook.kube.client import uses_pod_token
from webhook.kube.metered import MeteredApiClient
from webhook.kube.whoami import WhoAmIError, who_am_i
from webhook.server.logs import FIELDS
from webhook.server.run import learn_username

from .harness import fixture, free_port, stub_api
from .kube_emulator import emulator, eventually
from .test_informer import serving
from .test_snapshot_guard import PATH, SELF, annotated, real_snapshot, review_of

REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
ADMIN = "kubernetes-admin"  # whom a kubeadm cluster's admin kubeconfig authenticates as
TRUSTED = "runtime snapshots are written only by this service"


def review_answer(username: str) -> dict[str, Any]:
    """The API server's answer to a SelfSubjectReview (status 201), as 1.37 sends it."""
    return {
        "kind": "SelfSubjectReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "status": {
            "userInfo": {
                "username": username,
                "groups": ["kubeadm:cluster-admins", "system:authenticated"],
            }
        },
    }


@dataclass
class ApiServer:
    """What the stub answers a SelfSubjectReview, and what it was sent."""

    status: int = 201
    username: str = ADMIN
    silent: bool = False  # never answers
    received: list[dict[str, Any]] = field(default_factory=list)


@contextlib.asynccontextmanager
async def api_server(server: ApiServer) -> AsyncIterator[MeteredApiClient]:
    """A client of a stub API server that answers SelfSubjectReviews as `server` says."""

    async def review(request: web.Request) -> web.Response:
        server.received.append(await request.json())
        if server.silent:
            await asyncio.sleep(60)
        if server.status != 201:
            status = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                      "message": "the server could not find the requested resource",
                      "reason": "NotFound", "code": server.status}  # fmt: skip
            return web.json_response(status, status=server.status)
        return web.json_response(review_answer(server.username), status=201)

    app = web.Application()
    app.router.add_post(REVIEWS, review)
    async with stub_api(app) as api:
        yield api


def pod_token(tmp_path: Path, subject: str = SELF) -> Path:
    """A ServiceAccount token as the kubelet mounts it (a JWT; its signature is not read)."""
    claims = {"sub": subject, "aud": ["https://kubernetes.default.svc"]}
    payload = base64.urlsafe_b64encode(orjson.dumps(claims)).decode().rstrip("=")
    token = tmp_path / f"token-{len(list(tmp_path.glob('token-*')))}"
    token.write_text(f"eyJhbGciOiJSUzI1NiJ9.{payload}.c2ln\n")
    return token


def said(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "webhook.serve" and r.levelno == level]


def fields_of(record: logging.LogRecord) -> Any:
    """The fields a log line adds (`extra={FIELDS: ...}`)."""
    return getattr(record, FIELDS, None)


@pytest.mark.asyncio
async def test_outside_a_pod_the_api_server_says_who_the_service_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "webhook.serve")
    server = ApiServer()
    async with api_server(server) as api:
        no_token = tmp_path / "missing"
        assert await learn_username("", api, pod_token=False, token=no_token) == ADMIN
    assert server.received == [
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    ]
    (info,) = said(caplog, logging.INFO)
    assert info.getMessage() == TRUSTED
    assert fields_of(info) == {"username": ADMIN, "from": "SelfSubjectReview"}
    assert not said(caplog, logging.WARNING)


@pytest.mark.asyncio
async def test_the_flag_wins_and_nothing_is_asked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "webhook.serve")
    server = ApiServer()
    async with api_server(server) as api:
        token = pod_token(tmp_path)
        assert await learn_username("someone", api, pod_token=False, token=token) == "someone"
        assert await learn_username("someone", api, pod_token=True, token=token) == "someone"
    assert server.received == []
    fields = [fields_of(r) for r in said(caplog, logging.INFO)]
    assert fields == [{"username": "someone", "from": "--service-account"}] * 2


@pytest.mark.asyncio
async def test_in_a_pod_the_token_says_it_without_a_request(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As before: the client sends the pod's token, whose subject is the username."""
    caplog.set_level(logging.INFO, "webhook.serve")
    server = ApiServer()
    async with api_server(server) as api:
        token = pod_token(tmp_path)
        assert await learn_username("", api, pod_token=True, token=token) == SELF
        assert server.received == []
        # A token that names no ServiceAccount: the API server is asked after all.
        other = pod_token(tmp_path, subject="admin")
        assert await learn_username("", api, pod_token=True, token=other) == ADMIN
        assert len(server.received) == 1
        # In a pod, but with a kubeconfig: its credential is someone else's, and the API server
        # says whose.
        assert await learn_username("", api, pod_token=False, token=token) == ADMIN
        assert len(server.received) == 2
    sources = [fields_of(r)["from"] for r in said(caplog, logging.INFO)]
    assert sources == ["the pod's ServiceAccount token", "SelfSubjectReview", "SelfSubjectReview"]
    assert not said(caplog, logging.WARNING)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("server", "error"),
    [
        (ApiServer(status=404), "the API server answered 404 Not Found"),  # older than 1.28
        (ApiServer(status=403), "the API server answered 403 Forbidden"),
        (ApiServer(silent=True), "no answer within 0.3s"),
        (ApiServer(username=""), "the answer names no username"),
    ],
    ids=["not-served", "forbidden", "silent", "no-username"],
)
async def test_a_failed_review_warns_once_and_no_one_may_write(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, server: ApiServer, error: str
) -> None:
    caplog.set_level(logging.INFO, "webhook.serve")
    server = copy.deepcopy(server)
    async with api_server(server) as api:
        missing = tmp_path / "missing"
        username = await learn_username("", api, pod_token=False, token=missing, timeout=0.3)
    assert username == ""
    (warning,) = said(caplog, logging.WARNING)
    assert fields_of(warning) == {"error": error}
    message = warning.getMessage()
    assert "the TrainJob webhook denies every write of the runtime snapshot" in message
    assert "set --service-account to the username the kubeconfig authenticates as" in message
    assert not said(caplog, logging.INFO)


@pytest.mark.asyncio
async def test_an_api_server_that_is_not_there_does_not_stop_the_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "webhook.serve")
    api = MeteredApiClient(configuration=Configuration(host=f"http://127.0.0.1:{free_port()}"))
    try:
        with pytest.raises(WhoAmIError, match="Error"):  # aiohttp's connection error, named
            await who_am_i(api, timeout=2)
        assert await learn_username("", api, pod_token=False, token=tmp_path / "none") == ""
        # In a pod with a kubeconfig: the pod's token, as before the review existed.
        token = pod_token(tmp_path)
        assert await learn_username("", api, pod_token=False, token=token) == SELF
    finally:
        close: Any = api.close
        await close()
    first, second = (r.getMessage() for r in said(caplog, logging.WARNING))
    assert "denies every write" in first
    assert "trusting the pod's ServiceAccount instead" in second
    fields = [fields_of(r) for r in said(caplog, logging.INFO)]
    assert fields == [{"username": SELF, "from": "the pod's ServiceAccount token"}]


@pytest.mark.asyncio
async def test_without_a_cluster_nothing_is_asked_or_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "webhook.serve")
    assert await learn_username("", None, pod_token=False, token=tmp_path / "none") == ""
    assert not said(caplog, logging.WARNING) and not said(caplog, logging.INFO)


def test_the_client_uses_the_pod_token_only_in_a_pod_without_a_kubeconfig(tmp_path: Path) -> None:
    token = pod_token(tmp_path)
    in_pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    assert uses_pod_token(None, in_pod, token)
    assert uses_pod_token("", in_pod, token)
    assert not uses_pod_token("/etc/kubeconfig", in_pod, token)  # --kubeconfig wins in connect
    assert not uses_pod_token(None, {}, token)  # not in a cluster
    assert not uses_pod_token(None, in_pod, tmp_path / "none")  # no token mounted
    # $KUBECONFIG comes after the pod's token in connect: the token is still what it uses.
    assert uses_pod_token(None, {**in_pod, "KUBECONFIG": "/k"}, token)


@pytest.mark.asyncio
async def test_serve_trusts_the_username_the_api_server_gives_its_kubeconfig(
    tmp_path: Path,
) -> None:
    """`serve --kubeconfig` without --service-account: the emulator answers the review as
    `kubernetes-admin`'s, and the TrainJob webhook lets that username, and it only, write the
    snapshot."""
    async with emulator() as (k, url):
        k[kmock.method.POST, REVIEWS] << review_answer(ADMIN)
        async with serving(tmp_path, url) as (proc, client):
            await eventually(lambda: len(k[kmock.method.POST, REVIEWS]) == 1, "asked once")
            bare = fixture("trainjob-create.validate.json")["request"]["object"]
            write = annotated(bare, real_snapshot())
            mine = await client.post(PATH, json=review_of("UPDATE", write, bare, ADMIN))
            assert mine.json()["response"]["allowed"] is True, mine.text
            theirs = await client.post(PATH, json=review_of("UPDATE", write, bare, SELF))
            response = theirs.json()["response"]
            assert response["allowed"] is False
            assert (
                f"only the trainjob-scheduling service ({ADMIN}) writes it"
                in (response["status"]["message"])
            )
            lines = [line for line in proc.log_lines() if line["msg"] == TRUSTED]
            assert [(line["username"], line["from"]) for line in lines] == [
                (ADMIN, "SelfSubjectReview")
            ]
        assert len(k[kmock.method.POST, REVIEWS]) == 1

"""Quiet on the way out (issue 36 part 5): a refused list or watch (a 403, a watched namespace
that is gone) is said once when it starts and once when it ends, counted while it lasts, retried
with a backoff of its own up to its cap, never in a loop; and the watch resumes once the rule
is granted or the namespace is back. Against the API emulator, each fault a per-test reaction.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import kmock
import pytest
from kubernetes.aio.client.exceptions import ApiException

from tests.kube_emulator import (
    LIST,
    TRAINING_RUNTIMES,
    TRAINJOBS,
    WATCH,
    api_client,
    create,
    delete,
    emulator,
    eventually,
    status,
    status_object,
)
from tests.test_informer import running, serving, trainjob
from webhook.kube import client as kube_client
from webhook.kube.cache import Cache
from webhook.kube.discovery import BackendApiWatch
from webhook.kube.informer import REFUSED_BACKOFF_MAX, Informer
from webhook.kube.refusal import FORBIDDEN, NAMESPACE_GONE, Refusal, refusal_of
from webhook.kube.store import Store

NS = "team-a"
NAMESPACE_PATH = f"/api/v1/namespaces/{NS}"
Json = dict[str, Any]


def forbidden(verb: str = "list") -> Any:
    """RBAC's 403: a missing rule and a namespace deleted with its Role say the same."""
    return status(
        403,
        f'trainjobs.trainer.kubeflow.org is forbidden: User "system:serviceaccount:tjs:tjs" '
        f'cannot {verb} resource "trainjobs" in API group "trainer.kubeflow.org" in the '
        f'namespace "{NS}"',
        "Forbidden",
        {"group": "trainer.kubeflow.org", "kind": "trainjobs"},
    )


def namespace_not_found() -> Any:
    return status(
        404, f'namespaces "{NS}" not found', "NotFound", {"name": NS, "kind": "namespaces"}
    )


def at_namespace(request: kmock.Request) -> bool:
    """A request for the namespace team-a itself (kmock's criteria do not name a core one)."""
    return str(request.url.path) == NAMESPACE_PATH


def for_namespaces(request: kmock.Request) -> bool:
    return (
        str(request.url.path).startswith("/api/v1/namespaces/") and request.url.path.count("/") == 4
    )


class Namespace:
    """The API server's answer to GET /api/v1/namespaces/team-a: `phase` Active or
    Terminating, None for gone, "forbidden" when the service may not get namespaces."""

    def __init__(self, k: Any, phase: str | None = "Active") -> None:
        self.phase = phase
        self.k = k
        k[kmock.method.GET, at_namespace] << self.answer

    def asked(self) -> int:
        return len(self.k[at_namespace])

    def answer(self, request: Any) -> Json:
        if self.phase is None:
            raise namespace_not_found()
        if self.phase == "forbidden":
            raise status(403, 'namespaces "team-a" is forbidden', "Forbidden")
        meta: Json = {"name": NS}
        if self.phase == "Terminating":
            meta["deletionTimestamp"] = "2026-12-01T09:00:00Z"
        return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta,
                "status": {"phase": self.phase}}  # fmt: skip


class Sleeps:
    """The informer's sleep: records each delay, waits for nothing, and runs `then` once
    `after` delays were asked for."""

    def __init__(self, after: int = 0, then: Callable[[], None] = lambda: None) -> None:
        self.delays: list[float] = []
        self.after, self.then = after, then

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        if len(self.delays) == self.after:
            self.then()
        await asyncio.sleep(0)


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields of a log line (`extra={"fields": ...}`)."""
    found: dict[str, Any] = record.__dict__.get("fields", {})
    return found


def said(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "webhook.informer" and r.levelno == level]


def refusal_changes() -> tuple[list[tuple[Refusal | None, Refusal | None]], Any]:
    changes: list[tuple[Refusal | None, Refusal | None]] = []
    return changes, lambda before, after: changes.append((before, after))


def informer(api: Any, store: Store, sleep: Sleeps, on_refusal: Any) -> Informer:
    store.watched = (NS,)
    return Informer(
        api, kube_client.TRAINJOBS, store, namespace=NS, sleep=sleep, on_refusal=on_refusal
    )


@pytest.mark.asyncio
async def test_a_missing_rule_is_said_once_with_the_fix_and_the_watch_resumes_when_granted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="webhook.informer")
    refused = asyncio.Event()
    refused.set()
    attempts = 12  # past the cap: 1, 2, 4, ... 60, 60
    async with emulator() as (k, url), api_client(url) as api:
        Namespace(k)  # the namespace is there: a rule is missing
        await create(k, TRAINJOBS, trainjob(NS, "waiting"))
        k[LIST, TRAINJOBS, kmock.namespace(NS), refused] << forbidden()
        store, sleep = Store("trainjobs"), Sleeps(attempts, refused.clear)  # then granted
        changes, on_refusal = refusal_changes()
        watch = informer(api, store, sleep, on_refusal)
        async with running(watch):
            await eventually(lambda: store.synced, "listed once the rule is granted")
            await eventually(lambda: k.open_watches == 1, "watching")
        assert store.get(NS, "waiting") is not None
        assert len(k[LIST, TRAINJOBS]) == attempts + 1  # one request per backoff, no loop
        assert sleep.delays[0] <= 1.0
        assert max(sleep.delays) <= REFUSED_BACKOFF_MAX[FORBIDDEN]
        assert sleep.delays[-1] >= REFUSED_BACKOFF_MAX[FORBIDDEN] / 2  # capped, still jittered
        (warning,) = said(caplog, logging.WARNING)  # once, however long it lasts
        message = warning.getMessage()
        assert "may not list trainjobs" in message and f'in namespace "{NS}"' in message
        assert "grant list and watch on trainjobs" in message
        assert "was deleted" not in message  # the namespace is there: only the rule is said
        told = fields(warning)
        assert (told["reason"], told["namespace"]) == (FORBIDDEN, NS)
        assert told["error"].startswith("HTTP 403: Forbidden: trainjobs.trainer.kubeflow.org")
        (over,) = [r for r in said(caplog, logging.INFO) if "allowed again" in r.getMessage()]
        assert fields(over)["reason"] == FORBIDDEN
        assert len([r for r in said(caplog, logging.DEBUG) if "refused" in r.msg]) == attempts
        assert changes == [(None, FORBIDDEN), (FORBIDDEN, None)]
        assert watch.restarts == attempts and watch.refused is None


@pytest.mark.asyncio
async def test_a_watched_namespace_deleted_empties_its_part_quietly_until_it_comes_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Deleted with its Role, the namespace answers 403 to every list and watch. Being deleted,
    its objects stay; gone (404), they go and the store counts it as listed (readiness does not
    wait for it); back, it is listed again. One warning, one info, whatever the retries."""
    caplog.set_level(logging.DEBUG, logger="webhook.informer")
    refused = asyncio.Event()
    async with emulator() as (k, url), api_client(url) as api:
        namespace = Namespace(k)
        await create(k, TRAINJOBS, trainjob(NS, "old"))
        k[LIST, TRAINJOBS, kmock.namespace(NS), refused] << forbidden()
        k[WATCH, TRAINJOBS, kmock.namespace(NS), refused] << forbidden("watch")
        heard: list[str] = []
        store = Store("trainjobs")
        store.subscribe(lambda event, old, new: heard.append(event))
        sleep = Sleeps()
        changes, on_refusal = refusal_changes()
        watch = informer(api, store, sleep, on_refusal)
        async with running(watch):
            await eventually(lambda: store.synced and k.open_watches == 1, "watching")
            sleep.after, sleep.then = 3, lambda: setattr(namespace, "phase", None)  # then gone
            namespace.phase = "Terminating"
            refused.set()
            assert k.drop_watches() == 1
            await eventually(lambda: len(sleep.delays) >= 3, "refused while terminating")
            await eventually(lambda: not len(store), "emptied once gone")
            assert store.synced  # the gone namespace counts as listed (empty)
            await delete(k, TRAINJOBS, NS, "old")  # as the namespace's deletion did
            await eventually(lambda: len(sleep.delays) >= 8, "refused while gone")
            assert max(sleep.delays) <= REFUSED_BACKOFF_MAX[NAMESPACE_GONE]
            # Back: created again, with its Role and a TrainJob (the namespace is said Active
            # once listed: a 403 decided before may still be asking about it).
            await create(k, TRAINJOBS, trainjob(NS, "new"))
            refused.clear()
            await eventually(lambda: store.get(NS, "new") is not None, "listed again")
            namespace.phase = "Active"
            await eventually(lambda: k.open_watches == 1, "watching again")
        assert heard == ["ADDED", "DELETED", "ADDED"]
        # (The dropped connection is a failure of its own, said as before.)
        warnings = [w for w in said(caplog, logging.WARNING) if "reason" in fields(w)]
        assert [fields(w)["reason"] for w in warnings] == [NAMESPACE_GONE]
        assert f"watched namespace '{NS}' is being deleted" in warnings[0].getMessage()
        assert "--watch-namespaces" in warnings[0].getMessage()
        infos = [r for r in said(caplog, logging.INFO) if "allowed again" in r.getMessage()]
        assert len(infos) == 1
        assert changes == [(None, NAMESPACE_GONE), (NAMESPACE_GONE, None)]


@pytest.mark.asyncio
async def test_without_get_on_namespaces_a_403_names_both_causes_and_asks_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="webhook.informer")
    refused = asyncio.Event()
    refused.set()
    async with emulator() as (k, url), api_client(url) as api:
        namespace = Namespace(k, "forbidden")  # as the chart installs it
        k[LIST, TRAINJOBS, kmock.namespace(NS), refused] << forbidden()
        store, sleep = Store("trainjobs"), Sleeps(5, refused.clear)
        changes, on_refusal = refusal_changes()
        async with running(informer(api, store, sleep, on_refusal)):
            await eventually(lambda: store.synced, "listed once allowed")
        assert namespace.asked() == 1  # it will not say: not asked on every retry
        (warning,) = said(caplog, logging.WARNING)
        message = warning.getMessage()
        assert "grant list and watch on trainjobs" in message
        assert f"if namespace '{NS}' was deleted, take it out of --watch-namespaces" in message
        assert changes == [(None, FORBIDDEN), (FORBIDDEN, None)]


@pytest.mark.asyncio
async def test_a_list_answered_namespace_not_found_is_an_empty_namespace() -> None:
    """As client-go's reflector syncs an empty list on a 404: the store is synced (readiness
    does not wait for a namespace that is gone), retried every few minutes at most."""
    gone = asyncio.Event()
    gone.set()
    async with emulator() as (k, url), api_client(url) as api:
        k[LIST, TRAINJOBS, kmock.namespace(NS), gone] << namespace_not_found()
        store, sleep = Store("trainjobs"), Sleeps()
        changes, on_refusal = refusal_changes()
        watch = informer(api, store, sleep, on_refusal)
        async with running(watch):
            await eventually(lambda: store.synced, "synced, empty")
            assert watch.refused == NAMESPACE_GONE and not len(store)
            await eventually(lambda: len(sleep.delays) >= 10, "retried")
            assert max(sleep.delays) <= REFUSED_BACKOFF_MAX[NAMESPACE_GONE]
        # Stopped while refused (discovery, shutdown): the count of refusals goes down too.
        assert changes == [(None, NAMESPACE_GONE), (NAMESPACE_GONE, None)]


@pytest.mark.asyncio
async def test_a_cluster_wide_403_says_what_goes_without_it_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The Nodes' hint (feasibility stays off) comes after the rule to grant; a cluster-wide
    list is never asked about a namespace."""
    caplog.set_level(logging.DEBUG, logger="webhook.informer")
    async with emulator() as (k, url), api_client(url) as api:
        k[LIST, kmock.resource("", "v1", "nodes")] << status(403, "nodes is forbidden", "Forbidden")
        cache = Cache(connected=True)
        cache.jobsets.replace([])  # listed, none: restart attempt 0
        node_watch = kube_client.node_informer(api, cache)
        sleep = Sleeps()
        node_watch.sleep = sleep
        async with running(node_watch):
            await eventually(lambda: len(sleep.delays) >= 6, "retried")
        (warning,) = said(caplog, logging.WARNING)
        assert "may not list nodes" in warning.getMessage()
        assert "ClusterRole" in warning.getMessage()
        error = fields(warning)["error"]
        assert "HTTP 403" in error and "--feasibility=off" in error
        assert not len(k[for_namespaces])  # cluster-wide: no namespace to ask about


@pytest.mark.parametrize(
    ("answer", "namespace", "expected"),
    [
        (status(403, "x is forbidden", "Forbidden"), NS, FORBIDDEN),
        (status(403, "x is forbidden", "Forbidden"), None, FORBIDDEN),
        (
            status(
                403,
                f"unable to create new content in namespace {NS} because it is being terminated",
                "Forbidden",
                {"causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace"}]},
            ),
            NS,
            NAMESPACE_GONE,
        ),
        (namespace_not_found(), NS, NAMESPACE_GONE),
        (namespace_not_found(), "team-b", None),  # another namespace's
        (status(404, "the server could not find the requested resource", "NotFound"), NS, None),
        (status(500), NS, None),
    ],
    ids=["rbac", "rbac-cluster", "terminating", "ns-404", "other-ns-404", "not-served", "500"],
)
def test_refusals_are_told_apart(answer: Any, namespace: str | None, expected: Any) -> None:
    body = status_object(answer.status, answer.reason, answer.message, answer.details)
    err = ApiException(status=answer.status, reason=answer.reason, body=json.dumps(body))
    assert refusal_of(err, namespace) == expected


@pytest.mark.asyncio
async def test_discovery_refused_is_said_once_while_it_lasts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Checked every period, a group/version discovery may not read is one warning, not one a
    check; one info line when it answers again."""
    caplog.set_level(logging.DEBUG, logger="webhook.discovery")
    refused = asyncio.Event()
    refused.set()
    checks: list[float] = []
    async with emulator(backends=["volcano"]) as (k, url), api_client(url) as api:
        path = "/apis/scheduling.volcano.sh/v1beta1"
        k[kmock.method.GET, lambda request: request.url.path == path, refused] << status(
            403, "forbidden", "Forbidden"
        )
        cache = Cache(connected=True)
        cache.jobsets.replace([])  # listed, none: restart attempt 0

        async def sleep(seconds: float) -> None:
            checks.append(seconds)
            if len(checks) == 6:
                refused.clear()
            await asyncio.sleep(0)

        watch = BackendApiWatch(api, cache, lambda kind: [], period=60.0, sleep=sleep)
        task = asyncio.create_task(watch.run())
        try:
            await eventually(lambda: len(checks) >= 9, "nine checks")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert cache.api("volcano") == "served"
    lines = [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name == "webhook.discovery" and fields(r).get("api") == path[6:]
    ]
    assert [level for level, _ in lines if level >= logging.INFO] == [
        logging.WARNING, logging.INFO
    ], lines  # fmt: skip
    assert sum(level == logging.DEBUG for level, _ in lines) == 5  # the other refused checks


@pytest.mark.asyncio
async def test_the_service_counts_a_deleted_watched_namespace_and_says_it_once(
    tmp_path: Path,
) -> None:
    """`serve --watch-namespaces` whose namespace was deleted with its Role: every list there
    is refused, the namespace is gone. One warning per watch however often it is asked again,
    and `trainjob_scheduling_watches_refused` counts them."""
    async with emulator() as (k, url):
        Namespace(k, None)  # gone (and the service may ask: the emulator has no RBAC)
        for resource in (TRAINJOBS, TRAINING_RUNTIMES):
            k[LIST, resource, kmock.namespace(NS)] << forbidden()
        args = (f"--watch-namespaces={NS}", "--metrics-auth=false")
        async with serving(tmp_path, url, *args) as (proc, _):
            await eventually(lambda: len(k[LIST, TRAINJOBS]) >= 4, "asked again", timeout=30)
            ca = str(tmp_path / "certs" / "ca.crt")
            async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=ca)) as scrape:
                text = (await scrape.get(f"{proc.metrics_url}/metrics")).text
            lines = proc.log_lines()
    for plural in ("trainjobs", "trainingruntimes"):
        refused = 'trainjob_scheduling_watches_refused{reason="namespace-gone",resource="%s"} 1.0'
        assert refused % plural in text, text
        said = [
            line
            for line in lines
            if line["level"] == "warning" and line.get("resource", "").startswith(f"{plural}.")
        ]
        assert [line["reason"] for line in said] == ["namespace-gone"], said

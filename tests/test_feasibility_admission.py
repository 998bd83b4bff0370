"""Feasibility at `kubectl apply` of a TrainJob, over real HTTPS: a warning with the numbers, a
denial where the runtime or the service asks for one, nothing while the nodes are unknown; and
the service as a process, its Node watch fed by the API emulator (a 403 on Nodes degrades
quietly: one warning, ready all the same)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.builders import Json, runtime, trainjob
from tests.harness import ServerProcess, running_server
from tests.kube_emulator import (
    CLUSTER_RUNTIMES,
    LIST,
    NODES,
    ApiError,
    VersionedEmulator,
    create,
    emulator,
    eventually,
    status,
)
from tests.nodes import nodes
from tests.test_backends import TRAINJOB_PATH, cache_with, review
from tests.test_feasibility import IN_ZONE, gpu_node
from tests.test_informer import readyz, serving
from tests.timing import fastest
from webhook.kube.cache import Cache
from webhook.kube.feasibility import MODE_ANNOTATION

# The example: zone-b 24 nodes of 8 GPUs (48 pods of 4 GPUs), zone-a 6 nodes (12).
CLUSTER = nodes("b", 24, zone="zone-b", gpus=8) + nodes("a", 6, zone="zone-a", gpus=8)
NEVER = (
    "can never fit: gang node of 64 pods needs 256 nvidia.com/gpu in one "
    "topology.kubernetes.io/zone; the largest zone has 192 (zone-b, 24 nodes)"
)
# At kubectl apply, in warnings of at most 120 characters each, split after a clause:
WARNED = [NEVER.split("; ")[0] + ";", "... " + NEVER.split("; ")[1]]


def zone_runtime(mode: str | None = None, scheduler: str | None = None) -> Json:
    job = gpu_node(4) if scheduler is None else gpu_node(4, schedulerName=scheduler)
    rt = runtime(job, scheduling=IN_ZONE, name="rt")
    if mode is not None:
        rt["metadata"]["annotations"] = {MODE_ANNOTATION: mode}
    return rt


def cache_of(rt: Json, node_list: list[Json] | None = CLUSTER) -> Cache:
    cache = cache_with(rt)
    if node_list is not None:
        cache.nodes.replace(node_list)
    return cache


def post(client: Any, obj: Json) -> Json:
    answer = client.post(TRAINJOB_PATH, content=orjson.dumps(review(obj)))
    assert answer.status_code == 200, answer.text
    response: Json = answer.json()["response"]
    return response


def test_a_gang_that_can_never_fit_is_a_warning_with_the_numbers(tmp_path: Path) -> None:
    with running_server(cache_of(zone_runtime()), tmp_path / "certs") as srv, srv.client() as c:
        never = post(c, trainjob(num_nodes=64))
        assert never["allowed"] is True and never["warnings"] == WARNED
        fits = post(c, trainjob(num_nodes=48))  # zone-b holds exactly 48
        assert fits["allowed"] is True and not fits.get("warnings")


def test_the_runtime_annotation_or_the_service_flag_makes_it_a_denial(tmp_path: Path) -> None:
    cache = cache_of(zone_runtime("deny"))
    with running_server(cache, tmp_path / "certs") as srv, srv.client() as c:
        denied = post(c, trainjob(num_nodes=64))
        assert denied["allowed"] is False and denied["status"]["code"] == 422
        (cause,) = denied["status"]["details"]["causes"]
        assert (
            cause["field"] == "spec.trainer.numNodes" and cause["reason"] == "FieldValueForbidden"
        )
        assert cause["message"] == (
            f"Forbidden: {NEVER} (denied: the runtime's {MODE_ANNOTATION} is deny)"
        )
        assert denied["status"]["message"].startswith('TrainJob.trainer.kubeflow.org "my-job"')
        assert post(c, trainjob(num_nodes=48))["allowed"] is True

        # The service's --feasibility=deny, for a runtime that says nothing.
        cache.cluster_runtimes.replace([zone_runtime()])
        cache.feasibility.mode = "deny"
        flagged = post(c, trainjob(num_nodes=64))
        assert flagged["allowed"] is False
        assert "(denied: the service's --feasibility is deny)" in flagged["status"]["message"]
        # A runtime that turns it off wins over the flag; one with a typo keeps the flag's.
        cache.cluster_runtimes.replace([zone_runtime("off")])
        assert post(c, trainjob(num_nodes=64)) == {"uid": "u-1", "allowed": True}
        cache.cluster_runtimes.replace([zone_runtime("Deny")])
        typo = post(c, trainjob(num_nodes=64))
        assert typo["allowed"] is False
        assert typo["warnings"] == [
            f"the runtime's {MODE_ANNOTATION} annotation 'Deny' is not one of warn, deny, off"
        ]


def test_nothing_is_judged_while_the_nodes_are_unknown_and_that_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = cache_of(zone_runtime("deny"), node_list=None)  # the Node watch has not listed
    caplog.set_level(logging.INFO, logger="webhook.feasibility")
    with running_server(cache, tmp_path / "certs") as srv, srv.client() as c:
        for _ in range(3):
            assert post(c, trainjob(num_nodes=64)) == {"uid": "u-1", "allowed": True}
        cache.nodes.replace([])  # listed: a cluster with no nodes (scaling up from zero)
        assert post(c, trainjob(num_nodes=64)) == {"uid": "u-1", "allowed": True}
        cache.nodes.replace(CLUSTER)
        assert post(c, trainjob(num_nodes=64))["allowed"] is False
    said = [r.getMessage() for r in caplog.records if r.name == "webhook.feasibility"]
    assert said == [
        "feasibility is not judged: the Nodes are not listed (yet, or the service may not list "
        "them)",
        "feasibility is not judged: the cluster has no nodes",
    ]


def test_a_backend_whose_domains_are_not_node_labels_is_judged_over_the_cluster(
    tmp_path: Path,
) -> None:
    # 20 pods of 4 GPUs: no zone holds them (48 and 12), the cluster does (60).
    for scheduler, warned in ((None, True), ("volcano", False)):
        cache = cache_of(zone_runtime(scheduler=scheduler))
        with running_server(cache, tmp_path / f"certs-{scheduler}") as srv, srv.client() as c:
            said = post(c, trainjob(num_nodes=50)).get("warnings", [])
            assert any(w.startswith("can never fit") for w in said) is warned, said


def forbidden() -> ApiError:
    return status(403, 'nodes is forbidden: User "x" cannot list resource "nodes"', "Forbidden")


@contextlib.asynccontextmanager
async def zones_served(
    tmp_path: Path, *args: str, before: Callable[[VersionedEmulator], None] | None = None
) -> AsyncIterator[tuple[VersionedEmulator, ServerProcess, httpx.AsyncClient]]:
    """The service as a process, ready, on the emulator with the zone runtime and CLUSTER's
    nodes; `before` sets the emulator up first (a reaction)."""
    async with emulator() as (k, url):
        if before is not None:
            before(k)
        await create(k, CLUSTER_RUNTIMES, zone_runtime())
        for obj in CLUSTER:
            await create(k, NODES, obj)
        async with serving(tmp_path, url, *args) as (proc, client):
            await eventually_ready(client, proc)
            yield k, proc, client


async def answer_to(client: httpx.AsyncClient, num_nodes: int) -> Json:
    """The TrainJob webhook's answer to a TrainJob of `num_nodes` on the zone runtime."""
    body = review(trainjob(num_nodes=num_nodes))
    found: Json = (await client.post(TRAINJOB_PATH, json=body)).json()["response"]
    return found


@pytest.mark.asyncio
async def test_the_service_watches_the_nodes_and_judges_from_them(tmp_path: Path) -> None:
    async with zones_served(tmp_path) as (k, _, client):

        async def warnings() -> list[str]:
            found: list[str] = (await answer_to(client, 64)).get("warnings", [])
            return found

        await eventually_true(lambda: warnings(), WARNED, "the warning, from the watch")
        # 8 more nodes join zone-b: 32 x 2 = 64 pods, and the warning goes.
        for obj in nodes("more", 8, zone="zone-b", gpus=8):
            await create(k, NODES, obj)
        await eventually_true(lambda: warnings(), [], "the new nodes seen")
        assert len(k[LIST, NODES]) == 1  # followed by the watch, never listed again


@pytest.mark.asyncio
async def test_nodes_forbidden_degrades_quietly_and_readiness_does_not_wait(
    tmp_path: Path,
) -> None:
    async with emulator() as (k, url):
        k[LIST, NODES] << forbidden
        await create(k, CLUSTER_RUNTIMES, zone_runtime("deny"))
        async with serving(tmp_path, url) as (proc, client):
            await eventually_ready(client, proc)
            body = review(trainjob(num_nodes=64))
            answer = (await client.post(TRAINJOB_PATH, json=body)).json()["response"]
            assert answer == {"uid": "u-1", "allowed": True}
            await eventually(lambda: len(k[LIST, NODES]) >= 3, "the list retried", timeout=20)
            lines = proc.log_lines()
            about_nodes = [
                line
                for line in lines
                if line.get("resource") == "nodes" and line["level"] in ("warning", "error")
            ]
            (warning,) = about_nodes  # one warning however often it is retried
            assert "HTTP 403" in warning["error"] and "--feasibility=off" in warning["error"]
            judged = [line for line in lines if line["msg"].startswith("feasibility is not")]
            assert len(judged) == 1, judged


async def eventually_ready(client: Any, proc: Any) -> None:
    for _ in range(400):
        if (await readyz(client, proc)).status_code == 200:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(proc.log_file.read_text()[-3000:])


async def eventually_true(check: Any, expected: Any, what: str) -> None:
    found = None
    for _ in range(200):
        found = await check()
        if found == expected:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what}: {found!r}")


def test_sizes_a_tenant_writes_are_bounded_before_any_work(tmp_path: Path) -> None:
    """Tolerations, selectors and affinity far past the bounds: the gang is not judged (no
    warning, never a wrong one) and the answer comes at once: as fast, give or take a factor
    of 20, as for a runtime of ordinary size, measured in the same test."""
    many = 20_000
    hostile: list[Json] = [
        {"tolerations": [{"key": f"k{i}", "operator": "Exists"} for i in range(many)]},
        {"nodeSelector": {f"k{i}": "v" for i in range(many)}},
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "k", "operator": "In", "values": [str(v) for v in range(many)]}]}]}}}},
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": f"k{i}", "operator": "Exists"}]}
                                  for i in range(many)]}}}},
    ]  # fmt: skip
    ordinary = cache_of(runtime(gpu_node(4), scheduling=IN_ZONE, name="rt"))
    with running_server(ordinary, tmp_path / "certs") as srv, srv.client() as c:
        baseline = fastest(lambda: post(c, trainjob(num_nodes=64)))
    for i, spec in enumerate(hostile):
        rt = runtime(gpu_node(4, **spec), scheduling=IN_ZONE, name="rt")
        cache = cache_of(rt)
        with running_server(cache, tmp_path / f"certs-{i}") as srv, srv.client() as c:
            answer = post(c, trainjob(num_nodes=64))
            assert answer == {"uid": "u-1", "allowed": True}, list(spec)
            seconds = fastest(lambda: post(c, trainjob(num_nodes=64)))
            assert seconds < 0.25 + 20 * baseline, (list(spec), seconds, baseline)

"""`trainjob_scheduling_api_requests_total{verb, code}`: every request the service makes of the
API server, 429s and 5xx included, over real HTTP (issue 27)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from kubernetes.aio.client import Configuration, CustomObjectsApi
from kubernetes.aio.client.exceptions import ApiException

from webhook.kube import rest
from webhook.kube.metered import MeteredApiClient, verb_of
from webhook.metrics.registry import Metrics
from webhook.server.run import count_requests

from .harness import free_port
from .kube_emulator import emulator
from .test_informer import serving


def sample(text: str, verb: str, code: str) -> float:
    """The counter's value for (verb, code) in an exposition; 0 when it has no such series."""
    pattern = rf'^trainjob_scheduling_api_requests_total\{{code="{code}",verb="{verb}"\}} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


@contextlib.asynccontextmanager
async def api_server() -> AsyncIterator[str]:
    """An HTTP server answering as a struggling API server would."""

    async def handle(request: web.Request) -> web.Response:
        if request.query.get("watch") == "true":
            return web.Response(text="", content_type="application/json")
        if request.path.endswith("/busy"):
            return web.json_response({"kind": "Status", "code": 429}, status=429)
        if request.method == "PATCH":
            return web.json_response({"kind": "Status", "code": 503}, status=503)
        return web.json_response({"kind": "List", "items": []})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_each_request_is_counted_by_verb_and_code() -> None:
    metrics = Metrics()
    async with api_server() as url:
        api = MeteredApiClient(configuration=Configuration(host=url))
        count_requests(api, metrics)
        try:
            await rest.get_json(api, "/apis/trainer.kubeflow.org/v1alpha1/trainjobs")
            watch = await rest.request(
                api, "GET", "/api/v1/pods", query=[("watch", "true"), ("timeoutSeconds", 1)]
            )
            watch.release()
            for _ in range(2):
                busy = await rest.request(api, "GET", "/api/v1/namespaces/a/pods/busy")
                busy.release()
            with pytest.raises(ApiException) as failed:
                await CustomObjectsApi(api).patch_namespaced_custom_object(
                    "g", "v1", "ns", "things", "x", {"metadata": {}}
                )
            assert failed.value.status == 503
        finally:
            close: Any = api.close  # untyped in the client
            await close()
        # An API server that does not answer at all.
        gone = MeteredApiClient(configuration=Configuration(host=f"http://127.0.0.1:{free_port()}"))
        count_requests(gone, metrics)
        try:
            with pytest.raises(OSError):  # aiohttp's connection errors are OSErrors
                await asyncio.wait_for(rest.get_json(gone, "/api/v1/nodes", timeout=2), 5)
        finally:
            close = gone.close
            await close()
    text = metrics.render()[0].decode()
    assert sample(text, "GET", "200") == 1
    assert sample(text, "WATCH", "200") == 1
    assert sample(text, "GET", "429") == 2
    assert sample(text, "PATCH", "503") == 1
    assert sample(text, "GET", "error") == 1


def test_a_watch_is_told_from_a_get() -> None:
    assert verb_of("get", "https://h/api/v1/pods?watch=true&timeoutSeconds=5") == "WATCH"
    assert verb_of("GET", "https://h/api/v1/pods?labelSelector=watch%3Dtrue") == "GET"
    assert verb_of("GET", "https://h/api/v1/pods?allowWatchBookmarks=true&watch=1") == "WATCH"
    assert verb_of("patch", "https://h/apis/g/v1/x") == "PATCH"


@pytest.mark.asyncio
async def test_the_service_exports_its_own_requests(tmp_path: Path) -> None:
    async with (
        emulator() as (_, url),
        serving(tmp_path, url, "--metrics-auth=false") as (proc, _),
    ):
        verify = ssl.create_default_context(cafile=str(tmp_path / "certs" / "ca.crt"))
        async with httpx.AsyncClient(verify=verify, timeout=10) as client:
            for _ in range(200):
                text = (await client.get(f"{proc.metrics_url}/metrics")).text
                if sample(text, "WATCH", "200") >= 1:
                    break
                await asyncio.sleep(0.05)
        assert sample(text, "GET", "200") >= 3, text  # the lists (and discovery)
        assert sample(text, "WATCH", "200") >= 1

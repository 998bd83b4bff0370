"""A real Prometheus scrapes the secured metrics endpoint, and its own HTTP API tells the result.

Prometheus (Debian's package: `make prometheus`) runs as our own process on loopback with two
scrape jobs over HTTPS, both trusting the service's CA: `good` with an allowed bearer token and
`wrong-token` with a token the API server does not know. The test passes once Prometheus reports
`good` up with a known series stored and `wrong-token` down with a 401.

Skipped when there is no `prometheus` binary, unless REQUIRE_PROMETHEUS=1 (CI sets it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import free_port
from tests.test_metrics_auth import GOOD_TOKEN, UNKNOWN_TOKEN, secured

SERIES = "trainjob_scheduling_certificate_expiry_timestamp_seconds"  # always present
DEADLINE = 20.0  # seconds for Prometheus to start and report both targets


@pytest.fixture
def prometheus() -> str:
    found = shutil.which("prometheus")
    if found:
        return found
    if os.environ.get("REQUIRE_PROMETHEUS") == "1":
        pytest.fail("REQUIRE_PROMETHEUS=1 but no prometheus binary: run `make prometheus`")
    pytest.skip("no prometheus binary (`make prometheus` installs Debian's)")


@dataclass(frozen=True)
class ScrapeTarget:
    address: str  # host:port of the HTTPS metrics endpoint
    ca_file: Path
    good_token: str
    bad_token: str
    server_name: str = "localhost"  # in the serving certificate


@contextlib.asynccontextmanager
async def scrape_target(tmp_path: Path) -> AsyncIterator[ScrapeTarget]:
    """The one thing Prometheus scrapes: the metrics app with authentication on, against the
    kmock API server answering the reviews. Swap this for a `python -m webhook serve` process and
    nothing else in the test changes."""
    async with secured(tmp_path) as (endpoint, _, _):
        yield ScrapeTarget(
            f"127.0.0.1:{endpoint.port}", endpoint.ca_file, GOOD_TOKEN, UNKNOWN_TOKEN
        )


def scrape_config(target: ScrapeTarget) -> dict[str, Any]:
    def job(name: str, token: str) -> dict[str, Any]:
        return {
            "job_name": name,
            "scheme": "https",
            "metrics_path": "/metrics",
            "authorization": {"type": "Bearer", "credentials": token},
            "tls_config": {"ca_file": str(target.ca_file), "server_name": target.server_name},
            "static_configs": [{"targets": [target.address]}],
        }

    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [job("good", target.good_token), job("wrong-token", target.bad_token)],
    }


@contextlib.contextmanager
def running_prometheus(binary: str, work: Path, config: dict[str, Any]) -> Iterator[str]:
    """Prometheus with `config` on a free loopback port (our own process, not Debian's
    service); yields its URL; its log is `work/prometheus.log`."""
    config_file = work / "prometheus.yml"
    config_file.write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    cmd = [
        binary,
        f"--config.file={config_file}",
        f"--storage.tsdb.path={work / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with open(work / "prometheus.log", "wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def targets(client: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    """Prometheus's active targets by job (empty while it starts)."""
    with contextlib.suppress(httpx.HTTPError):
        response = await client.get("/api/v1/targets", params={"state": "active"})
        if response.status_code == 200:
            active = response.json()["data"]["activeTargets"]
            return {t["labels"]["job"]: t for t in active}
    return {}


async def query(client: httpx.AsyncClient, promql: str) -> list[dict[str, Any]]:
    response = await client.get("/api/v1/query", params={"query": promql})
    response.raise_for_status()
    result: list[dict[str, Any]] = response.json()["data"]["result"]
    return result


@pytest.mark.asyncio
async def test_prometheus_scrapes_with_a_bearer_token(prometheus: str, tmp_path: Path) -> None:
    work = tmp_path / "prometheus"
    work.mkdir()
    async with scrape_target(tmp_path) as target:
        with running_prometheus(prometheus, work, scrape_config(target)) as url:
            async with httpx.AsyncClient(base_url=url, timeout=2) as client:
                deadline = time.monotonic() + DEADLINE
                seen: dict[str, dict[str, Any]] = {}
                series: list[dict[str, Any]] = []
                while time.monotonic() < deadline:
                    seen = await targets(client)
                    good, bad = seen.get("good", {}), seen.get("wrong-token", {})
                    if good.get("health") == "up" and bad.get("health") == "down":
                        series = await query(client, f'{SERIES}{{job="good"}}')
                        if series:
                            break
                    await asyncio.sleep(0.25)
                log = (work / "prometheus.log").read_text(errors="replace")[-2000:]
                assert series, f"targets: {json.dumps(seen, indent=1)}\nlog: {log}"
                assert seen["good"]["lastError"] == ""
                assert "401" in seen["wrong-token"]["lastError"], seen["wrong-token"]
                assert float(series[0]["value"][1]) > time.time()  # an expiry in the future
                up = await query(client, "up")
                assert {r["metric"]["job"]: r["value"][1] for r in up} == {
                    "good": "1",
                    "wrong-token": "0",
                }
                assert await query(client, f'{SERIES}{{job="wrong-token"}}') == []

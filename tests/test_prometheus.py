"""A real Prometheus scrapes the real service, and its own HTTP API tells the result.

The target is `python -m webhook serve --kubeconfig` against the API emulator (run in a thread,
`tests.test_metrics_serve.cluster`), whose kmock reactions answer the service's TokenReviews and
SubjectAccessReviews. Prometheus (Debian's package: `make prometheus`) runs as our own process on
loopback with two scrape jobs over HTTPS to the service's metrics port, both trusting the
service's CA: `good` with an allowed bearer token and `wrong-token` with a token the API server
does not authenticate. The test passes once Prometheus reports `good` up with a known series
stored, and the series of the running service (gang API served, this replica leading), and
`wrong-token` down with a 401.

Skipped when there is no `prometheus` binary, unless REQUIRE_PROMETHEUS=1 (CI sets it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.harness import free_port
from tests.test_metrics_auth import GOOD_TOKEN, UNKNOWN_TOKEN
from tests.test_metrics_serve import GANG_API, LEADER, LEASE, Served, serve_with_cluster

SERIES = "trainjob_scheduling_certificate_expiry_timestamp_seconds"  # present once loaded
# The running service's own state, as the good job stores it: both 1.
SERVICE_SERIES = (f'{GANG_API}{{job="good"}}', f'{LEADER}{{job="good",name="{LEASE}"}}')
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


@contextlib.contextmanager
def scrape_target(tmp_path: Path) -> Iterator[tuple[ScrapeTarget, Served]]:
    """The one thing Prometheus scrapes: `python -m webhook serve` (authentication on, the
    default) with a kubeconfig for the emulator, on its metrics port. Not waited for: it starts
    while Prometheus does, and the test waits for Prometheus to see it up."""
    with serve_with_cluster(tmp_path, wait=False) as (_, served):
        port = urlsplit(served.proc.metrics_url).port
        target = ScrapeTarget(f"127.0.0.1:{port}", served.ca_file, GOOD_TOKEN, UNKNOWN_TOKEN)
        yield target, served


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


def targets(client: httpx.Client) -> dict[str, dict[str, Any]]:
    """Prometheus's active targets by job (empty while it starts)."""
    with contextlib.suppress(httpx.HTTPError):
        response = client.get("/api/v1/targets", params={"state": "active"})
        if response.status_code == 200:
            active = response.json()["data"]["activeTargets"]
            return {t["labels"]["job"]: t for t in active}
    return {}


def query(client: httpx.Client, promql: str) -> list[dict[str, Any]]:
    response = client.get("/api/v1/query", params={"query": promql})
    response.raise_for_status()
    result: list[dict[str, Any]] = response.json()["data"]["result"]
    return result


def values(client: httpx.Client, promql: str) -> list[str]:
    return [r["value"][1] for r in query(client, promql)]


def test_prometheus_scrapes_the_service_with_a_bearer_token(
    prometheus: str, tmp_path: Path
) -> None:
    work = tmp_path / "prometheus"
    work.mkdir()
    with (
        scrape_target(tmp_path) as (target, served),
        running_prometheus(prometheus, work, scrape_config(target)) as url,
        httpx.Client(base_url=url, timeout=2) as client,
    ):
        deadline = time.monotonic() + DEADLINE
        seen: dict[str, dict[str, Any]] = {}
        series: list[dict[str, Any]] = []
        service: dict[str, list[str]] = {}
        while time.monotonic() < deadline:
            seen = targets(client)
            good, bad = seen.get("good", {}), seen.get("wrong-token", {})
            # Down from a refused connection until the service listens: wait for the 401.
            refused = bad.get("health") == "down" and "401" in bad.get("lastError", "")
            if good.get("health") == "up" and refused:
                series = query(client, f'{SERIES}{{job="good",certificate="serving"}}')
                service = {promql: values(client, promql) for promql in SERVICE_SERIES}
                if series and all(v == ["1"] for v in service.values()):
                    break
            time.sleep(0.25)
        log = (work / "prometheus.log").read_text(errors="replace")[-2000:]
        why = f"targets: {json.dumps(seen, indent=1)}\nprometheus log: {log}"
        assert series, f"{why}\nservice log: {served.log_tail()}"
        assert service == {promql: ["1"] for promql in SERVICE_SERIES}, why
        assert seen["good"]["lastError"] == ""
        assert "401" in seen["wrong-token"]["lastError"], seen["wrong-token"]
        assert float(series[0]["value"][1]) > time.time()  # an expiry in the future
        up = query(client, "up")
        assert {r["metric"]["job"]: r["value"][1] for r in up} == {"good": "1", "wrong-token": "0"}
        assert query(client, '{job="wrong-token",__name__!~"up|scrape_.*"}') == []

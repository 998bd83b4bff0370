"""The service under test: `python -m webhook serve` started as a user would outside the cluster
(`--kubeconfig`), on ports of its own that stay the same when it is stopped and started again
(the registered webhooks point at its port), or one deployed in the cluster
(E2E_EXTERNAL_SERVICE=1) that the tests only observe."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import free_port, make_certs
from tests.paths import REPO

from .cluster import Cluster, Json, poll
from .registration import Registration

LOG_LINES = 40  # of the service's log, shown when a wait fails
READY_SECONDS = 60.0


class Service:
    """The service under test, as far as the tests can see it."""

    local = False

    def describe(self) -> str:
        return ""

    def check_running(self) -> None:
        """Fails the test at once when the service has died (rather than at a deadline)."""

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        """Every sample of /metrics by (name, sorted labels); None when not readable here."""
        return None

    def log_text(self) -> str:
        return ""


class ExternalService(Service):
    """A service deployed in the cluster. With `deployment` ("namespace/name",
    E2E_SERVICE_DEPLOYMENT) the outage test can stop it (its Deployment scaled to 0, every pod
    gone) and start it again (scaled back, every replica ready), as an operator would."""

    def __init__(self, cluster: Cluster | None = None, deployment: str = "") -> None:
        self.cluster = cluster
        self.namespace, _, self.name = deployment.partition("/")
        self.replicas = 0
        self.stopped = False

    @property
    def stoppable(self) -> bool:
        return self.cluster is not None and bool(self.namespace and self.name)

    def describe(self) -> str:
        return (
            "(the service is deployed in the cluster, E2E_EXTERNAL_SERVICE=1: see its pod's log; "
            "it must watch this run's namespaces)"
        )

    def _deployment(self) -> Json:
        assert self.cluster is not None
        found = self.cluster.get("apps", "v1", "deployments", self.name, self.namespace)
        assert found is not None, f"no Deployment {self.namespace}/{self.name}"
        return found

    def _scale(self, replicas: int) -> None:
        assert self.cluster is not None
        self.cluster.patch("apps", "v1", "deployments", self.namespace, self.name,
                           {"spec": {"replicas": replicas}})  # fmt: skip

    def stop(self) -> None:
        """Scaled to 0; returns once none of its pods is left (its Service has no endpoint)."""
        assert self.cluster is not None
        deployment = self._deployment()
        self.replicas = int(deployment["spec"].get("replicas") or 1)
        selector = deployment["spec"]["selector"]["matchLabels"]
        labels = ",".join(f"{k}={v}" for k, v in selector.items())
        self._scale(0)
        cluster = self.cluster

        def gone() -> bool:
            return not cluster.list_objects("", "v1", "pods", self.namespace, labels=labels)

        assert poll(gone, "the deployed service's pods gone", READY_SECONDS, interval=0.2)

    def start(self) -> None:
        """Scaled back; returns once every replica is ready (in its Service's endpoints)."""
        self._scale(self.replicas or 1)

        def ready() -> bool:
            status = self._deployment().get("status") or {}
            return int(status.get("readyReplicas") or 0) >= (self.replicas or 1)

        assert poll(ready, "the deployed service ready again", READY_SECONDS, interval=0.2)


@dataclass
class LocalService(Service):
    """One `serve` process at a time, restartable on the same ports with the same flags."""

    workdir: Path
    kubeconfig: str
    namespaces: list[str]
    username: str
    port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    stopped: bool = False  # stopped on purpose (an outage test), not crashed
    registration: Registration | None = None  # the webhooks registered for it
    local = True

    @property
    def cert_dir(self) -> Path:
        return self.workdir / "certs"

    @property
    def ca_file(self) -> Path:
        return self.cert_dir / "ca.crt"

    @property
    def log_file(self) -> Path:
        return self.workdir / "serve.log"

    def args(self) -> list[str]:
        return [
            sys.executable, "-m", "webhook", "serve",
            "--kubeconfig", self.kubeconfig,
            "--cert-dir", str(self.cert_dir),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--health-port", str(self.health_port),
            "--metrics-port", str(self.metrics_port),
            "--watch-namespaces", ",".join(self.namespaces),
            "--metrics-auth=false",
            "--leader-elect=false",
            # No --service-account: out of the cluster the service learns its own username (the
            # only writer of runtime snapshots) by a SelfSubjectReview, as a user's would.
            "--log-level=info",
        ]  # fmt: skip

    def start(self, wait_ready: bool = True) -> None:
        """Starts the process and waits for /readyz (the watches listed), unless not
        `wait_ready` (then only for its health port to answer)."""
        assert self.process is None or self.process.poll() is not None, "already running"
        if not self.ca_file.exists():
            self.cert_dir.mkdir(parents=True, exist_ok=True)
            make_certs(self.cert_dir)  # the serving pair holds IP 127.0.0.1
        env = {
            k: v
            for k, v in os.environ.items()
            if k != "KUBECONFIG" and not k.startswith("WEBHOOK_")
        }
        self.starts += 1
        with open(self.log_file, "ab") as log:
            log.write(f"--- start {self.starts} at {time.strftime('%H:%M:%S')}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.args(), stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                preexec_fn=_die_with_parent,
            )  # fmt: skip
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"the service exited with code {self.process.returncode}\n{self.describe()}"
                )
            if self.ready() or (not wait_ready and self.answers()):
                return
            time.sleep(0.2)
        raise AssertionError(f"the service never became ready\n{self.describe()}")

    def _probe(self, path: str) -> int | None:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"http://127.0.0.1:{self.health_port}{path}", timeout=2).status_code
        return None

    def ready(self) -> bool:
        """Whether /readyz says ready."""
        return self._probe("/readyz") == 200

    def answers(self) -> bool:
        """Whether the process serves its probes (/healthz), ready or not."""
        return self._probe("/healthz") == 200

    def identity(self) -> tuple[str, str] | None:
        """(username, where the service learnt it) from its log line saying who may write
        runtime snapshots; None when it said nothing."""
        for line in self.log_text().split("\n"):
            if line.startswith("{") and "runtime snapshots are written only by" in line:
                with contextlib.suppress(ValueError):
                    said = json.loads(line)
                    return str(said.get("username")), str(said.get("from"))
        return None

    def stop(self, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL) and wait for the process to end."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except OSError:
            return ""

    def log_mark(self) -> int:
        """Where the log ends now: `log_records(since=...)` reads what comes after."""
        return len(self.log_text())

    def log_records(self, since: int = 0) -> list[dict[str, Any]]:
        """The structured (JSON) log lines written after `since`, parsed."""
        found = []
        for line in self.log_text()[since:].split("\n"):
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if isinstance(record, dict):
                        found.append(record)
        return found

    def log_tail(self, lines: int = LOG_LINES) -> str:
        return "\n".join(self.log_text().rstrip("\n").split("\n")[-lines:])

    def describe(self) -> str:
        return f"service log ({self.log_file}), last lines:\n{self.log_tail()}"

    def check_running(self) -> None:
        if self.process is not None and self.process.poll() is not None and not self.stopped:
            raise AssertionError(
                f"the service exited with code {self.process.returncode}\n{self.describe()}"
            )

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        """/metrics over HTTPS, the dev CA verifying the service's certificate."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        url = f"https://127.0.0.1:{self.metrics_port}/metrics"
        answer = httpx.get(url, verify=context, timeout=10)
        answer.raise_for_status()
        return parse_samples(answer.text)


def parse_samples(
    text: str, keep: tuple[str, ...] = ()
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of a Prometheus text exposition by (name, sorted labels); with `keep`, only
    the families whose name starts with one of those."""
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        if keep and not family.name.startswith(keep):
            continue
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return samples


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when pytest dies, even by SIGKILL (Linux prctl
    PR_SET_PDEATHSIG), so a killed run leaves no service running. Elsewhere: nothing."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


def total(
    samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float] | None,
    name: str,
    **labels: str,
) -> float:
    """The sum of a metric's samples over every label set that has `labels` (0 when absent)."""
    return sum(
        value
        for (sample, found), value in (samples or {}).items()
        if sample == name and labels.items() <= dict(found).items()
    )

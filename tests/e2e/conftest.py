"""Fixtures of the end-to-end tests: a real cluster (or a skip), a namespace and a
ClusterTrainingRuntime of their own, and the service under test. See tests/e2e/README.md."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from kubernetes.client.exceptions import ApiException

from .cluster import (
    TRAINER_GROUP,
    TRAINER_VERSION,
    Cluster,
    Json,
    Skip,
    check_apis,
    connect,
    external_service,
    required,
)
from .objects import CREATED_BY, cluster_runtime
from .scenario import ExternalService, Scenario, Service, local_service


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: needs a real cluster (E2E_KUBECONFIG or KUBECONFIG); skips without one"
    )


NOTES: list[str] = []  # what the run did not check, and why; printed at the end


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for note in NOTES:
        terminalreporter.write_line(f"e2e note: {note}")


def _skip(reason: str) -> NoReturn:
    if required():
        pytest.fail(f"E2E=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def _keep() -> bool:
    return os.environ.get("E2E_KEEP", "").strip().lower() in ("1", "true", "yes", "on")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The configured cluster, able to run the scenario; else every e2e test skips (fast)."""
    try:
        found = connect()
    except Skip as why:
        _skip(str(why))
    try:
        check_apis(found, check_crd=os.environ.get("E2E_SKIP_CRD_CHECK", "") not in ("1", "true"))
    except Skip as why:
        found.close()
        _skip(str(why))
    NOTES.extend(f"{found.server} ({found.version}): {note}" for note in found.notes)
    try:
        yield found
    finally:
        found.close()


@pytest.fixture(scope="module")
def suffix() -> str:
    return secrets.token_hex(3)


@pytest.fixture(scope="module")
def namespace(cluster: Cluster, suffix: str) -> Iterator[str]:
    """A namespace of its own, deleted at the end (with everything in it) unless E2E_KEEP=1."""
    name = f"wasched-e2e-{suffix}"
    cluster.create_namespace(name, CREATED_BY)
    try:
        yield name
    finally:
        if not _keep():
            cluster.delete_namespace(name)


@pytest.fixture(scope="module")
def runtime(cluster: Cluster, suffix: str) -> Iterator[Json]:
    """The level-1 ClusterTrainingRuntime, under a unique name, as the API server stored it."""
    name = f"wasched-e2e-{suffix}"
    try:
        stored = cluster.create(
            TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", cluster_runtime(name)
        )
    except ApiException as err:
        if err.status == 400 and 'unknown field "spec.scheduling"' in str(err.body):
            _skip(
                "the ClusterTrainingRuntime CRD does not declare spec.scheduling (strict field "
                f"validation refused it: {err.body}); install tests/e2e/crds/"
            )
        raise  # another refusal (a CRD whose scheduling schema differs, a webhook): a failure
    try:
        if not (stored.get("spec") or {}).get("scheduling"):
            _skip(
                "the API server pruned spec.scheduling from the ClusterTrainingRuntime: its CRD "
                "does not declare it (Trainer before v2.4); install tests/e2e/crds/"
            )
        yield stored
    finally:
        if not _keep():
            cluster.delete(TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", name)


@pytest.fixture(scope="module")
def service(
    cluster: Cluster, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    """`python -m webhook serve` against the cluster, unless E2E_EXTERNAL_SERVICE=1."""
    if external_service():
        yield ExternalService()
        return
    workdir: Path = tmp_path_factory.mktemp("e2e-service")
    with local_service(workdir, cluster.kubeconfig, namespace) as running:
        yield running


@pytest.fixture(scope="module")
def scenario(cluster: Cluster, namespace: str, runtime: Json, service: Service) -> Scenario:
    return Scenario(cluster, namespace, runtime, service)

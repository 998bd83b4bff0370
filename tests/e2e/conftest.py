"""Fixtures of the end-to-end tests: a real cluster (or a skip), what it is configured with, the
service under test with the chart's webhooks registered for the run, and per test module a
namespace, a pod recorder and fake nodes of its own. See tests/e2e/README.md."""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import pytest

from .cluster import (
    Cluster,
    ServerFacts,
    Skip,
    check_apis,
    connect,
    external_service,
    feature_gates,
    keep,
    poll,
    probe_dropped_fields,
    required,
    service_deployment,
)
from .objects import TRAINER_STACK_LABEL
from .recorder import PodRecorder
from .registration import (
    LEFTOVERS,
    OWNER_ANNOTATION,
    RUN_LABEL,
    chart_configurations,
    for_local_service,
    owner,
    register,
    sweep,
    unregister,
)
from .scenario import Pool, Run, Scenario, objects_dump
from .service import ExternalService, LocalService, Service

LAST = ("test_outage",)  # modules that stop the shared service: run after every other one


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: needs a real cluster (E2E_KUBECONFIG or KUBECONFIG); skips without one"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def last(item: pytest.Item) -> bool:
        return Path(str(item.fspath)).stem in LAST

    items.sort(key=last)  # stable: the order within each group is kept


NOTES: list[str] = []  # what the run did not check, and why; printed at the end


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for note in NOTES:
        terminalreporter.write_line(f"e2e note: {note}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed e2e test's report ends with the namespace's objects (TrainJobs and their
    condition, gang objects, pods) and the service's log tail (waits already say it)."""
    report = yield
    if report.failed and call.when == "call":
        scenario = getattr(item, "funcargs", {}).get("scenario")
        if isinstance(scenario, Scenario):
            try:
                report.sections.append(("objects", objects_dump(scenario)))
            except Exception as err:  # the report must not fail for it
                report.sections.append(("objects", f"(could not read them: {err})"))
            if isinstance(scenario.service, LocalService):
                report.sections.append(("service log (tail)", scenario.service.log_tail(80)))
    return report


def _skip(reason: str) -> NoReturn:
    if required():
        pytest.fail(f"E2E=1 but {reason}", pytrace=False)
    pytest.skip(reason)


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
    try:
        yield found
    finally:
        NOTES.extend(f"{found.server} ({found.version}): {note}" for note in found.notes)
        found.close()


@pytest.fixture(scope="session")
def facts(cluster: Cluster) -> ServerFacts:
    """The server's configuration, learnt from the server (discovery, its feature gates, a
    dry-run PodGroup)."""
    found = ServerFacts(
        scheduling_version=cluster.scheduling_version,
        gates=feature_gates(cluster),
        dropped_fields=probe_dropped_fields(cluster, "default"),
        trainer_stack=True,
    )
    NOTES.append(f"{cluster.server} ({cluster.version}): {found.describe()}")
    return found


def _module_key(module: str) -> str:
    return module.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")


@pytest.fixture(scope="session")
def run(request: pytest.FixtureRequest, cluster: Cluster) -> Run:
    """This run: its id and the namespace of every e2e module collected (the service watches
    those, and only those)."""
    del cluster  # only so that no namespace is named without a cluster
    run_id = secrets.token_hex(3)
    modules = sorted(
        {
            item.module.__name__
            for item in request.session.items
            if isinstance(item, pytest.Function) and item.module.__name__.startswith("tests.e2e.")
        }
    )
    namespaces = {m: f"wasched-e2e-{run_id}-{_module_key(m)}"[:63] for m in modules}
    return Run(run_id, namespaces)


class _Interrupted(KeyboardInterrupt):
    pass


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    del frame
    raise _Interrupted(f"signal {signum}")


@pytest.fixture(scope="session")
def service(
    cluster: Cluster, run: Run, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    """`python -m webhook serve --kubeconfig ...` started as a user would outside the cluster,
    and the chart's webhook configurations registered for it (tests/e2e/registration.py);
    unless E2E_EXTERNAL_SERVICE=1 (the service is deployed; the tests only observe). The
    registration is deleted at the end whatever happens (SIGTERM and SIGHUP end the session
    as Ctrl-C does; an atexit hook is the last resort; the next run sweeps a dead run's)."""
    if external_service():
        yield ExternalService(cluster, service_deployment())
        return
    swept = sweep(cluster)
    if swept:
        NOTES.append(f"deleted webhook configurations of dead runs: {', '.join(swept)}")
    username = cluster.whoami()
    workdir = tmp_path_factory.mktemp("e2e-service")
    local = LocalService(workdir, cluster.kubeconfig, sorted(run.namespaces.values()), username)
    handlers = {
        sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)
    }
    atexit.register(unregister, cluster, run.id)
    try:
        local.start()
        said = poll(local.identity, "the service says who it is", 20, interval=0.2)
        assert said is not None and said[0] == username, (
            f"the service takes itself for {said}, the API server says {username!r} (the "
            "chart's matchConditions and the snapshot guard need the same)\n" + local.describe()
        )
        configurations = for_local_service(
            chart_configurations(run.namespaces.values(), run.id),
            run=run.id,
            port=local.port,
            ca_pem=local.ca_file.read_bytes(),
            username=username,
        )
        local.registration = register(cluster, configurations, run.id)
        NOTES.append(
            f"service {username} (learnt from {said[1]}) on 127.0.0.1:{local.port} "
            f"(log {local.log_file}); webhooks " + ", ".join(local.registration.paths())
        )
        yield local
    finally:
        deleted = unregister(cluster, run.id)
        local.stop()
        with contextlib.suppress(Exception):
            atexit.unregister(unregister)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        _sweep_run(cluster, run)
        NOTES.append(f"deleted {', '.join(deleted) or 'no webhook configuration'}")


def _sweep_run(cluster: Cluster, run: Run) -> None:
    """The run's cluster-scoped leftovers (fake nodes, runtimes, PriorityClasses, roles), by
    its label (its namespaces go with their modules)."""
    if keep():
        return
    selector = f"{RUN_LABEL}={run.id}"
    for kind, group, version, plural in LEFTOVERS:
        if kind == "Namespace":
            continue
        with contextlib.suppress(Exception):
            for obj in cluster.list_objects(group, version, plural, labels=selector):
                cluster.delete(group, version, plural, obj["metadata"]["name"])


@pytest.fixture(scope="module")
def scenario(
    request: pytest.FixtureRequest, cluster: Cluster, run: Run, facts: ServerFacts, service: Service
) -> Iterator[Scenario]:
    """The module's namespace (labelled for the run's webhooks and for the harness's Trainer and
    JobSet webhooks), its pod recorder; everything deleted at the end unless E2E_KEEP=1."""
    namespace = run.namespaces[request.module.__name__]
    cluster.create_namespace(
        namespace, {**run.labels, TRAINER_STACK_LABEL: "true"}, {OWNER_ANNOTATION: owner()}
    )
    recorder = PodRecorder(cluster, namespace, lambda: run.fake_nodes)
    world = Scenario(cluster, namespace, service, facts, run, recorder)
    try:
        recorder.start()
        if service.local:
            world.untied_at_start = world.untied_count()
        yield world
    finally:
        try:
            world.cleanup()
        finally:
            recorder.stop()


@pytest.fixture
def pool(scenario: Scenario) -> Pool:
    """Fake nodes of the test's own (add them with `pool.add(count, cpu, labels)`)."""
    return scenario.pool()

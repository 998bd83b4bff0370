"""End to end: a watched namespace deleted under the service is quiet (CHANGELOG "Quiet on the
way out").

The shared service runs as cluster-admin, whom nothing refuses. This module starts a service of
its own as the chart runs it in a cluster: a ServiceAccount with the chart's RBAC
(`identity.py`: rendered with `serve.watchNamespaces`, so its rules on the watched namespace
are a Role in that namespace, which goes when the namespace goes), watching one namespace of
its own that no webhook of the run serves:

1. it serves the namespace: a suspended TrainJob of a scheduling runtime is frozen;
2. the namespace is deleted while a finalizer keeps the TrainJob (and, for now, the Role): the
   TrainJob being deleted gets a `TrainJobDeleting` Event, which the API server refuses (the
   namespace is terminating): dropped, never retried, counted
   (`trainjob_scheduling_events_refused_total`), said once at most;
3. the finalizers taken off, the namespace and its Role are gone. A watch is authorised when
   it starts, so the watches running go on until they end (up to 5 minutes); the service is
   restarted instead, as its pod would be: every list of the namespace is refused (RBAC: its
   Role went with it), and over a minute each is said once (a warning naming the fix), retried
   with a backoff (never a warning loop) and counted (`trainjob_scheduling_watches_refused`);
4. the namespace and its Role made again: each watch says once that it is allowed again, the
   gauge is back at 0 and the service is ready."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from webhook.core.snapshot import SNAPSHOT_ANNOTATION

from .cluster import TRAINER_GROUP, TRAINER_VERSION, Cluster, Json, NotYet, poll, timeout
from .conftest import NOTES
from .identity import ChartIdentity, create, delete, unhold
from .objects import TRAINER_STACK_LABEL, replicated_job, runtime, trainjob
from .registration import OWNER_ANNOTATION, owner
from .scenario import Scenario
from .service import LocalService, total

pytestmark = pytest.mark.e2e

QUIET = 60.0  # seconds the restarted service is watched while its namespace is gone
# Seconds for every refused list to be tried again once the namespace is back: the refusal's
# backoff reaches a minute (jittered) by then.
BACK = 150.0
HOLD = "trainjob-scheduling-e2e.dev/hold"  # a finalizer of the test's: keeps what it is on
REFUSED_WATCHES = "trainjob_scheduling_watches_refused"
REFUSED_EVENTS = "trainjob_scheduling_events_refused_total"
ALLOWED_AGAIN = "allowed again after a refusal"


def test_a_deleted_watched_namespace_is_quiet(scenario: Scenario, tmp_path: Path) -> None:
    if not scenario.service.local:
        pytest.skip("the service is deployed (E2E_EXTERNAL_SERVICE=1): none is started here")
    cluster, run = scenario.cluster, scenario.run
    doomed = f"{scenario.namespace}-gone"[:63]
    identity = ChartIdentity(
        release=f"q{run.id}", namespace=scenario.namespace, name="quiet-service",
        watched=(doomed,), run=run.id,
    )  # fmt: skip
    objects = identity.objects()
    held = [o for o in objects if o["metadata"].get("namespace") == doomed]  # its Role, binding
    for obj in held:
        obj["metadata"]["finalizers"] = [HOLD]
    service: LocalService | None = None
    try:
        _make_namespace(scenario, doomed)
        create(cluster, objects)
        kubeconfig = identity.kubeconfig(cluster, tmp_path / "kubeconfig")
        service = LocalService(tmp_path, str(kubeconfig), [doomed], identity.username)
        service.start()
        _serves(cluster, doomed)
        _refused_events(cluster, service, doomed)
        _unhold(cluster, doomed, held)
        poll(lambda: cluster.get("", "v1", "namespaces", doomed) is None,
             f"namespace {doomed} gone", timeout())  # fmt: skip
        _restarted_quiet(service, doomed)
        mark = service.log_mark()
        _make_namespace(scenario, doomed)
        create(cluster, identity.in_namespace(doomed))
        _back(service, doomed, mark)
    finally:
        if service is not None:
            service.stop()
        _unhold(cluster, doomed, held)
        cluster.delete_namespace(doomed)
        delete(cluster, objects)


def _make_namespace(scenario: Scenario, name: str) -> None:
    """The watched namespace: labelled with the run (no webhook of the run serves it: they
    list their namespaces by name) and for the harness's Trainer and JobSet webhooks."""
    scenario.cluster.create_namespace(
        name, {**scenario.run.labels, TRAINER_STACK_LABEL: "true"}, {OWNER_ANNOTATION: owner()}
    )


def _unhold(cluster: Cluster, namespace: str, held: list[Json]) -> None:
    """The test's finalizer taken off the TrainJob and the namespace's Role and RoleBinding.
    Trainer's validator refuses every update of a TrainJob whose runtime is gone (the
    namespace's deletion took it): the namespace loses the label the harness scopes Trainer's
    webhooks by first."""
    with contextlib.suppress(ApiException):
        cluster.patch("", "v1", "namespaces", None, namespace,
                      {"metadata": {"labels": {TRAINER_STACK_LABEL: None}}})  # fmt: skip
    with contextlib.suppress(ApiException):
        cluster.patch(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", namespace, "quiet",
                      {"metadata": {"finalizers": None}})  # fmt: skip
    unhold(cluster, held)


def _serves(cluster: Cluster, namespace: str) -> None:
    """A suspended TrainJob (no pods) of a scheduling runtime, held by the test's finalizer,
    is frozen by the service (no webhook serves the namespace: its reconciler does)."""
    body = runtime(
        "quiet", {"schedulingPolicy": {"gang": {}}},
        [replicated_job("node", None, ancestor="trainer")], namespace=namespace,
    )  # fmt: skip
    stored = cluster.create(TRAINER_GROUP, TRAINER_VERSION, "trainingruntimes", body, namespace)
    job = trainjob("quiet", namespace, stored, num_nodes=1, suspend=True)
    job["metadata"]["finalizers"] = [HOLD]
    cluster.create(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", job, namespace)

    def frozen() -> bool:
        found = cluster.get(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", "quiet", namespace)
        annotations = ((found or {}).get("metadata") or {}).get("annotations") or {}
        return SNAPSHOT_ANNOTATION in annotations

    poll(frozen, f"the service freezes the runtime into {namespace}/quiet", timeout())


def _refused_events(cluster: Cluster, service: LocalService, namespace: str) -> None:
    """The namespace deleted, the TrainJob and the Role held: the TrainJobDeleting Event is
    refused (the namespace is terminating), dropped, counted, said once at most."""
    mark = service.log_mark()
    before = total(service.metrics(), REFUSED_EVENTS)
    cluster.delete_namespace(namespace)

    def refused() -> float:
        now = total(service.metrics(), REFUSED_EVENTS)
        if now <= before:
            raise NotYet(f"{REFUSED_EVENTS} {now}\n{service.log_tail(10)}")
        return now

    poll(refused, "an Event refused in the terminating namespace", timeout())
    time.sleep(5)  # what a retry loop would add
    records = service.log_records(mark)
    said = [r for r in records if r.get("logger") == "webhook.events" and r.get("refusal")]
    failed = [r for r in records if r.get("msg") == "cannot post an event"]
    assert len(said) <= 1 and not failed, f"refused Events said: {said + failed}"
    NOTES.append(
        f"quiet: {total(service.metrics(), REFUSED_EVENTS) - before:.0f} Event(s) refused in "
        f"the terminating namespace, said {len(said)} time(s)"
    )


def _restarted_quiet(service: LocalService, namespace: str) -> None:
    """The namespace and its Role gone, the service restarted: for QUIET seconds each refused
    list is said once, and counted."""
    service.stop()
    mark = service.log_mark()
    service.start(wait_ready=False)
    started = time.monotonic()
    counted: dict[str, float] = {}
    while time.monotonic() - started < QUIET:
        for (name, labels), value in (service.metrics() or {}).items():
            if name == REFUSED_WATCHES and value:
                counted[dict(labels).get("resource", "?")] = value
        time.sleep(2)
    warned = [r for r in service.log_records(mark) if _warns(r, namespace)]
    said = Counter(str(r.get("resource")) for r in warned)
    assert said, "no refusal said while the watched namespace is gone\n" + service.log_tail(30)
    assert all(n == 1 for n in said.values()), f"refusals said more than once: {said}"
    late = [r for r in warned if _seconds(warned[0], r) > QUIET / 2]
    assert not late, f"warnings still coming after {QUIET / 2:.0f}s: {late}"
    assert counted, f"{REFUSED_WATCHES} never showed the refusals"
    NOTES.append(
        f"quiet: the namespace gone, the restarted service said {sum(said.values())} "
        f"refusal(s) in {QUIET:.0f}s, one per watch ({', '.join(sorted(said))}); "
        f"{REFUSED_WATCHES} {counted}; ready meanwhile: {service.ready()}"
    )


def _back(service: LocalService, namespace: str, mark: int) -> None:
    """The namespace and its Role made again: every refused watch says once it is allowed
    again, none warns, the gauge is back at 0 and the service is ready."""

    def allowed() -> bool:
        refused = total(service.metrics(), REFUSED_WATCHES)
        if refused or not service.ready():
            raise NotYet(f"{REFUSED_WATCHES} {refused}, ready {service.ready()}")
        return True

    poll(allowed, "every watch of the namespace allowed again, the service ready", BACK)
    records = service.log_records(mark)
    again = Counter(
        str(r.get("resource")) for r in records
        if r.get("msg") == ALLOWED_AGAIN and r.get("namespace") == namespace
    )  # fmt: skip
    assert again and all(n == 1 for n in again.values()), f"'{ALLOWED_AGAIN}' said: {again}"
    warned = [r for r in records if _warns(r, namespace)]
    assert not warned, f"warnings once the namespace was back: {warned}"


def _warns(record: Json, namespace: str) -> bool:
    return record.get("level") in ("warning", "error") and record.get("namespace") == namespace


def _seconds(first: Json, record: Json) -> float:
    """Seconds between two log records (their ISO timestamps)."""

    def at(r: Json) -> float:
        return datetime.fromisoformat(str(r["ts"]).replace("Z", "+00:00")).timestamp()

    return at(record) - at(first)

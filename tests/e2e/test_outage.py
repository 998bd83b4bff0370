"""End to end: the service is down for a while with its webhooks registered (the chart's
failurePolicies). A ganged TrainJob resumed meanwhile (a change of spec.suspend alone never
waits on the service) gets no pod: the Job controller's creations are denied (held), never
admitted loose; plain pods and plain Jobs of the namespace are not held. A TrainJob created
meanwhile is refused or, if the chart lets it in, gets no pod either. Once the service is back,
the Job controller's retries are tied and every gang binds.

This module stops the shared service, so it runs last (conftest.py)."""

from __future__ import annotations

import re
import time

import pytest
from kubernetes.client.exceptions import ApiException

from .cluster import NotYet, timeout
from .objects import CREATED_BY, level1, pod_spec, trainjob
from .recorder import JOBSET_NAME
from .scenario import Pool, Scenario, describe_pods
from .service import LocalService

pytestmark = pytest.mark.e2e

OUTAGE = 25.0  # seconds the service is down


def test_pods_are_held_while_the_service_is_down_and_tied_when_it_returns(
    scenario: Scenario, pool: Pool
) -> None:
    service = scenario.service
    if not isinstance(service, LocalService):
        pytest.skip("the service is deployed (E2E_EXTERNAL_SERVICE=1): the suite cannot stop it")
    pool.add(3, cpu=4)  # both gangs (4 pods each) and the plain pods
    stored = scenario.apply_runtime(level1("outage", pool.name, scenario.namespace))
    scenario.create_trainjob(trainjob("outage", scenario.namespace, stored, num_nodes=3,
                                      suspend=True))  # fmt: skip
    plan = scenario.frozen_plan("outage")
    service.stopped = True
    service.stop()
    try:
        down_at = time.monotonic()
        scenario.set_suspend("outage", False)  # allowed: only spec.suspend changes
        plain_pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "plain", "labels": dict(CREATED_BY)},
            "spec": {**pod_spec(pool.name, "plain"), "restartPolicy": "Never"},
        }  # fmt: skip
        scenario.cluster.create("", "v1", "pods", plain_pod, scenario.namespace)
        plain_job = {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "plain-job", "labels": dict(CREATED_BY)},
            "spec": {"template": {"spec": {**pod_spec(pool.name, "work"),
                                           "restartPolicy": "Never"}}},
        }  # fmt: skip
        scenario.cluster.create("batch", "v1", "jobs", plain_job, scenario.namespace)
        # A TrainJob created meanwhile: the chart may refuse it (a Fail webhook) or let it in
        # (its runtime is frozen once the service is back); either way none of its pods may be
        # admitted loose, and once the service is back its gang is made and binds.
        try:
            scenario.create_trainjob(trainjob("during", scenario.namespace, stored, num_nodes=3))
            during = True
        except ApiException as err:
            assert re.search(r"trainjobs\.(mutate|validate)\.trainjob-scheduling", str(err.body)), (
                err.body
            )
            during = False

        def plain_ones_bound() -> bool:
            pods = scenario.cluster.list_objects("", "v1", "pods", scenario.namespace)
            plain = [p for p in pods if JOBSET_NAME not in (p["metadata"].get("labels") or {})]
            if len(plain) < 2 or not all(p["spec"].get("nodeName") for p in plain):
                raise NotYet(describe_pods(plain))
            return True

        scenario.wait(plain_ones_bound, "the plain pod and the plain Job's pod bound")

        def held() -> bool:
            jobs = scenario.jobs("outage")
            if not jobs:
                raise NotYet("no Jobs yet")
            denied = [
                e for e in scenario.cluster.list_objects("", "v1", "events", scenario.namespace)
                if e.get("reason") == "FailedCreate"
                and (e.get("involvedObject") or {}).get("kind") == "Job"
            ]  # fmt: skip
            if not denied:
                raise NotYet("no FailedCreate Event on the Jobs yet")
            return True

        scenario.wait(held, "the Job controller's pod creations denied")
        left = OUTAGE - (time.monotonic() - down_at)
        while left > 0:
            admitted = scenario.recorder.of("outage") + scenario.recorder.of("during")
            assert not admitted, f"pods admitted while the service was down: {admitted}"
            time.sleep(min(1.0, left))
            left = OUTAGE - (time.monotonic() - down_at)
        messages = [
            str(e.get("message"))
            for e in scenario.cluster.list_objects("", "v1", "events", scenario.namespace)
            if e.get("reason") == "FailedCreate"
        ]
        assert any("pods.mutate.trainjob-scheduling" in m for m in messages), messages
    finally:
        service.start()
        service.stopped = False
    assert plan.groups
    resumed = scenario.frozen_plan("outage")  # the run the resume started (its own names)
    scenario.gang_objects(resumed)
    scenario.wait_bound("outage", 4, seconds=2 * timeout())
    scenario.wait_condition("outage", "True", "Scheduled")
    scenario.assert_tied("outage")
    if during:
        scenario.frozen_plan("during")
        scenario.wait_bound("during", 4, seconds=2 * timeout())
        scenario.wait_condition("during", "True", "Scheduled")
        scenario.assert_tied("during")

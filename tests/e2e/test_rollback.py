"""End to end: a rollback. A TrainJob whose runtime snapshot a newer release froze (a plan
version this release does not know) is left alone, never planned again by rules that would
guess: its gang objects stay exactly as they are (the same uid and resourceVersion), its pods
are held (`PlanVersionUnknown`: a pod of the gang fails, and its replacement waits), and its
`GangScheduling` condition and a Warning Event say why. Rolled forward (the snapshot this
release knows put back), the held pod is tied to the same gang and binds.

The newer release's snapshot is written by the service's own identity, as that release would
write it: out of the cluster the suite's service is the kubeconfig's user, the suite's own, so
the snapshot guard lets the suite write it (a tenant's write is denied: test_tenancy.py). Against
a deployed service (`make e2e-chart`) the suite impersonates its ServiceAccount
(E2E_SERVICE_USER)."""

from __future__ import annotations

import json
import time

import pytest

from webhook.core.snapshot import PLAN_VERSION, SNAPSHOT_ANNOTATION

from .cluster import (
    MERGE_PATCH,
    TRAINER_GROUP,
    TRAINER_VERSION,
    Json,
    NotYet,
    api_path,
    external_service,
    service_user,
)
from .objects import uid
from .scenario import Pool, Scenario, describe_pods

pytestmark = pytest.mark.e2e

NEWER = 99  # a plan version no release knows yet
OBSERVE = 20.0  # seconds the gang objects are watched while the newer snapshot is there
REASON = "PlanVersionUnknown"


def _write_snapshot(scenario: Scenario, name: str, text: str) -> None:
    """As the service's identity: the suite's own user, or the deployed service's (impersonated,
    E2E_SERVICE_USER)."""
    path = api_path(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", scenario.namespace, name)
    patch = {"metadata": {"annotations": {SNAPSHOT_ANNOTATION: text}}}
    scenario.cluster.request("PATCH", path, patch, content_type=MERGE_PATCH,
                             as_user=service_user())  # fmt: skip


def _versions(objects: list[Json]) -> list[tuple[str, str, str]]:
    return [(o["metadata"]["name"], uid(o), str(o["metadata"]["resourceVersion"])) for o in objects]


def _live(pod: Json) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Failed", "Succeeded")


def test_a_snapshot_of_a_newer_release_is_left_alone_and_its_pods_held(
    scenario: Scenario, pool: Pool
) -> None:
    if external_service() and not service_user():
        pytest.skip("the deployed service's username is not known (set E2E_SERVICE_USER)")
    plan = scenario.start_gang(pool, "rollback")
    stored = scenario.trainjob("rollback")
    assert stored is not None
    known = str(stored["metadata"]["annotations"][SNAPSHOT_ANNOTATION])
    assert json.loads(known)["planVersion"] == PLAN_VERSION
    gang = _versions(scenario.gang_objects(plan))
    held_before = scenario.held_count(REASON)
    _write_snapshot(scenario, "rollback", json.dumps({**json.loads(known), "planVersion": NEWER}))

    condition = scenario.wait_condition("rollback", "False", REASON)
    assert f"plan version {NEWER}" in str(condition.get("message")), condition
    scenario.wait(lambda: scenario.events(uid(stored), REASON) or None, f"a {REASON} Event")
    # A pod of the gang fails: its Job makes another (after its backoff), which is held.
    victim = next(p for p in scenario.pods("rollback") if p["metadata"]["name"].startswith(
        "rollback-node-"))  # fmt: skip
    failed_at = time.monotonic()
    scenario.set_pod_status([victim], "Failed")

    def held() -> list[str]:
        found = [m for m in scenario.failed_creates("rollback") if f"plan version {NEWER}" in m]
        if not found:
            raise NotYet(f"FailedCreate Events: {scenario.failed_creates('rollback')}")
        return found

    said = scenario.wait(held, "the replacement pod held")
    assert all("SchedulingBlocked" in m for m in said), said
    deadline = time.monotonic() + OBSERVE
    while time.monotonic() < deadline:
        assert _versions(scenario.gang_objects(plan)) == gang, "the gang objects were changed"
        admitted = [r.name for r in scenario.recorder.of("rollback") if r.seen_at > failed_at]
        assert not admitted, f"pods admitted while the plan version is unknown: {admitted}"
        time.sleep(1)
    count = scenario.held_count(REASON)
    if count is not None and held_before is not None:
        assert count > held_before, f"held {REASON}: {held_before} -> {count}"

    _write_snapshot(scenario, "rollback", known)  # rolled forward
    pods = scenario.wait_bound("rollback", 4, where=_live)
    assert [uid(o) for o in scenario.gang_objects(plan)] == [u for _, u, _ in gang], (
        "the gang objects were made again"
    )
    assert victim["metadata"]["uid"] not in {uid(p) for p in pods}, describe_pods(pods)
    scenario.wait_condition("rollback", "True", "Scheduled")
    scenario.assert_tied("rollback")

"""The reconciler's pure parts: drift rules (rule 8(f)), the runtime snapshot, the work queue."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import orjson
import pytest

from tests.builders import rj, runtime, torch_node, trainjob
from tests.timing import STALL
from webhook.backends.native import pod_group, pod_group_drift, workload, workload_drift
from webhook.core import naming
from webhook.core.fields import parse
from webhook.core.ownership import controlled_by
from webhook.core.plan import Plan, build_plan
from webhook.core.snapshot import (
    LEGACY_PLAN_VERSION,
    PLAN_VERSION,
    SNAPSHOT_ANNOTATION,
    Frozen,
    from_annotations,
    from_text,
    snapshot,
)
from webhook.core.trainer import Runtime, TrainJob
from webhook.core.validation import check_stored_runtime
from webhook.kube.events import EventRecorder
from webhook.reconcile.queue import ShutDown, WorkQueue

async_test = pytest.mark.asyncio

LEVEL2 = {
    "replicatedJobs": [
        {"targetReplicatedJobs": ["dataset-initializer"], "schedulingPolicy": {"basic": {}}},
        {
            "targetReplicatedJobs": ["node"],
            "schedulingPolicy": {"gang": {}},
            "schedulingConstraints": {"topology": [{"key": "topology.kubernetes.io/zone"}]},
        },
    ]
}


def plan_of(num_nodes: int = 8, scheduling: dict[str, Any] | None = None) -> Plan:
    raw_runtime = runtime(
        rj("dataset-initializer", ancestor="dataset-initializer"),
        torch_node(depends=[("dataset-initializer", "Complete")]),
        scheduling=scheduling or LEVEL2,
    )
    rt, _ = parse(Runtime, raw_runtime)
    tj, _ = parse(TrainJob, trainjob(num_nodes=num_nodes))
    assert rt is not None and tj is not None
    plan = build_plan(tj, rt)
    assert plan is not None
    return plan


def stored(obj: dict[str, Any], **server_filled: Any) -> dict[str, Any]:
    """`obj` as the API server returns it: a uid, and defaults where it fills them in."""
    out = copy.deepcopy(obj)
    out["metadata"]["uid"] = "stored-uid"
    out["metadata"]["resourceVersion"] = "7"
    return out


# --- drift ---------------------------------------------------------------------------------------


def test_a_stored_copy_with_server_defaults_is_not_drift() -> None:
    plan = plan_of()
    want = workload(plan)
    have = stored(want)
    for template in have["spec"]["podGroupTemplates"]:
        template["disruptionMode"] = {"single": {}}
        template["priority"] = 0
        template["priorityClassName"] = "default-priority"
        template["preemptionPolicy"] = "PreemptLowerPriority"
    assert workload_drift(want, have).kind == "none"
    group = pod_group(plan, plan.groups[1], "stored-uid")
    have_group = stored(group)
    have_group["spec"].update(disruptionMode={"single": {}}, priority=0)
    have_group["status"] = {"conditions": []}
    assert pod_group_drift(group, have_group).kind == "none"


def test_a_different_min_count_is_patched_in_place_with_uid_and_name_tests() -> None:
    want = workload(plan_of(num_nodes=8))
    have = stored(workload(plan_of(num_nodes=5)))
    drift = workload_drift(want, have)
    assert drift.kind == "patch"
    assert drift.patch[0] == {"op": "test", "path": "/metadata/uid", "value": "stored-uid"}
    name = want["spec"]["podGroupTemplates"][1]["name"]
    assert list(drift.patch[1:]) == [
        {"op": "test", "path": "/spec/podGroupTemplates/1/name", "value": name},
        {"op": "replace", "path": "/spec/podGroupTemplates/1/schedulingPolicy/gang/minCount",
         "value": 8},
    ]  # fmt: skip
    plan8, plan5 = plan_of(num_nodes=8), plan_of(num_nodes=5)
    pg_drift = pod_group_drift(
        pod_group(plan8, plan8.groups[1]), stored(pod_group(plan5, plan5.groups[1]))
    )
    assert pg_drift.kind == "patch"
    assert pg_drift.patch[-1]["value"] == 8


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.update(schedulingPolicy={"basic": {}}),
        lambda t: t.update(disruptionMode={"all": {}}),
        lambda t: t.update(schedulingConstraints={"topology": [{"key": "example.com/rack"}]}),
        lambda t: (
            t.update(priorityClassName="other")
            if "priorityClassName" in t
            else t.update(resourceClaims=[{"name": "c", "resourceClaimName": "x"}])
        ),
        lambda t: t.update(name="renamed"),
    ],
)
def test_any_other_difference_means_recreate(change: Any) -> None:
    want = workload(plan_of())
    have = stored(want)
    change(have["spec"]["podGroupTemplates"][1])
    drift = workload_drift(want, have)
    assert drift.kind == "recreate", drift
    assert drift.reason


def test_a_gated_field_the_server_dropped_is_reported_not_recreated() -> None:
    plan = plan_of()
    want = pod_group(plan, plan.groups[1])
    have = stored(want)
    del have["spec"]["schedulingConstraints"]
    drift = pod_group_drift(want, have)
    assert drift.kind == "none"
    assert drift.dropped == (("schedulingConstraints", "TopologyAwareWorkloadScheduling"),)


def test_controlled_by_needs_the_trainjob_controller_with_that_uid() -> None:
    plan = plan_of()
    obj = workload(plan)
    assert controlled_by(obj, plan.trainjob_uid)
    assert not controlled_by(obj, "another-uid")
    obj["metadata"]["ownerReferences"][0]["controller"] = False
    assert not controlled_by(obj, plan.trainjob_uid)


# --- snapshot ------------------------------------------------------------------------------------


def test_the_snapshot_plans_exactly_as_the_runtime_and_drops_what_planning_ignores() -> None:
    raw = runtime(
        rj("dataset-initializer", ancestor="dataset-initializer", parallelism=2),
        torch_node(depends=[("dataset-initializer", "Complete")], priority_class="high"),
        scheduling=LEVEL2,
    )
    last_applied = {"kubectl.kubernetes.io/last-applied-configuration": "x" * 5000}
    raw["metadata"]["annotations"] = last_applied
    rt, _ = parse(Runtime, raw)
    assert rt is not None
    text = snapshot(rt)
    # Of a container only what a gang's resources need: no image, command or environment.
    assert "last-applied" not in text and "image" not in text and len(text) < 1500
    assert '"containers":[{"name":"node"}]' in text
    frozen = from_annotations({SNAPSHOT_ANNOTATION: text})
    assert frozen is not None and frozen.runtime is not None
    assert frozen.version == PLAN_VERSION == 3  # what this release writes
    before, after = check_stored_runtime(rt), check_stored_runtime(frozen.runtime)
    assert (before.layout, before.verdict) == (after.layout, after.verdict)
    tj, _ = parse(TrainJob, trainjob(num_nodes=4))
    assert tj is not None
    assert build_plan(tj, rt) == build_plan(tj, frozen.runtime, frozen.version)


def level2_runtime() -> Runtime:
    raw = runtime(
        rj("dataset-initializer", ancestor="dataset-initializer"),
        torch_node(depends=[("dataset-initializer", "Complete")]),
        scheduling=LEVEL2,
    )
    rt, _ = parse(Runtime, raw)
    assert rt is not None
    return rt


def test_a_version_3_snapshot_round_trips() -> None:
    text = snapshot(level2_runtime())
    assert orjson.loads(text).keys() == {"planVersion", "runtime"}
    frozen = from_text(text)
    assert frozen is not None and frozen.version == 3 and frozen.runtime is not None
    assert snapshot(frozen.runtime) == text  # read back and written again: the same text
    assert from_annotations({SNAPSHOT_ANNOTATION: text}) == frozen


def test_a_version_1_snapshot_is_the_bare_runtime_and_plans_the_legacy_names() -> None:
    # What releases before plan versions wrote: the runtime's JSON alone.
    rt = level2_runtime()
    legacy_text = orjson.dumps(orjson.loads(snapshot(rt))["runtime"]).decode()
    frozen = from_annotations({SNAPSHOT_ANNOTATION: legacy_text})
    assert frozen is not None and frozen.runtime is not None
    assert frozen.version == LEGACY_PLAN_VERSION == 1
    assert snapshot(frozen.runtime) == snapshot(rt)  # the same runtime as version 2 holds
    tj, _ = parse(TrainJob, trainjob(num_nodes=4))
    assert tj is not None and tj.metadata.uid
    plan = build_plan(tj, frozen.runtime, frozen.version)
    assert plan is not None and plan.plan_version == 1
    # Its gang keeps the names it was made with (no uid in them): an upgrade renames nothing.
    assert plan.workload_name == naming.workload_name("team-a", "my-job") == "my-job-f438be8c51"
    current = build_plan(tj, frozen.runtime)
    assert current is not None
    assert current.workload_name == naming.workload_name("team-a", "my-job", tj.metadata.uid)
    assert current.workload_name != plan.workload_name


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ('{"planVersion":3,"runtime":null}', 3),
        ('{"runtime": null, "planVersion": 3}', 3),
        ('{"planVersion":2,"runtime":null}', 2),  # an earlier release's: read as it wrote it
    ],
)
def test_runtime_null_is_a_frozen_no_gang(text: str, version: int) -> None:
    assert snapshot(None) == '{"planVersion":3,"runtime":null}'
    assert from_annotations({SNAPSHOT_ANNOTATION: text}) == Frozen(version, None)
    assert from_text(snapshot(None)) == Frozen(3, None)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "{not json",
        "[1, 2]",
        "null",
        # A plan version newer than this release knows: planning it by older rules would guess.
        '{"planVersion": 4, "runtime": null}',
        '{"planVersion": 4, "runtime": {"metadata": {"name": "rt"}}}',
        # Versions no release writes, or not an integer.
        '{"planVersion": 1, "runtime": {"metadata": {"name": "rt"}}}',
        '{"planVersion": 0, "runtime": null}',
        '{"planVersion": "2", "runtime": null}',
        '{"planVersion": 2.0, "runtime": null}',
        '{"planVersion": true, "runtime": null}',
        '{"planVersion": null, "runtime": null}',
        # A version 2 whose runtime is neither an object nor null.
        '{"planVersion": 2, "runtime": [1]}',
        '{"planVersion": 2, "runtime": "rt"}',
    ],
)
def test_an_unreadable_snapshot_is_no_snapshot(value: str | None) -> None:
    annotations = {} if value is None else {SNAPSHOT_ANNOTATION: value}
    assert from_annotations(annotations) is None


# --- the work queue ------------------------------------------------------------------------------


@async_test
async def test_a_key_added_many_times_is_queued_once() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for _ in range(5):
        queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    assert await queue.get() == "a"
    assert await queue.get() == "b"


@async_test
async def test_a_key_added_while_processed_comes_back_after_done_not_before() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    key = await queue.get()
    queue.add("a")  # changed while a worker has it
    assert len(queue) == 0  # not handed to a second worker
    queue.done(key)
    assert len(queue) == 1
    assert await queue.get() == "a"


@async_test
async def test_rate_limited_keys_back_off_exponentially_per_key_and_forget_resets() -> None:
    queue: WorkQueue[str] = WorkQueue(base_delay=0.01, max_delay=0.05)
    delays = [queue.add_rate_limited("a") for _ in range(5)]
    assert delays == [0.01, 0.02, 0.04, 0.05, 0.05]
    assert queue.add_rate_limited("b") == 0.01  # keys back off alone
    queue.forget("a")
    assert queue.failures("a") == 0
    got = await asyncio.wait_for(queue.get(), STALL)
    assert got in ("a", "b")


@async_test
async def test_add_after_fires_once_with_the_earliest_delay() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add_after("a", 0.05)
    queue.add_after("a", 10)  # a later add does not postpone the earlier one
    assert await asyncio.wait_for(queue.get(), STALL) == "a"


@async_test
async def test_shut_down_wakes_waiting_workers() -> None:
    queue: WorkQueue[str] = WorkQueue()
    waiter = asyncio.create_task(queue.get())
    await asyncio.sleep(0.01)
    queue.shut_down()
    with pytest.raises(ShutDown):
        await asyncio.wait_for(waiter, STALL)


# --- events --------------------------------------------------------------------------------------


@async_test
async def test_events_beyond_the_queue_are_dropped_and_counted_not_reported_as_posted() -> None:
    posted: list[str] = []
    drops: list[None] = []
    recorder = EventRecorder(
        None,
        "trainjob-scheduling",
        "replica",
        queue_size=1,
        on_event=posted.append,
        on_drop=lambda: drops.append(None),
    )
    trainjob_raw = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                    "metadata": {"name": "j", "namespace": "ns", "uid": "u"}}  # fmt: skip
    for note in ("one", "two", "three"):
        recorder.record(trainjob_raw, "Normal", "Created", "Create", note)
    recorder.record(trainjob_raw, "Normal", "Created", "Create", "one")  # a repeat: de-duplicated
    assert posted == ["Created"] and len(drops) == 2 and recorder.dropped == 2


def test_a_pass_tells_its_changes_in_one_note_that_fits_an_event() -> None:
    from webhook.kube.events import MAX_NOTE
    from webhook.reconcile.changes import summary

    assert summary(["created Workload 'a'", "created PodGroup 'b'"]) == (
        "created Workload 'a'; created PodGroup 'b'"
    )
    many = [f"created PodGroup 'my-job-rack-{i:03d}'" for i in range(100)]
    note = summary(many)
    assert len(note.encode()) <= MAX_NOTE and note.startswith(many[0])
    shown = note.count("created PodGroup")
    assert note.endswith(f"; and {100 - shown} more") and 0 < shown < 100
    assert summary(["x" * 2000, "y"]) == "x" * 2000  # nothing fits: the first (cut when posted)

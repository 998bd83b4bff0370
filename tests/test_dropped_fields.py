"""Fields the API server drops while their feature gate is off are what the cluster can express,
not drift: never a delete and create again (which would drop them again, about 30 times a
second), always named with their gate.

The captures in tests/fixtures/gang-objects/ are what a real kube-apiserver (1.36.2 with the
1.37 v1beta1 backport, `../shared/harness`) stored for the Workload and PodGroups this service
sent, with only the required gates on (GenericWorkload, GangScheduling) and with every alpha
gate on; tests/fixtures/gang-objects/README.md says how they were taken. That the reconciler
never recreates them on a real server is `make e2e`'s (tests/e2e).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.builders import rj, runtime, torch_node, trainjob
from webhook.backends.native import (
    GATES,
    UNKNOWN_GATE,
    NativeBackend,
    composite_drift,
    pod_group,
    pod_group_drift,
    workload,
    workload_drift,
)
from webhook.backends.native_versions import SHAPES, V1ALPHA2, V1BETA1
from webhook.core.fields import parse
from webhook.core.plan import Plan, build_plan
from webhook.core.trainer import Runtime, TrainJob
from webhook.reconcile.reconciler import dropped_note

Json = dict[str, Any]
CAPTURES = Path(__file__).parent / "fixtures" / "gang-objects"
EVERY_GATED = {
    ("disruptionMode", "WorkloadAwarePreemption"),
    ("priorityClassName", "WorkloadAwarePreemption"),
    ("resourceClaims", "DRAWorkloadResourceClaims"),
    ("schedulingConstraints", "TopologyAwareWorkloadScheduling"),
}
# What each capture's server dropped of what was sent (DRAWorkloadResourceClaims is off even
# with "every alpha gate": the harness's default list leaves it out).
EXPECTED = {
    "gates-off-v1beta1-workload-workload.json": EVERY_GATED,
    "gates-off-v1beta1-podgroup-node.json": EVERY_GATED,
    "gates-off-v1beta1-podgroup-initializer.json": set(),
    "gates-off-v1alpha2-workload-workload.json": EVERY_GATED,
    "gates-off-v1alpha2-podgroup-node.json": EVERY_GATED,
    "gates-off-v1alpha2-podgroup-initializer.json": set(),
    "gates-on-v1beta1-workload-workload.json": {("resourceClaims", "DRAWorkloadResourceClaims")},
    "gates-on-v1beta1-podgroup-node.json": {("resourceClaims", "DRAWorkloadResourceClaims")},
    "gates-on-v1beta1-podgroup-initializer.json": set(),
}


def capture(name: str) -> Json:
    loaded: Json = json.loads((CAPTURES / name).read_text())
    return loaded


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_what_a_real_server_stored_is_never_drift(name: str) -> None:
    found = capture(name)
    version = found["stored"]["apiVersion"].rpartition("/")[2]
    drift = NativeBackend(version).drift(found["sent"], found["stored"])
    assert drift.kind == "none", drift
    assert set(drift.dropped) == EXPECTED[name]


def test_every_capture_is_checked() -> None:
    assert sorted(p.name for p in CAPTURES.glob("*.json")) == sorted(EXPECTED)


# --- each gated field, on each object, in each version ------------------------------------------

LEVEL2 = {
    "replicatedJobs": [
        {"targetReplicatedJobs": ["dataset-initializer"], "schedulingPolicy": {"basic": {}}},
        {
            "targetReplicatedJobs": ["node"],
            "schedulingPolicy": {"gang": {}},
            "schedulingConstraints": {"topology": [{"key": "topology.kubernetes.io/zone"}]},
            "disruptionMode": {"all": {}},
            "resourceClaims": [{"name": "c", "resourceClaimTemplateName": "t"}],
        },
    ]
}


def plan_of(num_nodes: int = 8) -> Plan:
    raw = runtime(
        rj("dataset-initializer", ancestor="dataset-initializer"),
        torch_node(depends=[("dataset-initializer", "Complete")], priority_class="high"),
        scheduling=LEVEL2,
    )
    rt, _ = parse(Runtime, raw)
    tj, _ = parse(TrainJob, trainjob(num_nodes=num_nodes))
    assert rt is not None and tj is not None
    plan = build_plan(tj, rt)
    assert plan is not None
    return plan


def rendered(version: str) -> tuple[Json, Json]:
    """The Workload and the node gang's PodGroup, in `version`'s shape."""
    plan = plan_of()
    outgoing = SHAPES[version].outgoing
    return outgoing(workload(plan)), outgoing(pod_group(plan, plan.groups[1]))


SET_BY_THE_PLAN = ("schedulingConstraints", "disruptionMode", "resourceClaims", "priorityClassName")


@pytest.mark.parametrize("version", [V1BETA1, V1ALPHA2])
@pytest.mark.parametrize("field", SET_BY_THE_PLAN)
@pytest.mark.parametrize("how", ["absent", "null"])
def test_a_field_the_server_dropped_is_reported_with_its_gate(
    version: str, field: str, how: str
) -> None:
    want_wl, want_pg = rendered(version)
    shapes = SHAPES[version]
    for want, path in ((want_wl, ("podGroupTemplates", 1)), (want_pg, ())):
        have = copy.deepcopy(want)
        have["metadata"]["uid"] = "u"
        spec: Any = have["spec"]
        for part in path:
            spec = spec[part]
        assert field in spec, (field, spec)
        if how == "absent":
            del spec[field]
        else:
            spec[field] = None
        drift = (workload_drift if path else pod_group_drift)(want, have, shapes)
        assert drift.kind == "none", drift
        assert drift.dropped == ((field, GATES[field]),)


@pytest.mark.parametrize("version", [V1BETA1, V1ALPHA2])
def test_a_dropped_disruption_mode_reads_back_as_the_default(version: str) -> None:
    """The API server drops a PodGroup's mode and defaults it again when it reads it back."""
    _, want = rendered(version)
    have = copy.deepcopy(want)
    have["spec"]["disruptionMode"] = SHAPES[version].default_disruption_mode
    drift = pod_group_drift(want, have, SHAPES[version])
    assert drift.kind == "none"
    assert drift.dropped == (("disruptionMode", "WorkloadAwarePreemption"),)
    # The default asked for and not stored is the same thing: nothing to say.
    want["spec"]["disruptionMode"] = SHAPES[version].default_disruption_mode
    del have["spec"]["disruptionMode"]
    assert pod_group_drift(want, have, SHAPES[version]).dropped == ()


def test_a_field_gated_in_a_later_release_is_learnt_from_what_was_stored() -> None:
    _, want = rendered(V1BETA1)
    want["spec"]["futureField"] = {"x": 1}
    have = copy.deepcopy(want)
    del have["spec"]["futureField"]
    drift = pod_group_drift(want, have)
    assert drift.kind == "none"
    assert drift.dropped == (("futureField", UNKNOWN_GATE),)
    assert "futureField from its PodGroup (feature gate unknown)" in dropped_note(
        frozenset({("PodGroup", "futureField", UNKNOWN_GATE)})
    )


def test_a_dropped_field_in_a_tree_is_reported_not_recreated() -> None:
    want = {
        "spec": {
            "schedulingPolicy": {"gang": {"minGroupCount": 2}},
            "schedulingConstraints": {"topology": [{"key": "topology.kubernetes.io/zone"}]},
            "disruptionMode": {"all": {}},
        }
    }
    have = {"spec": {"schedulingPolicy": {"gang": {"minGroupCount": 2}},
                     "disruptionMode": {"single": {}}}}  # fmt: skip
    drift = composite_drift(want, have)
    assert drift.kind == "none"
    assert set(drift.dropped) == {
        ("schedulingConstraints", "TopologyAwareWorkloadScheduling"),
        ("disruptionMode", "WorkloadAwarePreemption"),
    }


@pytest.mark.parametrize(
    "change",
    [
        {"disruptionMode": {"single": {}}, "schedulingConstraints": {"topology": [{"key": "r"}]}},
        {"priorityClassName": "low"},
        {"resourceClaims": [{"name": "c", "resourceClaimName": "other"}]},
    ],
)
def test_a_stored_value_other_than_the_plans_is_still_drift(change: Json) -> None:
    """What the server keeps but differs (not dropped, not its default) is drift: recreated
    (the reconciler holds that while pods use the gang)."""
    _, want = rendered(V1BETA1)
    have = copy.deepcopy(want)
    have["spec"].update(change)
    key = next(iter(change))
    if key == "disruptionMode":  # the default read back is taken as dropped: change another
        key = "schedulingConstraints"
    drift = pod_group_drift(want, have)
    assert drift.kind == "recreate", drift
    assert key in drift.reason


def test_the_note_names_each_field_its_gate_and_kinds() -> None:
    note = dropped_note(
        frozenset(
            {
                ("PodGroup", "schedulingConstraints", "TopologyAwareWorkloadScheduling"),
                ("Workload", "schedulingConstraints", "TopologyAwareWorkloadScheduling"),
                ("PodGroup", "priorityClassName", "WorkloadAwarePreemption"),
            }
        )
    )
    assert note.startswith("the API server dropped priorityClassName from its PodGroup ")
    assert "(feature gate WorkloadAwarePreemption is off)" in note
    assert "schedulingConstraints from its PodGroup and Workload (feature gate " in note
    assert "its gang is made without them" in note


def test_a_field_a_later_server_fills_in_is_not_drift() -> None:
    """A Kubernetes release that defaults a new PodGroup field must not start a delete/re-create
    loop: what the service leaves unset is the server's to fill in."""
    _, want = rendered(V1BETA1)
    have = copy.deepcopy(want)
    have["spec"]["aDefaultOfLater"] = {"mode": "x"}
    drift = pod_group_drift(want, have)
    assert drift.kind == "none" and drift.dropped == ()

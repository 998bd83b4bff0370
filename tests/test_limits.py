"""The core's bounds (`webhook.core.limits` and the rules that count before they build), and the
graph algorithms that keep long dependsOn chains cheap: pure, no I/O. The served process gets
the same inputs over HTTPS in test_hostile.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import Json, rj, runtime, torch_node, trainjob
from tests.timing import growth
from webhook.core import errors as fe
from webhook.core.graph import COMPLETE, READY, Edge, never_started, ordering
from webhook.core.limits import MAX_DEPTH, shape_errors
from webhook.core.plan import (
    JOB_INDEX,
    JOBSET_NAME,
    REPLICATED_JOB_NAME,
    build_plan,
    pod_group_for_labels,
)
from webhook.core.trainer import Runtime, TrainJob
from webhook.core.validation import validate_runtime, validate_trainjob

INT32 = 2**31 - 1


def nested(depth: int, leaf: Any = 1) -> Any:
    for i in range(depth):
        leaf = [leaf] if i % 2 else {"a": leaf}
    return leaf


def messages(raw: Json) -> list[str]:
    return [str(e) for e in validate_runtime(raw).errors]


# --- depth and list bounds, on the raw object ----------------------------------------------------


def test_nesting_is_allowed_to_64_levels_and_denied_past_them() -> None:
    assert shape_errors({"x": nested(MAX_DEPTH - 1)}) == []  # the root is one level
    (err,) = shape_errors({"spec": {"x": nested(MAX_DEPTH)}})
    assert err.path == "spec.x[0].a[0].a[0].a...."  # the first 8 steps name the field
    assert "nested more than 64 levels deep" in str(err)


def test_the_depth_check_also_works_where_orjson_cannot_write_the_value() -> None:
    # YAML (the plan command) can give integers past 64 bits and non-string keys.
    assert shape_errors({"big": 2**70, "keys": {1: 2}}) == []
    (err,) = shape_errors({"big": 2**70, "deep": nested(100)})
    assert err.path.startswith("deep[0].a[0]")


def test_typed_lists_are_bounded_before_the_model_is_built() -> None:
    jobs = [rj(f"r{i}") for i in range(1001)]
    (err,) = validate_runtime(runtime(*jobs, scheduling={})).errors
    assert str(err) == (
        "spec.template.spec.replicatedJobs: Too many: 1001: must have at most 1000 items; the "
        "service reads no more than this; real objects never need that many"
    )
    deps = runtime(rj("a"), rj("b", depends=[("a", READY)] * 6), scheduling={})
    assert messages(deps)[0].startswith(
        "spec.template.spec.replicatedJobs[1].dependsOn: Too many: 6: must have at most 5 items"
    )
    many = {
        "replicatedJobs": [
            {"targetReplicatedJobs": ["a"] * 65, "job": {"resourceClaims": [{}] * 70}}
        ]
    }
    assert [e.path for e in shape_errors(runtime(rj("a"), scheduling=many), _runtime_lists())] == [
        "spec.scheduling.replicatedJobs[0].targetReplicatedJobs",
        "spec.scheduling.replicatedJobs[0].job.resourceClaims",
    ]
    conditions = trainjob()
    conditions["status"] = {"conditions": [{"type": "x", "status": "True"}] * 9}
    (err,) = validate_trainjob(conditions, None).errors
    assert err.path == "status.conditions" and err.type is fe.ErrorType.TOO_MANY


def _runtime_lists() -> Any:
    from webhook.core.limits import runtime_list_errors

    return runtime_list_errors


def test_lists_under_the_bound_keep_the_rules_own_messages() -> None:
    nine = {"replicatedJobs": [{"targetReplicatedJobs": [f"r{i}"]} for i in range(9)]}
    found = messages(runtime(*(rj(f"r{i}") for i in range(9)), scheduling=nine))
    assert "spec.scheduling.replicatedJobs: Too many: 9: must have at most 8 items" in found


# --- counts: int32, and never a loop over one -----------------------------------------------------


@pytest.mark.parametrize(
    ("field", "path"),
    [
        ("replicas", "spec.template.spec.replicatedJobs[0].replicas"),
        ("parallelism", "spec.template.spec.replicatedJobs[0].template.spec.parallelism"),
    ],
)
@pytest.mark.parametrize("value", [INT32 + 1, 2**63 - 1, 2**64 - 1, -1, -(2**63)])
def test_counts_outside_int32_name_field_value_and_limit(field: str, path: str, value: int) -> None:
    init = rj("init", replicas=value) if field == "replicas" else rj("init", parallelism=value)
    raw = runtime(init, torch_node(), scheduling={})
    want = "must be >= 0" if value < 0 else f"must be at most {INT32} (an int32)"
    assert f"{path}: Invalid value: {value}: {want}" in messages(raw)


def test_runtime_num_nodes_outside_int32() -> None:
    raw = runtime(torch_node(), scheduling={}, ml={"numNodes": 2**63 - 1, "torch": {}})
    assert messages(raw) == [
        f"spec.mlPolicy.numNodes: Invalid value: {2**63 - 1}: must be at most {INT32} (an int32)"
    ]


@pytest.mark.parametrize("value", [INT32 + 1, 2**64 - 1, -5])
def test_trainjob_num_nodes_outside_int32(value: int) -> None:
    rt = Runtime.model_validate(runtime(rj("init"), torch_node(), scheduling={}))
    (err,) = validate_trainjob(trainjob(num_nodes=value), rt).errors
    assert err.path == "spec.trainer.numNodes" and str(value) in str(err)


def test_numbers_past_64_bits_are_worded_for_people() -> None:
    raw = runtime(rj("init"), torch_node(), scheduling={})
    raw["spec"]["template"]["spec"]["replicatedJobs"][0]["replicas"] = 1e23
    (err,) = validate_runtime(raw).errors
    assert str(err).endswith("must be an integer of at most 2147483647 (an int32)"), str(err)


@pytest.mark.parametrize("replicas", [INT32, 2**63 - 1])
def test_a_level_3_entry_counts_its_templates_before_building_them(replicas: int) -> None:
    def entry_of(count: int) -> Json:
        return runtime(
            torch_node(replicas=count),
            scheduling={"replicatedJobs": [{"targetReplicatedJobs": ["node"], "job": {}}]},
        )

    found = messages(entry_of(replicas))
    # No longer than for 9 replicas, one over the cap: the count is compared, nothing built.
    assert growth(lambda n: messages(entry_of(n)), 9, replicas) < 10
    if replicas > INT32:  # one mistake, one cause: not also a count of its templates
        assert found == [
            f"spec.template.spec.replicatedJobs[0].replicas: Invalid value: {replicas}: must be "
            f"at most {INT32} (an int32)"
        ]
        return
    assert found == [
        f"spec.scheduling.replicatedJobs[0].job: Too many: {replicas} PodGroup templates, and a "
        f'Workload holds at most 8; a job entry makes one per Job, and "node" has replicas '
        f"{replicas}: lower its replicas, or remove job to make one group of its Jobs"
    ]


@pytest.mark.parametrize("replicas", [64, 100, INT32])
def test_a_tree_counts_the_groups_it_does_not_build(replicas: int) -> None:
    # A job entry without fields of its own puts one group per Job at the tree's root. Past
    # the 64 leaves a tree holds they are not built; they used not to be counted either, and
    # such a runtime was accepted.
    def tree_of(count: int) -> Json:
        return runtime(
            rj("init"),
            torch_node(replicas=count),
            scheduling={
                "schedulingConstraints": {"topology": [{"key": "topology.kubernetes.io/zone"}]},
                "replicatedJobs": [
                    {"targetReplicatedJobs": ["init"]},
                    {"targetReplicatedJobs": ["node"], "job": {}},
                ],
            },
        )

    found = messages(tree_of(replicas))
    # No longer than for 64 replicas: past the 64 leaves a tree holds, nothing more is built.
    assert growth(lambda n: messages(tree_of(n)), 64, replicas) < 10
    assert len(found) == 1 and found[0].startswith(
        f"spec.scheduling.replicatedJobs: Too many: {replicas + 1} groups at the TrainJob level "
        "of this tree, and a composite holds at most 8; it holds one per entry, and one per Job "
        "of a job entry without fields of its own"
    ), found


def test_a_gang_per_job_of_a_replicated_job_without_jobs_is_rejected() -> None:
    # Found by the property tests: it rendered a Workload without templates.
    zero = runtime(
        rj("init", replicas=0),
        torch_node(),
        scheduling={"replicatedJobs": [{"targetReplicatedJobs": ["init"], "job": {}}]},
    )
    assert messages(zero) == [
        "spec.template.spec.replicatedJobs[0].replicas: Invalid value: 0: must be at least 1: the "
        "job entry spec.scheduling.replicatedJobs[0] makes a gang of each Job, and a gang needs a "
        "pod to wait for; raise replicas or make that entry's job schedulingPolicy basic"
    ]
    basic = runtime(
        rj("init", replicas=0),
        torch_node(),
        scheduling={
            "replicatedJobs": [
                {"targetReplicatedJobs": ["init"], "job": {"schedulingPolicy": {"basic": {}}}}
            ]
        },
    )
    (only,) = messages(basic)
    assert "spec.scheduling yields no PodGroup" in only


def test_a_pod_index_label_that_is_not_an_int32_in_ascii_maps_to_no_group() -> None:
    raw = runtime(torch_node(replicas=2), scheduling={})
    plan = build_plan(TrainJob.model_validate(trainjob(num_nodes=1)), Runtime.model_validate(raw))
    assert plan is not None
    labels = {JOBSET_NAME: "my-job", REPLICATED_JOB_NAME: "node"}
    assert pod_group_for_labels(plan, {**labels, JOB_INDEX: "1"}) == plan.groups[0].pod_group_name
    for index in ("\u00b2", "\u0661", "9" * 5000, "-1", ""):  # superscript 2, Arabic-Indic 1
        assert pod_group_for_labels(plan, {**labels, JOB_INDEX: index}) is None
    # Before the API server validates a pod, a label's value may be any JSON value.
    odd: list[Any] = [None, 1, [], {}]
    for value in odd:
        assert pod_group_for_labels(plan, {**labels, JOB_INDEX: value}) is None
        assert (
            pod_group_for_labels(plan, {**labels, REPLICATED_JOB_NAME: value, JOB_INDEX: "1"})
            is None
        )


# --- errors and values in messages are bounded ------------------------------------------------


def test_a_denial_shows_20_errors_and_says_how_many_more() -> None:
    errors = [fe.required(fe.Path("spec", f"f{i}"), "set it") for i in range(25)]
    message = fe.render("Kind", "x", errors)
    assert message.count("Required value") == 20 and message.endswith(", and 5 more errors]")
    value = fe.invalid(fe.Path("spec"), [f"name-{i}" for i in range(1000)], "why")
    assert len(str(value)) < 260 and '"name-0"' in str(value) and "...: why" in str(value)


# --- the start-up graph at scale --------------------------------------------------------------


def chain(n: int, status: str = READY) -> dict[str, list[Edge]]:
    return {f"r{i}": [Edge(f"r{i - 1}", status)] if i else [] for i in range(n)}


def test_ordering_closes_a_5000_step_chain_quickly_and_right() -> None:
    edges = chain(5000)
    edges["r2500"].append(Edge("r0", COMPLETE))
    order = ordering(edges)
    # Ten times the steps: about 30 times as long (the ancestor bit sets grow with the square,
    # in C); a quadratic walk in Python would take a hundred times as long.
    assert growth(lambda n: ordering(chain(n)), 500, 5000) < 60
    assert len(order.ancestors("r4999")) == 4999
    assert order.ancestors("r0").sorted() == []
    assert order.ancestors("r3").sorted() == ["r0", "r1", "r2"]
    assert order.complete_before("r4999").sorted() == ["r0"]  # through r2500's Complete edge
    assert order.complete_before("r2499").sorted() == []
    assert (order.ancestors("r10") & order.of(["r5", "r50"])).sorted() == ["r5"]
    assert order.ancestors("r4999").first() == "r0"


def test_ordering_of_a_cycle_makes_its_members_each_others_ancestors() -> None:
    edges = {
        "a": [Edge("b", READY)],
        "b": [Edge("c", COMPLETE)],
        "c": [Edge("a", READY)],
        "d": [Edge("a", READY)],
    }
    order = ordering(edges)
    assert order.ancestors("a").sorted() == ["b", "c"]
    assert order.ancestors("d").sorted() == ["a", "b", "c"]
    assert order.complete_before("a").sorted() == ["c"]
    assert order.complete_before("c").sorted() == []  # only "c" itself is after the Complete edge
    assert order.complete_before("d").sorted() == ["c"]


def test_playing_a_5000_step_chain_forward_is_linear() -> None:
    edges = chain(5000)
    assert never_started(edges, []) == frozenset()
    # A gang of the last and the first: the last waits for the whole chain, the chain's start
    # for the gang (the first is in it): nothing after r0 can ever start.
    gang = (frozenset({"r0", "r4999"}), frozenset({"r0", "r4999"}))
    stuck = never_started(edges, [gang])
    assert stuck == frozenset(edges)

    def play(n: int) -> None:
        ends = frozenset({"r0", f"r{n - 1}"})
        never_started(chain(n), [(ends, ends)])

    # Linear: ten times the steps take about ten times as long (quadratic: a hundred).
    assert growth(play, 500, 5000) < 35


def test_quantities_are_bounded_before_any_arithmetic() -> None:
    from webhook.core import resources

    assert resources.parse("9223372036854775807") == resources.MAX_QUANTITY
    assert resources.parse("1Ei") == 2**60
    for beyond in ("9223372036854775808", "8Ei", "1e19", "1e1000000", "1" * 65, True, "-1e30"):
        assert resources.parse(beyond) is None, beyond
    # Whatever a gang adds up stays quick to print (int32 pods of the largest quantity).
    assert resources.text(resources.MAX_QUANTITY * (2**31 - 1)).isdigit()

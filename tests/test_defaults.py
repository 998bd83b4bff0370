"""The mutating webhooks' defaults: where they apply, that they are idempotent, and that the pod
path's hand-built patch is exactly what jsonpatch computes."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.harness import served
from webhook.admission.handlers import mutate_pod_review
from webhook.admission.review import Decision, Review
from webhook.backends.native import POD_GROUP, WORKLOAD, match_group, with_min_counts
from webhook.backends.native import scheduling_group_op as pod_group_op
from webhook.core.defaults import with_default_policies, with_gang_labels
from webhook.core.ownership import controlling_trainjob
from webhook.core.plan import Plan, build_plan
from webhook.kube.cache import Cache

from .builders import parsed, rj, runtime, torch_node, trainjob
from .harness import answering_lookup, decided, fixture, fixture_cache, frozen

GANG: dict[str, Any] = {"gang": {}}
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


def raw_runtime(scheduling: Any) -> dict[str, Any]:
    spec = {"scheduling": scheduling, "x-unknown": [1]}
    return {"kind": "ClusterTrainingRuntime", "metadata": {"name": "r"}, "spec": spec}


@pytest.mark.parametrize(
    ("scheduling", "expected"),
    [
        ({}, {"schedulingPolicy": GANG}),
        ({"schedulingPolicy": {"basic": {}}}, {"schedulingPolicy": {"basic": {}}}),
        ({"schedulingPolicy": None}, {"schedulingPolicy": GANG}),
        (
            {"replicatedJobs": [{"targetReplicatedJobs": ["a"]},
                                {"schedulingPolicy": {"basic": {}}}]},
            {"replicatedJobs": [{"targetReplicatedJobs": ["a"], "schedulingPolicy": GANG},
                                {"schedulingPolicy": {"basic": {}}}]},
        ),
        (  # level 3: the policy goes on the Job, not on the entry
            {"replicatedJobs": [{"targetReplicatedJobs": ["node"], "job": {}}]},
            {"replicatedJobs": [{"targetReplicatedJobs": ["node"],
                                 "job": {"schedulingPolicy": GANG}}]},
        ),
        # Shapes validation rejects are not touched.
        ({"replicatedJobs": "nope"}, {"replicatedJobs": "nope"}),
        ({"replicatedJobs": [1, {"job": 3}]}, {"replicatedJobs": [1, {"job": 3}]}),
        ([], []),
    ],
)  # fmt: skip
def test_default_policy_at_the_configured_level(scheduling: Any, expected: Any) -> None:
    original = raw_runtime(scheduling)
    frozen = copy.deepcopy(original)
    out = with_default_policies(original)
    assert original == frozen, "the input must not be mutated"
    assert out["spec"]["scheduling"] == expected
    assert out["spec"]["x-unknown"] == [1]


def test_runtime_without_scheduling_gets_nothing() -> None:
    raw = {"kind": "ClusterTrainingRuntime", "spec": {"mlPolicy": {"numNodes": 2}}}
    assert with_default_policies(raw) == raw


@settings(max_examples=300, deadline=None)
@given(scheduling=JSON, spec_extra=JSON)
def test_default_policies_are_idempotent(scheduling: Any, spec_extra: Any) -> None:
    raw = {"kind": "ClusterTrainingRuntime", "spec": {"scheduling": scheduling, "z": spec_extra}}
    once = with_default_policies(raw)
    assert with_default_policies(once) == once
    # And the JSON Patch the webhook sends turns the raw object into exactly that.
    assert jsonpatch.apply_patch(raw, jsonpatch.make_patch(raw, once)) == once


# --- pods --------------------------------------------------------------------------------------

SPECS = st.one_of(
    st.none(),
    JSON,
    st.dictionaries(st.sampled_from(["containers", "hostname", "schedulingGroup"]), JSON),
)


@settings(max_examples=500, deadline=None)
@given(spec=SPECS, missing=st.booleans(), job=st.booleans())
def test_pod_patch_equals_jsonpatch(spec: Any, missing: bool, job: bool) -> None:
    """The one operation puts the pod (or a Job's pod template) in the group, whatever its
    spec holds: a group already named by someone else is replaced; the same group is kept."""
    body: dict[str, Any] = {"metadata": {"generateName": "p-"}}
    at = ("spec", "template") if job else ()
    holder = body
    for part in at:
        holder = holder.setdefault(part, {})
    if not missing:
        holder["spec"] = spec
    target = copy.deepcopy(body)
    into = target
    for part in at:
        into = into[part]
    if isinstance(into.get("spec"), dict):
        into["spec"]["schedulingGroup"] = {"podGroupName": "g"}
    else:
        into["spec"] = {"schedulingGroup": {"podGroupName": "g"}}
    op = pod_group_op(body, "g", at)
    if target == body:
        assert op is None
        return
    assert op is not None
    assert jsonpatch.apply_patch(body, [op]) == target
    current = holder.get("spec")
    if not isinstance(current, dict) or "schedulingGroup" not in current:
        assert [op] == jsonpatch.make_patch(body, target).patch


def pod_review(labels: dict[str, str] | None, spec: dict[str, Any] | None = None) -> Review:
    pod = copy.deepcopy(fixture("pod-create-by-job-controller.mutate.json")["request"]["object"])
    if labels is not None:
        pod["metadata"]["labels"] = labels
    if spec is not None:
        pod["spec"].update(spec)
    return Review("u", "", "v1", "Pod", "pods", "", "", "team-a", "CREATE", "x", pod, None, False)


JOBSET = {"jobset.sigs.k8s.io/jobset-name": "my-job", "jobset.sigs.k8s.io/job-index": "0"}


@pytest.mark.parametrize(
    ("labels", "spec", "patched", "warned"),
    [
        ({**JOBSET, "jobset.sigs.k8s.io/replicatedjob-name": "node"}, None, True, False),
        ({"app": "web"}, None, False, False),  # not a JobSet pod
        ({**JOBSET, "jobset.sigs.k8s.io/replicatedjob-name": "ghost"}, None, False, False),
        (  # in another group (the Job controller's own gang): tied to its gang's instead
            {**JOBSET, "jobset.sigs.k8s.io/replicatedjob-name": "node"},
            {"schedulingGroup": {"podGroupName": "mine"}},
            True,
            False,
        ),
        (  # a JobSet with no TrainJob of its name (synced cache): someone else's, silently
            {**JOBSET, "jobset.sigs.k8s.io/jobset-name": "other", "x": "y"},
            None,
            False,
            False,
        ),
        ({**JOBSET, "jobset.sigs.k8s.io/job-index": "zero"}, None, False, False),
    ],
)
def test_which_pods_get_a_group(
    labels: dict[str, str], spec: dict[str, Any] | None, patched: bool, warned: bool
) -> None:
    cache = fixture_cache()
    # The API server holds team-a/my-job only (the cache has it): a JobSet pod whose TrainJob
    # the cache lacks is looked up there.
    cache.trainjob_lookup, asked = answering_lookup([("team-a", "my-job")])
    decision = decided(mutate_pod_review(pod_review(labels, spec), cache))
    assert decision.allowed
    assert bool(decision.patch) is patched
    assert bool(decision.warnings) is warned
    jobset = labels.get("jobset.sigs.k8s.io/jobset-name")
    assert asked == ([("team-a", jobset)] if jobset not in (None, "my-job") else [])


def test_pod_namespace_from_the_object_when_the_request_has_none() -> None:
    review = pod_review({**JOBSET, "jobset.sigs.k8s.io/replicatedjob-name": "node"})
    review.namespace = ""
    assert review.object is not None
    review.object["metadata"]["namespace"] = "team-a"
    decision = mutate_pod_review(review, fixture_cache())
    assert isinstance(decision, Decision) and decision.patch


def test_pods_of_an_untargeted_replicated_job_get_no_group() -> None:
    rt = runtime(
        torch_node(),
        rj("eval", parallelism=1),
        scheduling={"replicatedJobs": [{"targetReplicatedJobs": ["node"]}]},
        ml={"numNodes": 2, "torch": {}},
    )
    tj = trainjob("my-job", num_nodes=2)
    cache = Cache(connected=True)
    cache.jobsets.replace([])  # listed, none: restart attempt 0
    cache.cluster_runtimes.replace([rt])
    cache.trainjobs.replace([frozen(cache, tj)])
    served(cache, "native")
    for name, patched in (("node", True), ("eval", False)):
        labels = {**JOBSET, "jobset.sigs.k8s.io/replicatedjob-name": name}
        review = pod_review(labels)
        review.namespace = tj["metadata"]["namespace"]
        decision = mutate_pod_review(review, cache)
        assert isinstance(decision, Decision) and decision.allowed  # never held
        assert bool(decision.patch) is patched


# --- Workloads and PodGroups -------------------------------------------------------------------


def test_controller_is_the_controller_owner_reference_else_controller_ref() -> None:
    owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "a",
             "uid": "1", "controller": True}  # fmt: skip
    assert controlling_trainjob({"metadata": {"ownerReferences": [owner]}}) == "a"
    foreign = {**owner, "apiVersion": "batch/v1", "kind": "Job"}
    ref = {"apiGroup": "trainer.kubeflow.org", "kind": "TrainJob", "name": "b"}
    assert controlling_trainjob({"metadata": {"ownerReferences": [foreign]}, "spec": {}}) is None
    # A foreign controller wins over a controllerRef: never default someone else's object.
    assert (
        controlling_trainjob(
            {"metadata": {"ownerReferences": [foreign]}, "spec": {"controllerRef": ref}}
        )
        is None
    )
    assert controlling_trainjob({"metadata": {}, "spec": {"controllerRef": ref}}) == "b"
    assert controlling_trainjob({"spec": {"controllerRef": {**ref, "apiGroup": "x.io"}}}) is None
    assert (
        controlling_trainjob({"metadata": {"ownerReferences": [{**owner, "controller": False}]}})
        is None
    )


def level2_plan() -> Plan:
    rt = runtime(
        rj("launcher", parallelism=1),
        torch_node(),
        scheduling={"replicatedJobs": [{"targetReplicatedJobs": ["launcher"],
                                        "schedulingPolicy": {"basic": {}}},
                                       {"targetReplicatedJobs": ["node"]}]},
        ml={"numNodes": 6, "torch": {}},
    )  # fmt: skip
    runtime_model, trainjob_model = parsed(rt, trainjob("job", num_nodes=6))
    plan = build_plan(trainjob_model, runtime_model)
    assert plan is not None
    return plan


def test_template_matching() -> None:
    plan = level2_plan()
    node = next(g for g in plan.groups if "node" in g.replicated_jobs)
    assert match_group(plan, node.template_name) is node
    assert match_group(plan, "node") is node  # a hand-written template named after its RJ
    assert match_group(plan, "launcher") is node  # basic groups have no minCount: the only gang
    assert node.min_count == 6


def test_workload_templates_lacking_min_count_get_the_plan_value() -> None:
    plan = level2_plan()
    workload = {"metadata": {"name": "w"}, "spec": {"podGroupTemplates": [
        {"name": "node", "schedulingPolicy": {"gang": {"minCount": 0}}},
        {"name": "other", "schedulingPolicy": {"gang": {"minCount": 3}}},
        {"name": "b", "schedulingPolicy": {"basic": {}}},
    ]}}  # fmt: skip
    out, warnings = with_min_counts(WORKLOAD, workload, plan)
    assert [t["schedulingPolicy"] for t in out["spec"]["podGroupTemplates"]] == [
        {"gang": {"minCount": 6}},
        {"gang": {"minCount": 3}},  # set by its author: kept
        {"basic": {}},
    ]
    assert warnings == []
    assert with_min_counts(WORKLOAD, out, plan) == (out, [])


def test_pod_group_lacking_min_count() -> None:
    plan = level2_plan()
    node = next(g for g in plan.groups if "node" in g.replicated_jobs)
    pod_group = {"metadata": {"name": node.pod_group_name},
                 "spec": {"schedulingPolicy": {"gang": {}}}}  # fmt: skip
    out, warnings = with_min_counts(POD_GROUP, pod_group, plan)
    assert out["spec"]["schedulingPolicy"] == {"gang": {"minCount": 6}}
    assert warnings == []
    by_template = {"metadata": {"name": "x"},
                   "spec": {"workloadRef": {"templateName": node.template_name},
                            "schedulingPolicy": {"gang": {"minCount": 0}}}}  # fmt: skip
    assert with_min_counts(POD_GROUP, by_template, plan)[0]["spec"]["schedulingPolicy"] == {
        "gang": {"minCount": 6}
    }


@pytest.mark.parametrize("name", [{"a": {"a": 1}}, ["node"], None, 7])
def test_gang_labels_leave_a_replicated_job_with_no_string_name_alone(name: Any) -> None:
    """A name that is not a string (a hostile review's) is no group's: left as it was, never a
    crash (a dict is not hashable)."""
    rj = {"name": name, "template": {"spec": {"template": {"spec": {}}}}}
    runtime = {"spec": {"template": {"spec": {"replicatedJobs": [rj]}}}}
    assert with_gang_labels(runtime, frozenset({"node"})) == runtime

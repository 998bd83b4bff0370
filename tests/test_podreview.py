"""The pod review's fast reading answers exactly as the general one, whatever the body."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.harness import fixture, fixture_cache
from webhook.admission.handlers import mutate_pod_review
from webhook.admission.podreview import fast_parse, parse_pod_review
from webhook.admission.review import BadReview, Decision, parse

POD_REVIEW = fixture("pod-create-by-job-controller.mutate.json")
CACHE = fixture_cache()


def answer(read: Any, body: bytes) -> Decision | str:
    try:
        return mutate_pod_review(read(body), CACHE)
    except BadReview as err:
        return f"BadReview({err}, uid={err.uid})"


def test_the_captured_pod_is_read_fast_and_tied_as_before() -> None:
    body = orjson.dumps(POD_REVIEW)
    fast = fast_parse(body)
    assert fast is not None and fast == parse_pod_review(body)
    general = parse(body)
    pod = general.object
    assert pod is not None and fast.object is not None
    # Only what the pod webhook and the backends' ties read; the rest is never built.
    assert fast.object["metadata"]["labels"] == pod["metadata"]["labels"]
    assert fast.object["spec"] == {"schedulerName": pod["spec"]["schedulerName"]}
    assert "containers" not in fast.object["spec"]
    decision = answer(parse_pod_review, body)
    assert isinstance(decision, Decision) and decision.patch
    assert decision == answer(parse, body)


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r.update(kind="Other"),
        lambda r: r["request"].update(operation="UPDATE", oldObject={}),
        lambda r: r["request"].update(oldObject={"metadata": {}}),
        lambda r: r["request"].update(uid=""),
        lambda r: r["request"].update(uid=7),
        lambda r: r["request"].update(object=None),
        lambda r: r["request"].update(object=[1]),
        lambda r: r["request"]["object"].update(metadata="not a map"),
        lambda r: r["request"]["object"].update(spec=[]),
        lambda r: r["request"].update(kind="Pod"),
    ],
)
def test_an_unusual_shape_is_read_by_the_general_parser(change: Any) -> None:
    review = copy.deepcopy(POD_REVIEW)
    change(review)
    body = orjson.dumps(review)
    assert fast_parse(body) is None
    assert answer(parse_pod_review, body) == answer(parse, body)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
LABELS = st.dictionaries(
    st.sampled_from(["jobset.sigs.k8s.io/jobset-name", "jobset.sigs.k8s.io/replicatedjob-name",
                     "scheduling.x-k8s.io/pod-group", "other"]),
    st.sampled_from(["my-job", "node", "dataset-initializer", "x"]) | JSON,
    max_size=4,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    labels=st.none() | LABELS | JSON,
    spec=st.none() | JSON | st.fixed_dictionaries(
        {}, optional={"schedulingGroup": JSON, "schedulerName": st.sampled_from(
            ["default-scheduler", "volcano"]) | JSON, "affinity": JSON, "containers": JSON}
    ),
    meta_extra=st.dictionaries(st.sampled_from(["name", "generateName", "namespace",
                                                "annotations", "uid"]), JSON, max_size=3),
    operation=st.sampled_from(["CREATE", "CREATE", "UPDATE", "DELETE", "CONNECT", "nope"]),
    dry_run=JSON,
)  # fmt: skip
def test_any_pod_review_gets_the_same_answer_both_ways(
    labels: Any, spec: Any, meta_extra: dict[str, Any], operation: str, dry_run: Any
) -> None:
    review = copy.deepcopy(POD_REVIEW)
    request = review["request"]
    pod = request["object"]
    meta = {**pod["metadata"], **meta_extra}
    if labels is None:
        meta.pop("labels", None)
    else:
        meta["labels"] = labels
    pod["metadata"] = meta
    if spec is None:
        pod.pop("spec")
    else:
        pod["spec"] = spec
    request["operation"], request["dryRun"] = operation, dry_run
    body = orjson.dumps(review)
    assert answer(parse_pod_review, body) == answer(parse, body)
    fast = fast_parse(body)
    if fast is not None:
        general = parse(body)
        assert (fast.uid, fast.namespace, fast.object_name, fast.dry_run, fast.username) == (
            general.uid, general.namespace, general.object_name, general.dry_run,
            general.username,
        )  # fmt: skip


@pytest.mark.parametrize(
    "name",
    [
        "pod-create-by-job-controller.mutate.json",
        "pod-create-by-job-controller-index-1.mutate.json",
        "pod-create-as-job-controller-serviceaccount.mutate.json",
        "pod-create-with-schedulinggroup.mutate.json",
    ],
)
def test_every_captured_pod_review_is_answered_alike(name: str) -> None:
    body = orjson.dumps(fixture(name))
    assert fast_parse(body) is not None
    assert answer(parse_pod_review, body) == answer(parse, body)

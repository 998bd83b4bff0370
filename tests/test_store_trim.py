"""The watch cache keeps no managedFields and no last-applied-configuration (issue 27): nothing
the service reads is in them, and they are most of a stored object's size."""

from __future__ import annotations

import copy
from typing import Any

from webhook.core.snapshot import SNAPSHOT_ANNOTATION, snapshot_of
from webhook.kube.store import LAST_APPLIED, Store, without_bookkeeping

from .harness import fixture, fixture_cache


def stored_trainjob() -> dict[str, Any]:
    """A TrainJob as a real API server stored it (captured): managedFields of kubectl and of a
    status write, and kubectl's last-applied annotation; plus the service's snapshot."""
    obj: dict[str, Any] = fixture("trainjob-status-update.validate.json")["request"]["object"]
    assert obj["metadata"]["managedFields"] and LAST_APPLIED in obj["metadata"]["annotations"]
    obj["metadata"]["annotations"][SNAPSHOT_ANNOTATION] = '{"spec": {}}'
    obj["metadata"]["annotations"]["team/owner"] = "alice"
    return obj


def test_every_way_into_a_store_drops_the_bookkeeping_and_nothing_else() -> None:
    obj = stored_trainjob()
    before = copy.deepcopy(obj)
    for fill in ("apply", "replace", "trim"):
        store = Store("trainjobs")
        if fill == "apply":
            store.apply("ADDED", obj)
        elif fill == "replace":
            store.replace([obj])
        else:
            store.replace([store.trim(obj)])
        entry = store.get("team-a", "my-job")
        assert entry is not None
        meta = entry.raw["metadata"]
        assert "managedFields" not in meta, fill
        assert meta["annotations"] == {SNAPSHOT_ANNOTATION: '{"spec": {}}', "team/owner": "alice"}
        assert snapshot_of(entry.raw) == '{"spec": {}}'  # what the planner reads stays
        rest = {
            k: v for k, v in before["metadata"].items() if k not in ("managedFields", "annotations")
        }
        assert {k: v for k, v in meta.items() if k != "annotations"} == rest
        assert {k: entry.raw[k] for k in ("spec", "status")} == {
            k: before[k] for k in ("spec", "status")
        }
    assert obj == before  # the caller's object is never changed


def test_an_object_without_bookkeeping_is_kept_as_it_is() -> None:
    plain = {"metadata": {"name": "a", "namespace": "n", "annotations": {"x": "y"}}, "spec": {}}
    assert without_bookkeeping(plain) is plain
    assert without_bookkeeping({"kind": "X"}) == {"kind": "X"}


def test_a_relist_of_the_same_objects_changes_nothing() -> None:
    """Listeners hear of no change when a list brings back what the watch had (the stored copy
    and the new one compare equal once both are trimmed)."""
    store = Store("trainjobs")
    heard: list[str] = []
    store.subscribe(lambda event, old, new: heard.append(event))
    store.apply("ADDED", stored_trainjob())
    store.replace([stored_trainjob()])
    assert heard == ["ADDED"]


def test_the_fixture_cache_still_plans() -> None:
    cache = fixture_cache()
    assert cache.plan_for("team-a", "my-job").plan is not None


def _podgroup(owner: dict[str, Any] | None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = copy.deepcopy(
        fixture("podgroup-create.validate.json")["request"]["object"]
    )
    obj["metadata"]["labels"] = labels or {}
    obj["metadata"]["ownerReferences"] = [owner] if owner else []
    obj["metadata"]["managedFields"] = [{"manager": "kube-controller-manager"}]
    obj["metadata"]["deletionTimestamp"] = "2026-12-01T09:00:00Z"
    return obj


def test_anyone_elses_gang_objects_are_kept_as_stubs() -> None:
    """A Job's own PodGroup keeps only who owns it and whether it is going; the service's own
    and a TrainJob's (made by anyone) stay whole, as the reconciler and pod webhook read them."""
    from webhook.backends.base import MANAGED_BY, MANAGED_BY_LABEL
    from webhook.backends.native import POD_GROUP

    cache = fixture_cache()
    store = cache.store(POD_GROUP)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": "j",
        "uid": "job-uid",
        "controller": True,
    }
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "name": "my-job", "uid": "tj-uid", "controller": True}  # fmt: skip
    foreign = _podgroup(job)
    store.apply("ADDED", foreign)
    entry = store.get("team-a", foreign["metadata"]["name"])
    assert entry is not None
    assert entry.raw == {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            k: foreign["metadata"][k]
            for k in ("name", "namespace", "uid", "labels", "ownerReferences", "deletionTimestamp")
        },
    }
    ours = _podgroup(None, {MANAGED_BY_LABEL: MANAGED_BY})
    for i, kept in enumerate((_podgroup(trainjob), ours)):
        kept["metadata"]["name"] += f"-kept-{i}"
        store.apply("ADDED", kept)
        whole = store.get("team-a", kept["metadata"]["name"])
        assert whole is not None and whole.raw["spec"] == kept["spec"]
        assert "managedFields" not in whole.raw["metadata"]
    # The TrainJob-controlled one made by someone else is what the pod webhook stands down for.
    assert cache.owned(POD_GROUP, "tj-uid") and not cache.owned(POD_GROUP, "job-uid")

"""A TrainJob MultiKueue dispatches is never frozen on the manager cluster (issue 27's review).

Kueue's MultiKueue TrainJob adapter (`trainjob_multikueue_adapter.go`, `SyncJob`) creates the
worker cluster's copy with `api.CloneObjectMetaForCreation`: name, namespace, labels and *all*
annotations, `spec.managedBy` cleared. A snapshot frozen on the manager would ride along, and a
worker running this service denies a CREATE carrying one from anyone but itself (MultiKueue's
identity is not), so the dispatch would fail. Over real connections (the API emulator over HTTP,
the webhooks over HTTPS in front of the same cache): the manager's reconciler freezes nothing
for such a TrainJob and removes a snapshot an earlier release froze (a write the guard lets
through as the service's own), while an ordinary TrainJob beside it gets its snapshot and gang.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kmock
import orjson
import pytest

from webhook.core.lifecycle import MULTIKUEUE
from webhook.core.snapshot import snapshot_of

from .harness import fixture
from .kube_emulator import POD_GROUPS, TRAINJOBS, WORKLOADS, create, eventually
from .test_reconciler import (
    NAME,
    NS,
    UPDATE,
    World,
    converged,
    objects,
    quiet,
    stored,
    trainjob,
)
from .test_snapshot_guard import (
    PATH,
    SELF,
    TENANT,
    annotated,
    guarded_world,
    real_snapshot,
    review_of,
)

pytestmark = pytest.mark.asyncio

DISPATCHED = "dispatched"
# The identity of the kubeconfig in MultiKueue's cluster Secret, as the worker's API server sees it.
MULTIKUEUE_USER = "system:serviceaccount:kueue-system:multikueue-worker"
POD_PATH = "/mutate--v1-pod"


def dispatched(snapshot: str | None = None) -> dict[str, Any]:
    """A TrainJob on the scheduling runtime that MultiKueue manages (running: Kueue admitted it
    on the manager), with an annotation of the user's and, if given, a snapshot."""
    obj = trainjob(DISPATCHED)
    obj["spec"]["managedBy"] = MULTIKUEUE
    obj["metadata"]["annotations"] = {"team.example.com/owner": "alice"}
    return annotated(obj, snapshot) if snapshot is not None else obj


def worker_copy(manager: dict[str, Any]) -> dict[str, Any]:
    """What the adapter's SyncJob creates on the worker: the manager's name, namespace, labels
    and annotations (`CloneObjectMetaForCreation`), its spec without `managedBy`, and the
    prebuilt-workload and origin labels (`SetMultiKueueMeta`)."""
    meta = manager["metadata"]
    labels = dict(meta.get("labels") or {})
    labels["kueue.x-k8s.io/prebuilt-workload-name"] = f"trainjob-{meta['name']}-1a2b3"
    labels["kueue.x-k8s.io/multikueue-origin"] = "manager"
    spec = copy.deepcopy(manager["spec"])
    spec.pop("managedBy", None)
    return {
        "apiVersion": manager["apiVersion"],
        "kind": manager["kind"],
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": dict(meta.get("annotations") or {}),
        },
        "spec": spec,
    }


def snapshot_patches(w: World, name: str) -> int:
    """Patches of the TrainJob `name` (the snapshot is the only thing the reconciler patches
    on a TrainJob: this World has no status writer)."""
    return len(w.k[UPDATE, TRAINJOBS, kmock.name(name)])


def pod_review(trainjob_name: str) -> dict[str, Any]:
    """The Job controller's CREATE of a pod of `trainjob_name`'s JobSet."""
    doc = copy.deepcopy(fixture("pod-create-by-job-controller.mutate.json"))
    pod = doc["request"]["object"]
    pod["metadata"]["name"] = f"{trainjob_name}-node-0-0-x"
    pod["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] = trainjob_name
    pod["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] = "0"
    return doc


def assert_denied(response: dict[str, Any], verb: str, who: str) -> None:
    """The guard's 403 for `who`, naming the field (test_snapshot_guard checks every detail)."""
    assert response["allowed"] is False, response
    assert response["status"]["code"] == 403
    message = response["status"]["message"]
    assert f'"{DISPATCHED}" is forbidden' in message, message
    assert f"{who} may not {verb} the frozen runtime snapshot" in message, message


def gang_objects_of(w: World, name: str) -> list[dict[str, Any]]:
    return [
        obj
        for resource in (WORKLOADS, POD_GROUPS)
        for obj in objects(w.k, resource)
        if any(ref.get("name") == name for ref in obj["metadata"].get("ownerReferences") or [])
    ]


async def test_a_dispatched_trainjob_gets_no_snapshot_and_its_worker_copy_is_admitted(
    tmp_path: Path,
) -> None:
    async with guarded_world(tmp_path) as (w, send):
        await create(w.k, TRAINJOBS, dispatched())
        await create(w.k, TRAINJOBS, trainjob())
        # The ordinary TrainJob beside it is frozen and gets its gang, as always.
        await converged(w.k)
        ordinary = stored(w.k, TRAINJOBS, NAME)
        assert ordinary is not None and snapshot_of(ordinary) == real_snapshot()
        await quiet(w.k)
        # A pass over the dispatched one, now and again, writes nothing at all.
        await w.reconciler.reconcile((NS, DISPATCHED))
        assert snapshot_patches(w, DISPATCHED) == 0
        manager_tj = stored(w.k, TRAINJOBS, DISPATCHED)
        assert manager_tj is not None and snapshot_of(manager_tj) is None
        assert gang_objects_of(w, DISPATCHED) == []

        # The worker's service admits MultiKueue's copy (it then freezes it there itself).
        copied = worker_copy(manager_tj)
        allowed = await send(PATH, review_of("CREATE", copied, username=MULTIKUEUE_USER))
        assert allowed["allowed"] is True, allowed

        # Pods of its name are not the manager's to hold: Trainer makes none for it here, so
        # the pod webhook says "not tied" and lets one through instead of holding it for a
        # freeze that never comes; the ordinary TrainJob's pod is tied to its gang.
        answer = await send(POD_PATH, pod_review(DISPATCHED))
        assert answer["allowed"] is True and "patch" not in answer, answer
        tied = await send(POD_PATH, pod_review(NAME))
        assert tied["allowed"] is True and "patch" in tied, tied


async def test_a_snapshot_an_earlier_release_froze_is_removed_by_the_service(
    tmp_path: Path,
) -> None:
    async with guarded_world(tmp_path) as (w, send):
        stale = dispatched(real_snapshot())  # as 0.1.0 froze it (the emulator has no webhook)
        # What goes wrong without the removal: its copy carries the snapshot, and once the
        # runtime has changed since, the worker's guard denies MultiKueue's CREATE (a copy of
        # exactly what the worker would freeze now is what its own freeze would add).
        older = orjson.loads(real_snapshot())
        older["runtime"]["spec"]["mlPolicy"]["numNodes"] = 3
        outdated = worker_copy(dispatched(orjson.dumps(older).decode()))
        denied = await send(PATH, review_of("CREATE", outdated, username=MULTIKUEUE_USER))
        assert_denied(denied, "set", MULTIKUEUE_USER)

        await create(w.k, TRAINJOBS, stale)
        await create(w.k, TRAINJOBS, trainjob())
        cleaned = await eventually(
            lambda: (t := stored(w.k, TRAINJOBS, DISPATCHED)) and snapshot_of(t) is None and t,
            "the stale snapshot removed",
        )
        assert cleaned["metadata"]["annotations"] == {"team.example.com/owner": "alice"}
        await converged(w.k)  # the ordinary one still frozen and ganged
        ordinary = stored(w.k, TRAINJOBS, NAME)
        assert ordinary is not None and snapshot_of(ordinary) == real_snapshot()
        await quiet(w.k)
        await w.reconciler.reconcile((NS, DISPATCHED))
        assert snapshot_patches(w, DISPATCHED) == 1  # removed once, never frozen again
        assert gang_objects_of(w, DISPATCHED) == []

        # The removal, as the API server would send it to the manager's guard: the service's
        # own write passes; a tenant's same removal is denied.
        with_it = annotated(cleaned, real_snapshot())
        removal = review_of("UPDATE", cleaned, with_it, username=SELF)
        assert (await send(PATH, removal))["allowed"] is True
        tenants = review_of("UPDATE", cleaned, with_it)
        assert_denied(await send(PATH, tenants), "remove", TENANT)
        # And the dispatch now goes through.
        copied = worker_copy(cleaned)
        allowed = await send(PATH, review_of("CREATE", copied, username=MULTIKUEUE_USER))
        assert allowed["allowed"] is True, allowed

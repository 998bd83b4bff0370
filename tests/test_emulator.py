"""`VersionedEmulator` answers writes as a real kube-apiserver does, over real HTTP: the stamps
of a create, PUT and PATCH with optimistic concurrency, DeleteOptions preconditions, finalizers,
the garbage collector, and discovery of the resources it declares."""

from __future__ import annotations

import json
import re
from importlib.metadata import version
from typing import Any

import kmock
import pytest
from kubernetes.aio.client import (
    AdmissionregistrationV1Api,
    CoordinationV1Api,
    CoreV1Api,
    CustomObjectsApi,
    V1Lease,
    V1ObjectMeta,
)
from kubernetes.aio.client.exceptions import ApiException

from tests.kube_emulator import (
    COMPOSITE_POD_GROUPS,
    EVENTS,
    JSON_PATCH,
    LEASES,
    MERGE_PATCH,
    NODES,
    OPTIMISTIC_LOCK,
    POD_GROUP_PROTECTION,
    POD_GROUPS,
    POD_GROUPS_V1ALPHA2,
    PODS,
    SECRETS,
    STRATEGIC_MERGE_PATCH,
    TRAINER,
    TRAINJOBS,
    VERSION,
    WORKLOADS,
    WORKLOADS_V1ALPHA2,
    VersionedEmulator,
    api_client,
    create,
    delete,
    emulator,
    get,
    json_patch,
    next_requests,
    patch,
    replace,
    status,
)

Json = dict[str, Any]
NS = "team-a"
LEASES_URL = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
WORKLOADS_URL = f"/apis/scheduling.k8s.io/v1beta1/namespaces/{NS}/workloads"
SECONDS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def lease(name: str = "lock", **spec: Any) -> Json:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"holderIdentity": "a", **spec},
    }


def workload(name: str, *owners: Json, finalizers: list[str] | None = None) -> Json:
    meta: Json = {"name": name, "namespace": NS}
    if owners:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "X", "name": o["metadata"]["name"], "uid": uid(o)}
            for o in owners
        ]
    if finalizers:
        meta["finalizers"] = finalizers
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "Workload", "metadata": meta}


def uid(obj: Json) -> str:
    value: str = obj["metadata"]["uid"]
    return value


def rv(obj: Json) -> str:
    value: str = obj["metadata"]["resourceVersion"]
    return value


async def call(
    k: VersionedEmulator, method: str, url: str, body: Any = None, media_type: str | None = None
) -> tuple[int, Json]:
    """One request with a JSON body (in `media_type`); the status and the JSON answer."""
    headers = {"Content-Type": media_type or "application/json"}
    data = None if body is None else json.dumps(body)
    async with k.request(method, url, data=data, headers=headers) as response:
        answer: Json = await response.json()
        return response.status, answer


async def events_since(k: VersionedEmulator, url: str, since: str) -> list[tuple[str, Json]]:
    """The watch events after resourceVersion `since`: (type, object) pairs."""
    params = {"watch": "true", "resourceVersion": since, "timeoutSeconds": "0.3"}
    async with k.get(url, params=params) as response:
        assert response.status == 200
        lines = [line async for line in response.content if line.strip()]
    events = [json.loads(line) for line in lines]
    return [(e["type"], e["object"]) for e in events]


def assert_status(answer: Json, code: int, reason: str, message: str | None = None) -> None:
    assert answer["kind"] == "Status" and answer["apiVersion"] == "v1", answer
    assert (answer["status"], answer["code"], answer["reason"]) == ("Failure", code, reason)
    if message is not None:
        assert answer["message"] == message


# --- create -------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_create_stamps_uid_creation_time_generation_and_the_urls_namespace() -> None:
    async with emulator() as (k, _):
        body = lease()
        del body["metadata"]["namespace"]  # the URL says which
        code, created = await call(k, "POST", LEASES_URL, body)
        assert code == 201, created
        meta = created["metadata"]
        assert meta["namespace"] == NS and meta["generation"] == 1
        assert re.fullmatch(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", meta["uid"])
        assert SECONDS.match(meta["creationTimestamp"])
        assert meta["resourceVersion"] == str(k.resource_version)
        assert await get(k, LEASES, NS, "lock") == created
        other = await create(k, LEASES, lease("other"))
        assert uid(other) != meta["uid"]


@pytest.mark.asyncio
async def test_create_with_a_resource_version_is_refused() -> None:
    async with emulator() as (k, _):
        body = lease()
        body["metadata"]["resourceVersion"] = "7"
        code, answer = await call(k, "POST", LEASES_URL, body)
        message = "resourceVersion should not be set on objects to be created"
        assert code == 400
        assert_status(answer, 400, "BadRequest", message)
        assert await get(k, LEASES, NS, "lock") is None


@pytest.mark.asyncio
async def test_create_of_an_existing_name_is_409_already_exists() -> None:
    async with emulator() as (k, url), api_client(url) as api:
        await create(k, LEASES, lease())
        code, answer = await call(k, "POST", LEASES_URL, lease())
        assert code == 409
        assert_status(
            answer, 409, "AlreadyExists", 'leases.coordination.k8s.io "lock" already exists'
        )
        assert answer["details"] == {
            "name": "lock",
            "group": "coordination.k8s.io",
            "kind": "leases",
        }
        body = V1Lease(metadata=V1ObjectMeta(name="lock", namespace=NS))
        with pytest.raises(ApiException) as caught:  # as the official client sees it
            await CoordinationV1Api(api).create_namespaced_lease(NS, body)
        assert caught.value.status == 409
        assert json.loads(caught.value.body or "{}")["reason"] == "AlreadyExists"


@pytest.mark.asyncio
async def test_create_into_another_namespace_than_the_urls_is_refused() -> None:
    async with emulator() as (k, _):
        body = lease()
        body["metadata"]["namespace"] = "team-b"
        code, answer = await call(k, "POST", LEASES_URL, body)
        assert code == 400
        assert_status(answer, 400, "BadRequest")


# --- PUT ----------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_put_replaces_the_whole_object_and_keeps_uid_and_creation_time() -> None:
    async with emulator() as (k, _):
        created = await create(k, LEASES, lease(leaseTransitions=3))
        new = lease(renewTime="2030-01-01T00:00:00.000000Z")  # no leaseTransitions: it goes
        new["metadata"]["creationTimestamp"] = "2001-01-01T00:00:00Z"  # the server keeps its own
        code, replaced = await call(k, "PUT", f"{LEASES_URL}/lock", new)
        assert code == 200, replaced
        assert replaced["spec"] == new["spec"]
        assert uid(replaced) == uid(created)
        assert replaced["metadata"]["creationTimestamp"] == created["metadata"]["creationTimestamp"]
        assert int(rv(replaced)) > int(rv(created))
        assert await get(k, LEASES, NS, "lock") == replaced
        assert await events_since(k, LEASES_URL, rv(created)) == [("MODIFIED", replaced)]


@pytest.mark.asyncio
async def test_put_with_a_stale_resource_version_is_409_conflict() -> None:
    async with emulator() as (k, _):
        created = await create(k, LEASES, lease())
        current = await replace(k, LEASES, {**created, "spec": {"holderIdentity": "b"}})
        stale = {**created, "spec": {"holderIdentity": "c"}}  # still the first resourceVersion
        code, answer = await call(k, "PUT", f"{LEASES_URL}/lock", stale)
        message = (
            f'Operation cannot be fulfilled on leases.coordination.k8s.io "lock": {OPTIMISTIC_LOCK}'
        )
        assert code == 409
        assert_status(answer, 409, "Conflict", message)
        assert await get(k, LEASES, NS, "lock") == current
        unconditional = lease(holderIdentity="d")  # no resourceVersion: no precondition
        assert (await replace(k, LEASES, unconditional))["spec"]["holderIdentity"] == "d"


@pytest.mark.asyncio
async def test_put_with_another_uid_is_409_conflict() -> None:
    async with emulator() as (k, _):
        created = await create(k, LEASES, lease())
        other = {**created, "metadata": {**created["metadata"], "uid": "not-it"}}
        code, answer = await call(k, "PUT", f"{LEASES_URL}/lock", other)
        assert code == 409
        assert_status(answer, 409, "Conflict")
        assert "Precondition failed: UID in precondition: not-it" in answer["message"]


@pytest.mark.asyncio
async def test_put_of_a_missing_object_is_404() -> None:
    async with emulator() as (k, _):
        code, answer = await call(k, "PUT", f"{LEASES_URL}/lock", lease())
        assert code == 404
        assert_status(answer, 404, "NotFound", 'leases.coordination.k8s.io "lock" not found')


# --- PATCH --------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_merge_patch_is_stored_announced_and_returned() -> None:
    async with emulator() as (k, _):
        created = await create(k, LEASES, lease(leaseTransitions=1))
        body = {"spec": {"leaseTransitions": None, "holderIdentity": "b"}}  # null deletes
        code, patched = await call(k, "PATCH", f"{LEASES_URL}/lock", body, MERGE_PATCH)
        assert code == 200, patched
        assert patched["spec"] == {"holderIdentity": "b"}
        assert int(rv(patched)) > int(rv(created)) and uid(patched) == uid(created)
        assert await get(k, LEASES, NS, "lock") == patched
        assert await events_since(k, LEASES_URL, rv(created)) == [("MODIFIED", patched)]


@pytest.mark.asyncio
async def test_merge_patch_replaces_what_is_not_an_object_both_ways() -> None:
    async with emulator() as (k, _):
        await create(k, LEASES, {**lease(), "extra": {"a": 1}, "flag": 1})
        patched = await patch(k, LEASES, NS, "lock", {"extra": 2, "flag": {"b": 2}})  # RFC 7386
        assert (patched["extra"], patched["flag"]) == (2, {"b": 2})


@pytest.mark.asyncio
async def test_merge_patch_with_a_stale_resource_version_or_another_uid_is_409() -> None:
    async with emulator() as (k, _):
        created = await create(k, LEASES, lease())
        current = await patch(k, LEASES, NS, "lock", {"spec": {"holderIdentity": "b"}})
        url = f"{LEASES_URL}/lock"
        for meta in ({"resourceVersion": rv(created)}, {"uid": "recreated-meanwhile"}):
            body = {"metadata": meta, "spec": {"holderIdentity": "c"}}
            code, answer = await call(k, "PATCH", url, body, MERGE_PATCH)
            assert code == 409, meta
            assert_status(answer, 409, "Conflict")
        assert await get(k, LEASES, NS, "lock") == current
        guarded = {"metadata": {"resourceVersion": rv(current)}, "spec": {"holderIdentity": "d"}}
        assert (await patch(k, LEASES, NS, "lock", guarded))["spec"]["holderIdentity"] == "d"


@pytest.mark.asyncio
async def test_json_patch_applies_operations_and_refuses_a_failed_test_or_a_bad_path() -> None:
    async with emulator() as (k, _):
        created = await create(k, LEASES, lease())
        ops: list[Json] = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv(created)},
            {"op": "replace", "path": "/spec/holderIdentity", "value": "b"},
            {"op": "add", "path": "/metadata/labels", "value": {"x": "y"}},
        ]
        patched = await json_patch(k, LEASES, NS, "lock", ops)
        assert patched["spec"]["holderIdentity"] == "b"
        assert patched["metadata"]["labels"] == {"x": "y"}
        assert await events_since(k, LEASES_URL, rv(created)) == [("MODIFIED", patched)]
        url = f"{LEASES_URL}/lock"
        for bad in (
            [{"op": "test", "path": "/spec/holderIdentity", "value": "a"}],  # it is "b" now
            [{"op": "replace", "path": "/spec/nothing/here", "value": 1}],
            [{"op": "remove", "path": "/status"}],
        ):
            code, answer = await call(k, "PATCH", url, bad, JSON_PATCH)
            assert code == 422, bad
            assert_status(answer, 422, "Invalid")
        code, answer = await call(k, "PATCH", url, {"not": "a list"}, JSON_PATCH)
        assert code == 400
        assert await get(k, LEASES, NS, "lock") == patched


@pytest.mark.asyncio
async def test_json_patch_cannot_change_the_uid_and_creation_time_stays() -> None:
    async with emulator() as (k, _):
        created = await create(k, LEASES, lease())
        url = f"{LEASES_URL}/lock"
        change_uid = [{"op": "replace", "path": "/metadata/uid", "value": "mine"}]
        code, answer = await call(k, "PATCH", url, change_uid, JSON_PATCH)
        assert code == 409
        assert_status(answer, 409, "Conflict")
        old_time = [{"op": "replace", "path": "/metadata/creationTimestamp", "value": "2001"}]
        patched = await json_patch(k, LEASES, NS, "lock", old_time)
        assert patched == created  # nothing it may change changed


@pytest.mark.asyncio
async def test_strategic_merge_patch_merges_and_other_patch_types_are_415() -> None:
    async with emulator() as (k, _):
        await create(k, LEASES, lease())
        url = f"{LEASES_URL}/lock"
        body = {"spec": {"leaseTransitions": 2}}
        code, patched = await call(k, "PATCH", url, body, STRATEGIC_MERGE_PATCH)
        assert code == 200 and patched["spec"] == {"holderIdentity": "a", "leaseTransitions": 2}
        for media_type in ("application/json", "application/apply-patch+yaml", "text/plain"):
            code, answer = await call(k, "PATCH", url, body, media_type)
            assert code == 415, media_type
            assert_status(answer, 415, "UnsupportedMediaType")


@pytest.mark.asyncio
async def test_a_write_that_changes_nothing_stores_nothing() -> None:
    async with emulator() as (k, _):
        created = await create(k, LEASES, lease())
        same = await patch(k, LEASES, NS, "lock", {"spec": {"holderIdentity": "a"}})
        assert same == created
        assert await replace(k, LEASES, created) == created
        assert await events_since(k, LEASES_URL, rv(created)) == []


@pytest.mark.asyncio
async def test_generation_counts_changes_to_anything_but_metadata_and_status() -> None:
    async with emulator() as (k, _):
        await create(k, LEASES, lease())
        labelled = await patch(k, LEASES, NS, "lock", {"metadata": {"labels": {"x": "y"}}})
        with_status = await patch(k, LEASES, NS, "lock", {"status": {"ok": True}})
        respecced = await patch(k, LEASES, NS, "lock", {"spec": {"holderIdentity": "b"}})
        generations = [o["metadata"]["generation"] for o in (labelled, with_status, respecced)]
        assert generations == [1, 1, 2]


@pytest.mark.asyncio
async def test_a_write_a_reaction_answers_is_not_applied() -> None:
    async with emulator() as (k, _):
        next_requests(k[kmock.action.CREATE, LEASES]) << status(500)
        code, _ = await call(k, "POST", LEASES_URL, lease())
        assert code == 500
        assert await get(k, LEASES, NS, "lock") is None
        created = await create(k, LEASES, lease())
        next_requests(k[kmock.method.PUT, LEASES]) << status(500)
        code, _ = await call(k, "PUT", f"{LEASES_URL}/lock", lease(holderIdentity="b"))
        assert code == 500
        assert await get(k, LEASES, NS, "lock") == created


# --- DELETE -------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_delete_honours_uid_and_resource_version_preconditions() -> None:
    async with emulator() as (k, _):
        created = await create(k, LEASES, lease())
        url = f"{LEASES_URL}/lock"
        wrong = ({"uid": "another"}, {"resourceVersion": "1" + rv(created)})
        for preconditions in wrong:
            code, answer = await call(k, "DELETE", url, {"preconditions": preconditions})
            assert code == 409, preconditions
            assert_status(answer, 409, "Conflict")
            assert "Precondition failed" in answer["message"]
        assert await get(k, LEASES, NS, "lock") == created
        right = {"uid": uid(created), "resourceVersion": rv(created)}
        await delete(k, LEASES, NS, "lock", preconditions=right)
        assert await get(k, LEASES, NS, "lock") is None
        [(kind, gone)] = await events_since(k, LEASES_URL, rv(created))
        assert kind == "DELETED" and uid(gone) == uid(created)
        code, answer = await call(k, "DELETE", url)
        assert code == 404
        assert_status(answer, 404, "NotFound")


@pytest.mark.asyncio
async def test_an_object_with_finalizers_goes_when_the_last_one_is_removed() -> None:
    async with emulator() as (k, _):
        created = await create(k, WORKLOADS, workload("w", finalizers=["x/y"]))
        await delete(k, WORKLOADS, NS, "w")
        marked = await get(k, WORKLOADS, NS, "w")
        assert marked is not None and SECONDS.match(marked["metadata"]["deletionTimestamp"])
        await patch(k, WORKLOADS, NS, "w", {"metadata": {"finalizers": None}})
        assert await get(k, WORKLOADS, NS, "w") is None
        events = await events_since(k, WORKLOADS_URL, rv(created))
        assert [kind for kind, _ in events] == ["MODIFIED", "DELETED"]


# --- garbage collection -------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_garbage_collector_deletes_dependents_recursively() -> None:
    async with emulator() as (k, _):
        owner = await create(k, WORKLOADS, workload("owner"))
        child = await create(k, WORKLOADS, workload("child", owner))
        await create(k, WORKLOADS, workload("grandchild", child))
        other = await create(k, WORKLOADS, workload("other"))
        shared = await create(k, WORKLOADS, workload("shared", owner, other))
        unrelated = await create(k, WORKLOADS, workload("unrelated"))
        since = str(k.resource_version)
        await delete(k, WORKLOADS, NS, "owner")
        for gone in ("owner", "child", "grandchild"):
            assert await get(k, WORKLOADS, NS, gone) is None, gone
        kept = await get(k, WORKLOADS, NS, "shared")  # another owner lives: only the ref goes
        assert kept is not None
        assert [ref["uid"] for ref in kept["metadata"]["ownerReferences"]] == [uid(other)]
        assert uid(kept) == uid(shared)
        assert await get(k, WORKLOADS, NS, "unrelated") == unrelated
        events = await events_since(k, WORKLOADS_URL, since)
        assert sorted((kind, obj["metadata"]["name"]) for kind, obj in events) == [
            ("DELETED", "child"),
            ("DELETED", "grandchild"),
            ("DELETED", "owner"),
            ("MODIFIED", "shared"),
        ]


@pytest.mark.asyncio
async def test_the_garbage_collector_spares_dependents_with_finalizers_and_can_be_off() -> None:
    async with emulator() as (k, _):
        owner = await create(k, WORKLOADS, workload("owner"))
        await create(k, WORKLOADS, workload("held", owner, finalizers=["x/y"]))
        await delete(k, WORKLOADS, NS, "owner")
        held = await get(k, WORKLOADS, NS, "held")
        assert held is not None and "deletionTimestamp" in held["metadata"]

        k.garbage_collection = False
        owner = await create(k, WORKLOADS, workload("owner"))
        orphan = await create(k, WORKLOADS, workload("orphan", owner))
        await delete(k, WORKLOADS, NS, "owner")
        assert await get(k, WORKLOADS, NS, "orphan") == orphan


# --- gang lifecycles: PodGroup protection, pods' grace, immutable fields --------------------------

POD_GROUPS_URL = f"/apis/scheduling.k8s.io/v1beta1/namespaces/{NS}/podgroups"
PODS_URL = f"/api/v1/namespaces/{NS}/pods"
GANG = {"gang": {"minCount": 2}}
ZONE = {"topology": [{"key": "topology.kubernetes.io/zone"}]}


def pod_group(name: str = "g", *owners: Json) -> Json:
    meta: Json = {"name": name, "namespace": NS}
    if owners:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "X", "name": o["metadata"]["name"], "uid": uid(o)}
            for o in owners
        ]
    spec = {
        "workloadRef": {"workloadName": "w", "templateName": "node"},
        "schedulingPolicy": GANG,
        "schedulingConstraints": ZONE,
    }
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup", "metadata": meta,
            "spec": spec}  # fmt: skip


def gang_workload(*templates: str) -> Json:
    obj = workload("w")
    obj["spec"] = {
        "controllerRef": {"apiGroup": TRAINER, "kind": "TrainJob", "name": "job"},
        "podGroupTemplates": [
            {"name": t, "schedulingPolicy": GANG, "schedulingConstraints": ZONE}
            for t in templates or ("node",)
        ],
    }
    return obj


def pod(name: str, group: str | None = "g", *, node: str | None = None, **spec: Any) -> Json:
    """A pod, naming PodGroup `group`, bound to `node` if given."""
    body: Json = {"containers": [{"name": "c", "image": "i"}], **spec}
    if group is not None:
        body["schedulingGroup"] = {"podGroupName": group}
    if node is not None:
        body["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": body}  # fmt: skip


def assert_immutable(code: int, answer: Json, kind: str, name: str, *fields: str) -> None:
    """422 Invalid, a cause per field, in the API server's words."""
    assert code == 422, answer
    assert_status(answer, 422, "Invalid")
    causes = answer["details"]["causes"]
    assert [c["field"] for c in causes] == list(fields), causes
    assert all(c["message"].endswith(": field is immutable") for c in causes), causes
    assert all(c["reason"] == "FieldValueInvalid" for c in causes), causes
    assert answer["message"].startswith(f'{kind} "{name}" is invalid: '), answer["message"]
    assert all(f"{field}: Invalid value: " in answer["message"] for field in fields)


@pytest.mark.asyncio
async def test_a_pod_group_gets_the_protection_finalizer_on_create() -> None:
    async with emulator() as (k, _):
        created = await create(k, POD_GROUPS, pod_group())
        assert created["metadata"]["finalizers"] == [POD_GROUP_PROTECTION]
        assert await get(k, POD_GROUPS, NS, "g") == created
        given = pod_group("h")
        given["metadata"]["finalizers"] = ["x/y", POD_GROUP_PROTECTION]
        kept = await create(k, POD_GROUPS, given)
        assert kept["metadata"]["finalizers"] == ["x/y", POD_GROUP_PROTECTION]  # not twice
        assert "finalizers" not in (await create(k, WORKLOADS, gang_workload()))["metadata"]


@pytest.mark.asyncio
async def test_a_pod_group_stays_terminating_while_a_pod_names_it() -> None:
    async with emulator() as (k, _):
        created = await create(k, POD_GROUPS, pod_group())
        for name in ("a", "b"):
            await create(k, PODS, pod(name))
        await create(k, PODS, pod("elsewhere", "h"))  # names another group
        await create(k, PODS, pod("loose", None))  # names none
        code, answer = await call(k, "DELETE", f"{POD_GROUPS_URL}/g")
        assert code == 200 and SECONDS.match(answer["metadata"]["deletionTimestamp"]), answer
        await delete(k, PODS, NS, "a")
        terminating = await get(k, POD_GROUPS, NS, "g")
        assert terminating is not None and uid(terminating) == uid(created)
        assert terminating["metadata"]["finalizers"] == [POD_GROUP_PROTECTION]
        # The name is taken while it is Terminating: a new PodGroup under it is refused.
        code, answer = await call(k, "POST", POD_GROUPS_URL, pod_group())
        assert_status(answer, 409, "AlreadyExists")
        await delete(k, PODS, NS, "b")  # the last pod that names it
        assert await get(k, POD_GROUPS, NS, "g") is None
        events = await events_since(k, POD_GROUPS_URL, rv(created))
        assert [kind for kind, _ in events] == ["MODIFIED", "DELETED"]
        assert "deletionTimestamp" in events[0][1]["metadata"]
        again = await create(k, POD_GROUPS, pod_group())  # re-created: another uid
        assert uid(again) != uid(created)
        assert again["metadata"]["finalizers"] == [POD_GROUP_PROTECTION]


@pytest.mark.asyncio
async def test_a_dry_run_create_is_answered_as_stored_and_stores_nothing() -> None:
    async with emulator() as (k, _):
        probe = pod_group()
        probe["metadata"] = {"generateName": "probe-", "namespace": NS}
        code, answer = await call(k, "POST", f"{POD_GROUPS_URL}?dryRun=All", probe)
        assert code == 201 and answer["metadata"]["name"].startswith("probe-"), answer
        assert answer["spec"]["schedulingConstraints"] == ZONE and uid(answer)
        assert "resourceVersion" not in answer["metadata"]
        assert await get(k, POD_GROUPS, NS, answer["metadata"]["name"]) is None
        assert k.changes(POD_GROUPS) == []  # no watch event either
        await create(k, POD_GROUPS, pod_group())
        code, answer = await call(k, "POST", f"{POD_GROUPS_URL}?dryRun=All", pod_group())
        assert_status(answer, 409, "AlreadyExists")  # checked as a create would be


@pytest.mark.asyncio
async def test_only_pods_of_its_own_namespace_hold_a_pod_group_and_other_finalizers_stay() -> None:
    async with emulator() as (k, _):
        elsewhere = pod("p")
        elsewhere["metadata"]["namespace"] = "team-b"
        code, answer = await call(k, "POST", "/api/v1/namespaces/team-b/pods", elsewhere)
        assert code == 201, answer
        await create(k, POD_GROUPS, pod_group())
        await delete(k, POD_GROUPS, NS, "g")  # team-b's pod names a "g" of its own namespace
        assert await get(k, POD_GROUPS, NS, "g") is None
        held = pod_group("h")
        held["metadata"]["finalizers"] = ["x/y"]
        await create(k, POD_GROUPS, held)
        await delete(k, POD_GROUPS, NS, "h")
        left = await get(k, POD_GROUPS, NS, "h")  # protection released, x/y holds it
        assert left is not None and left["metadata"]["finalizers"] == ["x/y"]
        await patch(k, POD_GROUPS, NS, "h", {"metadata": {"finalizers": None}})
        assert await get(k, POD_GROUPS, NS, "h") is None


@pytest.mark.asyncio
async def test_a_terminating_pod_still_holds_its_pod_group_until_it_is_finished() -> None:
    async with emulator() as (k, _):
        k.pod_grace = True
        await create(k, POD_GROUPS, pod_group())
        await create(k, PODS, pod("a", node="n1", terminationGracePeriodSeconds=600))
        await delete(k, PODS, NS, "a")  # its grace: the pod's 600 s
        terminating = await get(k, PODS, NS, "a")
        assert terminating is not None
        assert terminating["metadata"]["deletionGracePeriodSeconds"] == 600
        await delete(k, POD_GROUPS, NS, "g")
        assert await get(k, POD_GROUPS, NS, "g") is not None
        assert await k.finish_pods(NS, "someone-else") == 0
        assert await k.finish_pods() == 1  # the kubelet is done with it
        assert await get(k, PODS, NS, "a") is None
        assert await get(k, POD_GROUPS, NS, "g") is None


@pytest.mark.asyncio
async def test_pods_honour_a_grace_period_only_when_asked_and_as_the_pod_strategy_says() -> None:
    async with emulator() as (k, _):
        await create(k, PODS, pod("off", node="n1"))
        await delete(k, PODS, NS, "off")
        assert await get(k, PODS, NS, "off") is None  # no `pod_grace`: at once
        k.pod_grace = True
        await create(k, PODS, pod("pending"))  # on no node: at once, grace or not
        await delete(k, PODS, NS, "pending", grace_period_seconds=30)
        assert await get(k, PODS, NS, "pending") is None
        done = pod("done", node="n1")
        done["status"] = {"phase": "Succeeded"}  # finished: at once
        await create(k, PODS, done)
        await delete(k, PODS, NS, "done")
        assert await get(k, PODS, NS, "done") is None
        await create(k, PODS, pod("forced", node="n1"))
        await delete(k, PODS, NS, "forced", grace_period_seconds=0)
        assert await get(k, PODS, NS, "forced") is None
        created = await create(k, PODS, pod("graceful", node="n1"))
        await delete(k, PODS, NS, "graceful", grace_period_seconds=5)
        held = await get(k, PODS, NS, "graceful")
        assert held is not None and held["metadata"]["deletionGracePeriodSeconds"] == 5
        assert SECONDS.match(held["metadata"]["deletionTimestamp"])
        await delete(k, PODS, NS, "graceful")  # again, with its default grace: no change
        assert await get(k, PODS, NS, "graceful") == held
        await delete(k, PODS, NS, "graceful", grace_period_seconds=0)  # a force delete
        assert await get(k, PODS, NS, "graceful") is None
        events = await events_since(k, PODS_URL, rv(created))
        assert [kind for kind, _ in events] == ["MODIFIED", "DELETED"]
        default = await create(k, PODS, pod("default", node="n1"))
        await delete(k, PODS, NS, "default")
        found = await get(k, PODS, NS, "default")
        assert found is not None and found["metadata"]["deletionGracePeriodSeconds"] == 30
        assert uid(found) == uid(default)


@pytest.mark.asyncio
async def test_a_finished_pod_still_waits_for_its_finalizers() -> None:
    async with emulator() as (k, _):
        k.pod_grace = True
        with_finalizer = pod("a", node="n1")
        with_finalizer["metadata"]["finalizers"] = ["batch.kubernetes.io/job-tracking"]
        await create(k, PODS, with_finalizer)
        await delete(k, PODS, NS, "a")
        await patch(k, PODS, NS, "a", {"metadata": {"finalizers": None}})
        left = await get(k, PODS, NS, "a")  # its grace period still runs
        assert left is not None and left["metadata"]["deletionGracePeriodSeconds"] == 30
        await patch(k, PODS, NS, "a", {"metadata": {"finalizers": ["x/y"]}})
        assert await k.finish_pods(NS) == 1
        finished = await get(k, PODS, NS, "a")
        assert finished is not None and finished["metadata"]["deletionGracePeriodSeconds"] == 0
        await patch(k, PODS, NS, "a", {"metadata": {"finalizers": None}})
        assert await get(k, PODS, NS, "a") is None


@pytest.mark.asyncio
async def test_a_pod_group_spec_is_immutable_but_its_gang_min_count() -> None:
    async with emulator() as (k, _):
        await create(k, POD_GROUPS, pod_group())
        url = f"{POD_GROUPS_URL}/g"
        path = "/spec/schedulingPolicy/gang/minCount"
        code, grown = await call(k, "PATCH", url, [{"op": "replace", "path": path, "value": 5}],
                                 JSON_PATCH)  # fmt: skip
        assert code == 200 and grown["spec"]["schedulingPolicy"] == {"gang": {"minCount": 5}}
        labelled = await patch(k, POD_GROUPS, NS, "g", {"metadata": {"labels": {"x": "y"}}})
        assert labelled["metadata"]["labels"] == {"x": "y"}
        refused = [
            ({"spec": {"schedulingConstraints": None}}, "spec.schedulingConstraints"),
            ({"spec": {"schedulingConstraints": {"topology": [{"key": "rack"}]}}},
             "spec.schedulingConstraints"),
            ({"spec": {"schedulingPolicy": {"gang": None, "basic": {}}}},
             "spec.schedulingPolicy"),
            ({"spec": {"workloadRef": {"workloadName": "v"}}}, "spec.workloadRef"),
            ({"spec": {"disruptionMode": {"all": {}}}}, "spec.disruptionMode"),
        ]  # fmt: skip
        for body, field in refused:
            code, answer = await call(k, "PATCH", url, body, MERGE_PATCH)
            assert_immutable(code, answer, "PodGroup.scheduling.k8s.io", "g", field)
        both: Json = {"spec": {"schedulingConstraints": None, "disruptionMode": {"all": {}}}}
        code, answer = await call(k, "PATCH", url, both, MERGE_PATCH)
        assert_immutable(code, answer, "PodGroup.scheduling.k8s.io", "g",
                         "spec.disruptionMode", "spec.schedulingConstraints")  # fmt: skip
        put = {**grown, "spec": {**grown["spec"], "schedulingConstraints": None}}
        code, answer = await call(k, "PUT", url, put)
        assert_immutable(code, answer, "PodGroup.scheduling.k8s.io", "g",
                         "spec.schedulingConstraints")  # fmt: skip
        assert (await get(k, POD_GROUPS, NS, "g")) == labelled


@pytest.mark.asyncio
async def test_on_1_36_v1alpha2_serves_the_gang_kinds_and_min_count_is_immutable_too() -> None:
    async with emulator(scheduling_version="v1alpha2") as (k, _):
        v1alpha2 = "/apis/scheduling.k8s.io/v1alpha2"
        code, listed = await call(k, "GET", v1alpha2)
        assert code == 200 and {r["name"] for r in listed["resources"]} >= {
            "workloads",
            "podgroups",
        }
        code, _ = await call(k, "GET", "/apis/scheduling.k8s.io/v1beta1")
        assert code == 404  # 1.36 has no v1beta1
        group = {**pod_group(), "apiVersion": "scheduling.k8s.io/v1alpha2"}
        await create(k, POD_GROUPS_V1ALPHA2, group)
        path = "/spec/schedulingPolicy/gang/minCount"
        code, answer = await call(
            k, "PATCH", f"{v1alpha2}/namespaces/{NS}/podgroups/g",
            [{"op": "replace", "path": path, "value": 5}], JSON_PATCH,
        )  # fmt: skip
        assert_immutable(code, answer, "PodGroup.scheduling.k8s.io", "g", "spec.schedulingPolicy")
        wl = {**gang_workload("node"), "apiVersion": "scheduling.k8s.io/v1alpha2"}
        await create(k, WORKLOADS_V1ALPHA2, wl)
        path = "/spec/podGroupTemplates/0/schedulingPolicy/gang/minCount"
        code, answer = await call(
            k, "PATCH", f"{v1alpha2}/namespaces/{NS}/workloads/w",
            [{"op": "replace", "path": path, "value": 5}], JSON_PATCH,
        )  # fmt: skip
        assert_immutable(code, answer, "Workload.scheduling.k8s.io", "w",
                         "spec.podGroupTemplates[0].schedulingPolicy")  # fmt: skip


@pytest.mark.asyncio
async def test_a_workload_spec_is_immutable_but_each_template_gang_min_count() -> None:
    async with emulator() as (k, _):
        created = await create(k, WORKLOADS, gang_workload("node", "launcher"))
        url = f"{WORKLOADS_URL}/w"
        path = "/spec/podGroupTemplates/1/schedulingPolicy/gang/minCount"
        ops = [{"op": "test", "path": "/spec/podGroupTemplates/1/name", "value": "launcher"},
               {"op": "replace", "path": path, "value": 1}]  # fmt: skip
        code, patched = await call(k, "PATCH", url, ops, JSON_PATCH)
        assert code == 200, patched
        assert patched["spec"]["podGroupTemplates"][1]["schedulingPolicy"]["gang"]["minCount"] == 1
        third = {"name": "extra", "schedulingPolicy": {"basic": {}}}
        refused: list[tuple[list[Json], str]] = [
            ([{"op": "add", "path": "/spec/podGroupTemplates/-", "value": third}],
             "spec.podGroupTemplates"),
            ([{"op": "remove", "path": "/spec/podGroupTemplates/1"}], "spec.podGroupTemplates"),
            ([{"op": "replace", "path": "/spec/podGroupTemplates/0/name", "value": "n"}],
             "spec.podGroupTemplates"),
            ([{"op": "remove", "path": "/spec/podGroupTemplates/0/schedulingConstraints"}],
             "spec.podGroupTemplates[0].schedulingConstraints"),
            ([{"op": "replace", "path": "/spec/podGroupTemplates/1/schedulingPolicy",
               "value": {"basic": {}}}], "spec.podGroupTemplates[1].schedulingPolicy"),
            ([{"op": "add", "path": "/spec/podGroupTemplates/0/disruptionMode",
               "value": {"all": {}}}], "spec.podGroupTemplates[0].disruptionMode"),
            ([{"op": "replace", "path": "/spec/controllerRef/name", "value": "other"}],
             "spec.controllerRef"),
        ]  # fmt: skip
        for change, field in refused:
            code, answer = await call(k, "PATCH", url, change, JSON_PATCH)
            assert_immutable(code, answer, "Workload.scheduling.k8s.io", "w", field)
        assert (await get(k, WORKLOADS, NS, "w")) == patched
        assert uid(patched) == uid(created)


@pytest.mark.asyncio
async def test_a_composite_pod_group_spec_is_immutable() -> None:
    async with emulator(composites=True) as (k, _):
        block = {"apiVersion": "scheduling.k8s.io/v1alpha3", "kind": "CompositePodGroup",
                 "metadata": {"name": "block", "namespace": NS},
                 "spec": {"workloadRef": {"workloadName": "w", "templateName": "block"},
                          "schedulingPolicy": {"gang": {"minGroupCount": 2}}}}  # fmt: skip
        await create(k, COMPOSITE_POD_GROUPS, block)
        url = f"/apis/scheduling.k8s.io/v1alpha3/namespaces/{NS}/compositepodgroups/block"
        for body, field in [
            ({"spec": {"schedulingConstraints": ZONE}}, "spec.schedulingConstraints"),
            ({"spec": {"schedulingPolicy": {"gang": {"minGroupCount": 1}}}},
             "spec.schedulingPolicy"),
        ]:  # fmt: skip
            code, answer = await call(k, "PATCH", url, body, MERGE_PATCH)
            assert_immutable(code, answer, "CompositePodGroup.scheduling.k8s.io", "block", field)


@pytest.mark.asyncio
async def test_a_pod_scheduling_group_is_set_at_creation_only() -> None:
    async with emulator() as (k, _):
        await create(k, PODS, pod("tied"))
        await create(k, PODS, pod("loose", None))
        changes = [
            ("tied", {"spec": {"schedulingGroup": {"podGroupName": "h"}}}),
            ("tied", {"spec": {"schedulingGroup": None}}),
            ("loose", {"spec": {"schedulingGroup": {"podGroupName": "g"}}}),
        ]
        for name, body in changes:
            code, answer = await call(k, "PATCH", f"{PODS_URL}/{name}", body, MERGE_PATCH)
            assert_immutable(code, answer, "Pod", name, "spec.schedulingGroup")
        labelled = await patch(k, PODS, NS, "tied", {"metadata": {"labels": {"x": "y"}}})
        assert labelled["spec"]["schedulingGroup"] == {"podGroupName": "g"}


@pytest.mark.asyncio
async def test_garbage_collection_of_a_pod_group_waits_for_the_pods_that_name_it() -> None:
    async with emulator() as (k, _):
        owner = await create(k, WORKLOADS, workload("owner"))
        await create(k, WORKLOADS, {**gang_workload(), "metadata": {
            **workload("w", owner)["metadata"]}})  # fmt: skip
        await create(k, POD_GROUPS, pod_group("g", owner))
        await create(k, PODS, pod("a"))
        await delete(k, WORKLOADS, NS, "owner")
        assert await get(k, WORKLOADS, NS, "w") is None
        held = await get(k, POD_GROUPS, NS, "g")
        assert held is not None and "deletionTimestamp" in held["metadata"]
        await delete(k, PODS, NS, "a")
        assert await get(k, POD_GROUPS, NS, "g") is None


@pytest.mark.asyncio
async def test_a_pod_group_gets_the_server_defaults() -> None:
    async with emulator() as (k, _):
        k.pod_group_defaults = True
        filled = await create(k, POD_GROUPS, pod_group())
        assert filled["spec"] == {
            **pod_group()["spec"],
            "disruptionMode": {"single": {}},
            "priority": 0,
            "preemptionPolicy": "PreemptLowerPriority",
        }
        k.pod_group_defaults = False
        bare = await create(k, POD_GROUPS, pod_group("h"))
        assert bare["spec"] == pod_group("h")["spec"]


def blocking(obj: Json, owner: Json) -> Json:
    """`obj` as a controller makes it: its owner's reference with `blockOwnerDeletion`."""
    ref = {"apiVersion": "v1", "kind": "X", "name": owner["metadata"]["name"], "uid": uid(owner),
           "controller": True, "blockOwnerDeletion": True}  # fmt: skip
    return {**obj, "metadata": {**obj["metadata"], "ownerReferences": [ref]}}


@pytest.mark.asyncio
async def test_a_foreground_delete_waits_for_the_dependents_that_block_it() -> None:
    async with emulator() as (k, _):
        owner = await create(k, WORKLOADS, workload("owner"))
        await create(k, POD_GROUPS, blocking(pod_group("g"), owner))
        await create(k, WORKLOADS, blocking(gang_workload(), owner))
        await create(k, WORKLOADS, workload("loose", owner))  # no blockOwnerDeletion
        await create(k, PODS, pod("a"))
        body = {"propagationPolicy": "Foreground"}
        code, answer = await call(k, "DELETE", f"{WORKLOADS_URL}/owner", body)
        assert code == 200 and answer["metadata"]["finalizers"] == ["foregroundDeletion"], answer
        for gone in ("w", "loose"):
            assert await get(k, WORKLOADS, NS, gone) is None, gone
        held = await get(k, POD_GROUPS, NS, "g")  # its pod holds it, and it holds the owner
        assert held is not None and "deletionTimestamp" in held["metadata"]
        deleting = await get(k, WORKLOADS, NS, "owner")
        assert deleting is not None and SECONDS.match(deleting["metadata"]["deletionTimestamp"])
        await delete(k, PODS, NS, "a")
        assert await get(k, POD_GROUPS, NS, "g") is None
        assert await get(k, WORKLOADS, NS, "owner") is None
        events = await events_since(k, WORKLOADS_URL, rv(owner))
        owner_events = [kind for kind, o in events if o["metadata"]["name"] == "owner"]
        assert owner_events == ["MODIFIED", "DELETED"]


@pytest.mark.asyncio
async def test_a_foreground_delete_with_nothing_blocking_goes_at_once_and_orphan_keeps_them() -> (
    None
):
    async with emulator() as (k, _):
        owner = await create(k, WORKLOADS, workload("owner"))
        await create(k, WORKLOADS, blocking(gang_workload(), owner))
        await delete(k, WORKLOADS, NS, "owner", propagation_policy="Foreground")
        assert await get(k, WORKLOADS, NS, "owner") is None
        assert await get(k, WORKLOADS, NS, "w") is None
        owner = await create(k, WORKLOADS, workload("owner"))
        await create(k, WORKLOADS, blocking(gang_workload(), owner))
        await delete(k, WORKLOADS, NS, "owner", propagation_policy="Orphan")
        assert await get(k, WORKLOADS, NS, "owner") is None
        orphan = await get(k, WORKLOADS, NS, "w")
        assert orphan is not None and "ownerReferences" not in orphan["metadata"]
        code, answer = await call(k, "DELETE", f"{WORKLOADS_URL}/w", {"propagationPolicy": "x"})
        assert code == 400, answer


@pytest.mark.asyncio
async def test_a_trainjob_reapplied_within_its_pods_grace_meets_its_terminating_pod_group() -> None:
    """The ghost a same-name gang would wait on: the old TrainJob's PodGroup outlives it for as
    long as its pods take to stop, and holds its name meanwhile."""
    async with emulator() as (k, _):
        k.pod_grace = True
        old = await create(k, TRAINJOBS, job())
        await create(k, POD_GROUPS, blocking(pod_group("g"), old))
        for name in ("a", "b"):  # stand-ins for the JobSet's pods, collected with the TrainJob
            await create(k, PODS, blocking(pod(name, node="n1"), old))
        await delete(k, TRAINJOBS, NS, "j")
        terminating = [await get(k, PODS, NS, name) for name in ("a", "b")]
        assert all(p is not None and p["metadata"]["deletionTimestamp"] for p in terminating)
        ghost = await get(k, POD_GROUPS, NS, "g")
        assert ghost is not None and "deletionTimestamp" in ghost["metadata"]
        new = await create(k, TRAINJOBS, job())  # re-applied: another uid, the same name
        assert uid(new) != uid(old)
        _, answer = await call(k, "POST", POD_GROUPS_URL, blocking(pod_group("g"), new))
        assert_status(answer, 409, "AlreadyExists")
        assert await k.finish_pods(NS, "a") == 1
        assert await get(k, POD_GROUPS, NS, "g") is not None  # b still names it
        assert await k.finish_pods(NS) == 1
        assert await get(k, POD_GROUPS, NS, "g") is None
        made = await create(k, POD_GROUPS, blocking(pod_group("g"), new))
        assert made["metadata"]["ownerReferences"][0]["uid"] == uid(new)


@pytest.mark.asyncio
async def test_an_object_deleted_and_created_again_gets_another_uid() -> None:
    async with emulator() as (k, _):
        first = await create(k, WORKLOADS, gang_workload())
        await delete(k, WORKLOADS, NS, "w")
        second = await create(k, WORKLOADS, gang_workload())
        assert uid(second) != uid(first)
        assert second["metadata"]["creationTimestamp"]
        code, answer = await call(k, "DELETE", f"{WORKLOADS_URL}/w",
                                  {"preconditions": {"uid": uid(first)}})  # fmt: skip
        assert code == 409, answer  # a delete meant for the first one misses the second


# --- discovery and the declared resources -------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("scheduling", [True, False])
async def test_discovery_lists_the_scheduling_resources_only_when_declared(
    scheduling: bool,
) -> None:
    async with emulator(scheduling=scheduling) as (k, _):
        async with k.get("/apis/scheduling.k8s.io/v1beta1") as response:
            if not scheduling:
                assert response.status == 404
                return
            assert response.status == 200
            listing = await response.json()
        assert (listing["kind"], listing["groupVersion"]) == (
            "APIResourceList",
            "scheduling.k8s.io/v1beta1",
        )
        found = {r["name"]: (r["kind"], r["namespaced"]) for r in listing["resources"]}
        assert found == {"workloads": ("Workload", True), "podgroups": ("PodGroup", True)}


@pytest.mark.asyncio
async def test_leases_events_and_the_scheduling_resources_are_served() -> None:
    async with emulator() as (k, _):
        for resource, kind in ((LEASES, "leases"), (EVENTS, "events")):
            group, version = resource.group, resource.version
            async with k.get(f"/apis/{group}/{version}") as response:
                names = [r["name"] for r in (await response.json())["resources"]]
                assert names == [kind]
        for resource in (WORKLOADS, POD_GROUPS, EVENTS, LEASES):
            created = await create(k, resource, {"metadata": {"name": "x", "namespace": NS}})
            assert created["apiVersion"] == f"{resource.group}/{resource.version}"
            await delete(k, resource, NS, "x")
    async with emulator(scheduling=False) as (k, _):
        code, answer = await call(k, "POST", WORKLOADS_URL, workload("w"))
        assert code == 404
        assert_status(answer, 404, "NotFound")


@pytest.mark.asyncio
async def test_the_official_client_sees_conflicts_as_the_writers_do() -> None:
    async with emulator() as (k, url), api_client(url) as api:
        created = await create(k, TRAINJOBS, {"metadata": {"name": "job", "namespace": NS}})
        objects = CustomObjectsApi(api)
        body = {"metadata": {"uid": "of-an-older-job", "annotations": {"a": "b"}}}
        with pytest.raises(ApiException) as caught:
            await objects.patch_namespaced_custom_object(
                TRAINER, VERSION, NS, "trainjobs", "job", body, _content_type=MERGE_PATCH
            )
        assert caught.value.status == 409
        body["metadata"]["uid"] = uid(created)
        patched: Any = await objects.patch_namespaced_custom_object(
            TRAINER, VERSION, NS, "trainjobs", "job", body, _content_type=MERGE_PATCH
        )
        assert patched["metadata"]["annotations"] == {"a": "b"}
        leases = CoordinationV1Api(api)
        await create(k, LEASES, lease())
        read = await leases.read_namespaced_lease("lock", NS)
        await replace(k, LEASES, lease(holderIdentity="b"))  # someone else writes meanwhile
        assert read.spec is not None
        read.spec.holder_identity = "c"
        with pytest.raises(ApiException) as caught:
            await leases.replace_namespaced_lease("lock", NS, read)
        assert caught.value.status == 409


# --- Secrets, webhook configurations and field selectors ----------------------------------------

SECRETS_URL = f"/api/v1/namespaces/{NS}/secrets"
MUTATING_URL = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def tls_secret(name: str, **data: str) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NS},
        "type": "kubernetes.io/tls",
        "data": data,
    }


@pytest.mark.asyncio
async def test_secrets_and_webhook_configurations_are_served_with_discovery() -> None:
    async with emulator() as (k, url), api_client(url) as api:
        async with k.get("/api/v1") as response:
            core = {r["name"]: r["namespaced"] for r in (await response.json())["resources"]}
        assert core == {"secrets": True, "nodes": False, "pods": True}
        async with k.get("/apis/admissionregistration.k8s.io/v1") as response:
            found = {r["name"]: r["namespaced"] for r in (await response.json())["resources"]}
        assert found == {
            "mutatingwebhookconfigurations": False,
            "validatingwebhookconfigurations": False,
        }
        await create(k, SECRETS, tls_secret("cert", **{"tls.crt": "YQ==", "tls.key": "Yg=="}))
        read = await CoreV1Api(api).read_namespaced_secret("cert", NS)
        assert (read.type, read.data) == (
            "kubernetes.io/tls",
            {"tls.crt": "YQ==", "tls.key": "Yg=="},
        )
        config = {"metadata": {"name": "hooks", "namespace": NS}, "webhooks": []}
        code, created = await call(k, "POST", MUTATING_URL, config)
        assert code == 201 and "namespace" not in created["metadata"]  # cluster-scoped
        in_a_namespace = f"/apis/admissionregistration.k8s.io/v1/namespaces/{NS}/mutating" + (
            "webhookconfigurations"
        )
        code, _ = await call(k, "POST", in_a_namespace, config)
        assert code == 404
        hooks = AdmissionregistrationV1Api(api)
        read_config = await hooks.read_mutating_webhook_configuration("hooks")
        assert read_config.metadata is not None and read_config.metadata.name == "hooks"


@pytest.mark.asyncio
async def test_a_tls_secret_must_hold_a_pair_and_keep_its_type() -> None:
    async with emulator() as (k, _):
        code, answer = await call(k, "POST", SECRETS_URL, tls_secret("s", **{"tls.crt": "YQ=="}))
        assert code == 422
        assert_status(
            answer, 422, "Invalid", 'Secret "s" is invalid: data[tls.key]: Required value'
        )
        created = await create(
            k, SECRETS, tls_secret("s", **{"tls.crt": "YQ==", "tls.key": "Yg=="})
        )
        changed = {**created, "type": "Opaque"}
        code, answer = await call(k, "PUT", f"{SECRETS_URL}/s", changed)
        assert code == 422
        assert "field is immutable" in answer["message"]
        emptied = {**created, "data": {}}
        code, _ = await call(k, "PUT", f"{SECRETS_URL}/s", emptied)
        assert code == 422


@pytest.mark.asyncio
async def test_field_selectors_pick_by_name_and_namespace_in_lists_and_watches() -> None:
    async with emulator() as (k, url), api_client(url) as api:
        for name, ns in (("a", NS), ("b", NS), ("a", "team-b")):
            await create(k, LEASES, {**lease(name), "metadata": {"name": name, "namespace": ns}})
        all_leases = "/apis/coordination.k8s.io/v1/leases"

        async def names(url: str, selector: str) -> list[tuple[str, str]]:
            async with k.get(url, params={"fieldSelector": selector}) as response:
                assert response.status == 200, await response.text()
                items = (await response.json())["items"]
                return sorted((i["metadata"]["namespace"], i["metadata"]["name"]) for i in items)

        assert await names(all_leases, "metadata.name=a") == [(NS, "a"), ("team-b", "a")]
        assert await names(all_leases, "metadata.name==a,metadata.namespace=team-b") == [
            ("team-b", "a")
        ]
        assert await names(LEASES_URL, "metadata.name!=a") == [(NS, "b")]
        assert await names(LEASES_URL, "") == [(NS, "a"), (NS, "b")]
        for bad, message in (("spec.holderIdentity=a", "field label not supported"), ("x", "")):
            async with k.get(LEASES_URL, params={"fieldSelector": bad}) as response:
                assert response.status == 400
                assert message in (await response.json())["message"]
        # a watch by name, through the official client, sees only that object
        listing = await CoordinationV1Api(api).list_namespaced_lease_without_preload_content(
            NS, field_selector="metadata.name=a", watch=True, timeout_seconds=1
        )
        await replace(k, LEASES, lease("b", holderIdentity="other"))
        await replace(k, LEASES, lease("a", holderIdentity="mine"))
        lines = [json.loads(line) async for line in listing.content if line.strip()]
        listing.release()
        seen = [(e["type"], e["object"]["metadata"]["name"]) for e in lines]
        assert seen == [("ADDED", "a"), ("MODIFIED", "a")]
        assert lines[-1]["object"]["spec"]["holderIdentity"] == "mine"


@pytest.mark.asyncio
async def test_label_selectors_pick_in_lists_and_watches_as_the_api_server_parses_them() -> None:
    async with emulator() as (k, url), api_client(url) as api:
        for name, labels in (("a", {"job": "x", "tier": "gpu"}), ("b", {"job": "y"}), ("c", {})):
            await create(k, PODS, {"metadata": {"name": name, "namespace": NS, "labels": labels}})
        pods = f"/api/v1/namespaces/{NS}/pods"

        async def names(selector: str) -> list[str]:
            async with k.get(pods, params={"labelSelector": selector}) as response:
                assert response.status == 200, await response.text()
                return sorted(i["metadata"]["name"] for i in (await response.json())["items"])

        assert await names("job=x") == ["a"]
        assert await names("job==x,tier=gpu") == ["a"]
        assert await names("job!=x") == ["b", "c"]
        assert await names("job in (x, y)") == ["a", "b"]
        assert await names("job notin (x),tier") == []
        assert await names("!job") == ["c"]
        assert await names("job") == ["a", "b"]
        async with k.get(pods, params={"labelSelector": "job in x"}) as response:
            assert response.status == 400
        # The official client's watch with a label selector sees only what matches.
        core = CoreV1Api(api)
        listing = await core.list_namespaced_pod_without_preload_content(
            NS, label_selector="job=y", watch=True, timeout_seconds=1
        )
        await patch(k, PODS, NS, "a", {"metadata": {"labels": {"edited": "1"}}})
        await patch(k, PODS, NS, "b", {"metadata": {"labels": {"edited": "1"}}})
        lines = [json.loads(line) async for line in listing.content if line.strip()]
        listing.release()
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines] == [
            ("ADDED", "b"),
            ("MODIFIED", "b"),
        ]


@pytest.mark.asyncio
async def test_lists_come_in_pages_with_continue_tokens() -> None:
    async with emulator() as (k, _):
        for i in range(5):
            await create(k, NODES, {"metadata": {"name": f"node-{i}"}})
        first_rv = k.resource_version
        seen: list[str] = []
        token = None
        pages = 0
        while True:
            params = {"limit": "2", **({"continue": token} if token else {})}
            async with k.get("/api/v1/nodes", params=params) as response:
                assert response.status == 200, await response.text()
                body = await response.json()
            pages += 1
            assert body["apiVersion"] == "v1" and body["kind"] == "NodeList"
            assert body["metadata"]["resourceVersion"] == str(first_rv)  # the first page's
            seen += [i["metadata"]["name"] for i in body["items"]]
            token = body["metadata"].get("continue")
            if pages == 1:
                assert body["metadata"]["remainingItemCount"] == 3
                await create(k, NODES, {"metadata": {"name": "node-9"}})  # after the last key
            if not token:
                break
        assert pages == 3 and seen == [*(f"node-{i}" for i in range(5)), "node-9"]
        async with k.get("/api/v1/nodes", params={"limit": "2", "continue": "garbage"}) as bad:
            assert bad.status == 400
        async with k.get("/api/v1/nodes", params={"limit": "2"}) as response:
            token = (await response.json())["metadata"]["continue"]
        await create(k, NODES, {"metadata": {"name": "node-10"}})
        k.compact()  # the token's version is history now
        async with k.get("/api/v1/nodes", params={"limit": "2", "continue": token}) as old:
            assert old.status == 410 and (await old.json())["reason"] == "Expired"


# --- the status subresource and server-side apply (TrainJobs) ----------------------------------

JOBS_URL = f"/apis/{TRAINER}/{VERSION}/namespaces/{NS}/trainjobs"
JOB_URL = f"{JOBS_URL}/j"
AT = "2026-03-04T05:06:07Z"


def job(**status: Any) -> Json:
    obj: Json = {
        "apiVersion": f"{TRAINER}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": "j", "namespace": NS},
        "spec": {"runtimeRef": {"name": "rt"}},
    }
    if status:
        obj["status"] = status
    return obj


def cond(kind: str, status: str = "True", **extra: Any) -> Json:
    fields = {"reason": kind, "message": "", "lastTransitionTime": AT, **extra}
    return {"type": kind, "status": status, **fields}


async def apply_status(
    k: VersionedEmulator, *conditions: Json, manager: str = "svc", query: str = ""
) -> tuple[int, Json]:
    body = job(conditions=list(conditions))
    url = f"{JOB_URL}/status?fieldManager={manager}{query}"
    return await call(k, "PATCH", url, body, "application/apply-patch+yaml")


@pytest.mark.asyncio
async def test_the_status_subresource_writes_the_status_and_the_object_all_but_it() -> None:
    async with emulator() as (k, _):
        created = await create(k, TRAINJOBS, job(conditions=[cond("Created")]))
        assert "status" not in created  # a create drops it: written only through .../status

        # A TrainJob's PUT must name the version it replaces (no unconditional update).
        code, answer = await call(k, "PUT", f"{JOB_URL}/status", job(conditions=[]))
        assert_status(answer, 422, "Invalid", f'trainjobs.{TRAINER} "j" is invalid: '
                      "metadata.resourceVersion: Invalid value: 0x0: must be specified for an "
                      "update")  # fmt: skip
        # PUT .../status: the status is taken, a change to the spec in the same body is not.
        body = job(conditions=[cond("Created")])
        body["metadata"]["resourceVersion"] = rv(created)
        body["spec"]["suspend"] = True
        code, put = await call(k, "PUT", f"{JOB_URL}/status", body)
        assert code == 200, put
        assert put["status"] == {"conditions": [cond("Created")]}
        assert put["spec"] == created["spec"] and put["metadata"]["generation"] == 1
        assert await events_since(k, JOBS_URL, rv(created)) == [("MODIFIED", put)]

        # The object's own endpoint keeps the stored status, takes the rest.
        change = {"spec": {"suspend": True}, "status": {"conditions": []}}
        code, patched = await call(k, "PATCH", JOB_URL, change, MERGE_PATCH)
        assert code == 200, patched
        assert patched["status"] == put["status"] and patched["spec"]["suspend"] is True
        assert patched["metadata"]["generation"] == 2  # the spec moved it; the status never does
        code, merged = await call(k, "PATCH", f"{JOB_URL}/status", {"status": None}, MERGE_PATCH)
        assert code == 200 and "status" not in merged and merged["metadata"]["generation"] == 2
        ops = [{"op": "add", "path": "/status", "value": {"conditions": [cond("Created")]}}]
        code, patched = await call(k, "PATCH", f"{JOB_URL}/status", ops, JSON_PATCH)
        assert code == 200 and patched["status"] == put["status"]

        # GET .../status is the whole object; no other subresource; no status subresource on a
        # kind that has none; a status is not deleted.
        code, read = await call(k, "GET", f"{JOB_URL}/status")
        assert (code, read) == (200, patched)
        for method, url in (("GET", f"{JOB_URL}/scale"), ("GET", f"{WORKLOADS_URL}/w/status")):
            code, answer = await call(k, method, url)
            assert code == 404, (url, answer)
        code, answer = await call(k, "DELETE", f"{JOB_URL}/status")
        assert_status(answer, 405, "MethodNotAllowed")
        code, stale = await call(k, "PUT", f"{JOB_URL}/status", created)  # an old resourceVersion
        assert_status(stale, 409, "Conflict")

        async with k.get(f"/apis/{TRAINER}/{VERSION}") as response:
            names = {r["name"] for r in (await response.json())["resources"]}
        assert {"trainjobs", "trainjobs/status"} <= names


@pytest.mark.asyncio
async def test_apply_asks_a_field_manager_and_checks_what_it_is_given() -> None:
    async with emulator() as (k, _):
        created = await create(k, TRAINJOBS, job())
        url = f"{JOB_URL}/status"
        apply = "application/apply-patch+yaml"

        code, answer = await call(k, "PATCH", url, job(), apply)
        assert_status(
            answer,
            422,
            "Invalid",
            'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
            "is required for apply patch",
        )
        assert answer["details"]["causes"][0]["field"] == "fieldManager"
        code, answer = await call(k, "PATCH", f"{url}?force=true", {"status": {}}, MERGE_PATCH)
        assert_status(answer, 422, "Invalid")
        assert "force: Forbidden: may not be specified for non-apply patch" in answer["message"]
        code, answer = await call(k, "PATCH", url, {"status": {}}, STRATEGIC_MERGE_PATCH)
        assert_status(answer, 415, "UnsupportedMediaType")  # a custom resource: none of those
        assert "application/apply-patch+yaml" in answer["message"]

        wrong_version = {**job(), "apiVersion": f"{TRAINER}/v1"}
        wrong_name = job()
        wrong_name["metadata"]["name"] = "other"
        with_fields = job()
        with_fields["metadata"]["managedFields"] = [{"manager": "x", "operation": "Apply"}]
        for body, code_wanted in ((wrong_version, 400), (wrong_name, 400), (with_fields, 400)):
            code, answer = await call(k, "PATCH", f"{url}?fieldManager=m", body, apply)
            assert code == code_wanted, answer
        stale = job()
        stale["metadata"]["resourceVersion"] = "1"
        await patch(k, TRAINJOBS, NS, "j", {"metadata": {"labels": {"a": "b"}}})
        code, answer = await call(k, "PATCH", f"{url}?fieldManager=m", stale, apply)
        assert_status(answer, 409, "Conflict")
        gone = job()
        gone["metadata"]["name"] = "gone"
        code, answer = await call(k, "PATCH", f"{JOBS_URL}/gone/status?fieldManager=m", gone, apply)
        assert code == 404, answer  # no create by an apply (never on .../status anyway)

        # YAML, as kubectl sends it; only the status counts on .../status.
        yaml_body = (
            f"apiVersion: {TRAINER}/{VERSION}\nkind: TrainJob\nmetadata:\n  name: j\n"
            "  labels: {ignored: here}\nspec: {suspend: true}\n"
            f"status:\n  conditions:\n  - {{type: A, status: 'True', reason: A, message: '',"
            f" lastTransitionTime: '{AT}'}}\n"
        )
        headers = {"Content-Type": apply}
        async with k.patch(f"{url}?fieldManager=m", data=yaml_body, headers=headers) as response:
            assert response.status == 200, await response.text()
            applied = await response.json()
        assert applied["status"] == {"conditions": [cond("A")]}
        assert applied["spec"] == created["spec"] and applied["metadata"]["labels"] == {"a": "b"}


@pytest.mark.asyncio
async def test_a_status_is_checked_against_the_crd_schema() -> None:
    async with emulator() as (k, _):
        created = await create(k, TRAINJOBS, job())
        cases: list[tuple[list[Json], str, str, str]] = [
            ([cond(f"C{i}") for i in range(9)], "status.conditions", "FieldValueTooMany",
             "Too many: 9: must have at most 8 items"),
            ([cond("A", reason="no spaces")], "status.conditions[0].reason", "FieldValueInvalid",
             "Invalid value: \"no spaces\": status.conditions[0].reason in body should match "
             "'^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$'"),
            ([{"type": "A", "status": "True", "reason": "A", "lastTransitionTime": AT}],
             "status.conditions[0].message", "FieldValueRequired", "Required value"),
            ([cond("A", "Maybe")], "status.conditions[0].status", "FieldValueNotSupported",
             'Unsupported value: "Maybe": supported values: "True", "False", "Unknown"'),
            ([cond("A"), cond("A", "False")], "status.conditions[1]", "FieldValueDuplicate",
             'Duplicate value: map[string]interface {}{"type":"A"}'),
        ]  # fmt: skip
        for conditions, field, reason, message in cases:
            body = job(conditions=conditions)
            body["metadata"]["resourceVersion"] = rv(created)
            _, answer = await call(k, "PUT", f"{JOB_URL}/status", body)
            assert_status(answer, 422, "Invalid")
            cause = {"reason": reason, "message": message, "field": field}
            assert cause in answer["details"]["causes"], answer
            assert answer["message"] == f'TrainJob.{TRAINER} "j" is invalid: {field}: {message}'
        _, answer = await apply_status(k, *[cond(f"C{i}") for i in range(9)])
        assert_status(answer, 422, "Invalid")  # an apply too
        _, answer = await apply_status(k, {"status": "True"})
        assert_status(answer, 422, "Invalid")  # an item without its key
        assert 'omits key field "type"' in answer["message"]
        assert (await get(k, TRAINJOBS, NS, "j") or {}).get("status") is None
        # A keyed list of the spec too: its items must have their keys (env, by name).
        other = job()
        other["metadata"]["name"] = "other"
        other["spec"]["trainer"] = {"env": [{"value": "no name"}]}
        _, answer = await call(k, "POST", JOBS_URL, other)
        assert_status(answer, 422, "Invalid")
        assert answer["details"]["causes"][0]["field"] == "spec.trainer.env[0]"


@pytest.mark.asyncio
async def test_managed_fields_say_who_set_what_in_the_api_servers_format() -> None:
    async with emulator() as (k, url), api_client(url) as api:
        await create(k, TRAINJOBS, job())
        custom = CustomObjectsApi(api)
        body = job(conditions=[cond("G", "False", observedGeneration=1)])
        applied: Any = await custom.patch_namespaced_custom_object_status(
            TRAINER, VERSION, NS, "trainjobs", "j", body,
            field_manager="svc", force=True, _content_type="application/apply-patch+yaml",
        )  # fmt: skip
        assert applied["status"]["conditions"] == body["status"]["conditions"]
        first, second = applied["metadata"]["managedFields"]
        assert SECONDS.match(first.pop("time")) and SECONDS.match(second.pop("time"))
        assert first == {
            "manager": "svc",
            "operation": "Apply",
            "apiVersion": f"{TRAINER}/{VERSION}",
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:status": {
                    "f:conditions": {
                        'k:{"type":"G"}': {
                            ".": {},
                            "f:lastTransitionTime": {},
                            "f:message": {},
                            "f:observedGeneration": {},
                            "f:reason": {},
                            "f:status": {},
                            "f:type": {},
                        }
                    }
                }
            },
            "subresource": "status",
        }
        assert second["operation"] == "Update" and "subresource" not in second
        assert second["fieldsV1"] == {"f:spec": {".": {}, "f:runtimeRef": {".": {}, "f:name": {}}}}

        # Applied again without a field it applied before: the field goes (nobody else owns it).
        code, fewer = await apply_status(k, cond("G", "False"))
        assert code == 200 and fewer["status"]["conditions"] == [cond("G", "False")]
        # The official client's own writes are its User-Agent's: "OpenAPI-Generator".
        updated: Any = await custom.patch_namespaced_custom_object_status(
            TRAINER, VERSION, NS, "trainjobs", "j",
            {"status": {"conditions": [cond("G", "False"), cond("H")]}},
        )  # fmt: skip
        managers = {(e["manager"], e["operation"]) for e in updated["metadata"]["managedFields"]}
        assert ("OpenAPI-Generator", "Update") in managers
        # Applying nothing of its own: its fields go, and so does a status left empty.
        code, emptied = await apply_status(k)
        assert code == 200 and emptied["status"]["conditions"] == [cond("H")]
        code, answer = await call(
            k, "PUT", f"{JOB_URL}/status", {**job(), "metadata": emptied["metadata"]}
        )
        assert code == 200 and "status" not in answer
        # Left: the creator's spec, under kmock's test client's User-Agent ("kmock/...").
        assert {e["manager"] for e in answer["metadata"]["managedFields"]} == {"kmock"}


@pytest.mark.asyncio
async def test_an_apply_to_the_object_itself_owns_its_fields_and_leaves_the_status() -> None:
    async with emulator() as (k, _):
        await create(k, TRAINJOBS, job())
        await apply_status(k, cond("G"))
        apply = "application/apply-patch+yaml"
        body = job(conditions=[])  # a status here is not this endpoint's: ignored
        body["spec"]["suspend"] = True
        body["metadata"]["labels"] = {"team": "a"}
        code, applied = await call(k, "PATCH", f"{JOB_URL}?fieldManager=kubectl", body, apply)
        assert code == 200, applied
        assert applied["spec"]["suspend"] is True and applied["metadata"]["labels"] == {"team": "a"}
        assert applied["status"]["conditions"] == [cond("G")]
        assert applied["metadata"]["generation"] == 2
        (mine,) = [e for e in applied["metadata"]["managedFields"] if e["manager"] == "kubectl"]
        assert mine["operation"] == "Apply" and "subresource" not in mine
        assert mine["fieldsV1"] == {
            "f:metadata": {"f:labels": {"f:team": {}}},
            "f:spec": {"f:runtimeRef": {"f:name": {}}, "f:suspend": {}},
        }
        other = job()
        other["spec"]["suspend"] = False
        code, answer = await call(k, "PATCH", f"{JOB_URL}?fieldManager=other", other, apply)
        assert_status(answer, 409, "Conflict")
        assert [c["field"] for c in answer["details"]["causes"]] == [".spec.suspend"]


# kmock's protected methods the emulators override or call (tests/kube_emulator.py,
# tests/kube_rbac.py, the benchmark's FastEmulator): kmock has no public way to change how its
# emulator answers. A release that renames one would leave an override silently unused.
KMOCK_HOOKS = [
    (kmock.RawHandler, "_handle"),  # the 201 of a create, RBAC; called to skip kmock's writes
    (kmock.KubernetesEmulator, "_handle"),  # kmock's own writes, which VersionedEmulator skips
    (kmock.KubernetesScaffold, "_render_error"),  # an ApiError as the API server's Status body
    (kmock.KubernetesScaffold, "_get_resources"),  # the benchmark's declared-only discovery
    *[
        (kmock.KubernetesEmulator, f"_serve_{verb}")  # what kmock's fallbacks call
        for verb in ("list", "watch", "fetch", "create", "update", "delete")
    ],
]


@pytest.mark.parametrize(("base", "name"), KMOCK_HOOKS, ids=lambda v: getattr(v, "__name__", v))
def test_the_kmock_methods_the_emulators_override_are_still_there(base: type, name: str) -> None:
    assert name in vars(base), (
        f"kmock {version('kmock')} no longer defines {base.__name__}.{name}, which the tests'"
        " emulators override or call: follow its rename there"
    )

"""The service's condition and the Trainer controller's share `status.conditions` of a TrainJob,
over HTTP to the emulator's status subresource, as they would on a real API server.

The service applies its one condition (`GangScheduling`) with server-side apply under its own
field manager, forced. Trainer writes its own conditions the three ways a controller can:
an Update of the whole status (controller-runtime's `Status().Update()`), a JSON merge patch
computed against its cached copy (`Status().Patch(client.MergeFrom(prev))`, what Trainer does),
and its own apply. Neither removes, changes or reorders the other's conditions, except the merge
patch from a stale copy, which replaces the whole list: then the service's next apply puts its
condition back and takes back its fields.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kmock import KubernetesEmulator

from tests.builders import trainjob
from tests.kube_emulator import (
    APPLY_PATCH,
    MERGE_PATCH,
    TRAINJOBS,
    VersionedEmulator,
    create,
    emulator,
    get,
)

Json = dict[str, Any]
NS, NAME = "team-a", "my-job"
URL = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs/{NAME}/status"
SERVICE = "trainjob-scheduling-webhook"
TRAINER = "trainer-controller-manager"
GANG = "GangScheduling"
AT = "2026-03-04T05:06:07Z"


def condition(kind: str, status: str = "True", reason: str = "", message: str = "") -> Json:
    return {
        "type": kind,
        "status": status,
        "reason": reason or kind,
        "message": message or f"{kind} is {status}",
        "lastTransitionTime": AT,
    }


def gang(reason: str = "WaitingForCapacity", message: str = "0/64 pods bound") -> Json:
    return {**condition(GANG, "False", reason, message), "observedGeneration": 1}


async def write(k: KubernetesEmulator, method: str, query: str, body: Any, media: str) -> Json:
    headers = {"Content-Type": media}
    async with k.request(method, URL + query, data=json.dumps(body), headers=headers) as response:
        answer: Json = await response.json()
        assert response.status == 200, answer
        return answer


async def service_applies(k: KubernetesEmulator, condition: Json) -> Json:
    """The service's write: its one condition, applied, forced (what webhook/kube/writer does)."""
    config = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": NAME, "namespace": NS},
        "status": {"conditions": [condition]},
    }
    return await write(k, "PATCH", f"?fieldManager={SERVICE}&force=true", config, APPLY_PATCH)


async def trainer_updates(k: KubernetesEmulator, obj: Json, *mine: Json) -> Json:
    """controller-runtime's `Status().Update()`: Trainer's copy with its conditions set (by
    type, in place or appended), the whole object PUT, its resourceVersion a precondition."""
    obj = copy.deepcopy(obj)
    conditions = obj.setdefault("status", {}).setdefault("conditions", [])
    for c in mine:
        at = next((i for i, old in enumerate(conditions) if old["type"] == c["type"]), None)
        if at is None:
            conditions.append(c)
        else:
            conditions[at] = c
    return await write(k, "PUT", f"?fieldManager={TRAINER}", obj, "application/json")


async def trainer_patches(k: KubernetesEmulator, prev: Json, *mine: Json) -> Json:
    """Trainer's `Status().Patch(ctx, job, client.MergeFrom(prev))`: its cached copy with its
    conditions set, sent as a JSON merge patch, which carries the whole `conditions` list."""
    cached = copy.deepcopy(prev.get("status") or {}).get("conditions") or []
    for c in mine:
        cached = [old for old in cached if old["type"] != c["type"]] + [c]
    body = {"status": {"conditions": cached}}
    return await write(k, "PATCH", f"?fieldManager={TRAINER}", body, MERGE_PATCH)


async def trainer_applies(k: KubernetesEmulator, *mine: Json) -> Json:
    config = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": NAME, "namespace": NS},
        "status": {"conditions": list(mine)},
    }
    return await write(k, "PATCH", f"?fieldManager={TRAINER}", config, APPLY_PATCH)


def conditions(obj: Json) -> list[Json]:
    found: list[Json] = obj.get("status", {}).get("conditions", [])
    return found


def types(obj: Json) -> list[str]:
    return [c["type"] for c in conditions(obj)]


def owned(obj: Json, manager: str) -> set[str]:
    """The condition types whose fields `manager` owns (any of its entries)."""
    found = set()
    for entry in obj["metadata"].get("managedFields", []):
        if entry["manager"] != manager:
            continue
        listed = entry["fieldsV1"].get("f:status", {}).get("f:conditions", {})
        found |= {json.loads(key[2:])["type"] for key in listed if key.startswith("k:")}
    return found


def entry(obj: Json, manager: str) -> Json:
    entries: list[Json] = obj["metadata"]["managedFields"]
    (found,) = [e for e in entries if e["manager"] == manager]
    return found


@contextlib.asynccontextmanager
async def one_trainjob() -> AsyncIterator[VersionedEmulator]:
    async with emulator() as (k, _):
        await create(k, TRAINJOBS, trainjob(NAME, namespace=NS))
        yield k


async def stored(k: KubernetesEmulator) -> Json:
    obj = await get(k, TRAINJOBS, NS, NAME)
    assert obj is not None
    return obj


@pytest.mark.asyncio
async def test_trainer_updating_the_whole_status_keeps_the_service_condition() -> None:
    async with one_trainjob() as k:
        await trainer_updates(k, await stored(k), condition("Created"))
        ours = await service_applies(k, gang())
        assert types(ours) == ["Created", GANG]

        # Trainer reads the object again (its informer saw the apply), sets its conditions, PUTs.
        after = await trainer_updates(
            k, ours, condition("Suspended"), condition("Created", "False")
        )
        assert types(after) == ["Created", GANG, "Suspended"]
        assert conditions(after)[1] == gang()  # content and place unchanged
        assert owned(after, SERVICE) == {GANG}
        assert owned(after, TRAINER) == {"Created", "Suspended"}  # not ours: it did not change it

        # The service's next apply changes only its condition; Trainer's stay as they were.
        again = await service_applies(k, gang("Scheduled", "every gang is placed"))
        assert [c for c in conditions(again) if c["type"] != GANG] == [
            c for c in conditions(after) if c["type"] != GANG
        ]
        assert types(again) == ["Created", GANG, "Suspended"]
        assert conditions(again)[1]["reason"] == "Scheduled"

        # Applying the same again changes nothing: no new version, no event to wake Trainer.
        events = len(k.changes(TRAINJOBS))
        same = await service_applies(k, gang("Scheduled", "every gang is placed"))
        assert same["metadata"]["resourceVersion"] == again["metadata"]["resourceVersion"]
        assert len(k.changes(TRAINJOBS)) == events


@pytest.mark.asyncio
async def test_a_stale_merge_patch_drops_the_condition_and_the_next_apply_restores_it() -> None:
    async with one_trainjob() as k:
        first = await trainer_patches(k, await stored(k), condition("Created"))
        prev = copy.deepcopy(first)  # Trainer's cache, before it sees the service's condition
        ours = await service_applies(k, gang())
        assert types(ours) == ["Created", GANG]

        # Both react to the same suspend: Trainer patches from its stale copy and replaces the list.
        dropped = await trainer_patches(k, prev, condition("Suspended"))
        assert types(dropped) == ["Created", "Suspended"]
        assert owned(dropped, SERVICE) == set()  # its entry went with its last field

        restored = await service_applies(k, gang("Suspended", "the TrainJob is suspended"))
        assert types(restored) == ["Created", "Suspended", GANG]  # Trainer's order kept, ours last
        assert conditions(restored)[:2] == conditions(dropped)
        assert owned(restored, SERVICE) == {GANG}
        assert owned(restored, TRAINER) == {"Created", "Suspended"}


@pytest.mark.asyncio
async def test_a_merge_patch_reverting_the_condition_takes_its_fields_force_takes_them_back() -> (
    None
):
    async with one_trainjob() as k:
        await trainer_patches(k, await stored(k), condition("Created"))
        await service_applies(k, gang())
        prev = await stored(k)  # Trainer's cache holds the service's first condition
        await service_applies(k, gang("Scheduled", "every gang is placed"))

        reverted = await trainer_patches(k, prev, condition("Suspended"))
        assert [c for c in conditions(reverted) if c["type"] == GANG] == [gang()]  # the old one
        assert GANG in owned(
            reverted, TRAINER
        )  # the merge patch changed those fields: Trainer's now

        # Without force the service's apply is refused, naming the manager and each field.
        config = {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": NAME, "namespace": NS},
            "status": {"conditions": [gang("Scheduled", "every gang is placed")]},
        }
        headers = {"Content-Type": APPLY_PATCH}
        url = f"{URL}?fieldManager={SERVICE}"
        async with k.patch(url, data=json.dumps(config), headers=headers) as response:
            refused = await response.json()
            assert response.status == 409
        assert refused["reason"] == "Conflict"
        manager = f'"{TRAINER}" with subresource "status" using trainer.kubeflow.org/v1alpha1'
        assert refused["message"].startswith(
            f"Apply failed with 2 conflicts: conflicts with {manager}:"
        )
        assert {c["field"] for c in refused["details"]["causes"]} == {
            '.status.conditions[type="GangScheduling"].message',
            '.status.conditions[type="GangScheduling"].reason',
        }
        assert all(c["message"] == f"conflict with {manager}" for c in refused["details"]["causes"])
        assert await stored(k) == reverted  # refused: nothing stored

        # With force (what the service sends) it is applied and the fields come back to it.
        forced = await service_applies(k, gang("Scheduled", "every gang is placed"))
        assert [c for c in conditions(forced) if c["type"] == GANG] == [
            gang("Scheduled", "every gang is placed")
        ]
        assert owned(forced, SERVICE) == {GANG}
        assert GANG not in owned(forced, TRAINER)  # it owned only what it had changed
        assert types(forced) == types(reverted)


@pytest.mark.asyncio
async def test_trainer_applying_its_conditions_keeps_the_service_condition() -> None:
    async with one_trainjob() as k:
        await trainer_applies(k, condition("Created"), condition("Suspended", "False"))
        ours = await service_applies(k, gang())
        assert types(ours) == ["Created", "Suspended", GANG]

        # Trainer's next apply changes its conditions, adds one; ours keeps its content and place.
        theirs = await trainer_applies(
            k, condition("Created"), condition("Suspended", "True"), condition("Complete")
        )
        assert types(theirs) == ["Created", "Suspended", GANG, "Complete"]
        assert conditions(theirs)[2] == gang()
        # It omits a condition it applied before: gone, as nobody else owns it; ours stays.
        fewer = await trainer_applies(k, condition("Created"), condition("Complete"))
        assert types(fewer) == ["Created", GANG, "Complete"]
        assert owned(fewer, TRAINER) == {"Created", "Complete"} and owned(fewer, SERVICE) == {GANG}

        # The service's apply keeps Trainer's conditions exactly, in their order.
        mine = await service_applies(k, gang("Scheduled", "every gang is placed"))
        assert [c for c in conditions(mine) if c["type"] != GANG] == [
            c for c in conditions(fewer) if c["type"] != GANG
        ]
        assert types(mine) == ["Created", GANG, "Complete"]
        assert entry(mine, SERVICE)["operation"] == "Apply"
        assert entry(mine, TRAINER)["operation"] == "Apply"


@pytest.mark.asyncio
async def test_applying_a_field_another_manager_owns_conflicts_unless_forced() -> None:
    async with one_trainjob() as k:
        await trainer_updates(k, await stored(k), condition("Created"))
        config = {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": NAME, "namespace": NS},
            "status": {"conditions": [{**condition("Created"), "status": "False"}]},
        }
        headers = {"Content-Type": APPLY_PATCH}
        async with k.patch(f"{URL}?fieldManager={SERVICE}", data=json.dumps(config),
                           headers=headers) as response:  # fmt: skip
            refused = await response.json()
            assert response.status == 409
        manager = f'"{TRAINER}" with subresource "status" using trainer.kubeflow.org/v1alpha1'
        field = '.status.conditions[type="Created"].status'
        assert (
            refused["message"] == f"Apply failed with 1 conflict: conflict with {manager}: {field}"
        )
        assert refused["details"]["causes"] == [
            {
                "reason": "FieldManagerConflict",
                "message": f"conflict with {manager}",
                "field": field,
            }
        ]

        # The same value is no conflict: both own the field then.
        same = {**config, "status": {"conditions": [condition("Created")]}}
        shared = await write(k, "PATCH", f"?fieldManager={SERVICE}", same, APPLY_PATCH)
        assert owned(shared, SERVICE) == owned(shared, TRAINER) == {"Created"}

        forced = await write(k, "PATCH", f"?fieldManager={SERVICE}&force=true", config, APPLY_PATCH)
        assert conditions(forced) == [{**condition("Created"), "status": "False"}]
        trainer_fields = entry(forced, TRAINER)["fieldsV1"]["f:status"]["f:conditions"]
        assert "f:status" not in trainer_fields['k:{"type":"Created"}']  # moved to the service

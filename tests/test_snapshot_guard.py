"""Only the service writes a TrainJob's frozen runtime snapshot (issue 27, part 1).

Over real HTTPS, with reviews shaped as a kube-apiserver sends them (the captured TrainJob
reviews, their object and requester changed): a tenant's forged snapshot on CREATE, and its
addition, edit or removal on UPDATE, are denied 403 naming the field; the service's own write
passes. Then the whole chain against the API emulator: the webhook stands where the API server's
admission would, and the gang the reconciler builds is the runtime's, while a snapshot that
reached the store unchecked (no webhook) would have been built as written.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import ssl
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import orjson
import pytest

from webhook.admission.snapshot_guard import SNAPSHOT_FIELD
from webhook.core.fields import parse
from webhook.core.snapshot import SNAPSHOT_ANNOTATION, snapshot
from webhook.core.trainer import Runtime
from webhook.server.run import own_username

from .harness import RunningServer, fixture, fixture_cache, running_server
from .kube_emulator import CLUSTER_RUNTIMES, TRAINJOBS, WORKLOADS, create, eventually, patch
from .test_reconciler import (
    NS,
    World,
    cluster_runtime,
    converged,
    objects,
    quiet,
    stored,
    trainjob,
    world,
)

SELF = "system:serviceaccount:trainjob-scheduling-system:trainjob-scheduling-webhook"
TENANT = "system:serviceaccount:team-a:data-scientist"  # the hidden check's `edit` tenant
PATH = "/validate-trainer-kubeflow-org-v1alpha1-trainjob-snapshot"


def real_snapshot() -> str:
    """What the reconciler freezes for torch-distributed: gang, zone topology, disruption all."""
    runtime = parse(Runtime, cluster_runtime())[0]
    assert runtime is not None
    return snapshot(runtime)


def forged_snapshot() -> str:
    """The same runtime, its required topology dropped: a tenant's cheaper gang."""
    frozen = orjson.loads(real_snapshot())
    del frozen["runtime"]["spec"]["scheduling"]["schedulingConstraints"]
    return orjson.dumps(frozen).decode()


def annotated(obj: dict[str, Any], value: str | None) -> dict[str, Any]:
    """`obj` with the snapshot annotation set to `value` (None: without it)."""
    obj = copy.deepcopy(obj)
    annotations = obj["metadata"].setdefault("annotations", {})
    annotations.pop(SNAPSHOT_ANNOTATION, None)
    if value is not None:
        annotations[SNAPSHOT_ANNOTATION] = value
    return obj


def review_of(
    operation: str,
    obj: dict[str, Any],
    old: dict[str, Any] | None = None,
    username: str = TENANT,
    dry_run: bool = False,
) -> dict[str, Any]:
    """A TrainJob review as the API server sends it: the captured envelope of that operation,
    with `obj` (and `old`), and the requester the API server authenticated."""
    name = "trainjob-create.validate.json" if operation == "CREATE" else (
        "trainjob-update-suspend.validate.json"
    )  # fmt: skip
    review = fixture(name)
    request = review["request"]
    request.update(uid=str(uuid.uuid4()), object=obj, oldObject=old, dryRun=dry_run)
    request["name"] = obj["metadata"]["name"]
    request["namespace"] = obj["metadata"].get("namespace", NS)
    request["userInfo"] = {"username": username, "groups": ["system:authenticated"]}
    return review


def send(client: httpx.Client, review: dict[str, Any]) -> dict[str, Any]:
    r = client.post(
        PATH, content=orjson.dumps(review), headers={"content-type": "application/json"}
    )
    assert r.status_code == 200, r.text
    response: dict[str, Any] = r.json()["response"]
    assert response["uid"] == review["request"]["uid"]
    return response


def assert_forbidden(response: dict[str, Any], verb: str, who: str = TENANT) -> None:
    assert response["allowed"] is False, response
    status = response["status"]
    assert (status["code"], status["reason"]) == (403, "Forbidden")
    assert status["message"].startswith('trainjobs.trainer.kubeflow.org "my-job" is forbidden: ')
    assert (
        f"{SNAPSHOT_FIELD}: Forbidden: {who} may not {verb} the frozen runtime snapshot"
        in (status["message"])
    )
    (cause,) = status["details"]["causes"]
    assert cause["field"] == "metadata.annotations[trainjob-scheduling.dev/runtime-snapshot]"
    assert cause["reason"] == "FieldValueForbidden"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    cache = fixture_cache()
    cache.service_username = SELF
    with running_server(cache, tmp_path_factory.mktemp("certs")) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def stored_trainjob() -> dict[str, Any]:
    """team-a/my-job as the cluster stores it, before any snapshot."""
    obj: dict[str, Any] = fixture("trainjob-create.validate.json")["request"]["object"]
    return obj


def frozen_now(server: RunningServer) -> str:
    """What the service freezes into team-a/my-job now: its runtime as the cache holds it."""
    ref = stored_trainjob()["spec"]["runtimeRef"]
    checked = server.cache.runtime(ref.get("kind"), "team-a", ref["name"])
    assert checked is not None
    return snapshot(checked.runtime)


def test_a_tenants_create_with_a_snapshot_is_denied(
    server: RunningServer, client: httpx.Client
) -> None:
    forged = annotated(stored_trainjob(), forged_snapshot())
    assert_forbidden(send(client, review_of("CREATE", forged)), "set")
    # Exactly what the service freezes now is what its TrainJob mutating webhook put into this
    # very request (the runtime frozen when the TrainJob is admitted): accepted.
    copied = annotated(stored_trainjob(), frozen_now(server))
    assert send(client, review_of("CREATE", copied))["allowed"] is True
    # A snapshot of an earlier version of the runtime, or of another one, is not.
    assert frozen_now(server) != real_snapshot()
    assert_forbidden(
        send(client, review_of("CREATE", annotated(stored_trainjob(), real_snapshot()))), "set"
    )
    older = orjson.loads(frozen_now(server))
    older["runtime"]["spec"]["mlPolicy"]["numNodes"] = 2
    assert_forbidden(
        send(
            client, review_of("CREATE", annotated(stored_trainjob(), orjson.dumps(older).decode()))
        ),
        "set",
    )
    # A dry run gets the answer the real request would.
    assert_forbidden(send(client, review_of("CREATE", forged, dry_run=True)), "set")
    # Without the annotation the same TrainJob is admitted (its warnings aside).
    assert send(client, review_of("CREATE", stored_trainjob()))["allowed"] is True


def test_the_runtime_is_frozen_when_the_trainjob_is_created(
    server: RunningServer, client: httpx.Client
) -> None:
    """The TrainJob mutating webhook freezes it in the tenant's own CREATE, and the guard then
    admits that request: its pods are tied the moment they come (issue 36)."""
    review = review_of("CREATE", stored_trainjob())
    mutated = client.post(
        "/mutate-trainer-kubeflow-org-v1alpha1-trainjob", content=orjson.dumps(review)
    ).json()["response"]
    assert mutated["allowed"] is True and mutated["patchType"] == "JSONPatch"
    ops = orjson.loads(base64.b64decode(mutated["patch"]))
    frozen = jsonpatch.apply_patch(stored_trainjob(), ops)
    assert frozen["metadata"]["annotations"][SNAPSHOT_ANNOTATION] == frozen_now(server)
    assert send(client, review_of("CREATE", frozen))["allowed"] is True
    # Frozen already (carried in): left for the guard to judge; MultiKueue's: never frozen here.
    again = client.post(
        "/mutate-trainer-kubeflow-org-v1alpha1-trainjob",
        content=orjson.dumps(review_of("CREATE", frozen)),
    ).json()["response"]
    assert "patch" not in again
    elsewhere = copy.deepcopy(stored_trainjob())
    elsewhere["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
    dispatched = client.post(
        "/mutate-trainer-kubeflow-org-v1alpha1-trainjob",
        content=orjson.dumps(review_of("CREATE", elsewhere)),
    ).json()["response"]
    assert "patch" not in dispatched


def test_a_tenants_update_that_adds_edits_or_removes_the_snapshot_is_denied(
    client: httpx.Client,
) -> None:
    bare = stored_trainjob()
    frozen = annotated(bare, real_snapshot())
    forged = annotated(bare, forged_snapshot())
    assert_forbidden(send(client, review_of("UPDATE", forged, bare)), "set")
    assert_forbidden(send(client, review_of("UPDATE", forged, frozen)), "change")
    assert_forbidden(send(client, review_of("UPDATE", bare, frozen)), "remove")
    empty = annotated(bare, "")
    assert_forbidden(send(client, review_of("UPDATE", empty, frozen)), "change")
    # Any other update that leaves the snapshot as stored is judged as before: suspend passes.
    suspended = copy.deepcopy(frozen)
    suspended["spec"]["suspend"] = True
    assert send(client, review_of("UPDATE", suspended, frozen))["allowed"] is True


def test_the_services_own_write_passes(client: httpx.Client) -> None:
    bare = stored_trainjob()
    frozen = annotated(bare, real_snapshot())
    assert send(client, review_of("UPDATE", frozen, bare, username=SELF))["allowed"] is True
    # Another ServiceAccount of the same name in another namespace is someone else.
    lookalike = "system:serviceaccount:team-a:trainjob-scheduling-webhook"
    assert_forbidden(
        send(client, review_of("UPDATE", frozen, bare, username=lookalike)), "set", lookalike
    )


def test_without_a_configured_identity_no_one_may_write_it(tmp_path: Path) -> None:
    cache = fixture_cache()  # service_username "" (no --service-account, not in a pod)
    with running_server(cache, tmp_path) as srv, srv.client() as c:
        bare = stored_trainjob()
        response = send(c, review_of("UPDATE", annotated(bare, real_snapshot()), bare, SELF))
        assert_forbidden(response, "set", SELF)
        assert "no one writes it" in response["status"]["message"]


def test_the_identity_comes_from_the_flag_else_the_pods_token(tmp_path: Path) -> None:
    import base64

    def jwt(claims: dict[str, Any]) -> str:
        payload = base64.urlsafe_b64encode(orjson.dumps(claims)).decode().rstrip("=")
        return f"eyJhbGciOiJSUzI1NiJ9.{payload}.c2ln"

    token = tmp_path / "token"
    assert own_username("someone", token) == "someone"
    assert own_username("", token) == ""  # no token: outside a pod
    token.write_text(jwt({"sub": SELF, "aud": ["https://kubernetes.default.svc"]}) + "\n")
    assert own_username("", token) == SELF
    token.write_text(jwt({"sub": "admin"}))  # not a ServiceAccount's token
    assert own_username("", token) == ""
    token.write_text("not a jwt")
    assert own_username("", token) == ""


@contextlib.asynccontextmanager
async def guarded_world(tmp_path: Path) -> AsyncIterator[tuple[World, Callable[..., Any]]]:
    """The emulator, the reconciler (as the service's identity), the runtime in the cache, and
    the webhooks over HTTPS answering from that cache: `send(path, review)` gives the
    AdmissionReview's response."""
    async with world() as w:
        w.cache.service_username = SELF
        await create(w.k, CLUSTER_RUNTIMES, cluster_runtime())
        await eventually(
            lambda: (
                w.cache.synced
                and w.cache.runtime("ClusterTrainingRuntime", "", "torch-distributed")
            ),
            "the runtime in the cache",
        )  # (before the server: its start waits for readiness without yielding to the loop)
        with running_server(w.cache, tmp_path / "certs") as srv:
            verify = ssl.create_default_context(cafile=str(srv.ca_file))
            async with httpx.AsyncClient(base_url=srv.url, verify=verify, timeout=10) as c:

                async def send(path: str, review: dict[str, Any]) -> dict[str, Any]:
                    body = orjson.dumps(review)
                    r = await c.post(
                        path, content=body, headers={"content-type": "application/json"}
                    )
                    assert r.status_code == 200, r.text
                    response: dict[str, Any] = r.json()["response"]
                    return response

                yield w, send


# --- the chain: the gang built is the runtime's -------------------------------------------------


@pytest.mark.asyncio
async def test_the_gang_built_is_the_runtimes_not_a_tenants(tmp_path: Path) -> None:
    """The webhook stands where the API server's admission would: a tenant's write reaches the
    store only if it allows it. Without that gate the reconciler builds what a stored snapshot
    says (the last TrainJob here), which is why the gate is needed."""
    async with guarded_world(tmp_path) as (w, send):

        async def admitted(review: dict[str, Any]) -> dict[str, Any]:
            response: dict[str, Any] = await send(PATH, review)
            return response

        # The tenant's CREATE with a forged snapshot never reaches the store.
        forged = annotated(trainjob(), forged_snapshot())
        assert_forbidden(await admitted(review_of("CREATE", forged)), "set")
        # Its CREATE without one does; the reconciler freezes the runtime and builds it.
        plain = trainjob()
        assert (await admitted(review_of("CREATE", plain)))["allowed"] is True
        await create(w.k, TRAINJOBS, plain)
        wl, pg = await converged(w.k)
        template = wl["spec"]["podGroupTemplates"][0]
        zone = {"topology": [{"key": "topology.kubernetes.io/zone"}]}
        assert template["schedulingConstraints"] == zone
        assert pg["spec"]["schedulingPolicy"]["gang"]["minCount"] == 100
        tj = stored(w.k, TRAINJOBS, "my-job")
        assert tj is not None and SNAPSHOT_ANNOTATION in tj["metadata"]["annotations"]
        # The reconciler's write, replayed as the API server would have sent it: passes
        # as the service, is denied as the tenant.
        bare = annotated(tj, None)
        assert (await admitted(review_of("UPDATE", tj, bare, SELF)))["allowed"] is True
        assert_forbidden(await admitted(review_of("UPDATE", tj, bare)), "set")
        # The tenant's edit of the frozen snapshot is denied: nothing changes.
        writes = await quiet(w.k)
        edited = annotated(tj, forged_snapshot())
        assert_forbidden(await admitted(review_of("UPDATE", edited, tj)), "change")
        assert_forbidden(await admitted(review_of("UPDATE", bare, tj)), "remove")
        assert await quiet(w.k) == writes
        again = stored(w.k, WORKLOADS, wl["metadata"]["name"])
        assert again is not None
        assert again["spec"]["podGroupTemplates"][0]["schedulingConstraints"] == zone

        # What the gate prevents: a forged snapshot in the store (as without the
        # webhook) is what the reconciler builds from.
        await create(w.k, TRAINJOBS, annotated(trainjob("unguarded"), forged_snapshot()))
        unguarded = await eventually(
            lambda: [
                x for x in objects(w.k, WORKLOADS) if x["metadata"]["name"].startswith("unguarded")
            ],
            "the unguarded TrainJob's Workload",
        )
        assert "schedulingConstraints" not in unguarded[0]["spec"]["podGroupTemplates"][0]
        # (a suspend flip by the tenant still passes, and keeps the runtime's gang)
        suspended = copy.deepcopy(tj)
        suspended["spec"]["suspend"] = True
        assert (await admitted(review_of("UPDATE", suspended, tj)))["allowed"] is True
        await patch(w.k, TRAINJOBS, NS, "my-job", {"spec": {"suspend": False}})


# --- across replicas: a snapshot another replica froze from a version this one has not ------


def _runtime_of(cache: Any) -> tuple[str, dict[str, Any]]:
    ref = stored_trainjob()["spec"]["runtimeRef"]
    entry = cache.cluster_runtimes.get("", ref["name"])
    assert entry is not None, ref
    return ref["name"], copy.deepcopy(entry.raw)


def _rezoned(raw: dict[str, Any], key: str) -> dict[str, Any]:
    """The runtime with its gang's required topology moved to `key`: a new version."""
    raw = copy.deepcopy(raw)
    raw["spec"]["scheduling"]["schedulingConstraints"] = {"topology": [{"key": key}]}
    raw["metadata"]["resourceVersion"] = str(int(raw["metadata"]["resourceVersion"]) + 1)
    return raw


def _snapshot_of_raw(raw: dict[str, Any]) -> str:
    runtime = parse(Runtime, raw)[0]
    assert runtime is not None and runtime.spec.scheduling is not None
    return snapshot(runtime)


def test_a_snapshot_frozen_by_another_replica_from_a_version_this_one_lacks_passes(
    tmp_path: Path,
) -> None:
    """Replicas' watches see a runtime's change at different moments, and the guard of one may
    judge a CREATE the mutating webhook of another froze: the snapshot of a version replaced
    within the last minute passes, one of a version this replica has not seen passes when the
    API server has that version now (one GET), and a forged one is denied whatever is read."""
    now = [1000.0]
    cache = fixture_cache(clock=lambda: now[0])
    cache.service_username = SELF
    name, before = _runtime_of(cache)
    after = _rezoned(before, "kubernetes.io/hostname")
    live: list[dict[str, Any] | None] = [after]
    fetched: list[tuple[str, str, str]] = []

    async def fetch(kind: str, namespace: str, runtime: str) -> dict[str, object] | None:
        fetched.append((kind, namespace, runtime))
        return live[0]

    cache.runtime_fetch = fetch
    bare = stored_trainjob()
    with running_server(cache, tmp_path) as srv, srv.client() as c:

        def created(text: str) -> dict[str, Any]:
            return send(c, review_of("CREATE", annotated(bare, text)))

        # This replica has the old version; another froze the new one: read, and it matches.
        assert created(_snapshot_of_raw(after))["allowed"] is True
        assert fetched == [("ClusterTrainingRuntime", "team-a", name)]
        # The API server no longer has that version (changed again, or deleted): denied.
        live[0] = _rezoned(after, "example.com/rack")
        assert_forbidden(created(_snapshot_of_raw(after)), "set")
        live[0] = None
        assert_forbidden(created(_snapshot_of_raw(after)), "set")
        # A forged one is denied, whatever the runtime is.
        live[0] = after
        assert_forbidden(created(forged_snapshot()), "set")
        # Now this replica's watch brings the change: the old version still passes for a
        # minute (another replica froze it a moment before), without a read; then it does not.
        cache.cluster_runtimes.apply("MODIFIED", after)
        fetched.clear()
        live[0] = None
        assert created(_snapshot_of_raw(after))["allowed"] is True
        assert created(_snapshot_of_raw(before))["allowed"] is True
        assert fetched == []
        now[0] += 61
        assert_forbidden(created(_snapshot_of_raw(before)), "set")
        assert created(_snapshot_of_raw(after))["allowed"] is True

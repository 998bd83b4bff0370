"""The RBAC-enforcing API emulator (tests/kube_rbac.py) on its own: Kubernetes' rule semantics,
then over HTTP (401, 403 with the API server's Status, the gc admission plugin, reviews)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from tests.kube_emulator import SECRETS, TRAINJOBS, WORKLOADS, create
from tests.kube_rbac import RBAC, Attributes, User, attributes, rbac_emulator, service_account

NS = "tjs-system"
SA = service_account(NS, "webhook")
OTHER = service_account("team-a", "someone")


def role(kind: str, name: str, rules: list[dict[str, Any]], ns: str = "") -> dict[str, Any]:
    meta = {"name": name, **({"namespace": ns} if ns else {})}
    return {"kind": kind, "metadata": meta, "rules": rules}


def binding(kind: str, name: str, ref: tuple[str, str], ns: str = "") -> dict[str, Any]:
    meta = {"name": name, **({"namespace": ns} if ns else {})}
    return {
        "kind": kind,
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": ref[0], "name": ref[1]},
        "subjects": [{"kind": "ServiceAccount", "name": "webhook", "namespace": NS}],
    }


OBJECTS = [
    role("ClusterRole", "c", [
        {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"], "verbs": ["list"]},
        {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs/finalizers"],
         "verbs": ["update"]},
        {"apiGroups": ["admissionregistration.k8s.io"],
         "resources": ["mutatingwebhookconfigurations"], "resourceNames": ["mine"],
         "verbs": ["get", "watch"]},
        {"nonResourceURLs": ["/metrics", "/debug/*"], "verbs": ["get"]},
        {"apiGroups": ["scheduling.k8s.io"], "resources": ["*"], "verbs": ["create"]},
    ]),
    binding("ClusterRoleBinding", "c", ("ClusterRole", "c")),
    role("Role", "r", [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}], NS),
    binding("RoleBinding", "r", ("Role", "r"), NS),
    role("ClusterRole", "leases", [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]},
    ]),
    binding("RoleBinding", "leases", ("ClusterRole", "leases"), NS),
]  # fmt: skip


def request(user: User, method: str, path: str, **params: str) -> Attributes:
    return attributes(user, method, path, params)


@pytest.fixture(scope="module")
def rbac() -> RBAC:
    return RBAC.of(OBJECTS)


@pytest.mark.parametrize(
    ("method", "path", "params", "allowed"),
    [
        ("GET", "/apis/trainer.kubeflow.org/v1alpha1/trainjobs", {}, True),  # list, anywhere
        ("GET", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/a/trainjobs", {}, True),
        ("GET", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/a/trainjobs/x", {}, False),  # get
        ("GET", "/apis/trainer.kubeflow.org/v1alpha1/trainjobs", {"watch": "true"}, False),
        (
            "PUT",
            "/apis/trainer.kubeflow.org/v1alpha1/namespaces/a/trainjobs/x/finalizers",
            {},
            True,
        ),
        ("PUT", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/a/trainjobs/x", {}, False),
        # resourceNames: a get by name, a watch only with the name's field selector
        (
            "GET",
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/mine",
            {},
            True,
        ),
        (
            "GET",
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/other",
            {},
            False,
        ),
        (
            "GET",
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
            {"watch": "true", "fieldSelector": "metadata.name=mine"},
            True,
        ),
        (
            "GET",
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
            {"watch": "true"},
            False,
        ),
        (
            "GET",
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
            {"watch": "true", "fieldSelector": "metadata.name=mine,metadata.namespace=x"},
            False,
        ),
        ("GET", "/metrics", {}, True),
        ("GET", "/debug/pprof", {}, True),
        ("POST", "/metrics", {}, False),
        ("GET", "/apis/scheduling.k8s.io/v1beta1", {}, True),  # discovery: system:discovery
        ("POST", "/apis/scheduling.k8s.io/v1beta1/namespaces/a/workloads", {}, True),  # "*"
        ("POST", "/apis/scheduling.k8s.io/v1beta1/namespaces/a/workloads/w/status", {}, True),
        ("POST", "/apis/scheduling.k8s.io/v1beta1/namespaces/a/workloads/w", {}, True),  # a name
        ("PUT", "/apis/scheduling.k8s.io/v1beta1/namespaces/a/workloads/w", {}, False),
        # a Role's rules, and a ClusterRole's through a RoleBinding: only in that namespace
        ("GET", f"/api/v1/namespaces/{NS}/secrets/s", {}, True),
        ("GET", "/api/v1/namespaces/team-a/secrets/s", {}, False),
        ("GET", "/api/v1/secrets", {}, False),
        ("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/l", {}, True),
        ("DELETE", "/apis/coordination.k8s.io/v1/namespaces/team-a/leases/l", {}, False),
    ],
)
def test_rules_decide_as_kubernetes_rbac_does(
    rbac: RBAC, method: str, path: str, params: dict[str, str], allowed: bool
) -> None:
    decision = rbac.decide(request(SA, method, path, **params))
    assert decision.allowed is allowed, decision


def test_attributes_are_the_api_servers(rbac: RBAC) -> None:
    a = request(SA, "GET", "/api/v1/namespaces/ns/secrets", fieldSelector="metadata.name==s")
    assert (a.verb, a.api_group, a.resource, a.namespace, a.name) == (
        "list",
        "",
        "secrets",
        "ns",
        "s",
    )
    d = request(SA, "DELETE", "/apis/scheduling.k8s.io/v1beta1/namespaces/ns/podgroups")
    assert d.verb == "deletecollection"
    assert request(SA, "POST", "/apis/x.io/v1/things").verb == "create"
    assert request(SA, "PATCH", "/apis/x.io/v1/namespaces/n/things/t").verb == "patch"
    assert not request(SA, "GET", "/apis/x.io/v1").resource_request  # group-version discovery
    # Nobody else is bound; a removed rule no longer allows what it did.
    assert not rbac.decide(request(OTHER, "GET", "/metrics")).allowed
    source = rbac.sources("ClusterRole", "", "c")[3]
    assert not rbac.without(source).decide(request(SA, "GET", "/metrics")).allowed
    assert rbac.decide(
        request(User("root", ("system:masters",)), "DELETE", "/api/v1/nodes/n")
    ).allowed


# --- over HTTP ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_emulator_authenticates_authorizes_and_answers_as_the_api_server(
    rbac: RBAC,
) -> None:
    tokens = {"sa-token": SA, "other-token": OTHER}
    async with rbac_emulator(rbac, tokens, "admin-token") as (k, url):
        trainjob = await create(k, TRAINJOBS, {
            "metadata": {"name": "job", "namespace": "a"}, "spec": {"runtimeRef": {"name": "r"}},
        })  # fmt: skip
        await create(k, SECRETS, {"metadata": {"name": "s", "namespace": NS}, "type": "Opaque"})

        async def call(
            token: str | None, method: str, path: str, body: Any = None
        ) -> tuple[int, Any]:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with (
                aiohttp.ClientSession() as session,
                session.request(method, url + path, headers=headers, json=body) as response,
            ):
                return response.status, await response.json(content_type=None)

        status, body = await call("sa-token", "GET", f"/api/v1/namespaces/{NS}/secrets/s")
        assert status == 200 and body["metadata"]["name"] == "s"
        status, body = await call("nobody", "GET", f"/api/v1/namespaces/{NS}/secrets/s")
        assert (status, body["reason"]) == (401, "Unauthorized")
        status, body = await call(None, "GET", "/api/v1/namespaces/team-a/secrets/s")
        assert status == 403 and body["kind"] == "Status" and body["reason"] == "Forbidden"
        assert body["message"] == (
            'secrets "s" is forbidden: User "system:anonymous" cannot get resource "secrets" in '
            'API group "" in the namespace "team-a"'
        )
        status, body = await call(
            "other-token", "GET", "/apis/trainer.kubeflow.org/v1alpha1/trainjobs"
        )
        assert status == 403 and body["message"] == (
            "trainjobs.trainer.kubeflow.org is forbidden: User "
            '"system:serviceaccount:team-a:someone" cannot list resource "trainjobs" in API group '
            '"trainer.kubeflow.org" at the cluster scope'
        )

        # blockOwnerDeletion needs update on the owner's finalizers (the SA has it; OTHER, with
        # create on workloads through a copy of the rule, has not).
        owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                 "name": "job", "uid": trainjob["metadata"]["uid"], "controller": True,
                 "blockOwnerDeletion": True}  # fmt: skip
        workload = {"metadata": {"name": "w", "ownerReferences": [owner]}, "spec": {}}
        path = "/apis/scheduling.k8s.io/v1beta1/namespaces/a/workloads"
        k.rbac = RBAC.of([*OBJECTS, {
            "kind": "ClusterRoleBinding", "metadata": {"name": "other"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "c"},
            "subjects": [{"kind": "User", "name": OTHER.name}],
        }])  # fmt: skip
        k.rbac.roles[("ClusterRole", "", "c")].pop(1)  # finalizers: nobody has it now
        status, body = await call("sa-token", "POST", path, workload)
        assert status == 403 and "cannot set blockOwnerDeletion" in body["message"], body
        assert 'cannot update resource "trainjobs/finalizers"' in body["message"]
        k.rbac = rbac
        status, body = await call("sa-token", "POST", path, workload)
        assert status == 201, body
        assert [d.attributes.subresource for d in k.decisions[-1:]] == ["finalizers"]
        assert (await call("admin-token", "GET", path + "/w"))[0] == 200
        assert len(k.changes(WORKLOADS)) == 1  # the refused create stored nothing

        # Reviews: a token's user, and access from the same rules (the SA may create them? no).
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                  "spec": {"token": "other-token"}}  # fmt: skip
        status, _ = await call(
            "sa-token", "POST", "/apis/authentication.k8s.io/v1/tokenreviews", review
        )
        assert status == 403  # not in the SA's rules
        status, body = await call(
            "admin-token", "POST", "/apis/authentication.k8s.io/v1/tokenreviews", review
        )
        assert status == 200 and body["status"]["user"]["username"] == OTHER.name
        sar: dict[str, Any] = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": SA.name,
                "groups": list(SA.groups),
                "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
            },
        }
        sar_path = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
        status, body = await call("admin-token", "POST", sar_path, sar)
        assert status == 200 and body["status"]["allowed"] is True, body
        sar["spec"]["user"] = OTHER.name
        status, body = await call("admin-token", "POST", sar_path, json.loads(json.dumps(sar)))
        assert body["status"] == {"allowed": False}

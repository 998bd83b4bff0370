"""End to end: a tenant ServiceAccount with only the built-in `edit` role cannot change the gang
the service builds by writing the frozen runtime snapshot
(`trainjob-scheduling.dev/runtime-snapshot`) on its own TrainJob, whichever way kubectl writes
it: a CREATE carrying one, a merge patch (`kubectl annotate --overwrite`, `kubectl patch`), a
removal, server-side apply with `--force-conflicts`, a replace. The gang built is the runtime's.

Needs the chart's webhooks registered with the API server: the suite registers them for the
service it starts (conftest.py), or the chart deployed them (`E2E_EXTERNAL_SERVICE=1`). The
tenant talks with a real token of its own ServiceAccount (TokenRequest), not impersonation, so the
API server authenticates it as any pod of the tenant would be. If the cluster's `edit` role does
not cover TrainJobs (Trainer's chart aggregates its roles into it; a bare CRD install does not),
the test binds a Role with just the TrainJob verbs `edit` would give, and says so in the summary.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import (
    ApiClient,
    AuthenticationV1TokenRequest,
    AuthorizationV1Api,
    Configuration,
    CoreV1Api,
    CustomObjectsApi,
    RbacAuthorizationV1Api,
    RbacV1Subject,
    V1ObjectMeta,
    V1PolicyRule,
    V1ResourceAttributes,
    V1Role,
    V1RoleBinding,
    V1RoleRef,
    V1SelfSubjectAccessReview,
    V1SelfSubjectAccessReviewSpec,
    V1ServiceAccount,
    V1TokenRequestSpec,
)
from kubernetes.client.exceptions import ApiException

from webhook.admission.snapshot_guard import SNAPSHOT_FIELD
from webhook.core.snapshot import SNAPSHOT_ANNOTATION

from .cluster import MERGE_PATCH, REQUEST_TIMEOUT, Cluster, Json
from .conftest import NOTES
from .objects import NUM_NODES, cluster_runtime, min_count, plan_for, trainjob
from .scenario import Scenario

pytestmark = pytest.mark.e2e

TENANT = "e2e-tenant"
GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
# The most tempting forgery: "frozen without a gang", so the pods start one by one.
FORGED = json.dumps({"planVersion": 2, "runtime": None})
APPLY_PATCH = "application/apply-patch+yaml"


@pytest.fixture(scope="module")
def runtime(scenario: Scenario) -> Json:
    """A level-1 ClusterTrainingRuntime whose pods land on no node."""
    return scenario.apply_runtime(cluster_runtime(scenario.namespace))


@pytest.fixture(scope="module")
def tenant(cluster: Cluster, scenario: Scenario) -> Iterator[CustomObjectsApi]:
    """The TrainJob API as the tenant: its ServiceAccount, bound to `edit` in the namespace,
    with a short-lived token of its own."""
    namespace = scenario.namespace
    core, rbac = CoreV1Api(cluster.api), RbacAuthorizationV1Api(cluster.api)
    core.create_namespaced_service_account(
        namespace, V1ServiceAccount(metadata=V1ObjectMeta(name=TENANT)),
        _request_timeout=REQUEST_TIMEOUT,
    )  # fmt: skip
    subject = RbacV1Subject(kind="ServiceAccount", name=TENANT, namespace=namespace)
    _bind(rbac, namespace, "ClusterRole", "edit", subject)
    request = AuthenticationV1TokenRequest(
        spec=V1TokenRequestSpec(audiences=[], expiration_seconds=900)
    )
    issued = core.create_namespaced_service_account_token(
        TENANT, namespace, request, _request_timeout=REQUEST_TIMEOUT
    )
    assert issued.status is not None
    token = issued.status.token
    admin: Configuration = cluster.api.configuration
    config = Configuration(host=admin.host)  # no client certificate: the token alone
    config.ssl_ca_cert, config.verify_ssl = admin.ssl_ca_cert, admin.verify_ssl
    config.api_key = {"authorization": f"Bearer {token}"}
    api = ApiClient(config)
    if not _may(api, namespace, "create") or not _may(api, namespace, "patch"):
        NOTES.append(
            "the cluster's edit role does not cover trainjobs (Trainer's aggregated roles are "
            "not installed): the tenant got a Role with the TrainJob verbs edit would give"
        )
        verbs = ["get", "list", "watch", "create", "update", "patch", "delete"]
        rule = V1PolicyRule(api_groups=[GROUP], resources=[PLURAL], verbs=verbs)
        role = V1Role(metadata=V1ObjectMeta(name=f"{TENANT}-trainjobs"), rules=[rule])
        rbac.create_namespaced_role(namespace, role, _request_timeout=REQUEST_TIMEOUT)
        _bind(rbac, namespace, "Role", f"{TENANT}-trainjobs", subject)
        scenario.wait(lambda: _may(api, namespace, "patch") or None, "the tenant's Role applies")
    try:
        yield CustomObjectsApi(api)
    finally:
        close: Any = api.close  # untyped in the client
        close()


def _bind(
    rbac: RbacAuthorizationV1Api, namespace: str, kind: str, role: str, subject: RbacV1Subject
) -> None:
    ref = V1RoleRef(api_group="rbac.authorization.k8s.io", kind=kind, name=role)
    binding = V1RoleBinding(
        metadata=V1ObjectMeta(name=f"{TENANT}-{role}"), role_ref=ref, subjects=[subject]
    )
    rbac.create_namespaced_role_binding(namespace, binding, _request_timeout=REQUEST_TIMEOUT)


def _may(api: ApiClient, namespace: str, verb: str) -> bool:
    """Whether the API server lets the tenant do `verb` on TrainJobs in the namespace."""
    where = V1ResourceAttributes(group=GROUP, resource=PLURAL, verb=verb, namespace=namespace)
    review = AuthorizationV1Api(api).create_self_subject_access_review(
        V1SelfSubjectAccessReview(spec=V1SelfSubjectAccessReviewSpec(resource_attributes=where)),
        _request_timeout=REQUEST_TIMEOUT,
    )
    return review.status is not None and bool(review.status.allowed)


def _denied(write: Any) -> str:
    """The body of the 403 `write()` must be answered with."""
    with pytest.raises(ApiException) as refused:
        write()
    assert refused.value.status == 403, refused.value.body
    body = str(refused.value.body)
    assert SNAPSHOT_FIELD in body and "frozen runtime snapshot" in body, body
    return body


def test_a_tenants_forged_snapshot_on_create_is_denied(
    tenant: CustomObjectsApi, scenario: Scenario, runtime: Json
) -> None:
    body = trainjob("forged", scenario.namespace, str(runtime["metadata"]["name"]))
    body["metadata"]["annotations"] = {SNAPSHOT_ANNOTATION: FORGED}
    _denied(
        lambda: tenant.create_namespaced_custom_object(
            GROUP, VERSION, scenario.namespace, PLURAL, body, _request_timeout=REQUEST_TIMEOUT
        )
    )
    assert scenario.trainjob("forged") is None


def test_a_tenant_cannot_change_or_remove_the_snapshot_and_the_gang_is_the_runtimes(
    tenant: CustomObjectsApi, scenario: Scenario, runtime: Json
) -> None:
    namespace, runtime_name = scenario.namespace, str(runtime["metadata"]["name"])
    created = tenant.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, trainjob("owned", namespace, runtime_name),
        _request_timeout=REQUEST_TIMEOUT,
    )  # fmt: skip
    assert isinstance(created, dict)

    def frozen() -> str | None:
        stored = scenario.trainjob("owned") or {}
        return ((stored.get("metadata") or {}).get("annotations") or {}).get(SNAPSHOT_ANNOTATION)

    snapshot = scenario.wait(frozen, "the service freezes the runtime into the TrainJob")

    def patch(body: Json, content_type: str = MERGE_PATCH, **options: Any) -> Any:
        return lambda: tenant.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "owned", body,
            _content_type=content_type, _request_timeout=REQUEST_TIMEOUT, **options,
        )  # fmt: skip

    # kubectl annotate --overwrite and kubectl patch --type=merge: a merge patch.
    _denied(patch({"metadata": {"annotations": {SNAPSHOT_ANNOTATION: FORGED}}}))
    _denied(patch({"metadata": {"annotations": {SNAPSHOT_ANNOTATION: None}}}))  # annotate KEY-
    # kubectl apply --server-side --force-conflicts: takes the field from the service's manager.
    applied = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob",
        "metadata": {"name": "owned", "namespace": namespace,
                     "annotations": {SNAPSHOT_ANNOTATION: FORGED}},
    }  # fmt: skip
    _denied(patch(applied, APPLY_PATCH, field_manager="kubectl", force=True))
    # kubectl replace of the object without the annotation (read again after a 409: Trainer
    # writes the TrainJob's status meanwhile, and a replace carries the resourceVersion read).
    for attempt in range(5):
        current = tenant.get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "owned", _request_timeout=REQUEST_TIMEOUT
        )
        assert isinstance(current, dict)
        replaced = copy.deepcopy(current)
        replaced["metadata"]["annotations"].pop(SNAPSHOT_ANNOTATION)
        try:
            tenant.replace_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, "owned", replaced,
                _request_timeout=REQUEST_TIMEOUT,
            )  # fmt: skip
        except ApiException as err:
            if err.status == 409 and attempt < 4:
                continue
            assert err.status == 403, err.body
            assert SNAPSHOT_FIELD in str(err.body) and "frozen runtime snapshot" in str(err.body)
            break
        raise AssertionError("the tenant's replace removing the snapshot was accepted")
    # Nothing was written, and the gang is the runtime's: every pod in one PodGroup.
    assert frozen() == snapshot
    stored = scenario.trainjob("owned")
    assert stored is not None
    plan = plan_for(stored, runtime)
    (group,) = plan.groups
    pod_group = scenario.wait(lambda: scenario.pod_group(group.pod_group_name), "the PodGroup")
    assert min_count(pod_group["spec"]) == NUM_NODES
    assert scenario.frozen_plan("owned") == plan  # the snapshot plans what the runtime plans

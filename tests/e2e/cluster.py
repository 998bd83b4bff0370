"""A real cluster for the end-to-end tests: whether there is one, and a small client for it.

`connect()` answers fast (one `/version` call with a 3 s timeout, no retries) with either a
`Cluster` or the reason the tests skip. Everything here uses the official synchronous
`kubernetes` client; writes are creates, merge patches and deletes (never a PUT of an object read
earlier, so a resourceVersion conflict cannot happen).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import urllib3
from kubernetes import config as kube_config
from kubernetes.client import (
    ApiClient,
    Configuration,
    CoreV1Api,
    CustomObjectsApi,
    V1Namespace,
    V1ObjectMeta,
)
from kubernetes.client.exceptions import ApiException

Json = dict[str, Any]
T = TypeVar("T")

TRAINER_GROUP, TRAINER_VERSION = "trainer.kubeflow.org", "v1alpha1"
SCHEDULING_GROUP, SCHEDULING_VERSION = "scheduling.k8s.io", "v1beta1"
EVENTS_GROUP, EVENTS_VERSION = "events.k8s.io", "v1"
RUNTIME_CRD = f"clustertrainingruntimes.{TRAINER_GROUP}"
PROBE_TIMEOUT = 3.0  # seconds for the reachability check; a dead address must not hang the run
REQUEST_TIMEOUT = 30.0
MERGE_PATCH = "application/merge-patch+json"
# Errors worth another try while polling: throttling, an API server restarting, a dropped
# connection. Anything else (403, 422, ...) is a real answer and ends the wait.
TRANSIENT_STATUSES = frozenset({0, 408, 429, 500, 502, 503, 504})


class Skip(Exception):
    """There is no usable cluster; the message says why (it becomes the skip reason)."""


class NotYet(Exception):
    """Raised by a `poll` check: not there yet; the message says what was seen instead."""


def _flag(name: str) -> str:
    return os.environ.get(name, "").strip().lower()


def disabled() -> bool:
    """E2E=0 (or false/no/off): skip even when a cluster is configured."""
    return _flag("E2E") in ("0", "false", "no", "off")


def required() -> bool:
    """E2E=1 (or true/yes/on): no cluster is a failure, not a skip (for a CI job on a cluster)."""
    return _flag("E2E") in ("1", "true", "yes", "on")


def external_service() -> bool:
    """E2E_EXTERNAL_SERVICE=1: the service is deployed in the cluster; the tests only observe."""
    return _flag("E2E_EXTERNAL_SERVICE") in ("1", "true", "yes", "on")


def timeout() -> float:
    """Seconds each wait may take (E2E_TIMEOUT, default 90)."""
    return float(os.environ.get("E2E_TIMEOUT") or 90)


def kubeconfig_path() -> str:
    """E2E_KUBECONFIG if set, else KUBECONFIG; never ~/.kube/config by default (a developer's
    everyday cluster is not a test cluster unless named on purpose)."""
    path = os.environ.get("E2E_KUBECONFIG") or os.environ.get("KUBECONFIG") or ""
    if not path.strip():
        raise Skip("no cluster: set E2E_KUBECONFIG (or KUBECONFIG) to a test cluster's kubeconfig")
    files = [os.path.expanduser(p) for p in path.split(os.pathsep) if p]
    if not any(os.path.isfile(f) for f in files):
        raise Skip(f"no cluster: kubeconfig {path!r} does not exist")
    return path


@dataclass
class Cluster:
    """One API server, reached with the kubeconfig's current context."""

    kubeconfig: str
    api: ApiClient
    server: str
    version: str = ""
    notes: list[str] = field(default_factory=list)  # what was not checked, and why

    @property
    def objects(self) -> CustomObjectsApi:
        return CustomObjectsApi(self.api)

    @property
    def core(self) -> CoreV1Api:
        return CoreV1Api(self.api)

    def close(self) -> None:
        close: Any = self.api.close  # untyped in the client
        close()

    # --- raw reads ----------------------------------------------------------------------------

    def get_path(self, path: str, timeout: float = REQUEST_TIMEOUT) -> tuple[int, Json | None]:
        """GET `path` exactly as written (discovery, /version): the status and the JSON body.
        Raises what the transport raises (refused, timed out, TLS)."""
        request = self.api.param_serialize(
            method="GET",
            resource_path=path,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*request, _request_timeout=timeout)
        read: Any = response.read  # untyped in the client
        raw = read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        return int(response.status), body if isinstance(body, dict) else None

    def served(self, group_version: str) -> set[str] | None:
        """The resources discovery lists for `group/version`; None when it is not served."""
        status, body = self.get_path(f"/apis/{group_version}")
        if status == 404:
            return None
        if status != 200 or body is None:
            raise Skip(f"discovery of {group_version} answered HTTP {status}")
        return {str(r.get("name")) for r in body.get("resources") or [] if isinstance(r, dict)}

    # --- objects (custom and built-in alike, as JSON) -----------------------------------------

    def get(
        self, group: str, version: str, plural: str, name: str, namespace: str | None = None
    ) -> Json | None:
        """The stored object, or None when there is none (404)."""
        try:
            if namespace is None:
                obj = self.objects.get_cluster_custom_object(
                    group, version, plural, name, _request_timeout=REQUEST_TIMEOUT
                )
            else:
                obj = self.objects.get_namespaced_custom_object(
                    group, version, namespace, plural, name, _request_timeout=REQUEST_TIMEOUT
                )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return _json(obj)

    def list(self, group: str, version: str, plural: str, namespace: str) -> list[Json]:
        found = self.objects.list_namespaced_custom_object(
            group, version, namespace, plural, _request_timeout=REQUEST_TIMEOUT
        )
        return [item for item in _json(found).get("items") or [] if isinstance(item, dict)]

    def create(
        self, group: str, version: str, plural: str, body: Json, namespace: str | None = None
    ) -> Json:
        """Creates with fieldValidation=Strict: a field the CRD does not declare is an error
        (400) instead of being pruned without a word."""
        if namespace is None:
            obj = self.objects.create_cluster_custom_object(
                group, version, plural, body,
                field_validation="Strict", _request_timeout=REQUEST_TIMEOUT,
            )  # fmt: skip
        else:
            obj = self.objects.create_namespaced_custom_object(
                group, version, namespace, plural, body,
                field_validation="Strict", _request_timeout=REQUEST_TIMEOUT,
            )  # fmt: skip
        return _json(obj)

    def merge_patch(
        self, group: str, version: str, plural: str, namespace: str, name: str, patch: Json
    ) -> Json:
        """An RFC 7386 merge patch: touches only the fields in `patch`, whatever the object's
        resourceVersion is now (so a concurrent status write by a controller cannot conflict)."""
        obj = self.objects.patch_namespaced_custom_object(
            group, version, namespace, plural, name, patch,
            _content_type=MERGE_PATCH, _request_timeout=REQUEST_TIMEOUT,
        )  # fmt: skip
        return _json(obj)

    def delete(
        self, group: str, version: str, plural: str, name: str, namespace: str | None = None
    ) -> bool:
        """Deletes with background propagation (the garbage collector removes dependents after
        the owner is gone); False when it was already gone."""
        try:
            if namespace is None:
                self.objects.delete_cluster_custom_object(
                    group, version, plural, name,
                    propagation_policy="Background", _request_timeout=REQUEST_TIMEOUT,
                )  # fmt: skip
            else:
                self.objects.delete_namespaced_custom_object(
                    group, version, namespace, plural, name,
                    propagation_policy="Background", _request_timeout=REQUEST_TIMEOUT,
                )  # fmt: skip
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    def create_namespace(self, name: str, labels: dict[str, str]) -> None:
        body = V1Namespace(metadata=V1ObjectMeta(name=name, labels=labels))
        self.core.create_namespace(body, _request_timeout=REQUEST_TIMEOUT)

    def delete_namespace(self, name: str) -> None:
        with contextlib.suppress(ApiException):  # 404: gone already; anything else: best effort
            self.core.delete_namespace(
                name, propagation_policy="Background", _request_timeout=REQUEST_TIMEOUT
            )


def _json(obj: Any) -> Json:
    """CustomObjectsApi answers with plain JSON (dicts), typed `object` by the client."""
    assert isinstance(obj, dict), type(obj)
    return obj


def connect() -> Cluster:
    """The configured cluster, checked to be reachable (fast), or Skip with the reason."""
    if disabled():
        raise Skip("E2E=0: end-to-end tests switched off")
    path = kubeconfig_path()
    cfg = Configuration()
    load: Any = kube_config.load_kube_config  # untyped in the client
    try:
        load(config_file=path, client_configuration=cfg, persist_config=False)
    except Exception as err:  # ConfigException, YAML errors, a failing exec plugin, ...
        raise Skip(f"no cluster: cannot load kubeconfig {path!r}: {err}") from None
    # The probe must not retry: urllib3's default (3 retries) would quadruple the wait on a
    # black-holed address. The tests' own client keeps the client's defaults (the REST client
    # reads `retries` when it is made).
    cfg.retries = urllib3.Retry(0, read=False, redirect=False)
    probe = Cluster(path, ApiClient(cfg), str(cfg.host))
    cfg.retries = None
    try:
        status, body = probe.get_path("/version", timeout=PROBE_TIMEOUT)
    except Exception as err:  # refused, timed out, DNS, TLS: nothing answers there
        reason = _short(err)
        raise Skip(f"no cluster: the API server at {cfg.host} is unreachable ({reason})") from None
    finally:
        probe.close()
    if status in (401, 403):
        raise Skip(f"no cluster: the API server at {cfg.host} refused the credentials ({status})")
    if status != 200 or body is None:
        raise Skip(f"no cluster: GET {cfg.host}/version answered HTTP {status}")
    cluster = Cluster(path, ApiClient(cfg), str(cfg.host))
    cluster.version = str(body.get("gitVersion") or "")
    return cluster


def _short(err: BaseException) -> str:
    """The root cause of a transport error, in one line."""
    reason = getattr(err, "reason", None)
    text = f"{type(reason or err).__name__}: {reason or err}"
    return text.replace("\n", " ")[:200]


def check_apis(cluster: Cluster, check_crd: bool) -> None:
    """Skip unless the cluster can run the scenario: scheduling.k8s.io/v1beta1 served with
    Workloads and PodGroups, Kubeflow Trainer's resources served, and (unless `check_crd` is
    false) the ClusterTrainingRuntime CRD declaring spec.scheduling."""
    scheduling = cluster.served(f"{SCHEDULING_GROUP}/{SCHEDULING_VERSION}")
    missing = {"workloads", "podgroups"} - (scheduling or set())
    if missing:
        raise Skip(
            f"GenericWorkload off: {SCHEDULING_GROUP}/{SCHEDULING_VERSION} "
            + ("is not served" if scheduling is None else f"lacks {', '.join(sorted(missing))}")
            + f" on {cluster.server} ({cluster.version}); start kube-apiserver with "
            "--feature-gates=GenericWorkload=true "
            "--runtime-config=scheduling.k8s.io/v1beta1=true"
        )
    trainer = cluster.served(f"{TRAINER_GROUP}/{TRAINER_VERSION}") or set()
    missing = {"trainjobs", "clustertrainingruntimes", "trainingruntimes"} - trainer
    if missing:
        raise Skip(
            f"Kubeflow Trainer CRDs not installed ({', '.join(sorted(missing))} missing from "
            f"{TRAINER_GROUP}/{TRAINER_VERSION}); install them, e.g. "
            "kubectl create -f tests/e2e/crds/"
        )
    if not check_crd:
        cluster.notes.append("CRD check skipped (E2E_SKIP_CRD_CHECK=1)")
        return
    if cluster.served("apiextensions.k8s.io/v1") is None:  # every real API server serves it
        cluster.notes.append("CRD check skipped: apiextensions.k8s.io/v1 is not served")
        return
    status, crd = cluster.get_path(
        f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{RUNTIME_CRD}"
    )
    if status in (401, 403):
        raise Skip(f"cannot read CRD {RUNTIME_CRD} (HTTP {status}): the kubeconfig user needs "
                   "get on customresourcedefinitions (cluster-admin is simplest)")  # fmt: skip
    if status != 200 or crd is None:
        raise Skip(f"cannot read CRD {RUNTIME_CRD} (HTTP {status})")
    if not declares_scheduling(crd, TRAINER_VERSION):
        raise Skip(
            f"CRD {RUNTIME_CRD} does not declare spec.scheduling in {TRAINER_VERSION}, so the "
            "API server would prune it (Trainer before v2.4); install the CRDs in "
            "tests/e2e/crds/ (kubectl replace -f tests/e2e/crds/ where older ones are installed)"
        )


def declares_scheduling(crd: Json, version: str) -> bool:
    """Whether the CRD keeps `spec.scheduling` in `version`: declared under
    spec.versions[].schema.openAPIV3Schema.properties.spec.properties, or `spec` keeps unknown
    fields."""
    for entry in crd.get("spec", {}).get("versions") or []:
        if entry.get("name") != version:
            continue
        schema = (entry.get("schema") or {}).get("openAPIV3Schema") or {}
        spec = (schema.get("properties") or {}).get("spec") or {}
        if "scheduling" in (spec.get("properties") or {}):
            return True
        return spec.get("x-kubernetes-preserve-unknown-fields") is True
    return False


# --- waiting ------------------------------------------------------------------------------------


def transient(err: BaseException) -> bool:
    if isinstance(err, ApiException):
        return err.status in TRANSIENT_STATUSES
    return isinstance(err, urllib3.exceptions.HTTPError | OSError)


def poll(
    check: Callable[[], T | None],
    what: str,
    seconds: float,
    *,
    interval: float = 0.5,
    describe: Callable[[], str] = lambda: "",
) -> T:
    """Calls `check` until it returns something other than None or False; fails the test with
    `what`, the last thing seen and `describe()` (e.g. the service's log) after `seconds`.
    `NotYet` and transient API errors count as "not yet"."""
    deadline = time.monotonic() + seconds
    last = ""
    while True:
        try:
            result = check()
        except NotYet as err:
            result, last = None, f"last seen: {err}"
        except Exception as err:
            if not transient(err):
                raise
            result, last = None, f"last error: {_short(err)}"
        if result is not None and result is not False:
            return result
        if time.monotonic() > deadline:
            detail = "\n".join(part for part in (last, describe()) if part)
            raise AssertionError(f"not within {seconds:.0f}s: {what}\n{detail}".rstrip())
        time.sleep(interval)

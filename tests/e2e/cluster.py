"""A real cluster for the end-to-end tests: whether there is one, what it serves, and a small
client for it.

`connect()` answers fast (one `/version` call with a 3 s timeout, no retries) with either a
`Cluster` or the reason the tests skip. Everything here goes through the official synchronous
`kubernetes` client's transport, as plain JSON (`Cluster.request`): creates, patches (merge,
strategic merge, JSON Patch) and deletes; never a PUT of an object read earlier, so a
resourceVersion conflict cannot happen. Watches are read line by line (`Cluster.watch`).

`ServerFacts` is what the tests learn of the server's configuration from the server itself, never
from the environment: the scheduling.k8s.io version discovery lists, the feature gates the API
server reports (`kubernetes_feature_enabled` in its /metrics) and the PodGroup fields a server-side
dry-run create keeps.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import urllib3
from kubernetes import config as kube_config
from kubernetes.client import ApiClient, Configuration, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

Json = dict[str, Any]
T = TypeVar("T")

TRAINER_GROUP, TRAINER_VERSION = "trainer.kubeflow.org", "v1alpha1"
SCHEDULING_GROUP = "scheduling.k8s.io"
# The versions of the gang API the service speaks, newest first (1.37: v1beta1; 1.36: v1alpha2).
SCHEDULING_VERSIONS = ("v1beta1", "v1alpha2")
EVENTS_GROUP, EVENTS_VERSION = "events.k8s.io", "v1"
JOBSET_GROUP, JOBSET_VERSION = "jobset.x-k8s.io", "v1alpha2"
RUNTIME_CRD = f"clustertrainingruntimes.{TRAINER_GROUP}"
PROBE_TIMEOUT = 3.0  # seconds for the reachability check; a dead address must not hang the run
REQUEST_TIMEOUT = 30.0
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
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


def service_user() -> str:
    """E2E_SERVICE_USER: the deployed service's username (with E2E_EXTERNAL_SERVICE=1), for the
    writes only the service may make (a newer release's snapshot): the suite impersonates it.
    Empty when the suite's own service runs as the kubeconfig's user."""
    return os.environ.get("E2E_SERVICE_USER", "").strip()


def service_deployment() -> str:
    """E2E_SERVICE_DEPLOYMENT: the deployed service's Deployment, "namespace/name" (with
    E2E_EXTERNAL_SERVICE=1), which the outage test scales to 0 and back. Empty: not stopped."""
    return os.environ.get("E2E_SERVICE_DEPLOYMENT", "").strip()


def keep() -> bool:
    """E2E_KEEP=1: keep namespaces, runtimes and nodes afterwards (webhooks are never kept)."""
    return _flag("E2E_KEEP") in ("1", "true", "yes", "on")


def timeout() -> float:
    """Seconds each wait may take (E2E_TIMEOUT, default 90)."""
    return float(os.environ.get("E2E_TIMEOUT") or 90)


def kubeconfig_path() -> str:
    """E2E_KUBECONFIG; or KUBECONFIG when E2E=1 says the run is meant (`make e2e` sets both).
    A KUBECONFIG alone, as a developer's shell has it, is not enough: the suite registers
    webhooks and makes fake nodes, which `make test` must never do to an everyday cluster.
    ~/.kube/config is never used on its own."""
    path = os.environ.get("E2E_KUBECONFIG") or ""
    if not path.strip() and required():
        path = os.environ.get("KUBECONFIG") or ""
    if not path.strip():
        hint = " (KUBECONFIG is set: E2E=1 uses it)" if os.environ.get("KUBECONFIG") else ""
        raise Skip(
            "no cluster: set E2E_KUBECONFIG to a test cluster's kubeconfig, or run make e2e" + hint
        )
    files = [os.path.expanduser(p) for p in path.split(os.pathsep) if p]
    if not any(os.path.isfile(f) for f in files):
        raise Skip(f"no cluster: kubeconfig {path!r} does not exist")
    return path


def api_path(
    group: str,
    version: str,
    plural: str,
    namespace: str | None = None,
    name: str | None = None,
    sub: str | None = None,
) -> str:
    """The REST path of a collection or an object (`group` "" is the core group)."""
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    if namespace is not None:
        base += f"/namespaces/{quote(namespace)}"
    base += f"/{plural}"
    if name is not None:
        base += f"/{quote(name)}"
    if sub is not None:
        base += f"/{sub}"
    return base


@dataclass
class Cluster:
    """One API server, reached with the kubeconfig's current context."""

    kubeconfig: str
    api: ApiClient
    server: str
    version: str = ""
    scheduling_version: str = SCHEDULING_VERSIONS[0]  # the newest one discovery lists
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

    # --- raw requests -------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, Any] | None = None,
        content_type: str | None = None,
        request_timeout: float | tuple[float, float] = REQUEST_TIMEOUT,
        as_user: str = "",
    ) -> Any:
        headers = {"Accept": "application/json"}
        if as_user:
            headers["Impersonate-User"] = as_user
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        if query:
            path += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        request = self.api.param_serialize(
            method=method,
            resource_path=path,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        return self.api.call_api(*request, _request_timeout=request_timeout)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, Any] | None = None,
        content_type: str | None = None,
        request_timeout: float = REQUEST_TIMEOUT,
        as_user: str = "",
    ) -> Json:
        """One request (as `as_user` when given: impersonated); the JSON answer, or
        ApiException for an HTTP error (as the typed clients raise it, so `err.status` and
        `err.body` read the same)."""
        response = self._call(
            method, path, body, query=query, content_type=content_type,
            request_timeout=request_timeout, as_user=as_user,
        )  # fmt: skip
        read: Any = response.read  # untyped in the client
        raw = read()
        status = int(response.status)
        if status >= 400:
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            raise ApiException(status=status, reason=str(response.reason), body=text)
        try:
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {}
        return answer if isinstance(answer, dict) else {"items": answer}

    def get_path(self, path: str, timeout: float = REQUEST_TIMEOUT) -> tuple[int, Json | None]:
        """GET `path` exactly as written (discovery, /version): the status and the JSON body.
        Raises what the transport raises (refused, timed out, TLS)."""
        response = self._call("GET", path, request_timeout=timeout)
        read: Any = response.read  # untyped in the client
        raw = read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        return int(response.status), body if isinstance(body, dict) else None

    def get_text(self, path: str) -> tuple[int, str]:
        """GET a non-JSON document (the API server's /metrics)."""
        response = self._call("GET", path)
        read: Any = response.read  # untyped in the client
        raw = read()
        return int(response.status), raw.decode("utf-8", "replace") if raw else ""

    def watch(
        self, path: str, resource_version: str, seconds: float, query: dict[str, Any] | None = None
    ) -> Iterator[Json]:
        """The events of one watch of `path` from `resource_version`, for at most `seconds`
        (the server ends it then): each `{"type": ..., "object": ...}` as it arrives."""
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(max(1, int(seconds))),
            **(query or {}),
        }
        response = self._call(
            "GET", path, query=params, request_timeout=(REQUEST_TIMEOUT, seconds + 30)
        )
        inner: Any = response.response  # urllib3's response, not read yet
        try:
            if int(response.status) >= 400:
                raw = inner.data
                raise ApiException(status=int(response.status), body=raw.decode("utf-8", "replace"))
            pending = b""
            for chunk in inner.stream(65536, decode_content=True):
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if line.strip():
                        event = json.loads(line)
                        if isinstance(event, dict):
                            yield event
        finally:
            with contextlib.suppress(Exception):
                inner.release_conn()

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
            return self.request("GET", api_path(group, version, plural, namespace, name))
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def list_objects(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str | None = None,
        *,
        labels: str | None = None,
    ) -> list[Json]:
        found = self.request(
            "GET", api_path(group, version, plural, namespace), query={"labelSelector": labels}
        )
        return [item for item in found.get("items") or [] if isinstance(item, dict)]

    def create(
        self,
        group: str,
        version: str,
        plural: str,
        body: Json,
        namespace: str | None = None,
        *,
        dry_run: bool = False,
    ) -> Json:
        """Creates with fieldValidation=Strict: a field the CRD does not declare is an error
        (400) instead of being pruned without a word."""
        query = {"fieldValidation": "Strict", "dryRun": "All" if dry_run else None}
        return self.request("POST", api_path(group, version, plural, namespace), body, query=query)

    def patch(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        content_type: str = MERGE_PATCH,
        sub: str | None = None,
    ) -> Json:
        """A patch (merge by default: only the fields in `patch`, whatever the object's
        resourceVersion is now, so a concurrent status write by a controller cannot conflict)."""
        path = api_path(group, version, plural, namespace, name, sub)
        return self.request("PATCH", path, patch, content_type=content_type)

    def merge_patch(
        self, group: str, version: str, plural: str, namespace: str, name: str, patch: Json
    ) -> Json:
        return self.patch(group, version, plural, namespace, name, patch)

    def delete(
        self,
        group: str,
        version: str,
        plural: str,
        name: str,
        namespace: str | None = None,
        *,
        propagation: str = "Background",
        grace_seconds: int | None = None,
        uid: str | None = None,
    ) -> bool:
        """Deletes (background propagation by default: the garbage collector removes dependents
        after the owner is gone); False when it was already gone."""
        options: Json = {
            "apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation,
        }  # fmt: skip
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", api_path(group, version, plural, namespace, name), options)
        except ApiException as err:
            if err.status in (404, 409) if uid else err.status == 404:
                return False
            raise
        return True

    def create_namespace(
        self, name: str, labels: dict[str, str], annotations: dict[str, str] | None = None
    ) -> None:
        meta = {"name": name, "labels": labels, "annotations": annotations or {}}
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}
        self.create("", "v1", "namespaces", body)

    def delete_namespace(self, name: str) -> None:
        with contextlib.suppress(ApiException):  # 404: gone already; anything else: best effort
            self.delete("", "v1", "namespaces", name)

    # --- the gang API, in the version discovery lists ---------------------------------------------

    def gang(self, plural: str, name: str, namespace: str) -> Json | None:
        return self.get(SCHEDULING_GROUP, self.scheduling_version, plural, name, namespace)

    def gangs(self, plural: str, namespace: str) -> list[Json]:
        return self.list_objects(SCHEDULING_GROUP, self.scheduling_version, plural, namespace)

    def whoami(self) -> str:
        """The username the API server gives this kubeconfig's requests (SelfSubjectReview,
        what `kubectl auth whoami` asks)."""
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        answer = self.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", review)
        return str(answer["status"]["userInfo"]["username"])


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
    cfg.connection_pool_maxsize = 16  # the watches (threads) and the test share the client
    cluster = Cluster(path, ApiClient(cfg), str(cfg.host))
    cluster.version = str(body.get("gitVersion") or "")
    return cluster


def _short(err: BaseException) -> str:
    """The root cause of a transport error, in one line."""
    reason = getattr(err, "reason", None)
    text = f"{type(reason or err).__name__}: {reason or err}"
    return text.replace("\n", " ")[:200]


def check_apis(cluster: Cluster, check_crd: bool) -> None:
    """Skip unless the cluster can run the scenario: scheduling.k8s.io Workloads and PodGroups
    served (v1beta1, else v1alpha2: `cluster.scheduling_version` is set to the newest served),
    Kubeflow Trainer's resources served, and (unless `check_crd` is false) the
    ClusterTrainingRuntime CRD declaring spec.scheduling."""
    seen = []
    for version in SCHEDULING_VERSIONS:
        served = cluster.served(f"{SCHEDULING_GROUP}/{version}")
        seen.append(
            f"{version}: " + ("not served" if served is None else ", ".join(sorted(served)))
        )
        if served is not None and {"workloads", "podgroups"} <= served:
            cluster.scheduling_version = version
            break
    else:
        raise Skip(
            f"GenericWorkload off: {SCHEDULING_GROUP} serves no Workloads and PodGroups "
            f"({'; '.join(seen)}) on {cluster.server} ({cluster.version}); start kube-apiserver "
            "with --feature-gates=GenericWorkload=true "
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


# --- what the server is configured with -----------------------------------------------------------


@dataclass(frozen=True)
class ServerFacts:
    """The server's configuration as the server shows it."""

    scheduling_version: str  # the newest scheduling.k8s.io version serving Workloads/PodGroups
    gates: dict[str, bool]  # the API server's feature gates (its /metrics); empty if unreadable
    # PodGroup spec fields a server-side dry-run create dropped (their gate is off), with None
    # when the probe could not run
    dropped_fields: frozenset[str] | None
    trainer_stack: bool  # the namespace label the harness's Trainer/JobSet webhooks need

    def gate(self, name: str) -> bool | None:
        return self.gates.get(name)

    @property
    def topology(self) -> bool:
        """Whether PodGroups keep schedulingConstraints (TopologyAwareWorkloadScheduling)."""
        return (
            self.dropped_fields is not None and "schedulingConstraints" not in self.dropped_fields
        )

    def describe(self) -> str:
        on = sorted(g for g, v in self.gates.items() if v and _gang_gate(g))
        off = sorted(g for g, v in self.gates.items() if not v and _gang_gate(g))
        dropped = "unknown" if self.dropped_fields is None else sorted(self.dropped_fields)
        return (
            f"scheduling.k8s.io/{self.scheduling_version}; gates on: {', '.join(on) or '-'}; "
            f"off: {', '.join(off) or '-'}; PodGroup fields dropped: {dropped}"
        )


def _gang_gate(name: str) -> bool:
    return any(
        word in name
        for word in ("Workload", "Gang", "PodGroup", "Topology", "WorkloadWithJob", "DRA")
    )


def feature_gates(cluster: Cluster) -> dict[str, bool]:
    """The API server's feature gates, from `kubernetes_feature_enabled{name, stage}` in its
    /metrics (readable by cluster-admin); empty when the server does not show them."""
    try:
        status, text = cluster.get_text("/metrics")
    except Exception:
        return {}
    if status != 200:
        return {}
    gates: dict[str, bool] = {}
    for line in text.splitlines():
        if not line.startswith("kubernetes_feature_enabled{"):
            continue
        labels, _, value = line.rpartition("}")
        name = labels.split('name="', 1)[-1].split('"', 1)[0]
        with contextlib.suppress(ValueError):
            gates[name] = float(value.strip()) == 1.0
    return gates


def probe_dropped_fields(
    cluster: Cluster, namespace: str, priority_class: str | None = None
) -> frozenset[str] | None:
    """The gated PodGroup spec fields the server drops: a server-side dry-run create (nothing is
    stored; the server drops a disabled gate's fields as on a real create) of a standalone
    PodGroup setting each (`priorityClassName` too when a PriorityClass is named), compared with
    what comes back; None when the server refused the probe."""
    version = cluster.scheduling_version
    spec: Json = {
        "schedulingPolicy": {"gang": {"minCount": 2}},
        "schedulingConstraints": {"topology": [{"key": "topology.kubernetes.io/zone"}]},
        # 1.37 (v1beta1): a union; 1.36 (v1alpha2): the string enum Pod | PodGroup
        "disruptionMode": {"all": {}} if version == "v1beta1" else "PodGroup",
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    pod_group = {
        "apiVersion": f"{SCHEDULING_GROUP}/{version}", "kind": "PodGroup",
        "metadata": {"name": "e2e-field-probe", "namespace": namespace}, "spec": spec,
    }  # fmt: skip
    try:
        kept = cluster.create(
            SCHEDULING_GROUP, version, "podgroups", pod_group, namespace, dry_run=True
        )
    except ApiException as err:
        cluster.notes.append(f"PodGroup field probe refused: {err.status} {str(err.body)[:300]}")
        return None
    stored = kept.get("spec") or {}
    # Dropped: absent, or back at the server's default (an unset disruptionMode is single).
    return frozenset(key for key in spec if stored.get(key) != spec[key])


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

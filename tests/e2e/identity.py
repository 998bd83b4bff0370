"""The service as the chart runs it in a cluster: a ServiceAccount with the chart's own RBAC,
rendered by Helm (tests/chart.py) with `serve.watchNamespaces` (the ClusterRole keeps the
cluster-scoped rules; each watched namespace gets a Role and a RoleBinding of its own), and a
kubeconfig holding a token of that ServiceAccount.

The suite's shared service runs as the kubeconfig's user (cluster-admin), whom nothing refuses.
A test that needs what RBAC refuses (a watched namespace deleted with its Role) starts a
service of its own as this identity. Everything made is labelled with the run (the session's
sweep and `python -m tests.e2e.registration` delete what a dead run left)."""

from __future__ import annotations

import base64
import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

from kubernetes.client.exceptions import ApiException

from .cluster import Cluster, Json
from .registration import CREATED_BY_KEY, CREATED_BY_VALUE, OWNER_ANNOTATION, RUN_LABEL, owner

RBAC = "rbac.authorization.k8s.io"
# What the service's identity is made of, as the chart renders it: (group, version, plural).
KINDS = {
    "ServiceAccount": ("", "v1", "serviceaccounts"),
    "ClusterRole": (RBAC, "v1", "clusterroles"),
    "ClusterRoleBinding": (RBAC, "v1", "clusterrolebindings"),
    "Role": (RBAC, "v1", "roles"),
    "RoleBinding": (RBAC, "v1", "rolebindings"),
}
TOKEN_SECONDS = 3600


@dataclass(frozen=True)
class ChartIdentity:
    """The chart's ServiceAccount `name` in `namespace` (the release's), for a service watching
    `watched`, and its RBAC as rendered for release `release`."""

    release: str
    namespace: str
    name: str
    watched: tuple[str, ...]
    run: str

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"

    def objects(self) -> list[Json]:
        """The ServiceAccount and every Role, ClusterRole and binding the chart gives it (the
        metrics reader's aside: that one is the scrapers'), labelled with the run."""
        from tests.chart import render  # helm-python-sdk: imported only when a cluster is there

        values = {"serviceAccount": {"name": self.name},
                  "serve": {"watchNamespaces": list(self.watched)}}  # fmt: skip
        rendered = render(values, release=self.release, namespace=self.namespace)
        found = []
        for obj in rendered.release:
            if obj["kind"] not in KINDS or obj["metadata"]["name"].endswith("-metrics-reader"):
                continue
            obj = json.loads(json.dumps(obj))  # the rendering is cached: never change it
            meta = obj["metadata"]
            meta["labels"] = {**(meta.get("labels") or {}), CREATED_BY_KEY: CREATED_BY_VALUE,
                              RUN_LABEL: self.run}  # fmt: skip
            meta["labels"].pop("app.kubernetes.io/managed-by", None)  # not Helm's
            meta["annotations"] = {OWNER_ANNOTATION: owner()}
            found.append(obj)
        return found

    def in_namespace(self, namespace: str) -> list[Json]:
        """What the chart puts in one watched namespace (its Role and RoleBinding)."""
        return [o for o in self.objects() if o["metadata"].get("namespace") == namespace
                and namespace != self.namespace]  # fmt: skip

    def kubeconfig(self, cluster: Cluster, path: Path) -> Path:
        """A kubeconfig for the API server `cluster` talks to, with a fresh token of the
        ServiceAccount (TokenRequest) and the cluster's CA."""
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": {"expirationSeconds": TOKEN_SECONDS}}  # fmt: skip
        issued = cluster.request(
            "POST",
            f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{self.name}/token",
            request,
        )
        admin = cluster.api.configuration
        server: Json = {"server": admin.host}
        if admin.ssl_ca_cert:
            ca = Path(admin.ssl_ca_cert).read_bytes()
            server["certificate-authority-data"] = base64.b64encode(ca).decode()
        else:
            server["insecure-skip-tls-verify"] = not admin.verify_ssl
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "service",
            "clusters": [{"name": "cluster", "cluster": server}],
            "users": [{"name": "service", "user": {"token": issued["status"]["token"]}}],
            "contexts": [{"name": "service", "context": {"cluster": "cluster",
                                                         "user": "service"}}],
        }  # fmt: skip
        path.write_text(json.dumps(config))  # JSON is YAML
        path.chmod(0o600)
        return path


def create(cluster: Cluster, objects: list[Json]) -> None:
    for obj in objects:
        group, version, plural = KINDS[obj["kind"]]
        cluster.create(group, version, plural, obj, obj["metadata"].get("namespace"))


def unhold(cluster: Cluster, objects: list[Json]) -> None:
    """Takes every finalizer off them (a test's own, which keeps one while its namespace is
    deleted); those already gone are skipped."""
    for obj in objects:
        group, version, plural = KINDS[obj["kind"]]
        meta = obj["metadata"]
        with contextlib.suppress(ApiException):
            cluster.patch(group, version, plural, meta.get("namespace"), meta["name"],
                          {"metadata": {"finalizers": None}})  # fmt: skip


def delete(cluster: Cluster, objects: list[Json]) -> None:
    """Deletes them, finalizers first (best effort: a namespace's go with it)."""
    unhold(cluster, objects)
    for obj in objects:
        group, version, plural = KINDS[obj["kind"]]
        meta = obj["metadata"]
        with contextlib.suppress(ApiException):
            cluster.delete(group, version, plural, meta["name"], meta.get("namespace"))

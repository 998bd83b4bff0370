"""The chart's webhook configurations, registered with the API server for one run of the suite,
pointing at the service the run started outside the cluster.

The configurations are rendered by the real Helm engine (tests/chart.py), so the chart's own
rules, selectors, matchConditions, failurePolicies and timeouts are what the API server applies;
whatever webhooks the chart has (a new one included) are registered. Only what an out-of-cluster
service needs is changed:

* the name: `trainjob-scheduling-e2e-<run>` (labelled with the run and its creator);
* `clientConfig`: `url: https://127.0.0.1:<port><the webhook's path>` and the dev CA as
  `caBundle`, instead of the Service reference;
* the chart values `serve.watchNamespaces` (the run's namespaces) and `webhooks.namespaceLabel`
  (the run's label), so the namespaced webhooks are called for the run's namespaces only;
* the cluster-scoped ones (ClusterTrainingRuntime), where no namespaceSelector applies, get an
  objectSelector on the run's label, so other users' runtimes never reach this run's service;
* the service's username in the matchConditions (`not-the-service-itself`): the chart renders
  `system:serviceaccount:<ns>:<sa>`; out of the cluster the service is the kubeconfig's user
  (what a SelfSubjectReview says).

A leftover registration of a dead run would break the cluster (failurePolicy Fail pointing at a
port nothing listens on), so: no finalizers; each configuration is annotated with the host and
pid of the pytest process that made it; the session deletes its own at the end (also on a
failure, Ctrl-C or SIGTERM) and, before it registers, those of runs whose process is gone
(`sweep`); `python -m tests.e2e.registration` sweeps too (`make e2e` runs it after pytest).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import os
import socket
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

from kubernetes.client.exceptions import ApiException

from .cluster import Cluster, Json

ADMISSION_GROUP, ADMISSION_VERSION = "admissionregistration.k8s.io", "v1"
KINDS = {
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
}
CREATED_BY_KEY, CREATED_BY_VALUE = "app.kubernetes.io/created-by", "trainjob-scheduling-e2e"
RUN_LABEL = "trainjob-scheduling-e2e.dev/run"
OWNER_ANNOTATION = "trainjob-scheduling-e2e.dev/owner"  # <host>/<pid> of the pytest process
# What the chart is rendered as: the release's namespace and ServiceAccount only name things
# that are replaced (the Service reference, the service's username).
RELEASE, RELEASE_NAMESPACE, SERVICE_ACCOUNT = "e2e", "trainjob-scheduling-e2e", "e2e-service"
CHART_USERNAME = f"system:serviceaccount:{RELEASE_NAMESPACE}:{SERVICE_ACCOUNT}"


def owner() -> str:
    return f"{socket.gethostname()}/{os.getpid()}"


def name_for(run: str) -> str:
    return f"trainjob-scheduling-e2e-{run}"


@dataclass(frozen=True)
class Registration:
    run: str
    name: str
    objects: tuple[Json, ...]  # the configurations as registered

    def webhooks(self) -> list[Json]:
        return [hook for obj in self.objects for hook in obj.get("webhooks") or []]

    def paths(self) -> list[str]:
        return [str(hook["clientConfig"]["url"]).split(":", 2)[2] for hook in self.webhooks()]


def chart_configurations(namespaces: Iterable[str], run: str) -> list[Json]:
    """The chart's Mutating- and ValidatingWebhookConfiguration, rendered by Helm with the run's
    namespaces and label."""
    from tests.chart import render  # helm-python-sdk: imported only when a cluster is there

    values = {
        "serviceAccount": {"name": SERVICE_ACCOUNT},
        "serve": {"watchNamespaces": sorted(namespaces)},
        "webhooks": {"namespaceLabel": {"key": RUN_LABEL, "value": run}},
    }
    rendered = render(values, release=RELEASE, namespace=RELEASE_NAMESPACE)
    found = [copy.deepcopy(obj) for obj in rendered.release if obj.get("kind") in KINDS]
    kinds = sorted(str(obj["kind"]) for obj in found)
    assert kinds == sorted(KINDS), f"the chart rendered {kinds}, not one of each of {list(KINDS)}"
    return found


def for_local_service(
    configurations: Iterable[Json], *, run: str, port: int, ca_pem: bytes, username: str
) -> list[Json]:
    """The chart's configurations, changed only where an out-of-cluster service needs it (see
    the module's docstring)."""
    ca_bundle = base64.b64encode(ca_pem).decode()
    out = []
    for original in configurations:
        obj = copy.deepcopy(original)
        meta = obj["metadata"]
        labels = {**(meta.get("labels") or {}), CREATED_BY_KEY: CREATED_BY_VALUE, RUN_LABEL: run}
        labels.pop("app.kubernetes.io/managed-by", None)  # not Helm's: this run's
        obj["metadata"] = {
            "name": name_for(run),
            "labels": labels,
            "annotations": {OWNER_ANNOTATION: owner()},
        }
        for hook in obj.get("webhooks") or []:
            service = (hook.get("clientConfig") or {}).get("service") or {}
            path = service.get("path")
            assert path, (
                f"webhook {hook.get('name')} has no service path: {hook.get('clientConfig')}"
            )
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
            if any(rule.get("scope") == "Cluster" for rule in hook.get("rules") or []):
                selector = hook.get("objectSelector") or {}
                selector["matchLabels"] = {**(selector.get("matchLabels") or {}), RUN_LABEL: run}
                hook["objectSelector"] = selector
            for condition in hook.get("matchConditions") or []:
                condition["expression"] = str(condition["expression"]).replace(
                    CHART_USERNAME, username
                )
        out.append(obj)
    return out


def register(cluster: Cluster, objects: list[Json], run: str) -> Registration:
    """Creates the configurations (after removing any of the same name); on a failure midway,
    removes what it made."""
    made: list[Json] = []
    try:
        for obj in objects:
            plural = KINDS[obj["kind"]]
            cluster.delete(ADMISSION_GROUP, ADMISSION_VERSION, plural, obj["metadata"]["name"])
            made.append(cluster.create(ADMISSION_GROUP, ADMISSION_VERSION, plural, obj))
    except BaseException:
        unregister(cluster, run)
        raise
    return Registration(run, name_for(run), tuple(made))


def unregister(cluster: Cluster, run: str) -> list[str]:
    """Deletes the run's configurations (by its label, whatever their names); what it deleted.
    Retries transient failures for a while: a configuration left behind breaks the cluster."""
    deleted: list[str] = []
    for kind, plural in KINDS.items():
        for attempt in range(10):
            try:
                for obj in cluster.list_objects(
                    ADMISSION_GROUP, ADMISSION_VERSION, plural, labels=f"{RUN_LABEL}={run}"
                ):
                    name = obj["metadata"]["name"]
                    if cluster.delete(ADMISSION_GROUP, ADMISSION_VERSION, plural, name):
                        deleted.append(f"{kind}/{name}")
                break
            except Exception as err:
                if attempt == 9:
                    print(f"e2e: could not delete the run's {kind}: {err}", file=sys.stderr)
                time.sleep(1)
    return deleted


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"python" in cmdline.read()  # not a recycled pid of another program
    except OSError:
        return True  # no /proc: assume the worst (alive)


def stale(obj: Json) -> bool:
    """Whether a configuration of this suite was made by a process of this host that is gone.
    Another host's, or a live run's, is left alone."""
    mark = str(((obj.get("metadata") or {}).get("annotations") or {}).get(OWNER_ANNOTATION, ""))
    host, _, pid = mark.rpartition("/")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    return int(pid) != os.getpid() and not _alive(int(pid))


def sweep(cluster: Cluster) -> list[str]:
    """Deletes what runs of this suite left when their process died (a crash, a kill -9): their
    webhook configurations first (a Fail webhook on a closed port breaks the cluster), then
    their namespaces, fake nodes, runtimes and PriorityClasses (by the run's label); what it
    deleted."""
    deleted = []
    dead_runs: set[str] = set()
    selector = f"{CREATED_BY_KEY}={CREATED_BY_VALUE}"
    for kind, plural in KINDS.items():
        found = cluster.list_objects(ADMISSION_GROUP, ADMISSION_VERSION, plural, labels=selector)
        for obj in found:
            if stale(obj):
                name = obj["metadata"]["name"]
                dead_runs.add(str((obj["metadata"].get("labels") or {}).get(RUN_LABEL, "")))
                with contextlib.suppress(ApiException):
                    if cluster.delete(ADMISSION_GROUP, ADMISSION_VERSION, plural, name):
                        deleted.append(f"{kind}/{name}")
    for kind, group, version, plural in LEFTOVERS:
        with contextlib.suppress(ApiException):
            for obj in cluster.list_objects(group, version, plural, labels=selector):
                labels = obj["metadata"].get("labels") or {}
                if stale(obj) or labels.get(RUN_LABEL) in dead_runs - {""}:
                    name = obj["metadata"]["name"]
                    with contextlib.suppress(ApiException):
                        if cluster.delete(group, version, plural, name):
                            deleted.append(f"{kind}/{name}")
                    if kind == "Namespace":
                        _force_delete_pods(cluster, name)
    return deleted


def _force_delete_pods(cluster: Cluster, namespace: str) -> None:
    """No kubelet confirms the deletion of pods on fake nodes (and their nodes go next)."""
    with contextlib.suppress(ApiException):
        for pod in cluster.list_objects("", "v1", "pods", namespace):
            with contextlib.suppress(ApiException):
                cluster.delete("", "v1", "pods", pod["metadata"]["name"], namespace,
                               grace_seconds=0)  # fmt: skip


# What a run makes besides its webhook configurations (all labelled with it).
LEFTOVERS = (
    ("Namespace", "", "v1", "namespaces"),
    ("Node", "", "v1", "nodes"),
    ("ClusterTrainingRuntime", "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes"),
    ("PriorityClass", "scheduling.k8s.io", "v1", "priorityclasses"),
    ("ClusterRole", "rbac.authorization.k8s.io", "v1", "clusterroles"),  # identity.py
    ("ClusterRoleBinding", "rbac.authorization.k8s.io", "v1", "clusterrolebindings"),
)


def main(argv: list[str]) -> int:
    """`python -m tests.e2e.registration`: deletes the configurations of dead runs on the
    cluster of E2E_KUBECONFIG/KUBECONFIG (nothing to do without one)."""
    from .cluster import Skip, connect

    del argv
    try:
        cluster = connect()
    except Skip as why:
        print(f"e2e sweep: nothing to do ({why})")
        return 0
    try:
        deleted = sweep(cluster)
    finally:
        cluster.close()
    print(
        "e2e sweep: "
        + (f"deleted {', '.join(deleted)}" if deleted else "nothing left by dead runs")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`make e2e-chart`: the chart installed with Helm in the cluster, then the e2e suite against it.

`make e2e` runs the service outside the cluster; this runs it as a platform engineer does: `helm
install` (the real Helm engine, helm-python-sdk) of charts/trainjob-scheduling with the image
the cluster's nodes have, its own ServiceAccount token, the chart's RBAC, its self-managed
certificate and caBundle injection, leader election between its two replicas. Then `helm test`,
the e2e suite with `E2E_EXTERNAL_SERVICE=1` (the tests only observe the installed service), and
`helm uninstall` (its pre-delete hook deletes the webhook configurations first), checked.

On the harness (a Node labelled tjs.dev/real-node=true, tainted so), the pods go to that node
and use the image the harness built from the checkout (`node/build-images.sh`), never pulled.
Elsewhere, give the values (`--values`: at least `image.repository` a node can pull).

Usage: python -m tools.e2e_chart [--kubeconfig K] [--values FILE] [--keep] [-- PYTEST ARGS]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

from tests.e2e.cluster import Cluster, Skip, connect

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "trainjob-scheduling"
RELEASE = "trainjob-scheduling"
NAMESPACE = "trainjob-scheduling-system"
NAME = f"{RELEASE}-webhook"  # the Deployment, the Service and both webhook configurations
REAL_NODE = "tjs.dev/real-node"  # the harness's real kubelet node: its label and its taint
HARNESS_IMAGE = "docker.io/library/trainjob-scheduling-webhook"  # as its build imports it
ADMISSION = ("admissionregistration.k8s.io", "v1")
CONFIGURATIONS = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")


def harness_values(cluster: Cluster) -> dict[str, Any]:
    """Where the harness's real node is: the pods on it, with the image built there."""
    if not cluster.list_objects("", "v1", "nodes", labels=f"{REAL_NODE}=true"):
        return {}
    return {
        "image": {"repository": HARNESS_IMAGE, "pullPolicy": "Never"},
        "nodeSelector": {REAL_NODE: "true"},
        "tolerations": [{"key": REAL_NODE, "operator": "Exists", "effect": "NoSchedule"}],
    }


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def configurations(cluster: Cluster) -> list[dict[str, Any]]:
    found = (cluster.get(*ADMISSION, plural, NAME) for plural in CONFIGURATIONS)
    return [c for c in found if c is not None]


def injected(cluster: Cluster) -> bool:
    """Both configurations are there, and every webhook has the CA the service injected."""
    found = configurations(cluster)
    hooks = [w for c in found for w in c.get("webhooks") or []]
    return len(found) == 2 and all(w.get("clientConfig", {}).get("caBundle") for w in hooks)


def namespace_gone(cluster: Cluster, timeout: float = 180) -> None:
    """Waits until the release namespace is gone (a previous run's, still terminating)."""
    deadline = time.monotonic() + timeout
    while cluster.get("", "v1", "namespaces", NAMESPACE) is not None:
        if time.monotonic() > deadline:
            raise SystemExit(f"e2e-chart: namespace {NAMESPACE} still there after {timeout:.0f} s")
        time.sleep(1)


def has_cluster_dns(cluster: Cluster) -> bool:
    return cluster.get("", "v1", "services", "kube-dns", "kube-system") is not None


def pods(cluster: Cluster, component: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/component={component}"
    return cluster.list_objects("", "v1", "pods", NAMESPACE, labels=selector)


def helm_test(helm_config: helm.Config, cluster: Cluster) -> None:
    """`helm test`: its pods' logs said when one fails."""
    try:
        helm_config.test(RELEASE, timeout=180)
    except helm.HelmError as failed:
        for pod in pods(cluster, "test"):
            name = pod["metadata"]["name"]
            _, log = cluster.get_text(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/log")
            print(f"e2e-chart: {name}: {pod.get('status', {}).get('phase')}\n{log[-3000:]}")
        raise SystemExit(f"e2e-chart: helm test failed: {failed}") from failed
    print("e2e-chart: helm test passed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--kubeconfig", default=os.environ.get("E2E_KUBECONFIG") or "")
    parser.add_argument("--values", type=Path, help="a values file, merged over the harness's")
    parser.add_argument("--keep", action="store_true", help="leave the release installed")
    parser.add_argument("pytest", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args()
    kubeconfig = args.kubeconfig or os.environ.get("KUBECONFIG") or ""
    if not kubeconfig:
        print("e2e-chart: no cluster: set KUBECONFIG or --kubeconfig", file=sys.stderr)
        return 2
    os.environ["E2E_KUBECONFIG"] = kubeconfig
    try:
        cluster = connect()
    except Skip as why:
        print(f"e2e-chart: {why}", file=sys.stderr)
        return 2
    values = harness_values(cluster)
    if args.values:
        values = merged(values, yaml.safe_load(args.values.read_text()) or {})
    print(f"e2e-chart: helm install {RELEASE} -n {NAMESPACE} {json.dumps(values)}")
    helm_config = helm.Config(kubeconfig_path=kubeconfig, namespace=NAMESPACE)
    chart = helm.Chart.load(CHART)
    namespace_gone(cluster)
    started = time.monotonic()
    outcome = 1
    try:
        helm_config.install(
            chart, RELEASE, values, namespace=NAMESPACE, create_namespace=True,
            wait="watcher", timeout=300,
        )  # fmt: skip
        deployment = cluster.get("apps", "v1", "deployments", NAME, NAMESPACE) or {}
        ready = deployment.get("status", {}).get("readyReplicas", 0)
        pod_spec = deployment.get("spec", {}).get("template", {}).get("spec", {})
        account = pod_spec.get("serviceAccountName") or "default"
        print(f"e2e-chart: installed in {time.monotonic() - started:.0f} s, {ready} ready")
        deadline = time.monotonic() + 60
        while not injected(cluster):
            if time.monotonic() > deadline:
                raise SystemExit("e2e-chart: the CA was not injected into every webhook in 60 s")
            time.sleep(1)
        if not has_cluster_dns(cluster):
            # The test pods reach the Service by its DNS name, as the webhook clients do.
            print("e2e-chart: helm test skipped: the cluster has no DNS (no kube-system/kube-dns)")
        else:
            helm_test(helm_config, cluster)
        env = {
            **os.environ,
            "E2E": "1",
            "E2E_KUBECONFIG": kubeconfig,
            "E2E_EXTERNAL_SERVICE": "1",
            # The writes only the service may make (test_rollback) are made as it.
            "E2E_SERVICE_USER": f"system:serviceaccount:{NAMESPACE}:{account}",
            # The outage test scales it to 0 and back.
            "E2E_SERVICE_DEPLOYMENT": f"{NAMESPACE}/{NAME}",
        }
        suite = [sys.executable, "-m", "pytest", "tests/e2e", "-v", *args.pytest]
        outcome = subprocess.run(suite, cwd=REPO, env=env, check=False).returncode
        for pod in pods(cluster, "webhook"):
            statuses = pod.get("status", {}).get("containerStatuses") or []
            restarts = sum(int(c.get("restartCount", 0)) for c in statuses)
            where = pod.get("spec", {}).get("nodeName")
            print(f"e2e-chart: pod {pod['metadata']['name']} on {where}: {restarts} restarts")
    finally:
        if args.keep:
            print("e2e-chart: --keep: the release stays installed")
        else:
            helm_config.uninstall(RELEASE, wait="watcher", timeout=180, ignore_not_found=True)
            left = [c["metadata"]["name"] for c in configurations(cluster)]
            if left:
                print(f"e2e-chart: left after uninstall: {left}", file=sys.stderr)
                outcome = outcome or 1
            else:
                print("e2e-chart: uninstalled; both webhook configurations deleted by its hook")
            cluster.delete_namespace(NAMESPACE)
            namespace_gone(cluster)
            cluster.close()
    print(f"e2e-chart: {time.monotonic() - started:.0f} s in all, pytest exit {outcome}")
    return outcome


if __name__ == "__main__":
    sys.exit(main())

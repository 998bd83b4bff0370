"""Node objects for the tests and benchmarks, in the JSON shape the API server stores (the
kubelet's status included, so trimming has something to drop)."""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]
ZONE = "topology.kubernetes.io/zone"
RACK = "example.com/rack"
GPU = "nvidia.com/gpu"


def node(
    name: str,
    *,
    zone: str | None = None,
    rack: str | None = None,
    gpus: int = 0,
    cpu: str = "64",
    memory: str = "256Gi",
    pods: int = 110,
    taints: list[Json] | None = None,
    cordoned: bool = False,
    labels: dict[str, str] | None = None,
) -> Json:
    found = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(labels or {})}
    if zone is not None:
        found[ZONE] = zone
    if rack is not None:
        found[RACK] = rack
    allocatable = {"cpu": cpu, "memory": memory, "pods": str(pods), "ephemeral-storage": "900Gi"}
    if gpus:
        allocatable[GPU] = str(gpus)
    spec: Json = {"podCIDR": "10.0.0.0/24", "providerID": f"example://{name}"}
    if taints:
        spec["taints"] = taints
    if cordoned:
        spec["unschedulable"] = True
        spec["taints"] = [
            *(taints or []),
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
        ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": found, "annotations": {"node.alpha/ttl": "0"}},
        "spec": spec,
        "status": {
            "allocatable": allocatable,
            "capacity": {**allocatable, "memory": "264Gi"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "addresses": [{"type": "Hostname", "address": name}],
            "images": [{"names": [f"registry.example.com/image-{i}:v1"]} for i in range(5)],
            "nodeInfo": {"kubeletVersion": "v1.37.0", "architecture": "amd64"},
        },
    }


def nodes(prefix: str, count: int, **kw: Any) -> list[Json]:
    return [node(f"{prefix}-{i}", **kw) for i in range(count)]

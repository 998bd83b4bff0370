"""Could a gang ever fit? Node sets built by hand, the numbers worked out in each test.

Every node here has 64 cpu, 256Gi memory and 110 pods unless a test says otherwise; pods ask
for GPUs (`nvidia.com/gpu`) so the GPU count per node decides, as in the issue's example.
"""

from __future__ import annotations

import itertools
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import Json, rj, runtime, torch_node, trainjob
from tests.nodes import GPU, RACK, ZONE, node, nodes
from webhook.core.feasibility import Demand, Fit, Gang, Nodes, Part, gangs_of, judge, message
from webhook.core.nodes import NodeSummary, summary_of
from webhook.core.placement import PodNeeds
from webhook.core.plan import build_plan
from webhook.core.trainer import Runtime, TrainJob

IN_ZONE = {"schedulingConstraints": {"topology": [{"key": ZONE}]}}


def pod(job: Json, **spec: Any) -> Json:
    """`job` with these pod spec fields (containers, initContainers, tolerations, ...)."""
    job["template"]["spec"]["template"]["spec"].update(spec)
    return job


def container(name: str, **requests: Any) -> Json:
    """Its extended resources (GPUs) get an equal limit: the API server refuses them without."""
    limits = {k: v for k, v in requests.items() if "/" in k}
    resources = {"requests": requests, "limits": limits} if limits else {"requests": requests}
    return {"name": name, "image": "x", "resources": resources}


def gpu_node(gpus: int = 4, **spec: Any) -> Json:
    """The trainer ReplicatedJob, its container asking for `gpus` GPUs."""
    return pod(torch_node(), containers=[container("node", **{GPU: gpus})], **spec)


def judged(
    raw_runtime: Json, raw_trainjob: Json, node_list: list[Json], topology: bool = True
) -> list[tuple[Gang, Fit]]:
    rt, tj = Runtime.model_validate(raw_runtime), TrainJob.model_validate(raw_trainjob)
    plan = build_plan(tj, rt)
    assert plan is not None
    gangs, notes = gangs_of(plan, rt, tj, topology=topology)
    assert not notes, notes
    summary = summary_of(node_list)
    view = Nodes(summary.shapes, summary.dropped_keys)
    return [(g, judge(g.demand, view)) for g in gangs]


def one(raw_runtime: Json, raw_trainjob: Json, node_list: list[Json]) -> tuple[Gang, Fit]:
    (found,) = judged(raw_runtime, raw_trainjob, node_list)
    return found


def torch_job(pods: int) -> Json:
    return trainjob(num_nodes=pods)


# --- domains that fit, or fall short ------------------------------------------------------------


def test_a_zone_that_fits_exactly_and_one_gpu_short() -> None:
    # zone-a: 8 nodes of 8 GPUs = 2 pods of 4 GPUs each = 16 pods; zone-b: 4 nodes = 8 pods.
    cluster = nodes("a", 8, zone="zone-a", gpus=8) + nodes("b", 4, zone="zone-b", gpus=8)
    rt = runtime(gpu_node(4), scheduling=IN_ZONE)
    gang, fit = one(rt, torch_job(16), cluster)
    assert fit.fits and fit.reason is None and message(gang, fit) == ""
    assert [(d.value, d.nodes, d.capacity) for d in fit.domains] == [
        ("zone-a", 8, 16),
        ("zone-b", 4, 8),
    ]
    assert fit.headroom(gang.demand) == 0  # zone-a must be entirely free

    # One node of zone-a has 7 GPUs: 7 x 2 + 1 x 1 = 15 pods, one short; 63 GPUs of 64.
    short = [*nodes("a", 7, zone="zone-a", gpus=8), node("a-7", zone="zone-a", gpus=7)]
    gang, fit = one(rt, torch_job(16), short + nodes("b", 4, zone="zone-b", gpus=8))
    assert not fit.fits and fit.reason == "DomainTooSmall"
    assert fit.best is not None and fit.best.capacity == 15
    assert fit.headroom(gang.demand) == -1
    assert message(gang, fit) == (
        "gang node of 16 pods needs 64 nvidia.com/gpu in one topology.kubernetes.io/zone; the "
        "largest zone has 63 (zone-a, 8 nodes)"
    )


def test_the_issues_example_word_for_word() -> None:
    # zone-b: 24 nodes x 8 GPUs = 192; 64 pods x 4 GPUs = 256; zone-a has 6 nodes.
    cluster = nodes("b", 24, zone="zone-b", gpus=8) + nodes("a", 6, zone="zone-a", gpus=8)
    gang, fit = one(runtime(gpu_node(4), scheduling=IN_ZONE), torch_job(64), cluster)
    assert message(gang, fit) == (
        "gang node of 64 pods needs 256 nvidia.com/gpu in one topology.kubernetes.io/zone; the "
        "largest zone has 192 (zone-b, 24 nodes)"
    )


def test_summing_gpus_is_not_enough_whole_pods_count() -> None:
    # 80 nodes of 6 GPUs: 480 GPUs, but 6 // 4 = 1 pod of 4 GPUs per node: 80 pods, not 120.
    cluster = nodes("n", 80, gpus=6)
    gang, fit = one(runtime(gpu_node(4), scheduling={}), torch_job(100), cluster)
    assert fit.reason == "DomainTooSmall" and fit.best is not None
    assert (fit.best.value, fit.best.capacity) == (None, 80)
    assert message(gang, fit) == (
        "gang node of 100 pods does not fit in the cluster: the cluster holds 80 of them (80 "
        "nodes; 4 nvidia.com/gpu each)"
    )
    assert one(runtime(gpu_node(4), scheduling={}), torch_job(80), cluster)[1].fits


def test_the_pods_allocatable_caps_a_node() -> None:
    # 4 nodes allowing 3 pods each hold 12 small pods, whatever their cpu.
    cluster = nodes("n", 4, pods=3)
    rt = runtime(pod(torch_node(), containers=[container("node", cpu="100m")]), scheduling={})
    assert one(rt, torch_job(12), cluster)[1].fits
    _, fit = one(rt, torch_job(13), cluster)
    assert fit.best is not None and fit.best.capacity == 12 and fit.reason == "DomainTooSmall"


def test_nodes_without_the_topology_label_are_left_out() -> None:
    # 10 nodes in zone-a (2 pods each: 20), 30 nodes with no zone label (60 pods).
    cluster = nodes("a", 10, zone="zone-a", gpus=8) + nodes("x", 30, gpus=8)
    gang, fit = one(runtime(gpu_node(4), scheduling=IN_ZONE), torch_job(24), cluster)
    assert fit.reason == "DomainTooSmall" and fit.left_out == {"unlabelled": 30}
    assert fit.best is not None and (fit.best.value, fit.best.capacity) == ("zone-a", 20)
    # Without a topology key the whole cluster is the domain: 80 pods.
    _, anywhere = one(runtime(gpu_node(4), scheduling={}), torch_job(24), cluster)
    assert anywhere.fits and anywhere.best is not None and anywhere.best.capacity == 80
    # No node carries the key at all.
    rack = {"schedulingConstraints": {"topology": [{"key": RACK}]}}
    gang, fit = one(runtime(gpu_node(4), scheduling=rack), torch_job(2), cluster)
    assert fit.reason == "NoTopologyLabel" and not fit.domains
    assert message(gang, fit) == (
        "gang node of 2 pods: none of the 40 nodes its pods may use has the label example.com/rack"
    )


# --- taints, cordons, selectors, affinity -------------------------------------------------------

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def test_tainted_and_cordoned_nodes_are_left_out_unless_tolerated() -> None:
    # zone-a: 4 plain nodes, 4 tainted nvidia.com/gpu=present:NoSchedule, 2 cordoned; 2 more
    # with a PreferNoSchedule taint and 1 not-ready (NoExecute): both count, as they pass.
    cluster = (
        nodes("plain", 4, zone="zone-a", gpus=8)
        + nodes("tainted", 4, zone="zone-a", gpus=8, taints=[GPU_TAINT])
        + nodes("cordoned", 2, zone="zone-a", gpus=8, cordoned=True)
        + nodes("soft", 2, zone="zone-a", gpus=8,
                taints=[{**GPU_TAINT, "effect": "PreferNoSchedule"}])
        + nodes("flaky", 1, zone="zone-a", gpus=8,
                taints=[{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}])
    )  # fmt: skip
    # Intolerant pods: 4 + 2 + 1 = 7 nodes, 14 pods.
    gang, fit = one(runtime(gpu_node(4), scheduling=IN_ZONE), torch_job(16), cluster)
    assert fit.best is not None and (fit.best.usable, fit.best.nodes, fit.best.capacity) == (
        7,
        13,
        14,
    )
    assert fit.left_out == {"tainted": 4, "cordoned": 2}
    assert message(gang, fit).endswith("the largest zone has 56 (zone-a, 7 usable nodes)")
    # Tolerating the GPU taint: 11 nodes, 22 pods; the cordoned ones stay out.
    tolerant = gpu_node(4, tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    _, fit = one(runtime(tolerant, scheduling=IN_ZONE), torch_job(22), cluster)
    assert fit.fits and fit.best is not None and fit.best.capacity == 22
    assert fit.left_out == {"cordoned": 2}
    # A toleration of everything (empty key, Exists) takes cordoned nodes too: 13 x 2 = 26.
    everything = gpu_node(4, tolerations=[{"operator": "Exists"}])
    _, fit = one(runtime(everything, scheduling=IN_ZONE), torch_job(26), cluster)
    assert fit.fits and fit.left_out == {}
    # A wrong value does not tolerate an Equal taint; a wrong effect does not either.
    for wrong in (
        {"key": "nvidia.com/gpu", "value": "absent"},
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoExecute"},
    ):
        _, fit = one(runtime(gpu_node(4, tolerations=[wrong]), scheduling=IN_ZONE),
                     torch_job(16), cluster)  # fmt: skip
        assert fit.left_out == {"tainted": 4, "cordoned": 2}, wrong


def test_no_node_at_all_takes_the_pods() -> None:
    cluster = nodes("t", 3, gpus=8, taints=[GPU_TAINT]) + nodes("c", 2, gpus=8, cordoned=True)
    gang, fit = one(runtime(gpu_node(4), scheduling={}), torch_job(2), cluster)
    assert fit.reason == "NoMatchingNodes"
    assert message(gang, fit) == (
        "gang node of 2 pods: no node takes its pods (2 cordoned, 3 with taints they do not "
        "tolerate)"
    )


H100 = {"node.kubernetes.io/instance-type": "h100", "example.com/gpu-memory-gb": "80"}
A100 = {"node.kubernetes.io/instance-type": "a100", "example.com/gpu-memory-gb": "40"}


def test_node_selectors_and_required_affinity_choose_the_nodes() -> None:
    # zone-a: 6 h100 nodes (12 pods) and 10 a100 nodes (20 pods).
    cluster = nodes("h", 6, zone="zone-a", gpus=8, labels=H100) + nodes(
        "a", 10, zone="zone-a", gpus=8, labels=A100
    )

    def capacity(**spec: Any) -> tuple[int, dict[str, int]]:
        _, fit = one(runtime(gpu_node(4, **spec), scheduling=IN_ZONE), torch_job(8), cluster)
        assert fit.best is not None
        return fit.best.capacity, dict(fit.left_out)

    assert capacity() == (32, {})
    assert capacity(nodeSelector={"node.kubernetes.io/instance-type": "h100"}) == (
        12, {"unselected": 10},
    )  # fmt: skip

    def required(*expressions: Json) -> Json:
        terms = [{"matchExpressions": [e]} for e in expressions]
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms}}}  # fmt: skip

    key = "node.kubernetes.io/instance-type"
    assert (
        capacity(affinity=required({"key": key, "operator": "In", "values": ["h100", "h200"]}))[0]
        == 12
    )
    assert (
        capacity(affinity=required({"key": key, "operator": "NotIn", "values": ["h100"]}))[0] == 20
    )
    memory = "example.com/gpu-memory-gb"
    assert capacity(affinity=required({"key": memory, "operator": "Gt", "values": ["60"]}))[0] == 12
    assert capacity(affinity=required({"key": memory, "operator": "Lt", "values": ["60"]}))[0] == 20
    assert capacity(affinity=required({"key": "example.com/none", "operator": "Exists"}))[0] == 0
    # Terms are ORed: h100 or a100 is every node.
    either = required({"key": key, "operator": "In", "values": ["h100"]},
                      {"key": key, "operator": "In", "values": ["a100"]})  # fmt: skip
    assert capacity(affinity=either)[0] == 32
    # Selector and affinity both apply (h100 by selector, NotIn h100 by affinity: nothing).
    assert (
        capacity(
            nodeSelector={key: "h100"},
            affinity=required({"key": key, "operator": "NotIn", "values": ["h100"]}),
        )[0]
        == 0
    )
    # The summary does not keep per-node labels (hostname): a pod pinned by one is judged as if
    # unpinned, which can only say "fits" too often, never "cannot fit" wrongly.
    assert capacity(nodeSelector={"kubernetes.io/hostname": "h-0"})[0] == 32


def test_a_trainjob_patch_adds_tolerations_and_replaces_the_selector() -> None:
    cluster = nodes("h", 2, gpus=8, labels=H100, taints=[GPU_TAINT]) + nodes(
        "a", 3, gpus=8, labels=A100
    )
    job = gpu_node(4, nodeSelector={"node.kubernetes.io/instance-type": "a100"})
    patched = torch_job(4)
    patch = {"nodeSelector": {"node.kubernetes.io/instance-type": "h100"},
             "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}  # fmt: skip
    patched["spec"]["runtimePatches"] = [{"manager": "example.com/placer", "trainingRuntimeSpec": {
        "template": {"spec": {"replicatedJobs": [
            {"name": "node", "template": {"spec": {"template": {"spec": patch}}}}]}}}}]  # fmt: skip
    _, plain = one(runtime(job, scheduling={}), torch_job(4), cluster)
    _, moved = one(runtime(job, scheduling={}), patched, cluster)
    assert plain.best is not None and plain.best.capacity == 6  # 3 a100 nodes x 2
    assert moved.best is not None and moved.best.capacity == 4  # 2 h100 nodes x 2, tolerated


# --- what a pod requests -----------------------------------------------------------------------


def test_init_containers_larger_than_the_app_containers_decide() -> None:
    # App container 2 GPUs; an init container needs 4: the pod requests max(2, 4) = 4, so an
    # 8-GPU node holds 2 pods, not 4. A sidecar (restartPolicy Always) of 1 GPU runs beside
    # both: max(2 + 1, 4 + 1) = 5 per pod, 1 per node.
    cluster = nodes("n", 4, gpus=8)
    init = {**container("warmup", **{GPU: 4})}
    job = pod(torch_node(), containers=[container("node", **{GPU: 2})], initContainers=[init])
    _, fit = one(runtime(job, scheduling={}), torch_job(8), cluster)
    assert fit.fits and fit.best is not None and fit.best.capacity == 8
    assert not one(runtime(job, scheduling={}), torch_job(9), cluster)[1].fits
    sidecar = {**container("proxy", **{GPU: 1}), "restartPolicy": "Always"}
    job = pod(torch_node(), containers=[container("node", **{GPU: 2})],
              initContainers=[sidecar, init])  # fmt: skip
    _, fit = one(runtime(job, scheduling={}), torch_job(4), cluster)
    assert fit.fits and fit.best is not None and fit.best.capacity == 4


def test_resources_per_node_replace_the_trainer_containers() -> None:
    cluster = nodes("n", 2, gpus=8)
    job = trainjob(num_nodes=8)
    job["spec"]["trainer"]["resourcesPerNode"] = {"requests": {GPU: 2}}
    _, fit = one(runtime(gpu_node(8), scheduling={}), job, cluster)
    assert fit.fits and fit.best is not None and fit.best.capacity == 8  # 2 nodes x 8 // 2


def test_a_pod_too_large_for_any_node() -> None:
    gang, fit = one(runtime(gpu_node(16), scheduling={}), torch_job(1), nodes("n", 5, gpus=8))
    assert fit.reason == "PodTooLarge"
    assert message(gang, fit) == (
        "gang node of 1 pods: no node has room for one of its pods: each needs 16 nvidia.com/gpu, "
        "no node has more than 8"
    )


# --- several gangs, and gangs whose pods differ --------------------------------------------------


def test_several_gangs_of_one_trainjob_are_judged_each() -> None:
    # Gang 1: launcher + node (MPI: numNodes 4, node pods 4 GPUs, launcher cpu only) in a zone;
    # gang 2: eval (2 pods of 8 GPUs) in a rack. zone-a has 2 racks of 2 nodes of 8 GPUs.
    cluster = [node(f"n{i}", zone="zone-a", rack=f"r{i // 2}", gpus=8) for i in range(4)]
    launcher = pod(rj("launcher"), containers=[container("launcher", cpu="2")])
    workers = pod(rj("node"), containers=[container("node", **{GPU: 4})])
    evaluation = pod(rj("eval", parallelism=2), containers=[container("eval", **{GPU: 8})])
    rack = {"schedulingConstraints": {"topology": [{"key": RACK}]}}
    entries = [{"targetReplicatedJobs": ["launcher", "node"], **IN_ZONE},
               {"targetReplicatedJobs": ["eval"], **rack}]  # fmt: skip
    rt = runtime(launcher, workers, evaluation, scheduling={"replicatedJobs": entries},
                 ml={"numNodes": 1, "mpi": {}})  # fmt: skip
    found = judged(rt, trainjob(num_nodes=8), cluster)
    assert [(g.label, g.demand.pods, f.fits) for g, f in found] == [
        ("launcher+node", 9, True),  # 8 node pods (4 nodes x 2) + the launcher: fits
        ("eval", 2, True),  # one rack: 2 nodes x 1
    ]
    found = judged(rt, trainjob(num_nodes=9), cluster)
    (gang, fit), (_, fine) = found
    assert fine.fits and not fit.fits
    assert message(gang, fit) == (
        "gang launcher+node: its 9 node pods need 36 nvidia.com/gpu in one "
        "topology.kubernetes.io/zone; the largest zone has 32 (zone-a, 4 nodes)"
    )


def mixed(node_pods: int, node_cpu: str, launcher_cpu: str) -> Demand:
    return Demand(
        (
            Part("launcher", PodNeeds((("cpu", Decimal(launcher_cpu)),)), 1),
            Part("node", PodNeeds((("cpu", Decimal(node_cpu)), (GPU, Decimal(2)))), node_pods),
        ),
        ZONE,
    )


def view(node_list: list[Json]) -> Nodes:
    summary = summary_of(node_list)
    return Nodes(summary.shapes, summary.dropped_keys)


def test_a_mixed_gang_is_ruled_out_only_by_what_every_placement_needs() -> None:
    # 3 nodes of 64 cpu and 8 GPUs. Node pods of 20 cpu + 2 GPUs: 3 per node (cpu), 9 alone;
    # a launcher of 64 cpu: 1 per node, 3 alone. Each part fits alone; together they need
    # 7 x 20 + 64 = 204 cpu and the zone has 192: no placement exists.
    cluster = nodes("n", 3, zone="zone-a", gpus=8)
    fit = judge(mixed(7, "20", "64"), view(cluster))
    assert fit.reason == "DomainTooSmall" and fit.best is not None
    assert fit.best.binding == ("resource", "cpu") and fit.best.part_pods == {
        "launcher": 3,
        "node": 9,
    }
    gang = Gang("launcher+node", mixed(7, "20", "64"), ("pg",))
    assert message(gang, fit) == (
        "gang launcher+node of 8 pods needs 204 cpu in one topology.kubernetes.io/zone; the "
        "largest zone has 192 (zone-a, 3 nodes)"
    )
    # 6 node pods: 6 x 20 + 64 = 184 <= 192, and it packs (the launcher on one node, 3 node
    # pods on each of the other two): said to fit.
    assert judge(mixed(6, "20", "64"), view(cluster)).fits
    # The rule's price: 2 nodes of 64 cpu, pods of 40 cpu (2 node pods, 1 launcher). Each part
    # fits alone and 120 <= 128 cpu, so it is said to fit, though only 2 such pods fit at
    # once. Never the other way round (the property below).
    assert judge(mixed(2, "40", "40"), view(nodes("m", 2, zone="zone-a", gpus=8))).fits


def _packs(parts: list[tuple[dict[str, int], int]], bins: list[dict[str, int]]) -> bool:
    """Whether some assignment of every pod to one node respects every node's allocatable."""
    pods = [need for need, count in parts for _ in range(count)]
    for assignment in itertools.product(range(len(bins)), repeat=len(pods)):
        used = [dict.fromkeys(b, 0) for b in bins]
        ok = True
        for need, where in zip(pods, assignment, strict=True):
            for resource, amount in {**need, "pods": 1}.items():
                used[where][resource] = used[where].get(resource, 0) + amount
                if used[where][resource] > bins[where].get(resource, 0):
                    ok = False
        if ok:
            return True
    return False


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 8), st.integers(0, 4), st.integers(1, 3)), min_size=1,
             max_size=3),
    st.lists(st.tuples(st.integers(1, 6), st.integers(0, 2), st.integers(1, 3)), min_size=1,
             max_size=2),
)  # fmt: skip
def test_never_says_cannot_fit_when_a_placement_exists(
    node_specs: list[tuple[int, int, int]], part_specs: list[tuple[int, int, int]]
) -> None:
    """Small clusters (cpu, gpu, pods per node) and gangs of up to two pod shapes (cpu, gpu,
    count): whenever the judgement says "cannot fit", no assignment of the pods exists."""
    bins = [{"cpu": c, GPU: g, "pods": p} for c, g, p in node_specs]
    cluster = [node(f"n{i}", cpu=str(c), gpus=g, pods=p) for i, (c, g, p) in enumerate(node_specs)]
    demand = Demand(
        tuple(
            Part(
                f"rj{i}",
                PodNeeds(tuple((r, Decimal(v)) for r, v in (("cpu", c), (GPU, g)) if v)),
                n,
            )
            for i, (c, g, n) in enumerate(part_specs)
        ),
        None,
    )
    fit = judge(demand, view(cluster))
    parts = [({"cpu": c, GPU: g}, n) for c, g, n in part_specs]
    if not fit.fits:
        assert not _packs(parts, bins), (node_specs, part_specs, fit)
    if len(part_specs) == 1:  # one pod shape: the judgement is exact
        assert fit.fits == _packs(parts, bins)


# --- levels 3 and trees --------------------------------------------------------------------------


def test_the_jobs_of_a_level_three_entry_are_judged_once_and_a_tree_as_a_whole() -> None:
    # 4 slices (Jobs) of 4 pods of 4 GPUs, each slice in one rack, all slices at once (the
    # node entry is a gang of gangs): 16 pods. 4 racks of 2 nodes of 8 GPUs: 4 pods a rack.
    cluster = [node(f"n{i}", zone="zone-a", rack=f"r{i // 2}", gpus=8) for i in range(8)]
    job = {"schedulingPolicy": {"gang": {}},
           "schedulingConstraints": {"topology": [{"key": RACK}]}}  # fmt: skip
    entries = [{"targetReplicatedJobs": ["node"], "schedulingPolicy": {"gang": {}}, "job": job}]
    rt = runtime(gpu_node(4) | {"replicas": 4}, scheduling={"replicatedJobs": entries})
    found = judged(rt, trainjob(num_nodes=4), cluster)
    assert [(g.label, len(g.groups), g.demand.pods, f.fits) for g, f in found] == [
        ("node (each of 4 Jobs)", 4, 4, True),  # a rack holds 2 nodes x 2 = 4
        ("node (4 gangs together)", 1, 16, True),  # the cluster holds 8 x 2 = 16
    ]
    (slices, fit), (_, together) = judged(rt, trainjob(num_nodes=5), cluster)
    assert not fit.fits and message(slices, fit).startswith("gang node (each of 4 Jobs) of 5 pods")
    assert not together.fits and together.best is not None and together.best.capacity == 16


# --- the summary the Node watch keeps ---------------------------------------------------------


def test_the_summary_keeps_shapes_and_counts_and_changes_only_with_them() -> None:
    summary = NodeSummary()
    summary.replace([*nodes("a", 3, zone="zone-a", gpus=8), node("b-0", zone="zone-b", gpus=8)])
    assert len(summary) == 4 and sorted(summary.shapes.values()) == [1, 3]
    version = summary.version
    # The kubelet's heartbeat changes its conditions, not its shape: nothing to judge again.
    beat = node("a-0", zone="zone-a", gpus=8)
    beat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-12-01T00:00:00Z"
    summary.apply("MODIFIED", beat)
    assert summary.version == version
    # A pressure taint comes and goes: a passing condition, not a shape.
    memory_pressure = {"key": "node.kubernetes.io/memory-pressure", "effect": "NoSchedule"}
    pressure = node("a-0", zone="zone-a", gpus=8, taints=[memory_pressure])
    summary.apply("MODIFIED", pressure)
    assert summary.version == version
    # Cordoned: a shape of its own; uncordoned: back with the others; deleted: gone.
    summary.apply("MODIFIED", node("a-0", zone="zone-a", gpus=8, cordoned=True))
    assert summary.version > version and sorted(summary.shapes.values()) == [1, 1, 2]
    summary.apply("MODIFIED", node("a-0", zone="zone-a", gpus=8))
    summary.apply("DELETED", node("b-0", zone="zone-b", gpus=8))
    assert list(summary.shapes.values()) == [3] and len(summary) == 3
    # The hostname (unique per node) is not part of a shape, and a node's name as a label
    # value neither; both keys are remembered as dropped.
    (shape,) = summary.shapes
    assert "kubernetes.io/hostname" not in shape.label_map
    summary.apply("ADDED", node("c-0", zone="zone-a", gpus=8, labels={"example.com/id": "c-0"}))
    assert summary.dropped_keys == frozenset({"kubernetes.io/hostname", "example.com/id"})
    assert list(summary.shapes.values()) == [4]


def test_trimming_keeps_only_what_a_shape_is_read_from() -> None:
    full = node("n-0", zone="zone-a", gpus=8, taints=[GPU_TAINT])
    trimmed = NodeSummary().trim(full)
    assert set(trimmed["status"]) == {"allocatable", "capacity"}
    assert set(trimmed["spec"]) == {"taints"} and "annotations" not in trimmed["metadata"]
    assert summary_of([trimmed]).shapes == summary_of([full]).shapes
    # A node whose kubelet has not reported allocatable yet: capacity is the bound.
    fresh = node("n-1", gpus=8)
    del fresh["status"]["allocatable"]
    (shape,) = summary_of([fresh]).shapes
    assert shape.has(GPU) == 8


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 5),  # which node
            st.sampled_from(["zone-a", "zone-b", None]),
            st.sampled_from([0, 4, 8]),  # GPUs
            st.booleans(),  # cordoned
            st.booleans(),  # tainted
            st.booleans(),  # deleted
        ),
        max_size=12,
    )
)
def test_tallies_kept_up_to_date_by_node_events_judge_as_a_fresh_look(
    events: list[tuple[int, str | None, int, bool, bool, bool]],
) -> None:
    """The service's judgements after any sequence of node events equal a judgement of the
    nodes as they then are, from nothing (its tallies are updated event by event)."""
    from webhook.kube.feasibility import Feasibility

    feasibility = Feasibility()
    summary = feasibility.summary
    summary.replace(nodes("n", 6, zone="zone-a", gpus=8))
    tolerant = PodNeeds(((GPU, Decimal(4)),))
    fussy = PodNeeds(((GPU, Decimal(8)), ("cpu", Decimal(30))))
    demands = [
        Demand((Part("node", tolerant, 5),), ZONE),
        Demand((Part("node", tolerant, 3), Part("eval", fussy, 2)), ZONE),
        Demand((Part("node", fussy, 4),), None),
    ]
    for demand in demands:
        feasibility.judge(demand)  # tallies made now, then kept up to date
    for index, zone, gpus, cordoned, tainted, deleted in events:
        obj = node(f"n-{index}", zone=zone, gpus=gpus, cordoned=cordoned,
                   taints=[GPU_TAINT] if tainted else None)  # fmt: skip
        summary.apply("DELETED" if deleted else "MODIFIED", obj)
        for demand in demands:
            fresh = judge(demand, Nodes(summary.shapes, summary.dropped_keys))
            assert feasibility.judge(demand) == fresh, (demand, events)

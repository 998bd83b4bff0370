"""`explain trainjob NAME` against the API emulator over HTTP: one cluster state per verdict,
read with get and list only; `-o json`; the kubectl plugin as an installed process (through
kubectl itself when it is on the machine); and clear errors for a missing TrainJob, no
cluster and a 403."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import kmock
import pytest

from tests.builders import Json, trainjob
from tests.kube_emulator import (
    CLUSTER_RUNTIMES,
    EVENTS,
    KUEUE_WORKLOADS,
    NODES,
    POD_GROUPS,
    PODS,
    TRAINJOBS,
    WORKLOADS,
    api_client,
    create,
    declare_kueue_resources,
    emulator,
    kubeconfig,
    patch,
)
from tests.kube_rbac import RBAC, rbac_emulator, service_account
from tests.nodes import nodes
from tests.test_chart_rbac import kubeconfig as token_kubeconfig
from tests.test_feasibility_admission import CLUSTER, zone_runtime
from webhook.backends.base import Context
from webhook.backends.native import NativeBackend
from webhook.core.plan import build_plan
from webhook.core.trainer import Runtime, TrainJob
from webhook.explain.gather import ExplainError, connect, gather
from webhook.explain.report import build, render

NS = "team-a"
PLUGIN = Path(sys.executable).parent / "kubectl-trainjob_scheduling"
READS = {kmock.method.GET}


class World:
    """The emulator with a runtime, a TrainJob and (optionally) what came of it."""

    def __init__(self, k: Any, url: str, api: Any) -> None:
        self.k, self.url, self.api = k, url, api
        self.job: Json = {}

    async def trainjob(self, pods: int = 4, **meta: Any) -> Json:
        await create(self.k, CLUSTER_RUNTIMES, zone_runtime())
        job = trainjob(num_nodes=pods, uid=None)
        job["metadata"].update(meta)
        self.job = await create(self.k, TRAINJOBS, job)
        return self.job

    def plan(self) -> Any:
        tj = TrainJob.model_validate(self.job)
        plan = build_plan(tj, Runtime.model_validate(zone_runtime()))
        assert plan is not None
        return plan

    async def gang_objects(
        self, condition: tuple[str, str, str] | None = None, gates_off: bool = False
    ) -> None:
        """The native Workload and PodGroup, as the reconciler makes them; `condition` is the
        PodGroupInitiallyScheduled (status, reason, message) kube-scheduler writes; `gates_off`:
        stored as an API server with TopologyAwareWorkloadScheduling off stores them (no
        topology constraint; tests/fixtures/gang-objects/)."""
        for obj in NativeBackend().render(self.plan(), Context.of(self.job)):
            if gates_off:
                obj["spec"].pop("schedulingConstraints", None)
                for template in obj["spec"].get("podGroupTemplates") or ():
                    template["schedulingConstraints"] = None
            made = await create(self.k, WORKLOADS if obj["kind"] == "Workload" else POD_GROUPS, obj)
            if condition is not None and obj["kind"] == "PodGroup":
                status, reason, message = condition
                found = {"type": "PodGroupInitiallyScheduled", "status": status,
                         "reason": reason, "message": message,
                         "lastTransitionTime": "2026-12-01T10:00:00Z"}  # fmt: skip
                name = made["metadata"]["name"]
                await patch(self.k, POD_GROUPS, NS, name, {"status": {"conditions": [found]}})

    async def pods(
        self,
        count: int,
        bound: bool = False,
        why: str | None = None,
        group: str | None = "",
        first: int = 0,
    ) -> None:
        """JobSet's pods; `group` is the PodGroup they name ("": their own, as the pod webhook
        ties them; None: none, as if admitted without it)."""
        for i in range(first, first + count):
            labels = {"jobset.sigs.k8s.io/jobset-name": "my-job",
                      "jobset.sigs.k8s.io/replicatedjob-name": "node",
                      "jobset.sigs.k8s.io/job-index": "0"}  # fmt: skip
            pod: Json = {"metadata": {"name": f"my-job-node-0-{i}", "namespace": NS,
                                      "labels": labels},
                         "spec": {"containers": [{"name": "node", "image": "x"}]}}  # fmt: skip
            if group is not None:
                name = group or self.plan().pod_group_for("node", 0)
                pod["spec"]["schedulingGroup"] = {"podGroupName": name}
            if bound:
                pod["spec"]["nodeName"] = f"b-{i}"
            if why is not None:
                pod["status"] = {"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                     "message": why}]}  # fmt: skip
                await create(self.k, EVENTS, failed_scheduling(pod["metadata"]["name"], why))
            await create(self.k, PODS, pod)

    async def nodes(self, node_list: list[Json]) -> None:
        for obj in node_list:
            await create(self.k, NODES, obj)

    async def explain(self, name: str = "my-job") -> Json:
        before = len(list(self.k))
        report = build(await gather(self.api, NS, name))
        methods = {r.method for r in list(self.k)[before:]}
        assert methods <= READS, methods  # get and list only
        json.dumps(report)  # -o json can print it
        assert render(report).startswith(f"TrainJob {NS}/{name}")
        return report


def failed_scheduling(pod: str, note: str) -> Json:
    return {
        "metadata": {"name": f"{pod}.1", "namespace": NS},
        "regarding": {"kind": "Pod", "name": pod, "namespace": NS},
        "reason": "FailedScheduling", "note": note, "type": "Warning", "action": "Scheduling",
        "reportingController": "default-scheduler", "reportingInstance": "default-scheduler-1",
        "eventTime": "2026-12-01T10:00:01.000000Z", "series": {"count": 3,
        "lastObservedTime": "2026-12-01T10:05:00.000000Z"},
    }  # fmt: skip


UNSCHEDULABLE = "0/30 nodes are available: 30 Insufficient nvidia.com/gpu."


@pytest.mark.asyncio
async def test_each_verdict_from_what_the_cluster_says() -> None:
    async with emulator() as (k, url), api_client(url) as api:
        w = World(k, url, api)
        await w.nodes(CLUSTER)  # zone-b holds 48 pods of 4 GPUs, zone-a 12
        await w.trainjob(pods=8)

        report = await w.explain()
        assert report["verdict"]["state"] == "waiting-for-gang-objects"
        assert report["plan"]["backend"] == "native" and report["pods"]["created"] == 0
        (gang,) = report["feasibility"]["gangs"]
        assert gang["fits"] and gang["domains"][0] == {
            "value": "zone-b", "nodes": 24, "usableNodes": 24, "holds": 48,
        }  # fmt: skip

        await w.gang_objects()  # no verdict from the scheduler yet
        await w.pods(5)
        report = await w.explain()
        assert report["verdict"] == {
            "state": "waiting-for-pods",
            "text": f"waiting for pods to be created: gang {w.plan().groups[0].pod_group_name} has "
            "5 of the 8 pods it waits for (Trainer, JobSet, quota, the pod webhook)",
        }
        assert [o["kind"] for o in report["gangObjects"]] == ["Workload", "PodGroup"]
        assert report["gangObjects"][1]["state"] == "waiting"


@pytest.mark.asyncio
async def test_waiting_for_capacity_shows_the_schedulers_reasons_and_events() -> None:
    async with emulator() as (k, url), api_client(url) as api:
        w = World(k, url, api)
        await w.nodes(CLUSTER)
        await w.trainjob(pods=8)
        await w.gang_objects(("False", "Unschedulable", "pod group is unschedulable"))
        await w.pods(8, why=UNSCHEDULABLE)
        report = await w.explain()
        assert report["verdict"]["state"] == "waiting-for-capacity"
        assert report["verdict"]["text"] == (
            f"waiting for capacity in a domain: gang {w.plan().groups[0].pod_group_name} fits in "
            f"zone-b (room for 48 of its pods when empty) once enough of it is free; the scheduler "
            f"says: "
            f"{UNSCHEDULABLE}"
        )
        assert report["pods"]["pendingReasons"] == [
            {"reason": "Unschedulable", "message": UNSCHEDULABLE, "pods": 8,
             "example": "my-job-node-0-0"}
        ]  # fmt: skip
        (event,) = report["events"]
        assert (event["reason"], event["count"], event["regarding"]) == (
            "FailedScheduling",
            24,
            "Pod",
        )
        pod_group = report["gangObjects"][1]
        assert pod_group["conditions"][0]["reason"] == "Unschedulable"
        text = render(report)
        assert "PodGroupInitiallyScheduled=False Unschedulable: pod group is unschedulable" in text
        assert "zone-b: room for 48 of its pods (24 nodes)" in text


@pytest.mark.asyncio
async def test_can_never_fit_and_scheduled_and_finished() -> None:
    async with emulator() as (k, url), api_client(url) as api:
        w = World(k, url, api)
        await w.nodes(CLUSTER)
        await w.trainjob(pods=64)
        await w.gang_objects(("False", "Unschedulable", "pod group is unschedulable"))
        report = await w.explain()
        assert report["verdict"]["state"] == "never-fits"
        assert report["verdict"]["text"] == (
            "can never fit as configured: gang node of 64 pods needs 256 nvidia.com/gpu in one "
            "topology.kubernetes.io/zone; the largest zone has 192 (zone-b, 24 nodes)"
        )
        assert "Feasibility (30 nodes, 2 node shapes; as if empty):" in render(report)

        # More nodes join zone-b and the gang is placed.
        await w.nodes(nodes("more", 8, zone="zone-b", gpus=8))
        (pod_group,) = [o for o in list(k.objects) if o[0] == POD_GROUPS]
        scheduled = {"type": "PodGroupInitiallyScheduled", "status": "True", "reason": "Scheduled",
                     "lastTransitionTime": "2026-12-01T11:00:00Z"}  # fmt: skip
        await patch(k, POD_GROUPS, NS, pod_group[2], {"status": {"conditions": [scheduled]}})
        await w.pods(64, bound=True)
        report = await w.explain()
        assert report["verdict"] == {
            "state": "scheduled",
            "text": "scheduled: every gang is placed (64 pods bound)",
        }
        done = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
        await patch(k, TRAINJOBS, NS, "my-job", done)
        assert (await w.explain())["verdict"]["state"] == "finished"


@pytest.mark.asyncio
async def test_a_gang_whose_topology_was_dropped_is_judged_over_the_whole_cluster() -> None:
    """Its PodGroup stored without the constraint (the gate off): kube-scheduler places it
    across zones, so 50 pods that no zone holds only wait; the note says why."""
    async with emulator() as (k, url), api_client(url) as api:
        w = World(k, url, api)
        await w.nodes(CLUSTER)
        await w.trainjob(pods=50)
        await w.gang_objects(("False", "Unschedulable", "pod group is unschedulable"), True)
        report = await w.explain()
        assert report["verdict"]["state"] != "never-fits", report["verdict"]
        (gang,) = report["feasibility"]["gangs"]
        assert gang["fits"] is True, gang
        assert any(n.startswith("topology not enforced: the API server drops") for n in
                   report["notes"]), report["notes"]  # fmt: skip


@pytest.mark.asyncio
async def test_a_trainjob_multikueue_dispatched_is_explained_as_running_elsewhere() -> None:
    """On the manager cluster: no snapshot (never frozen there), and its gang is not judged on
    the manager's nodes, which it would never fit (it runs on a worker's)."""
    async with emulator() as (k, url), api_client(url) as api:
        w = World(k, url, api)
        await w.nodes(CLUSTER)
        await create(k, CLUSTER_RUNTIMES, zone_runtime())
        job = trainjob(num_nodes=64, uid=None)
        job["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
        w.job = await create(k, TRAINJOBS, job)
        report = await w.explain()
        assert report["verdict"] == {
            "state": "multikueue",
            "text": "dispatched by MultiKueue: its pods run on a worker cluster",
        }


@pytest.mark.asyncio
async def test_suspended_by_kueue_with_its_workload_or_suspended_by_hand() -> None:
    async with emulator() as (k, url), api_client(url) as api:
        declare_kueue_resources(k)
        w = World(k, url, api)
        await w.nodes(CLUSTER)
        job = await w.trainjob(pods=8, labels={"kueue.x-k8s.io/queue-name": "team-a-queue"})
        await patch(k, TRAINJOBS, NS, "my-job", {"spec": {"suspend": True}})
        report = await w.explain()
        assert report["verdict"] == {
            "state": "suspended-by-kueue",
            "text": "suspended by Kueue: queue team-a-queue; Kueue has no Workload for it (yet)",
        }
        pending = "couldn't assign flavors to pod set node: insufficient quota for nvidia.com/gpu"
        workload = {
            "metadata": {"name": "trainjob-my-job-3f2a1", "namespace": NS,
                         "labels": {"kueue.x-k8s.io/job-uid": job["metadata"]["uid"]}},
            "spec": {"queueName": "team-a-queue"},
            "status": {"conditions": [{"type": "QuotaReserved", "status": "False",
                                       "reason": "Pending", "message": pending}]},
        }  # fmt: skip
        await create(k, KUEUE_WORKLOADS, workload)
        report = await w.explain()
        assert report["verdict"]["text"] == (
            f"suspended by Kueue: queue team-a-queue, Workload trainjob-my-job-3f2a1: {pending}"
        )
        assert report["kueue"]["admitted"] is False
        assert "Kueue: queue team-a-queue, suspended: true" in render(report)
        # Without the queue label: suspended by someone, not by Kueue.
        await patch(k, TRAINJOBS, NS, "my-job", {"metadata": {"labels": None}})
        assert (await w.explain())["verdict"]["state"] == "suspended"


@pytest.mark.asyncio
async def test_what_cannot_be_read_becomes_a_note() -> None:
    async with emulator() as (k, url), api_client(url) as api:
        w = World(k, url, api)
        await w.trainjob(pods=8, labels={"kueue.x-k8s.io/queue-name": "q"})  # Kueue not served
        report = await w.explain()
        assert report["feasibility"] is None
        assert "the cluster has no nodes: feasibility is not judged" in report["notes"]
        assert "Kueue's Workload API (kueue.x-k8s.io) is not served" in report["notes"]
        # The gang API not served (GenericWorkload off): no gang, said in the verdict.
        k.resources.pop(POD_GROUPS)
        assert (await w.explain())["verdict"] == {
            "state": "no-gang",
            "text": "no gang: native gang scheduling is unavailable (scheduling.k8s.io/v1beta1 "
            "or v1alpha2 is not served): its pods are held until it is",
        }
        # A runtime that does not exist: no plan, said in the verdict.
        await patch(k, TRAINJOBS, NS, "my-job", {"spec": {"runtimeRef": {"name": "gone"}}})
        report = await w.explain()
        assert report["verdict"] == {
            "state": "no-gang",
            "text": 'no gang: its ClusterTrainingRuntime "gone" does not exist',
        }


# --- as a process: the kubectl plugin, -o json, errors ------------------------------------------


async def run(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    assert PLUGIN.exists(), f"{PLUGIN} is not installed: run make setup"
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**env, "PATH": f"{PLUGIN.parent}:{os.environ.get('PATH', '')}"},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def close(api: Any) -> None:
    await api.close()  # untyped in the client


def clean_env(home: Path, **more: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    return {**env, "HOME": str(home), **more}


@pytest.mark.asyncio
async def test_the_kubectl_plugin_explains_as_json_and_errors_clearly(tmp_path: Path) -> None:
    async with emulator() as (k, url), api_client(url) as api:
        w = World(k, url, api)
        await w.nodes(CLUSTER)
        await w.trainjob(pods=64)
        config = tmp_path / "kubeconfig"
        config.write_text(kubeconfig(url))
        env = clean_env(tmp_path, KUBECONFIG=str(config))
        code, out, err = await run(
            str(PLUGIN), "explain", "trainjob", "my-job", "-n", NS, "-o", "json", env=env
        )
        assert code == 0, err
        report = json.loads(out)
        assert report["verdict"]["state"] == "never-fits"
        assert report["feasibility"]["gangs"][0]["reason"] == "DomainTooSmall"

        code, out, err = await run(str(PLUGIN), "explain", "trainjob", "nope", "-n", NS, env=env)
        assert (code, out) == (1, "")
        assert err == f'error: TrainJob "nope" not found in namespace "{NS}"\n'

        if shutil.which("kubectl"):  # kubectl finds the plugin on PATH, dashes as underscores
            code, out, err = await run(
                "kubectl", "trainjob-scheduling", "explain", "trainjob", "my-job", "-n", NS,
                env=env,
            )  # fmt: skip
            assert code == 0, err
            assert out.startswith(f"TrainJob {NS}/my-job (runtime ClusterTrainingRuntime rt")
            assert "Verdict: can never fit as configured: gang node of 64 pods" in out


@pytest.mark.asyncio
async def test_no_cluster_and_a_dead_cluster_are_one_sentence(tmp_path: Path) -> None:
    # No kubeconfig, no ~/.kube/config, not in a pod.
    with pytest.raises(ExplainError, match=r"^no cluster configured: pass --kubeconfig"):
        await connect(None, None, clean_env(tmp_path))
    config = tmp_path / "dead"
    config.write_text(kubeconfig("http://127.0.0.1:9"))
    cluster = await connect(str(config), None, clean_env(tmp_path))
    try:
        with pytest.raises(
            ExplainError, match=r"^cannot reach the cluster at http://127\.0\.0\.1:9:"
        ):
            await gather(cluster.api, NS, "x")
    finally:
        await close(cluster.api)
    assert cluster.namespace == "default"  # the context says none
    with pytest.raises(ExplainError, match=r"^cannot load the cluster configuration"):
        await connect(str(tmp_path / "missing"), None, clean_env(tmp_path))


@pytest.mark.asyncio
async def test_forbidden_is_a_clear_error_and_forbidden_nodes_a_note(tmp_path: Path) -> None:
    alice = service_account(NS, "alice")
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "reader", "namespace": NS},
        "rules": [{"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"],
                   "verbs": ["get"]}],
    }  # fmt: skip
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "reader", "namespace": NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "alice", "namespace": NS}],
    }  # fmt: skip
    tokens = {"alice-token": alice, "bob-token": service_account(NS, "bob")}
    async with rbac_emulator(RBAC.of([role, binding]), tokens, "admin-token") as (k, url):
        await create(k, CLUSTER_RUNTIMES, zone_runtime())
        await create(k, TRAINJOBS, trainjob(num_nodes=8, uid=None))
        config = tmp_path / "kubeconfig"
        config.write_text(token_kubeconfig(url, "bob-token"))
        bob = await connect(None, None, clean_env(tmp_path, KUBECONFIG=str(config)))
        try:
            with pytest.raises(ExplainError) as refused:
                await gather(bob.api, NS, "my-job")
        finally:
            await close(bob.api)
        assert str(refused.value).startswith(f'cannot read TrainJob "{NS}/my-job": HTTP 403: ')
        assert "cannot get resource" in str(refused.value)
        # Alice may read the TrainJob and nothing else: a report, with notes for the rest.
        config.write_text(token_kubeconfig(url, "alice-token"))
        alice_api = await connect(str(config), None, clean_env(tmp_path))
        try:
            notes = build(await gather(alice_api.api, NS, "my-job"))["notes"]
        finally:
            await close(alice_api.api)
        assert any(n.startswith("the nodes cannot be listed (HTTP 403") for n in notes), notes
        assert any("cannot be read (HTTP 403" in n for n in notes), notes  # the runtime

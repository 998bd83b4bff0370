"""Feasibility on a cluster whose API server drops a gang's topology constraint
(`TopologyAwareWorkloadScheduling` off, the required gates only): the service learns it without
configuration, from a dry-run create at start (`kube/constraints.py`) and from what the server
stored of its gang objects, and then judges a native gang with topology over the whole cluster,
as kube-scheduler places it, saying that its topology is not enforced (at `kubectl apply`, in the
metrics; the condition's side is in tests/test_status.py).

The gates-off server is the emulator with a reaction that drops, from a PodGroup's create, the
fields the captured gates-off kube-apiserver dropped (tests/fixtures/gang-objects/)."""

from __future__ import annotations

import copy
import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import kmock
import pytest

from tests.builders import Json, trainjob
from tests.harness import freeze, running_server
from tests.kube_emulator import (
    POD_GROUPS,
    POD_GROUPS_V1ALPHA2,
    api_client,
    emulator,
    status,
)
from tests.test_feasibility_admission import (
    CLUSTER,
    answer_to,
    cache_of,
    eventually_true,
    post,
    zone_runtime,
    zones_served,
)
from tests.test_metrics_feasibility import sample, stored
from webhook.backends.native import NativeBackend
from webhook.backends.native_versions import V1ALPHA2
from webhook.kube.cache import Cache
from webhook.kube.constraints import (
    FIELD,
    REPROBE,
    TopologyKept,
    TopologyProbe,
    created_at,
    sets_constraint,
)
from webhook.metrics.feasibility import FeasibilityCollector
from webhook.metrics.registry import Metrics

CAPTURE = (
    Path(__file__).parent / "fixtures" / "gang-objects" / "gates-off-v1beta1-podgroup-node.json"
)
# The 50 pods of 4 GPUs no zone holds (zone-b 48, zone-a 12), and the cluster does (60).
ACROSS_ZONES = 50
UNENFORCED = [
    "topology not enforced: the API server drops schedulingConstraints (feature gate "
    "TopologyAwareWorkloadScheduling is off);",
    "... kube-scheduler may place a gang across topology.kubernetes.io/zone domains;",
    "... feasibility judged its gangs over the whole cluster",
]


def dropped_by_the_capture() -> set[str]:
    """The PodGroup spec fields the captured gates-off API server did not store."""
    found = json.loads(CAPTURE.read_text())
    return set(found["sent"]["spec"]) - set(found["stored"]["spec"])


def gates_off(request: kmock.Request) -> Json:
    """A PodGroup create as the gates-off API server answers it (a dry run's answer is the
    object as it would be stored)."""
    obj: Json = copy.deepcopy(request.data)
    for key in dropped_by_the_capture():
        obj["spec"].pop(key, None)
    meta = obj["metadata"]
    meta.update(name=meta.get("name") or f"{meta['generateName']}x", uid=str(uuid.uuid4()))
    return obj


def answers_as_gates_off(k: Any, resource: Any = POD_GROUPS) -> None:
    assert FIELD in dropped_by_the_capture()
    # 201 Created, as the API server answers a create (a dry run's too).
    k[kmock.method.POST, resource, kmock.params(dryRun="All")] << 201 << gates_off


def native_of(cache: Cache) -> NativeBackend:
    native = cache.backends.named("native")
    assert isinstance(native, NativeBackend)
    return native


def probes(k: Any, resource: Any = POD_GROUPS) -> list[kmock.Request]:
    return list(k[kmock.method.POST, resource])


# --- what is known, and from when ---------------------------------------------------------------


def test_the_newest_evidence_wins_and_a_change_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="webhook.constraints")
    known = TopologyKept()
    assert known.kept is None  # not known: judged as kept
    known.observe(False, 100.0, "PodGroup a/x as stored")
    known.observe(False, 150.0, "PodGroup a/y as stored")  # the same: not said again
    # An object made before the gate was turned on (never made again for it) does not outweigh
    # a newer probe; one made after does.
    known.observe(True, 200.0, "a dry-run create of a PodGroup")
    known.observe(False, 120.0, "PodGroup a/z as stored")
    assert known.kept is True and known.evidence is not None
    assert known.evidence.source == "a dry-run create of a PodGroup"
    known.observe(False, 200.0, "PodGroup b/w as stored")
    assert known.kept is False
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in said] == ["WARNING", "INFO", "WARNING"], said
    assert "feasibility judges such gangs over the whole cluster" in said[0][1]


def test_which_objects_ask_for_a_topology_constraint() -> None:
    zone = {"topology": [{"key": "topology.kubernetes.io/zone"}]}
    assert sets_constraint({"spec": {FIELD: zone}})
    assert sets_constraint({"spec": {"podGroupTemplates": [{"name": "a"}, {FIELD: zone}]}})
    nested = {"compositePodGroupTemplates": [{"podGroupTemplates": [{FIELD: zone}]}]}
    assert sets_constraint({"spec": nested})
    assert not sets_constraint({"spec": {"podGroupTemplates": [{"name": "a", FIELD: None}]}})
    assert not sets_constraint({"spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}})
    assert created_at({"metadata": {"creationTimestamp": "2026-12-06T06:18:15Z"}}) == 1796537895.0
    assert created_at({"metadata": {}}) is None


# --- the probe --------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_dry_run_create_learns_it_and_stores_nothing() -> None:
    now = [time.time()]  # the answers are dated by the server (creationTimestamp): real time
    async with emulator() as (k, url), api_client(url) as api:
        cache = Cache(connected=True)
        native = native_of(cache)
        probe = TopologyProbe(api, cache, ["trainjob-scheduling-system"], clock=lambda: now[0])
        await probe(native)  # discovery has not found the API served: nothing asked
        assert not probes(k) and cache.topology.kept is None
        cache.apis["native"] = "served"
        await probe(native)
        assert cache.topology.kept is True  # this API server keeps it
        (asked,) = probes(k)
        assert (
            asked.params.get("dryRun") == "All" and asked.namespace == "trainjob-scheduling-system"
        )
        assert asked.data["spec"][FIELD] == {"topology": [{"key": "kubernetes.io/hostname"}]}
        assert not [key for key in k.objects if key[0] == POD_GROUPS]  # a dry run: none stored
        # Not asked again within the period, nor for another backend.
        volcano = cache.backends.named("volcano")
        assert volcano is not None
        await probe(volcano)
        now[0] += REPROBE - 1
        await probe(native)
        assert len(probes(k)) == 1
        # A period later it is asked again: kube-apiserver was restarted with the gate off.
        answers_as_gates_off(k)
        now[0] += 1
        await probe(native)
        assert len(probes(k)) == 2 and cache.topology.kept is False


@pytest.mark.asyncio
async def test_a_1_36_server_is_asked_in_v1alpha2() -> None:
    async with emulator(scheduling_version=V1ALPHA2) as (k, url), api_client(url) as api:
        answers_as_gates_off(k, POD_GROUPS_V1ALPHA2)
        cache = Cache(connected=True)
        cache.apis["native"] = "served"
        native = native_of(cache)
        native.use_version(V1ALPHA2)  # as discovery does on 1.36
        await TopologyProbe(api, cache, ["default"])(native)
        (asked,) = probes(k, POD_GROUPS_V1ALPHA2)
        assert asked.data["apiVersion"] == "scheduling.k8s.io/v1alpha2"
        assert cache.topology.kept is False


@pytest.mark.asyncio
async def test_a_probe_without_an_answer_is_said_once_and_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="webhook.constraints")
    async with emulator() as (k, url), api_client(url) as api:
        refused = status(403, 'podgroups.scheduling.k8s.io is forbidden: User "x"', "Forbidden")
        k[kmock.method.POST, POD_GROUPS, kmock.namespace("gone")] << refused
        cache = Cache(connected=True)
        cache.apis["native"] = "served"
        native = native_of(cache)
        # The first watched namespace refuses it; the next answers.
        await TopologyProbe(api, cache, ["gone", "team-a"])(native)
        assert cache.topology.kept is True
        assert [r.namespace for r in probes(k)] == ["gone", "team-a"]
        # Where none answers: not known, said once, and asked at each of discovery's checks.
        alone = TopologyKept()
        cache.topology = alone
        probe = TopologyProbe(api, cache, ["gone"])
        for _ in range(3):
            await probe(native)
        assert alone.kept is None and len(probes(k)) == 5
        warned = [r for r in caplog.records if r.levelname == "WARNING"]
        (warning,) = warned
        assert "403" in warning.__dict__["fields"]["error"]


# --- what admission says ------------------------------------------------------------------------


def test_a_gang_whose_topology_is_dropped_is_judged_over_the_whole_cluster(
    tmp_path: Path,
) -> None:
    cache = cache_of(zone_runtime("deny"))
    cache.topology.observe(False, time.time(), "a dry-run create of a PodGroup")
    with running_server(cache, tmp_path / "certs") as srv, srv.client() as c:
        across = post(c, trainjob(num_nodes=ACROSS_ZONES))
        assert across["allowed"] is True and across["warnings"] == UNENFORCED
        # More than the whole cluster holds is still denied, with the cluster's numbers.
        never = post(c, trainjob(num_nodes=64))
        assert never["allowed"] is False and never["warnings"] == UNENFORCED
        assert (
            "needs 256 nvidia.com/gpu in the cluster; the cluster has 240 (30 nodes)"
            in (never["status"]["message"])
        )
        # With feasibility off the topology is still said not to be enforced.
        cache.cluster_runtimes.replace([zone_runtime("off")])
        off = post(c, trainjob(num_nodes=64))
        assert off["allowed"] is True and off["warnings"] == [
            UNENFORCED[0],
            UNENFORCED[1].removesuffix(";"),
        ]
        # A server that keeps the constraint (the gate turned on since): per zone, as before.
        cache.cluster_runtimes.replace([zone_runtime("deny")])
        cache.topology.observe(True, time.time() + 1, "a dry-run create of a PodGroup")
        kept = post(c, trainjob(num_nodes=ACROSS_ZONES))
        assert (
            kept["allowed"] is False
            and "in one topology.kubernetes.io/zone" in (kept["status"]["message"])
        )


@pytest.mark.asyncio
@pytest.mark.parametrize("keeps", [False, True], ids=["gates-off", "gates-on"])
async def test_the_first_trainjob_is_judged_by_what_the_api_server_keeps(
    tmp_path: Path, keeps: bool
) -> None:
    """The service as a process, before any gang object exists, with --feasibility=deny: ready
    only once its probe has answered, so on a gates-off server the first TrainJob already hears
    that its topology is not enforced, and one that fits only across zones is admitted; on a
    server that keeps the constraint it is denied per zone."""
    before = None if keeps else answers_as_gates_off
    async with zones_served(tmp_path, "--feasibility=deny", before=before) as (k, proc, client):
        first = await answer_to(client, ACROSS_ZONES)
        if keeps:
            await eventually_true(
                lambda: denied_without_warnings(client), True, "denied per zone, from the watch"
            )
        else:
            assert first["allowed"] is True and first["warnings"][0] == UNENFORCED[0], first
            await eventually_true(lambda: warnings_of(client), UNENFORCED, "judged, from the watch")
        assert len(probes(k)) == 1  # at start, and nothing stored
        assert not [key for key in k.objects if key[0] == POD_GROUPS]
        said = [line for line in proc.log_lines() if "topology constraint" in line["msg"]]
        assert [line["level"] for line in said] == ["info" if keeps else "warning"], said


async def warnings_of(client: Any) -> list[str]:
    found = await answer_to(client, ACROSS_ZONES)
    assert found["allowed"] is True, found
    warnings: list[str] = found.get("warnings", [])
    return warnings


async def denied_without_warnings(client: Any) -> bool:
    found = await answer_to(client, ACROSS_ZONES)
    return found["allowed"] is False and not found.get("warnings")


# --- the metrics --------------------------------------------------------------------------------


def test_the_metrics_judge_it_over_the_whole_cluster_too() -> None:
    metrics, cache = Metrics(), Cache(connected=True)
    FeasibilityCollector(metrics, cache)
    cache.cluster_runtimes.replace([zone_runtime()])
    cache.trainjobs.replace([stored("across", ACROSS_ZONES)])
    freeze(cache)
    cache.nodes.replace(CLUSTER)
    infeasible = "trainjob_scheduling_gangs_infeasible"
    assert sample(metrics, infeasible, backend="native", reason="DomainTooSmall") == 1
    cache.topology.observe(False, time.time(), "PodGroup team-a/x as stored")
    assert sample(metrics, infeasible, backend="native", reason="DomainTooSmall") == 0

"""The Job webhook: a ganged TrainJob's Jobs name their PodGroup in their pod template, so the
Job controller's own per-Job gangs (WorkloadWithJob: an Indexed Job with parallelism equal to
completions whose template names no group) stand down, and one pod set never has two gangs.
And the pod webhook's side: a pod that came naming another group (a Job made while the service
could not answer) is tied to its TrainJob's gang instead.

The Job review is captured from a real kube-apiserver (tests/fixtures/admission/README.md): the
JobSet controller creating the `node` Job of TrainJob team-a/my-job. That the Job controller then
makes no Workload of its own, and every pod binds in the TrainJob's gang, is `make e2e`'s.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import pytest

from tests.builders import rj, runtime, torch_node, trainjob
from tests.harness import RunningServer, fixture, fixture_cache, frozen, running_server, served
from tests.test_holds import jobset
from webhook.admission.handlers import mutate_job_review
from webhook.admission.review import parse
from webhook.backends.native import POD_GROUP
from webhook.core import naming
from webhook.core.snapshot import SNAPSHOT_ANNOTATION, snapshot
from webhook.kube.cache import Cache

Json = dict[str, Any]
JOB_PATH = "/mutate-batch-v1-job"
POD_PATH = "/mutate--v1-pod"
CAPTURED = Path(__file__).parent / "fixtures" / "admission" / "job-create-by-jobset.mutate.json"
NS, NAME = "team-a", "my-job"


def job_review(**labels: str) -> Json:
    doc: Json = json.loads(CAPTURED.read_text())
    template = doc["request"]["object"]["spec"]["template"]
    template["metadata"]["labels"].update(labels)
    return doc


def answer(client: Any, path: str, doc: Json) -> Json:
    response: Json = client.post(path, content=orjson.dumps(doc)).json()["response"]
    assert response["allowed"] is True, response
    return response


def ops(response: Json) -> list[Json]:
    if "patch" not in response:
        return []
    patch: list[Json] = orjson.loads(base64.b64decode(response["patch"]))
    return patch


def uid_of(cache: Cache) -> str:
    entry = cache.trainjobs.get(NS, NAME)
    assert entry is not None
    return str(entry.raw["metadata"]["uid"])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    with running_server(fixture_cache(), tmp_path / "certs") as srv:
        yield srv


def test_a_ganged_trainjobs_job_names_its_podgroup(server: RunningServer) -> None:
    with server.client() as client:
        response = answer(client, JOB_PATH, job_review())
    group = naming.workload_name(NS, NAME, uid_of(server.cache))  # level 1: the Workload's name
    assert ops(response) == [
        {"op": "add", "path": "/spec/template/spec/schedulingGroup",
         "value": {"podGroupName": group}},
        # Its pods carry the gang label (the pod webhook that holds them selects it).
        {"op": "add", "path": "/spec/template/metadata/labels/trainjob-scheduling.dev~1gang",
         "value": "true"},
    ]  # fmt: skip


def test_a_restarted_jobsets_job_names_that_attempts_podgroup(server: RunningServer) -> None:
    doc = job_review(**{"jobset.sigs.k8s.io/restart-attempt": "2"})
    cache = server.cache
    cache.jobsets.replace([jobset(uid_of(cache), restarts=2)])
    with server.client() as client:
        op, _ = ops(answer(client, JOB_PATH, doc))
    group = naming.workload_name(NS, NAME, uid_of(server.cache))
    assert op["value"] == {"podGroupName": naming.for_attempt(group, 2)}


def test_the_mutation_is_idempotent_and_a_named_group_is_kept(server: RunningServer) -> None:
    doc = job_review()
    with server.client() as client:
        patch = ops(answer(client, JOB_PATH, doc))
        obj = doc["request"]["object"] = jsonpatch.apply_patch(doc["request"]["object"], patch)
        assert ops(answer(client, JOB_PATH, doc)) == []
        # A template that names another group (someone decided): left as it is.
        obj["spec"]["template"]["spec"]["schedulingGroup"] = {"podGroupName": "theirs"}
        assert ops(answer(client, JOB_PATH, doc)) == []


@pytest.mark.parametrize(
    "labels",
    [
        {"jobset.sigs.k8s.io/jobset-name": "not-a-trainjob"},  # a plain JobSet's Job
        {"jobset.sigs.k8s.io/replicatedjob-name": "ghost"},  # not a group of the plan
        {"jobset.sigs.k8s.io/restart-attempt": "x"},  # an attempt that is not a count
    ],
)
def test_jobs_the_service_does_not_gang_are_left_alone(
    server: RunningServer, labels: dict[str, str]
) -> None:
    with server.client() as client:
        assert ops(answer(client, JOB_PATH, job_review(**labels))) == []


def test_a_trainjob_without_a_gang_leaves_its_jobs_to_the_job_controller(tmp_path: Path) -> None:
    cache = fixture_cache()
    entry = cache.trainjobs.get(NS, NAME)
    assert entry is not None
    raw = copy.deepcopy(entry.raw)
    raw["metadata"]["annotations"][SNAPSHOT_ANNOTATION] = snapshot(None)  # frozen "no gang"
    cache.trainjobs.replace([raw])
    assert cache.plan_for(NS, NAME).state == "frozen-no-gang"
    with running_server(cache, tmp_path / "certs") as srv, srv.client() as client:
        assert ops(answer(client, JOB_PATH, job_review())) == []


def test_an_unfrozen_trainjobs_job_names_the_group_its_runtime_gives_now(tmp_path: Path) -> None:
    """The reconciler freezes the runtime in a moment; the group name is the same."""
    cache = fixture_cache()
    group = naming.workload_name(NS, NAME, uid_of(cache))
    entry = cache.trainjobs.get(NS, NAME)
    assert entry is not None
    raw = copy.deepcopy(entry.raw)
    raw["metadata"]["annotations"].pop(SNAPSHOT_ANNOTATION)
    cache.trainjobs.replace([raw])
    assert cache.plan_for(NS, NAME).state == "unfrozen"
    with running_server(cache, tmp_path / "certs") as srv, srv.client() as client:
        op, _ = ops(answer(client, JOB_PATH, job_review()))
    assert op["value"] == {"podGroupName": group}


def test_level_3_jobs_each_name_their_own_gang() -> None:
    rt = runtime(
        torch_node(replicas=3),
        rj("eval"),
        scheduling={"replicatedJobs": [{"targetReplicatedJobs": ["node"], "job": {}}]},
        ml={"numNodes": 4, "torch": {}},
    )
    tj = trainjob(NAME, num_nodes=4)
    cache = Cache(connected=True)
    cache.jobsets.replace([])  # listed, none: restart attempt 0
    cache.cluster_runtimes.replace([rt])
    cache.training_runtimes.replace([])
    cache.trainjobs.replace([frozen(cache, tj)])
    served(cache)
    plan = cache.plan_for(NS, NAME).plan
    assert plan is not None
    names = set()
    for index in range(3):
        review = parse(orjson.dumps(job_review(**{"jobset.sigs.k8s.io/job-index": str(index)})))
        op, _ = mutate_job_review(review, cache).patch or []
        names.add(op["value"]["podGroupName"])
        group = plan.group_for("node", index)
        assert group is not None and op["value"] == {"podGroupName": group.pod_group_name}
    assert len(names) == 3
    untargeted = job_review(**{"jobset.sigs.k8s.io/replicatedjob-name": "eval"})
    assert mutate_job_review(parse(orjson.dumps(untargeted)), cache).patch is None


def test_a_suspended_or_foreign_gangs_job_is_left_alone(server: RunningServer) -> None:
    """A Job made suspended (Kueue queued the TrainJob): the Job controller makes no gang for a
    Job that was suspended, and the run it will start is not named yet. A TrainJob another
    controller gangs (Trainer's own): not this service's Jobs."""
    doc = job_review()
    doc["request"]["object"]["spec"]["suspend"] = True
    with server.client() as client:
        assert ops(answer(client, JOB_PATH, doc)) == []
        owner = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                 "name": NAME, "uid": uid_of(server.cache), "controller": True}  # fmt: skip
        theirs = {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
                  "metadata": {"name": "theirs", "namespace": NS, "uid": "t",
                               "ownerReferences": [owner]}}  # fmt: skip
        server.cache.store(POD_GROUP).replace([theirs])
        assert ops(answer(client, JOB_PATH, job_review())) == []


def test_a_deleting_trainjobs_job_names_no_group(server: RunningServer) -> None:
    """A foreground delete sets the TrainJob's deletionTimestamp, which bumps a custom
    resource's generation (seen on a real API server): the plan then names a run that is never
    made. Trainer and JobSet may still make Jobs; they name no group, and their pods are held."""
    entry = server.cache.trainjobs.get(NS, NAME)
    assert entry is not None
    deleting = copy.deepcopy(entry.raw)
    deleting["metadata"]["deletionTimestamp"] = "2026-12-06T08:00:00Z"
    deleting["metadata"]["generation"] = 2
    server.cache.trainjobs.apply("MODIFIED", deleting)
    with server.client() as client:
        assert ops(answer(client, JOB_PATH, job_review())) == []
        pod = fixture("pod-create-by-job-controller.mutate.json")
        response = client.post(POD_PATH, content=orjson.dumps(pod)).json()["response"]
    assert response["allowed"] is False and "being deleted" in response["status"]["message"]


def test_a_pod_naming_the_job_controllers_group_is_tied_to_its_gang(server: RunningServer) -> None:
    doc = fixture("pod-create-by-job-controller.mutate.json")
    doc["request"]["object"]["spec"]["schedulingGroup"] = {"podGroupName": "my-job-node-0-x"}
    with server.client() as client:
        (op,) = ops(answer(client, POD_PATH, doc))
    group = naming.workload_name(NS, NAME, uid_of(server.cache))
    assert op == {"op": "replace", "path": "/spec/schedulingGroup",
                  "value": {"podGroupName": group}}  # fmt: skip
    regrouped = server.service.metrics.registry.get_sample_value(
        "trainjob_scheduling_pods_regrouped_total"
    )
    assert regrouped == 1
    # One already in its gang's group is left as it is, and not counted.
    doc["request"]["object"]["spec"]["schedulingGroup"] = {"podGroupName": group}
    with server.client() as client:
        assert ops(answer(client, POD_PATH, doc)) == []
    assert (
        server.service.metrics.registry.get_sample_value("trainjob_scheduling_pods_regrouped_total")
        == 1
    )

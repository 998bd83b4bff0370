"""The webhooks over real HTTPS, fed the AdmissionReviews a real kube-apiserver sent.

Each captured review goes to the service's webhook for its resource; the test checks the decision,
the warnings and the object that results from applying the returned patch, then sends that object
again and expects an empty patch (idempotence).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import orjson
import pytest
import yaml

from webhook.admission.routes import WEBHOOKS
from webhook.core import naming
from webhook.core.defaults import GANG_LABEL
from webhook.core.snapshot import SNAPSHOT_ANNOTATION as SNAPSHOT
from webhook.core.snapshot import snapshot
from webhook.core.trainer import Runtime
from webhook.core.validation import runtime_layout
from webhook.kube.cache import Cache
from webhook.server.logs import json_handler
from webhook.server.reviewlog import FLUSH_AFTER, FLUSH_BYTES, ReviewLog

from .builders import TRAINJOB_UID, rj, runtime
from .harness import (
    RunningServer,
    fixture,
    fixture_cache,
    fixture_names,
    running_server,
    webhook_path,
)
from .paths import SAMPLES

PATHS = {w.path for w in WEBHOOKS}
# was-api §4: the level-1 Workload, template and PodGroup of team-a/my-job share one name: for
# a TrainJob this release froze (plan version 2), one qualified by its uid...
MY_JOB_GROUP = naming.workload_name("team-a", "my-job", TRAINJOB_UID)
# ... and the documented one for a TrainJob an earlier release froze (plan version 1).
LEGACY_GROUP = "my-job-f438be8c51"
POD_PATCH = [
    {"op": "add", "path": "/spec/schedulingGroup", "value": {"podGroupName": MY_JOB_GROUP}}
]
# README fact 20: the patch the API server accepted for a hand-written `gang: {}` Workload.
MIN_COUNT_PATCH = [
    {
        "op": "replace",
        "path": "/spec/podGroupTemplates/0/schedulingPolicy/gang/minCount",
        "value": 100,
    }
]
EXPECTED_PATCHES: dict[str, list[dict[str, Any]]] = {
    "clustertrainingruntime-create-level1.mutate.json": [
        {"op": "add", "path": "/spec/scheduling/schedulingPolicy", "value": {"gang": {}}}
    ],
    "pod-create-by-job-controller.mutate.json": POD_PATCH,
    "pod-create-by-job-controller.validate.json": POD_PATCH,
    "pod-create-by-job-controller-index-1.mutate.json": POD_PATCH,
    "pod-create-by-job-controller-index-1.validate.json": POD_PATCH,
    "pod-create-as-job-controller-serviceaccount.mutate.json": POD_PATCH,
    "pod-create-as-job-controller-serviceaccount.validate.json": POD_PATCH,
    # It names a group, not its gang's (as the Job controller's per-Job gang does): replaced.
    **{
        f"pod-create-with-schedulinggroup.{verb}.json": [
            {
                "op": "replace",
                "path": "/spec/schedulingGroup",
                "value": {"podGroupName": MY_JOB_GROUP},
            }
        ]
        for verb in ("mutate", "validate")
    },
    "workload-create-gang-without-mincount-patched.mutate.json": MIN_COUNT_PATCH,
    # Same shape (controllerRef to my-job); captured while the webhook still answered no patch.
    "workload-create-gang-without-mincount-rejected.mutate.json": MIN_COUNT_PATCH,
}
LAUNCHER_WARNING = (
    'scheduling: "launcher" starts after "node": it joins its gang later, outside minCount'
)


def gpus_without_a_limit(gpus: int) -> list[str]:
    """What kubectl prints (each after `Warning: `) for a TrainJob whose GPUs have no limit: the
    captured TrainJobs are written so, and Trainer would copy it to pods the API server refuses.
    Cut at clause ends into lines of at most 120 characters (was-api's limit for a warning)."""
    return [
        f"spec.trainer.resourcesPerNode.requests[nvidia.com/gpu]: requests {gpus} without a limit;",
        "... the API server refuses pods that request an extended resource without an equal limit,",
        "... so the TrainJob would create no pods: set "
        f"spec.trainer.resourcesPerNode.limits[nvidia.com/gpu] to {gpus}",
    ]


EXPECTED_WARNINGS = {
    "clustertrainingruntime-create-level2.validate.json": [LAUNCHER_WARNING],
    # (the .mutate captures go to the TrainJob mutating webhook, which freezes and warns of
    # nothing)
    "trainjob-create.validate.json": gpus_without_a_limit(4),
    "trainjob-create-dry-run.validate.json": gpus_without_a_limit(8),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(fixture_cache(), tmp_path_factory.mktemp("certs")) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def path_for(name: str, review: dict[str, Any]) -> str:
    """The webhook a capture belongs to: its own verb's, else the one the service has."""
    verb = "mutate" if ".mutate." in name else "validate"
    other = "validate" if verb == "mutate" else "mutate"
    for candidate in (webhook_path(review, verb), webhook_path(review, other)):
        if candidate in PATHS:
            return candidate
    raise AssertionError(f"no webhook for {name}")


def send(client: httpx.Client, path: str, review: dict[str, Any]) -> dict[str, Any]:
    r = client.post(
        path, content=orjson.dumps(review), headers={"content-type": "application/json"}
    )
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    assert doc["apiVersion"] == "admission.k8s.io/v1"
    assert doc["kind"] == "AdmissionReview"
    response: dict[str, Any] = doc["response"]
    assert response["uid"] == review["request"]["uid"]
    return response


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]] | None:
    if "patch" not in response:
        assert "patchType" not in response
        return None
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    assert ops, "an empty patch must be left out"
    return ops


def gang_labelled(raw: dict[str, Any]) -> set[str]:
    """The ReplicatedJobs whose Job template and pod template both carry the gang label."""
    found = set()
    spec = raw.get("spec") or {}
    rjs = ((spec.get("template") or {}).get("spec") or {}).get("replicatedJobs") or []
    for job_set_entry in rjs:
        template = job_set_entry.get("template") or {}
        job = (template.get("metadata") or {}).get("labels") or {}
        pod = ((template.get("spec") or {}).get("template") or {}).get("metadata") or {}
        if job.get(GANG_LABEL) == "true" and (pod.get("labels") or {}).get(GANG_LABEL) == "true":
            found.add(job_set_entry["name"])
    return found


def grouped_in(raw: dict[str, Any]) -> set[str]:
    """The ReplicatedJobs a group of the runtime's plan holds (none without spec.scheduling)."""
    runtime = Runtime.model_validate(raw)
    layout, _ = runtime_layout(runtime)
    return {rj for g in layout.groups for rj in g.targets} if layout is not None else set()


def frozen_patch(server: RunningServer, review: dict[str, Any]) -> list[dict[str, Any]]:
    """What the TrainJob mutating webhook adds to a TrainJob CREATE: the snapshot of its runtime
    as the cache holds it, beside the annotations it carries."""
    obj = review["request"]["object"]
    ref = obj["spec"]["runtimeRef"]
    checked = server.cache.runtime(ref.get("kind"), review["request"]["namespace"], ref["name"])
    assert checked is not None and checked.layout is not None
    text = snapshot(checked.runtime)
    if obj["metadata"].get("annotations") is None:
        return [{"op": "add", "path": "/metadata/annotations", "value": {SNAPSHOT: text}}]
    return [{"op": "add", "path": "/metadata/annotations/" + SNAPSHOT.replace("/", "~1"),
             "value": text}]  # fmt: skip


@pytest.mark.parametrize("name", fixture_names())
def test_captured_review(server: RunningServer, client: httpx.Client, name: str) -> None:
    review = fixture(name)
    path = path_for(name, review)
    response = send(client, path, review)
    assert response["allowed"] is True, response
    assert response.get("warnings", []) == EXPECTED_WARNINGS.get(name, [])
    ops = patch_of(response)
    if path == "/mutate-trainer-kubeflow-org-v1alpha1-trainjob" and name.startswith(
        "trainjob-create"
    ):  # frozen when created: its pods are tied the moment they come
        assert ops == frozen_patch(server, review)
    elif "runtime" in path and path.startswith("/mutate") and review["request"]["object"]:
        # The defaults, and the gang label on the Job and pod templates of every ReplicatedJob
        # a group holds (the pod webhook's objectSelector).
        escaped = GANG_LABEL.replace("/", "~1")
        stamps = [op for op in ops or [] if GANG_LABEL in json.dumps(op) or escaped in op["path"]]
        rest = [op for op in ops or [] if op not in stamps]
        assert (rest or None) == EXPECTED_PATCHES.get(name)
        labelled = jsonpatch.apply_patch(review["request"]["object"], ops or [])
        assert gang_labelled(labelled) == grouped_in(labelled)
    else:
        assert ops == EXPECTED_PATCHES.get(name)
    if ops is None:
        return
    original = review["request"]["object"]
    patched = jsonpatch.apply_patch(original, ops)
    # Only what the patch names changed: the diff back to the original is the patch itself
    # (a group named by someone else is replaced whole, where jsonpatch would go one level in).
    if not any(op["op"] == "replace" and isinstance(op["value"], dict) for op in ops):
        assert jsonpatch.make_patch(original, patched).patch == ops
    again = copy.deepcopy(review)
    again["request"]["object"] = patched
    again["request"]["uid"] = review["request"]["uid"] + "-again"
    assert patch_of(send(client, path, again)) is None, "the mutation is not idempotent"


def test_pod_patch_puts_every_pod_of_the_job_in_the_group(client: httpx.Client) -> None:
    review = fixture("pod-create-by-job-controller.mutate.json")
    pod = review["request"]["object"]
    patched = jsonpatch.apply_patch(pod, patch_of(send(client, "/mutate--v1-pod", review)) or [])
    assert patched["spec"]["schedulingGroup"] == {"podGroupName": MY_JOB_GROUP}
    assert {k: v for k, v in patched["spec"].items() if k != "schedulingGroup"} == pod["spec"]


def test_pods_of_a_trainjob_an_earlier_release_froze_keep_its_gangs_names(tmp_path: Path) -> None:
    # An upgrade renames no running gang: the captured pods get the documented name.
    assert MY_JOB_GROUP != LEGACY_GROUP
    with (
        running_server(fixture_cache(plan_version=1), tmp_path) as srv,
        srv.client() as client,
    ):
        tied = [name for name, patch in EXPECTED_PATCHES.items() if patch == POD_PATCH]
        assert len(tied) == 6
        for name in tied:
            review = fixture(name)
            ops = patch_of(send(client, path_for(name, review), review))
            assert ops == [{**POD_PATCH[0], "value": {"podGroupName": LEGACY_GROUP}}], name


def test_dry_run_gets_the_same_answer(client: httpx.Client) -> None:
    review = fixture("pod-create-by-job-controller.mutate.json")
    dry = copy.deepcopy(review)
    dry["request"]["dryRun"] = True
    dry["request"]["options"]["dryRun"] = ["All"]
    assert send(client, "/mutate--v1-pod", dry) == send(client, "/mutate--v1-pod", review)


# --- denials -----------------------------------------------------------------------------------


def runtime_review(runtime: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    review = fixture("clustertrainingruntime-create-level1.validate.json")
    review["request"]["object"] = runtime
    review["request"]["name"] = runtime["metadata"]["name"]
    review["request"]["operation"] = operation
    return review


def test_invalid_runtime_denied_the_way_the_api_server_words_it(client: httpx.Client) -> None:
    runtime = yaml.safe_load((SAMPLES / "invalid.runtime.yaml").read_text())
    response = send(
        client, webhook_path(runtime_review(runtime), "validate"), runtime_review(runtime)
    )
    assert response["allowed"] is False
    status = response["status"]
    assert (status["code"], status["reason"]) == (422, "Invalid")
    prefix = 'ClusterTrainingRuntime.trainer.kubeflow.org "torchtune-broken" is invalid: ['
    assert status["message"].startswith(prefix)
    assert status["message"].endswith("]")
    details = status["details"]
    assert (details["name"], details["group"], details["kind"]) == (
        "torchtune-broken",
        "trainer.kubeflow.org",
        "ClusterTrainingRuntime",
    )
    causes = {(c["field"], c["reason"]) for c in details["causes"]}
    rjs = "spec.scheduling.replicatedJobs"
    assert causes == {
        (f"{rjs}[0].schedulingPolicy.gang.minCount", "FieldValueForbidden"),
        (f"{rjs}[1].schedulingConstraints.topology", "FieldValueTooMany"),
        (f"{rjs}[0].targetReplicatedJobs", "FieldValueInvalid"),
        (f"{rjs}[1].targetReplicatedJobs[0]", "FieldValueDuplicate"),
        (f"{rjs}[1].targetReplicatedJobs[1]", "FieldValueInvalid"),
    }
    typo = next(c for c in details["causes"] if c["field"].endswith("targetReplicatedJobs[1]"))
    assert typo["message"].startswith('Invalid value: "nodes": no ReplicatedJob of that name')
    # The message lists each cause as `field: message`, as field.ErrorList does.
    for cause in details["causes"]:
        assert f"{cause['field']}: {cause['message']}" in status["message"]


def test_each_cause_of_a_denial_names_the_item_to_fix(client: httpx.Client) -> None:
    """Three mistakes, three causes, each at the field to change (JobSet's webhook names a
    target that breaks its PodGroup's priority class the same way), and of the warnings only
    the misspelt field's: how a denied runtime would be scheduled is not worth saying."""
    rt = runtime(
        rj("init", priority_class="high"),
        rj("node", priority_class="low"),
        rj("eval", parallelism=-1),
        rj("extra"),  # not targeted: no warning while the runtime is denied
        scheduling={
            "replicatedJobs": [
                {"targetReplicatedJobs": ["init", "node"]},
                {"targetReplicatedJobs": ["node"]},
                {"targetReplicatedJobs": ["eval"], "schedulingPolicys": {"basic": {}}},
            ]
        },
    )
    review = runtime_review(rt)
    response = send(client, webhook_path(review, "validate"), review)
    assert response["allowed"] is False
    causes = [(c["field"], c["reason"]) for c in response["status"]["details"]["causes"]]
    rjs = "spec.scheduling.replicatedJobs"
    assert sorted(causes) == [
        (f"{rjs}[0].targetReplicatedJobs[1]", "FieldValueInvalid"),
        (f"{rjs}[1].targetReplicatedJobs[0]", "FieldValueDuplicate"),
        ("spec.template.spec.replicatedJobs[2].template.spec.parallelism", "FieldValueInvalid"),
    ]
    assert (
        f'{rjs}[0].targetReplicatedJobs[1]: Invalid value: "node": its pods\' priorityClassName '
        '"low" must match "high" of "init"'
    ) in response["status"]["message"]
    assert response["warnings"] == [f"{rjs}[2].schedulingPolicys: unknown field, ignored"]


def test_a_runtime_jobset_would_refuse_is_denied_but_a_stored_one_stays_editable(
    client: httpx.Client,
) -> None:
    """The launcher listed before the workers it depends on: JobSet's webhook would refuse every
    JobSet Trainer makes of it ("replicatedJob: launcher cannot depend on replicatedJob: node",
    and for the first ReplicatedJob "DependsOn can't be set for the first ReplicatedJob"), so
    its TrainJobs would never start. Denied at the runtime's apply, at the dependsOn to move;
    an update of one stored before this rule that keeps its order is not."""
    rt = runtime(rj("launcher", depends=[("node", "Ready")]), rj("node", replicas=4),
                 scheduling={})  # fmt: skip
    review = runtime_review(rt)
    path = webhook_path(review, "validate")
    response = send(client, path, review)
    assert response["allowed"] is False
    (cause,) = response["status"]["details"]["causes"]
    assert (cause["field"], cause["reason"]) == (
        "spec.template.spec.replicatedJobs[0].dependsOn",
        "FieldValueForbidden",
    )
    assert 'the first ReplicatedJob ("launcher") cannot have dependsOn' in cause["message"]
    relabelled = copy.deepcopy(rt)
    relabelled["metadata"]["labels"] = {"team": "a"}
    update = runtime_review(relabelled, "UPDATE")
    update["request"]["oldObject"] = rt
    assert send(client, path, update)["allowed"] is True
    reordered = runtime(rj("node", replicas=4), rj("launcher", depends=[("node", "Ready")]),
                        scheduling={})  # fmt: skip
    fixed = runtime_review(reordered, "UPDATE")
    fixed["request"]["oldObject"] = rt
    assert send(client, path, fixed)["allowed"] is True


def trainjob_review(name: str = "trainjob-create.validate.json") -> dict[str, Any]:
    return fixture(name)


def test_trainjob_with_an_unknown_runtime_is_denied(client: httpx.Client) -> None:
    review = trainjob_review()
    review["request"]["object"]["spec"]["runtimeRef"]["name"] = "no-such-runtime"
    response = send(client, "/validate-trainer-kubeflow-org-v1alpha1-trainjob", review)
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        'TrainJob.trainer.kubeflow.org "my-job" is invalid: spec.runtimeRef.name: Not found: '
        '"no-such-runtime": no ClusterTrainingRuntime of that name; create the runtime first or '
        "fix spec.runtimeRef"
    )


def test_num_nodes_change_needs_the_gang_gone(client: httpx.Client) -> None:
    review = trainjob_review("trainjob-update-suspend.validate.json")
    old = review["request"]["oldObject"]
    new = review["request"]["object"]
    new["spec"]["trainer"]["numNodes"] = 64
    for suspended, allowed in ((False, False), (True, True)):
        old["spec"]["suspend"] = suspended
        response = send(client, "/validate-trainer-kubeflow-org-v1alpha1-trainjob", review)
        assert response["allowed"] is allowed, response
    old["spec"]["suspend"] = False
    message = send(client, "/validate-trainer-kubeflow-org-v1alpha1-trainjob", review)["status"][
        "message"
    ]
    assert "spec.trainer.numNodes: Forbidden: may not change from 100 to 64" in message


def test_wrong_resource_for_the_path_is_an_error_answer(client: httpx.Client) -> None:
    review = fixture("pod-create-by-job-controller.mutate.json")
    response = send(client, "/validate-trainer-kubeflow-org-v1alpha1-trainjob", review)
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert "handles trainer.kubeflow.org/trainjobs, not pods" in response["status"]["message"]


# --- no cluster -------------------------------------------------------------------------------


def test_without_a_cluster_pods_pass_with_a_warning_and_trainjobs_are_denied(
    tmp_path: Path,
) -> None:
    with running_server(Cache(connected=False), tmp_path / "certs") as srv, srv.client() as c:
        pod = fixture("pod-create-by-job-controller.mutate.json")
        response = send(c, "/mutate--v1-pod", pod)
        assert response["allowed"] is True
        assert patch_of(response) is None
        assert response["warnings"] == [
            'not tied to a gang: no TrainJob "team-a/my-job" in the cache'
        ]
        response = send(c, "/validate-trainer-kubeflow-org-v1alpha1-trainjob", trainjob_review())
        assert response["allowed"] is False
        assert "has no cluster connection" in response["status"]["message"]
        # Runtimes need no cluster: they are judged on their own.
        runtime = fixture("clustertrainingruntime-create-level2.validate.json")
        response = send(
            c, "/validate-trainer-kubeflow-org-v1alpha1-clustertrainingruntime", runtime
        )
        assert response["allowed"] is True


# --- logs ------------------------------------------------------------------------------------


def test_one_json_log_line_per_review(tmp_path: Path) -> None:
    review = fixture("pod-create-as-job-controller-serviceaccount.mutate.json")
    out = io.BytesIO()
    with (
        running_server(fixture_cache(), tmp_path, review_log=ReviewLog(out, enabled=True)) as srv,
        srv.client() as client,
    ):
        answer = send(client, "/mutate--v1-pod", review)
        rejected = client.post("/mutate--v1-pod", content=b'{"kind": "AdmissionReview"}')
        assert rejected.status_code == 400  # logged through `logging`, as a warning
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    fields: dict[str, Any] = json.loads(lines[0])
    assert (fields["level"], fields["logger"], fields["msg"]) == (
        "info",
        "webhook.admission",
        "admission review",
    )
    assert fields["ts"].endswith("Z")
    assert fields["webhook"] == "mutate--v1-pod"
    assert fields["uid"] == review["request"]["uid"]
    assert fields["kind"] == "Pod"
    assert (fields["namespace"], fields["name"]) == ("team-a", "my-job-node-0-0-")
    assert fields["operation"] == "CREATE"
    assert fields["user"] == "system:serviceaccount:kube-system:job-controller"
    assert fields["decision"] == "allowed"
    assert fields["patch_ops"] == 1
    assert fields["patch_bytes"] == len(base64.b64decode(answer["patch"]))
    assert fields["duration_ms"] > 0


class CountedWrites(io.BytesIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, data: Any) -> int:
        self.writes += 1
        return super().write(data)


@pytest.mark.asyncio
async def test_review_lines_go_out_together_in_time_and_before_other_lines() -> None:
    """Review lines wait for company (one write for many), but not past FLUSH_AFTER, and any
    other log line from the event loop is written after the review lines before it."""
    out = CountedWrites()
    review_log = ReviewLog(out, enabled=True)
    head = ReviewLog.head(webhook="mutate--v1-pod")
    for n in range(3):
        review_log.write(head, {"uid": f"u{n}"})
    assert out.writes == 0  # waiting for company
    await asyncio.sleep(FLUSH_AFTER * 3)
    assert out.writes == 1
    assert [json.loads(line)["uid"] for line in out.getvalue().splitlines()] == ["u0", "u1", "u2"]

    logger = logging.getLogger("test.review-order")
    logger.propagate = False
    logger.addHandler(json_handler(io.TextIOWrapper(out, write_through=True)))
    review_log.write(head, {"uid": "u3"})
    logger.warning("after u3")
    review_log.write(head, {"uid": "u4"})
    review_log.flush()  # as the service does when it stops
    shown = [json.loads(line) for line in out.getvalue().splitlines()[3:]]
    assert [line.get("uid", line["msg"]) for line in shown] == ["u3", "after u3", "u4"]

    big = CountedWrites()
    burst = ReviewLog(big, enabled=True)
    lines = FLUSH_BYTES // 40 + 1  # more than FLUSH_BYTES of lines: written without waiting
    for n in range(lines):
        burst.write(head, {"uid": f"b{n}"})
    assert big.writes >= 1
    burst.flush()
    assert len(big.getvalue().splitlines()) == lines


def test_trainjob_before_the_runtimes_are_listed_is_denied_as_such(tmp_path: Path) -> None:
    cache = Cache(connected=True)
    cache.jobsets.replace([])  # listed, none: restart attempt 0
    for store in cache.stores:
        store.replace([])
    with running_server(cache, tmp_path / "certs") as srv, srv.client() as c:
        cache.cluster_runtimes.synced = False  # a cluster, but the runtimes' list is not back yet
        response = send(c, "/validate-trainer-kubeflow-org-v1alpha1-trainjob", trainjob_review())
        assert response["allowed"] is False
        message = response["status"]["message"]
        assert "has not read the ClusterTrainingRuntimes from the cluster yet" in message
        cache.cluster_runtimes.synced = True  # listed, and the runtime is not there: Not found
        response = send(c, "/validate-trainer-kubeflow-org-v1alpha1-trainjob", trainjob_review())
        assert "no ClusterTrainingRuntime of that name" in response["status"]["message"]


def test_pod_group_of_a_trainjob_gets_min_count_over_https(client: httpx.Client) -> None:
    review = fixture("podgroup-create-gang-without-mincount-rejected.mutate.json")
    pod_group = review["request"]["object"]
    owner = fixture("podgroup-create.mutate.json")["request"]["object"]["metadata"]
    pod_group["metadata"]["ownerReferences"] = owner["ownerReferences"]
    pod_group["spec"]["workloadRef"] = {"workloadName": MY_JOB_GROUP, "templateName": MY_JOB_GROUP}
    response = send(client, "/mutate-scheduling-k8s-io-v1beta1-podgroup", review)
    ops = patch_of(response)
    assert ops == [{"op": "replace", "path": "/spec/schedulingPolicy/gang/minCount", "value": 100}]
    # An owner of the same name but another uid (a deleted TrainJob's leftover): not defaulted.
    pod_group["metadata"]["ownerReferences"][0]["uid"] = "0000"
    response = send(client, "/mutate-scheduling-k8s-io-v1beta1-podgroup", review)
    assert patch_of(response) is None
    assert response["warnings"][0].startswith("minCount not defaulted: owner uid 0000")


# --- requests the API server refuses without an equal limit: said at apply -----------------------

TRAINJOB_PATH = "/validate-trainer-kubeflow-org-v1alpha1-trainjob"
RUNTIME_PATH = "/validate-trainer-kubeflow-org-v1alpha1-clustertrainingruntime"


def with_resources_per_node(name: str, per_node: dict[str, Any]) -> dict[str, Any]:
    review = trainjob_review(name)
    review["request"]["object"]["spec"]["trainer"]["resourcesPerNode"] = per_node
    return review


@pytest.mark.parametrize(
    ("per_node", "expected"),
    [
        # A limit equal to the request (as a quantity), or a limit alone: runs.
        ({"requests": {"nvidia.com/gpu": 4}, "limits": {"nvidia.com/gpu": "4000m"}}, []),
        ({"limits": {"nvidia.com/gpu": 4}}, []),
        # cpu, memory and kubernetes.io names may be requested without a limit.
        ({"requests": {"cpu": "8", "memory": "64Gi", "example.kubernetes.io/thing": 1}}, []),
        (
            {"requests": {"nvidia.com/gpu": 8}, "limits": {"nvidia.com/gpu": 4}},
            [
                "spec.trainer.resourcesPerNode.requests[nvidia.com/gpu]: requests 8 but limits 4;",
                "... the API server refuses pods whose request for an extended resource differs "
                "from its limit,",
                "... so the TrainJob would create no pods: set "
                "spec.trainer.resourcesPerNode.limits[nvidia.com/gpu] to 8",
            ],
        ),
        (  # hugepages-* are native, but may not be overcommitted either
            {"requests": {"cpu": "1", "hugepages-2Mi": "1Gi"}},
            [
                "spec.trainer.resourcesPerNode.requests[hugepages-2Mi]: requests 1Gi without a "
                "limit;",
                "... the API server refuses pods that request huge pages without an equal limit,",
                "... so the TrainJob would create no pods: set "
                "spec.trainer.resourcesPerNode.limits[hugepages-2Mi] to 1Gi",
            ],
        ),
    ],
    ids=["equal", "limit-alone", "native", "unequal", "hugepages"],
)
def test_a_trainjob_whose_pods_the_api_server_would_refuse_is_warned_at_apply(
    client: httpx.Client, per_node: dict[str, Any], expected: list[str]
) -> None:
    """The captured TrainJob CREATE with its resourcesPerNode changed, over HTTPS: allowed, and
    the warnings are what kubectl prints after `Warning: `, each within 120 characters."""
    review = with_resources_per_node("trainjob-create.validate.json", per_node)
    response = send(client, TRAINJOB_PATH, review)
    assert response["allowed"] is True, response
    assert response.get("warnings", []) == expected
    assert all(len(line) <= 120 for line in expected)


def test_an_update_is_warned_only_when_it_changes_resources_per_node(
    client: httpx.Client,
) -> None:
    """Suspending the captured TrainJob (its GPUs still without a limit) says nothing again; an
    update that changes resourcesPerNode is judged like a CREATE."""
    review = trainjob_review("trainjob-update-suspend.validate.json")
    assert send(client, TRAINJOB_PATH, review).get("warnings", []) == []
    review["request"]["object"]["spec"]["trainer"]["resourcesPerNode"] = {
        "requests": {"nvidia.com/gpu": 8}
    }
    assert send(client, TRAINJOB_PATH, review)["warnings"] == gpus_without_a_limit(8)


def gpu_runtime() -> dict[str, Any]:
    """The captured level-1 runtime, its trainer container asking for a GPU and a sidecar for an
    RDMA device, both without limits."""
    review = fixture("clustertrainingruntime-create-level1.validate.json")
    pod = review["request"]["object"]["spec"]["template"]["spec"]["replicatedJobs"][0]
    pod = pod["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": 1}}
    pod["initContainers"] = [
        {"name": "rdma", "restartPolicy": "Always", "resources": {"requests": {"rdma/ib": 1}}}
    ]
    return review


RUNTIME_CONTAINER = "spec.template.spec.replicatedJobs[0].template.spec.template.spec"
REFUSED = "the API server refuses pods that request an extended resource without an equal limit,"


def test_a_runtime_whose_pods_the_api_server_would_refuse_is_warned_at_apply(
    client: httpx.Client,
) -> None:
    response = send(client, RUNTIME_PATH, gpu_runtime())
    assert response["allowed"] is True, response
    assert response["warnings"] == [
        f"{RUNTIME_CONTAINER}.containers[0].resources.requests[nvidia.com/gpu]:",
        f"... requests 1 without a limit; {REFUSED}",
        "... so its TrainJobs without resourcesPerNode would create no pods: set its "
        "limits[nvidia.com/gpu] to 1",
        f"{RUNTIME_CONTAINER}.initContainers[0].resources.requests[rdma/ib]:",
        f"... requests 1 without a limit; {REFUSED}",
        "... so its TrainJobs would create no pods: set its limits[rdma/ib] to 1",
    ]


def test_a_trainjob_of_such_a_runtime_is_warned_for_the_containers_it_keeps(
    tmp_path: Path,
) -> None:
    """Trainer replaces the trainer container's resources with resourcesPerNode: a TrainJob
    that sets it (with its limits) is warned only of the runtime's sidecar."""
    cache = fixture_cache()
    cache.cluster_runtimes.replace([gpu_runtime()["request"]["object"]])
    sidecar = [
        'ClusterTrainingRuntime "torch-distributed":',
        f"... {RUNTIME_CONTAINER}.initContainers[0].resources.requests[rdma/ib]:",
        f"... requests 1 without a limit; {REFUSED}",
        "... so the TrainJob would create no pods: set its limits[rdma/ib] to 1 in the runtime",
    ]
    with running_server(cache, tmp_path / "certs") as srv, srv.client() as c:
        kept = with_resources_per_node(
            "trainjob-create.validate.json",
            {"requests": {"nvidia.com/gpu": 4}, "limits": {"nvidia.com/gpu": 4}},
        )
        assert send(c, TRAINJOB_PATH, kept)["warnings"] == sidecar
        review = trainjob_review()
        del review["request"]["object"]["spec"]["trainer"]["resourcesPerNode"]
        assert send(c, TRAINJOB_PATH, review)["warnings"] == [
            'ClusterTrainingRuntime "torch-distributed":',
            f"... {RUNTIME_CONTAINER}.containers[0].resources.requests[nvidia.com/gpu]:",
            f"... requests 1 without a limit; {REFUSED}",
            "... so the TrainJob would create no pods: set its limits[nvidia.com/gpu] to 1 in the "
            "runtime",
            *sidecar,
        ]


def test_many_requests_without_limits_give_a_few_warnings(client: httpx.Client) -> None:
    """Hostile input: 200 containers of 20 unlimited extended resources each are read only as
    far as the bounds allow and said in a few warnings, the last saying there are more."""
    review = fixture("clustertrainingruntime-create-level1.validate.json")
    pod = review["request"]["object"]["spec"]["template"]["spec"]["replicatedJobs"][0]
    requests = {f"example.com/device-{i}": 1 for i in range(20)}
    pod["template"]["spec"]["template"]["spec"]["containers"] = [
        {"name": f"c{i}", "resources": {"requests": requests}} for i in range(200)
    ]
    said = send(client, RUNTIME_PATH, review)["warnings"]
    assert len(said) == 10 and all(len(line) <= 120 for line in said)
    assert said[0] == f"{RUNTIME_CONTAINER}.containers[0].resources.requests[example.com/device-0]:"
    assert said[-1] == (
        "more requests than these 3 lack an equal limit; fix these, then apply again to see the "
        "rest"
    )

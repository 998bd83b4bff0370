"""A hostile tenant against the served process (`python -m webhook serve`) over real HTTPS.

Objects built to make the work grow with a number the tenant controls (counts at int32 and
int64 extremes at every level, 5,000-step dependsOn chains, thousands of targets, 1,000 levels
of nesting in every field the core reads, on create and on update) must each be answered within
3 s with a review a person can act on (the field, the number, the limit), never a 500; while
they are judged, the probes and a normal pod review answer within 1 s. Connections: a 1 MiB
header section is refused (431), a body trickling in after its 408 loses its connection, a TCP
connection that never starts TLS is closed by the header deadline, and SIGTERM under keep-alive
load leaves no request unanswered.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import signal
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.builders import Json, rj, runtime, trainjob
from tests.harness import ServerProcess, fixture, make_certs, server_process
from tests.kube_emulator import CLUSTER_RUNTIMES, create
from tests.test_metrics_serve import Cluster, Served, cluster, serve
from tests.timing import STALL

INT32 = 2**31 - 1
EXTREMES = (INT32, INT32 + 1, 2**63 - 1, 2**64 - 1, -(2**31), -(2**63))
DEPTH = 1000  # below orjson's 1,024-level limit with the envelope: a review to answer
POD_REVIEW = "pod-create-by-job-controller.mutate.json"

RUNTIME_PATHS = {
    "validate": "/validate-trainer-kubeflow-org-v1alpha1-clustertrainingruntime",
    "mutate": "/mutate-trainer-kubeflow-org-v1alpha1-clustertrainingruntime",
}
TRAINJOB_PATH = "/validate-trainer-kubeflow-org-v1alpha1-trainjob"
POD_PATH = "/mutate--v1-pod"


# --- reviews -----------------------------------------------------------------------------------


def review(obj: Json, operation: str = "CREATE", old: Json | None = None) -> Json:
    kind = obj["kind"]
    plural = {"ClusterTrainingRuntime": "clustertrainingruntimes", "TrainJob": "trainjobs"}[kind]
    meta = obj["metadata"] if isinstance(obj.get("metadata"), dict) else {}
    request: Json = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "trainer.kubeflow.org", "version": "v1alpha1", "kind": kind},
        "resource": {"group": "trainer.kubeflow.org", "version": "v1alpha1", "resource": plural},
        "name": meta.get("name", "") if isinstance(meta.get("name"), str) else "",
        "namespace": "team-a" if kind == "TrainJob" else "",
        "operation": operation,
        "userInfo": {"username": "tenant"},
        "object": obj,
    }
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def level_runtime(level: int, name: str | None = None) -> Json:
    """A valid runtime of each level: dataset-initializer, node (trainer), eval."""
    jobs = [rj("dataset-initializer"), rj("node", ancestor="trainer", replicas=2), rj("eval")]
    scheduling: Json = {}
    if level == 2:
        scheduling = {
            "replicatedJobs": [
                {
                    "targetReplicatedJobs": ["dataset-initializer"],
                    "schedulingPolicy": {"basic": {}},
                },
                {"targetReplicatedJobs": ["node", "eval"]},
            ]
        }
    elif level == 3:
        scheduling = {
            "replicatedJobs": [
                {
                    "targetReplicatedJobs": ["dataset-initializer"],
                    "schedulingPolicy": {"basic": {}},
                },
                {"targetReplicatedJobs": ["node"], "job": {}},
                {"targetReplicatedJobs": ["eval"], "job": {}},
            ]
        }
    return runtime(
        *jobs, scheduling=scheduling, ml={"numNodes": 2, "torch": {}}, name=name or f"level-{level}"
    )


def chain(n: int, status: str = "Ready") -> list[Json]:
    return [rj(f"r{i}", depends=[(f"r{i - 1}", status)] if i else None) for i in range(n)]


DEEP = "@@deep@@"  # stands for a value nested DEPTH levels deep (orjson writes at most 254)
DEEP_BYTES = b'{"a":[' * (DEPTH // 2) + b"1" + b"]}" * (DEPTH // 2)


def encode(doc: Json) -> bytes:
    return orjson.dumps(doc).replace(b'"' + DEEP.encode() + b'"', DEEP_BYTES)


def set_path(obj: Json, path: tuple[str | int, ...], value: Any) -> Json:
    out = copy.deepcopy(obj)
    at: Any = out
    for key in path[:-1]:
        at = at[key] if isinstance(key, int) else at.setdefault(key, {})
    at[path[-1]] = value
    return out


@dataclass
class Answer:
    status: int
    seconds: float
    body: Any

    @property
    def response(self) -> Json:
        assert self.status == 200, (self.status, self.body)
        response: Json = self.body["response"]
        return response

    @property
    def denial(self) -> str:
        """The message of a denied review (and a check that it is a user error, not a crash)."""
        response = self.response
        assert response["allowed"] is False, response
        status = response["status"]
        assert 400 <= status["code"] < 500, status
        message: str = status["message"]
        assert "Traceback" not in message and len(message) < 8000, message[:300]
        assert len(status["details"]["causes"]) <= 20 if "details" in status else True
        return message


def post(client: httpx.Client, path: str, doc: Json | bytes) -> Answer:
    content = doc if isinstance(doc, bytes) else encode(doc)
    start = time.monotonic()
    resp = client.post(path, content=content, headers={"content-type": "application/json"})
    seconds = time.monotonic() - start
    # Bounded work: a review past every limit is answered in milliseconds (the admission bench
    # has the figure); only work that grows with a hostile number could take this long.
    assert seconds < STALL, f"{path} took {seconds:.2f}s"
    body = orjson.loads(resp.content)
    if resp.status_code == 200:
        response = body["response"]
        assert response["uid"] == orjson.loads(content)["request"]["uid"]
        assert response.get("status", {}).get("code") != 500, response
        assert len(response.get("warnings", [])) <= 12, response["warnings"]
    return Answer(resp.status_code, seconds, body)


# --- the served process and its cluster, for the module ----------------------------------------


@dataclass
class Target:
    api: Cluster
    served: Served
    client: httpx.Client


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    tmp = tmp_path_factory.mktemp("hostile")
    with cluster(tmp) as api:
        for level in (1, 2, 3):
            api.run(create(api.k, CLUSTER_RUNTIMES, level_runtime(level)))
        with (
            serve(tmp, "--kubeconfig", str(api.kubeconfig), "--reconcile=false") as served,
            served.client(served.proc.url) as client,
        ):
            # The runtimes are in the service's cache once a TrainJob of each is admitted.
            for level in (1, 2, 3):
                ok = review(trainjob(f"probe-{level}", runtime_name=f"level-{level}"))

                def admitted(ok: Json = ok) -> bool:
                    return post(client, TRAINJOB_PATH, ok).response["allowed"] is True

                served.eventually(admitted, f"runtime level-{level} in the cache")
            yield Target(api, served, client)


# --- 1. counts at int32 and int64 extremes, at every level --------------------------------------


COUNT_FIELDS: dict[str, tuple[str | int, ...]] = {
    "replicas": ("spec", "template", "spec", "replicatedJobs", 1, "replicas"),
    "parallelism": (
        "spec",
        "template",
        "spec",
        "replicatedJobs",
        2,
        "template",
        "spec",
        "parallelism",
    ),
    "mlPolicy.numNodes": ("spec", "mlPolicy", "numNodes"),
}


@pytest.mark.parametrize("value", EXTREMES)
@pytest.mark.parametrize("name", COUNT_FIELDS)
@pytest.mark.parametrize("level", [1, 2, 3])
def test_runtime_counts_at_the_extremes_get_an_answer_naming_field_number_and_limit(
    target: Target, level: int, name: str, value: int
) -> None:
    path = COUNT_FIELDS[name]
    obj = set_path(level_runtime(level), path, value)
    mutated = post(target.client, RUNTIME_PATHS["mutate"], review(obj))
    assert mutated.response["allowed"] is True
    answer = post(target.client, RUNTIME_PATHS["validate"], review(obj))
    field_path = ".".join(str(p) for p in path[:4]) + "".join(
        f"[{p}]" if isinstance(p, int) else f".{p}" for p in path[4:]
    )
    if not 0 <= value <= INT32:
        message = answer.denial
        assert field_path in message and str(value) in message, message
        assert "must be >= 0" in message or f"at most {INT32}" in message, message
    elif not answer.response["allowed"]:
        # In range, but the groups it makes are not: too many templates or too many pods.
        message = answer.denial
        assert str(value) in message, message
        assert "at most 8" in message or f"can count ({INT32})" in message, message


@pytest.mark.parametrize("value", EXTREMES)
@pytest.mark.parametrize("level", [1, 2, 3])
def test_trainjob_num_nodes_at_the_extremes_on_create_and_update(
    target: Target, level: int, value: int
) -> None:
    obj = trainjob(f"extreme-{level}", runtime_name=f"level-{level}", num_nodes=value)
    old = trainjob(f"extreme-{level}", runtime_name=f"level-{level}", num_nodes=2)
    for answer in (
        post(target.client, TRAINJOB_PATH, review(obj)),
        post(target.client, TRAINJOB_PATH, review(obj, "UPDATE", old)),
    ):
        if not 0 <= value <= INT32:
            message = answer.denial
            assert "spec.trainer.numNodes" in message and str(value) in message, message
        elif not answer.response["allowed"]:
            assert "spec.trainer.numNodes" in answer.denial, answer.denial


@pytest.mark.parametrize("value", ["1e300000", "1e1000000", "9Ei", "9223372036854775808", "1" * 65])
def test_quantities_past_what_the_api_holds_are_denied_at_once(target: Target, value: str) -> None:
    """resourcesPerNode adds up into the gangs' minResources; printing 1e1000000 as a whole
    number takes most of a minute, on the loop that answers every pod."""
    obj = trainjob("huge", runtime_name="level-1")
    trainer = obj["spec"].setdefault("trainer", {})
    trainer["resourcesPerNode"] = {"requests": {"cpu": value, "memory": "1Gi"}}
    message = post(target.client, TRAINJOB_PATH, review(obj)).denial
    assert "spec.trainer.resourcesPerNode.requests[cpu]: Invalid value" in message, message
    assert "must be a quantity from 0 to 9223372036854775807" in message
    assert "memory" not in message  # a quantity in range is fine
    trainer["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": 8}}
    assert post(target.client, TRAINJOB_PATH, review(obj)).response["allowed"] is True


def test_a_level_3_target_with_int32_replicas_is_denied_at_once(target: Target) -> None:
    obj = set_path(level_runtime(3), COUNT_FIELDS["replicas"], INT32)
    message = post(target.client, RUNTIME_PATHS["validate"], review(obj)).denial
    assert f'"node" has replicas {INT32}' in message, message
    assert "a Workload holds at most 8" in message, message


# --- 2. long lists: dependsOn chains, targets, entries ------------------------------------------


def test_dependson_chains_of_5000_and_1000_steps(target: Target) -> None:
    long = runtime(*chain(5000), scheduling={})
    message = post(target.client, RUNTIME_PATHS["validate"], review(long)).denial
    assert "spec.template.spec.replicatedJobs: Too many: 5000: must have at most 1000" in message

    ready = runtime(*chain(1000), scheduling={}, ml={"numNodes": 1, "torch": {}})
    answer = post(target.client, RUNTIME_PATHS["validate"], review(ready))
    assert answer.response["allowed"] is True, answer.body
    warnings = answer.response["warnings"]
    assert len(warnings) == 12 and warnings[-1] == "988 more warnings not shown", warnings

    complete = runtime(*chain(1000, "Complete"), scheduling={})
    message = post(target.client, RUNTIME_PATHS["validate"], review(complete)).denial
    assert "splits into 1000 gangs" in message, message

    cycle = [rj(f"r{i}", depends=[(f"r{(i - 1) % 1000}", "Ready")]) for i in range(1000)]
    cyclic = runtime(*cycle, scheduling={})
    message = post(target.client, RUNTIME_PATHS["validate"], review(cyclic)).denial
    assert "dependsOn forms a cycle" in message and "..." in message, message


def test_thousands_of_targets_and_entries(target: Target) -> None:
    jobs = chain(10)
    many_targets = {"replicatedJobs": [{"targetReplicatedJobs": [f"x{i}" for i in range(5000)]}]}
    message = post(
        target.client, RUNTIME_PATHS["validate"], review(runtime(*jobs, scheduling=many_targets))
    ).denial
    assert "targetReplicatedJobs: Too many: 5000: must have at most 64" in message, message

    wide = {"replicatedJobs": [{"targetReplicatedJobs": [f"x{i}" for i in range(60)]}] * 60}
    answer = post(
        target.client, RUNTIME_PATHS["validate"], review(runtime(*chain(1000), scheduling=wide))
    )
    message = answer.denial
    assert "spec.scheduling.replicatedJobs: Too many: 60: must have at most 8 items" in message
    assert "more errors" in message, message  # thousands of errors, 20 shown
    assert len(answer.response["status"]["details"]["causes"]) == 20

    entries = {"replicatedJobs": [{"targetReplicatedJobs": ["r1"]}] * 10_000}
    message = post(
        target.client, RUNTIME_PATHS["validate"], review(runtime(*jobs, scheduling=entries))
    ).denial
    assert "spec.scheduling.replicatedJobs: Too many: 10000: must have at most 64" in message

    deps = [rj(f"r{i}", depends=[(f"missing-{j}", "Ready") for j in range(5)]) for i in range(1000)]
    message = post(
        target.client, RUNTIME_PATHS["validate"], review(runtime(*deps, scheduling={}))
    ).denial
    # 5,000 names not found, and the first ReplicatedJob's dependsOn (JobSet refuses it)
    assert "and 4981 more errors" in message, message


# --- 3. deep nesting in every field the core reads -----------------------------------------------

RUNTIME_FIELDS: tuple[tuple[str | int, ...], ...] = (
    ("spec", "scheduling"),
    ("spec", "scheduling", "replicatedJobs", 1, "schedulingPolicy"),
    ("spec", "scheduling", "replicatedJobs", 1, "schedulingConstraints"),
    ("spec", "scheduling", "replicatedJobs", 1, "targetReplicatedJobs"),
    ("spec", "scheduling", "replicatedJobs", 1, "resourceClaims"),
    ("spec", "scheduling", "replicatedJobs", 1, "job"),
    ("spec", "scheduling", "replicatedJobs", 1, "unknownField"),
    ("spec", "mlPolicy", "numNodes"),
    ("spec", "mlPolicy", "mpi"),
    ("spec", "podGroupPolicy"),
    ("spec", "template", "spec", "startupPolicy"),
    ("spec", "template", "spec", "replicatedJobs", 1, "replicas"),
    ("spec", "template", "spec", "replicatedJobs", 1, "dependsOn"),
    ("spec", "template", "spec", "replicatedJobs", 1, "template", "metadata", "labels"),
    ("spec", "template", "spec", "replicatedJobs", 1, "template", "spec", "parallelism"),
    ("spec", "template", "spec", "replicatedJobs", 1, "template", "spec", "template", "spec"),
    ("metadata", "labels"),
    ("metadata", "annotations"),
)
TRAINJOB_FIELDS: tuple[tuple[str | int, ...], ...] = (
    ("spec", "trainer", "numNodes"),
    ("spec", "trainer"),
    ("spec", "runtimeRef"),
    ("spec", "suspend"),
    ("metadata", "labels"),
    ("metadata", "annotations"),
    ("status", "conditions"),
)


@pytest.mark.parametrize("where", ["create", "update", "old"])
@pytest.mark.parametrize("path", RUNTIME_FIELDS, ids=lambda p: ".".join(map(str, p)))
def test_deeply_nested_runtime_fields(
    target: Target, path: tuple[str | int, ...], where: str
) -> None:
    base = level_runtime(2, name="deep")
    deep = set_path(base, path, DEEP)
    doc = {
        "create": review(deep),
        "update": review(deep, "UPDATE", base),
        "old": review(base, "UPDATE", deep),
    }[where]
    assert post(target.client, RUNTIME_PATHS["mutate"], doc).response  # no crash
    answer = post(target.client, RUNTIME_PATHS["validate"], doc)
    if where == "old":
        assert answer.response["allowed"] is True, answer.body  # the new object is fine
    else:
        message = answer.denial
        assert "nested more than 64 levels deep" in message, message
        assert ".".join(str(p) for p in path[:2]) in message, message


@pytest.mark.parametrize("where", ["create", "update", "old"])
@pytest.mark.parametrize("path", TRAINJOB_FIELDS, ids=lambda p: ".".join(map(str, p)))
def test_deeply_nested_trainjob_fields(
    target: Target, path: tuple[str | int, ...], where: str
) -> None:
    base = trainjob("deep", runtime_name="level-1", num_nodes=2)
    deep = set_path(base, path, DEEP)
    doc = {
        "create": review(deep),
        "update": review(deep, "UPDATE", base),
        "old": review(base, "UPDATE", deep),
    }[where]
    answer = post(target.client, TRAINJOB_PATH, doc)
    if where == "old":
        assert answer.response["allowed"] is True, answer.body
    else:
        assert "nested more than 64 levels deep" in answer.denial, answer.denial


def test_nesting_past_the_parsers_limit_is_a_plain_400(target: Target) -> None:
    body = orjson.dumps(review(set_path(level_runtime(1), ("spec", "scheduling"), "@@")))
    body = body.replace(b'"@@"', b"[" * 2000 + b"]" * 2000)
    resp = target.client.post(RUNTIME_PATHS["validate"], content=body)
    assert resp.status_code == 400 and "JSON" in resp.json()["error"], resp.text


# --- 4. while one is judged, the rest of the cluster is answered ---------------------------------


def hostile_bodies() -> list[tuple[str, bytes]]:
    level3 = set_path(level_runtime(3), COUNT_FIELDS["replicas"], INT32)
    return [
        (RUNTIME_PATHS["validate"], orjson.dumps(review(level3))),
        (RUNTIME_PATHS["mutate"], orjson.dumps(review(level3))),
        (RUNTIME_PATHS["validate"], orjson.dumps(review(runtime(*chain(5000))))),
        (RUNTIME_PATHS["validate"], orjson.dumps(review(runtime(*chain(1000), scheduling={})))),
        (
            RUNTIME_PATHS["validate"],
            encode(review(set_path(level_runtime(2), ("spec", "scheduling"), DEEP))),
        ),
        (
            TRAINJOB_PATH,
            orjson.dumps(review(trainjob("x", runtime_name="level-3", num_nodes=2**63 - 1))),
        ),
    ]


def test_probes_and_pod_reviews_answer_while_hostile_reviews_are_judged(target: Target) -> None:
    stop = threading.Event()
    slowest: list[float] = []
    failures: list[str] = []

    def attacker(offset: int) -> None:
        with target.served.client(target.served.proc.url) as client:
            bodies = hostile_bodies()
            for path, body in itertools.islice(itertools.cycle(bodies), offset, None):
                if stop.is_set():
                    return
                try:
                    start = time.monotonic()
                    resp = client.post(path, content=body)
                    slowest.append(time.monotonic() - start)
                    if resp.status_code != 200:
                        failures.append(f"{path}: {resp.status_code}")
                except httpx.HTTPError as err:
                    failures.append(f"{path}: {err!r}")

    attackers = [threading.Thread(target=attacker, args=(i,)) for i in range(3)]
    for t in attackers:
        t.start()
    pod = fixture(POD_REVIEW)
    latencies: dict[str, float] = {"healthz": 0.0, "readyz": 0.0, "pod": 0.0}
    try:
        with (
            httpx.Client(timeout=STALL) as probes,
            target.served.client(target.served.proc.url) as client,
        ):
            health = target.served.proc.health_url
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                for name in latencies:
                    start = time.monotonic()
                    if name == "pod":
                        resp = client.post(POD_PATH, content=orjson.dumps(pod))
                    else:
                        resp = probes.get(f"{health}/{name}")
                    assert resp.status_code == 200, name
                    latencies[name] = max(latencies[name], time.monotonic() - start)
                time.sleep(0.02)
    finally:
        stop.set()
        for t in attackers:
            t.join(timeout=30)
    assert not failures, failures
    assert len(slowest) >= 6, slowest  # the attackers did get through their bodies
    assert max(slowest) < STALL, max(slowest)
    # Nothing waits for the attack: a probe or a pod review waits at most for the reviews being
    # judged when it came (on this event loop, one per attacker), not for the attackers' turns.
    # Relative to the hostile reviews' own time, a loaded machine slows both alike.
    assert max(latencies.values()) < 1.0 + 2 * max(slowest), (latencies, max(slowest))


# --- 5. connections ---------------------------------------------------------------------------


def tls_connect(served: Served, port_url: str | None = None) -> ssl.SSLSocket:
    url = httpx.URL(port_url or served.proc.url)
    context = ssl.create_default_context(cafile=str(served.ca_file))
    raw = socket.create_connection(("127.0.0.1", url.port), timeout=5)
    return context.wrap_socket(raw, server_hostname="localhost")


def read_head(sock: ssl.SSLSocket, timeout: float = 5.0) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the peer closes the connection within `seconds` (reading whatever comes)."""
    deadline = time.monotonic() + seconds
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            continue
        except (ConnectionError, ssl.SSLError, OSError):
            return True
    return False


def test_a_1_mib_header_section_is_431_and_others_are_answered(target: Target) -> None:
    sock = tls_connect(target.served)
    sock.sendall(b"POST /mutate--v1-pod HTTP/1.1\r\nhost: localhost\r\nx-big: ")
    sent, answer = 0, b""
    with contextlib.suppress(ConnectionError, ssl.SSLError, OSError):
        while sent < 1024 * 1024 and not answer:
            sock.sendall(b"a" * 16384)
            sent += 16384
            sock.settimeout(0.05)  # a moment for an answer (TLS tickets alone are not one)
            with contextlib.suppress(TimeoutError):
                answer = sock.recv(65536)
    with contextlib.suppress(ConnectionError, ssl.SSLError, OSError):
        answer += read_head(sock)
    assert answer.startswith(b"HTTP/1.1 431 "), (sent, answer[:200])
    assert b"connection: close" in answer.lower()
    assert sent < 512 * 1024, f"the server read {sent} bytes of headers before refusing"
    assert closed_within(sock, STALL)
    sock.close()
    assert post(target.client, POD_PATH, fixture(POD_REVIEW)).status == 200


@pytest.mark.parametrize("upgrade", [b"foo", b"websocket", b"h2c"])
def test_an_upgrade_is_refused_and_its_connection_closed(target: Target, upgrade: bytes) -> None:
    # Past an Upgrade header no parser reads the bytes that follow, so no deadline would watch
    # them: a client trickling bytes behind one held its connection for ever.
    sock = tls_connect(target.served)
    sock.sendall(
        b"POST /mutate--v1-pod HTTP/1.1\r\nhost: localhost\r\nconnection: upgrade\r\n"
        b"upgrade: %b\r\ncontent-length: 100000\r\n\r\n{" % upgrade
    )
    answer = read_head(sock, STALL)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b"connection: close" in answer.lower()
    closed = False
    with contextlib.suppress(ConnectionError, ssl.SSLError, OSError):
        sock.sendall(b"{")  # a trickle after the answer is not read
    closed = closed_within(sock, STALL)
    assert closed
    sock.close()
    assert post(target.client, POD_PATH, fixture(POD_REVIEW)).status == 200


def test_a_head_request_is_answered_and_keeps_pipelined_answers_in_order(target: Target) -> None:
    """uvicorn writes no body for HEAD: the answer's head goes out at once, and the answer to a
    request pipelined behind it follows it."""
    sock = tls_connect(target.served)
    head = b"HEAD /mutate--v1-pod HTTP/1.1\r\nhost: localhost\r\n\r\n"
    sock.sendall(head)
    first = read_head(sock)
    assert first.startswith(b"HTTP/1.1 405 "), first[:200]
    body = orjson.dumps(fixture(POD_REVIEW))
    post_request = (
        b"POST /mutate--v1-pod HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json"
        b"\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)
    )
    sock.sendall(head + post_request)
    answers = b""
    sock.settimeout(5)
    while answers.count(b"HTTP/1.1 ") < 2 or not answers.rstrip().endswith(b"}"):
        chunk = sock.recv(65536)
        assert chunk, answers[:300]
        answers += chunk
    assert answers.startswith(b"HTTP/1.1 405 "), answers[:200]
    second = answers[answers.index(b"HTTP/1.1 ", 10) :]
    assert second.startswith(b"HTTP/1.1 200 ") and b'"allowed":true' in second, second[:300]
    sock.close()


def test_pipelined_reviews_are_answered_in_order_each_in_full(target: Target) -> None:
    """Several reviews sent at once on one connection come back in order, each with the head
    uvicorn writes (date, server, content-type, a content-length that is the body's) and no
    close."""
    sock = tls_connect(target.served)
    reviews = []
    for n in range(3):
        doc = fixture(POD_REVIEW)
        doc["request"]["uid"] = f"pipelined-{n}"
        reviews.append(orjson.dumps(doc))
    sock.sendall(
        b"".join(
            b"POST /mutate--v1-pod HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json"
            b"\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)
            for body in reviews
        )
    )
    data = b""
    answers: list[Json] = []
    sock.settimeout(5)
    while len(answers) < 3:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, (answers, data[:300])
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        headers = dict(line.split(b": ", 1) for line in lines[1:])
        length = int(headers[b"content-length"])
        while len(data) < length:
            chunk = sock.recv(65536)
            assert chunk, (answers, head)
            data += chunk
        body, data = data[:length], data[length:]
        assert lines[0] == b"HTTP/1.1 200 OK", head
        assert sorted(headers) == [b"content-length", b"content-type", b"date", b"server"], head
        assert headers[b"content-type"] == b"application/json"
        answers.append(orjson.loads(body)["response"])
    assert [a["uid"] for a in answers] == ["pipelined-0", "pipelined-1", "pipelined-2"]
    assert all(a["allowed"] is True for a in answers)
    assert not data
    sock.close()


def test_slow_clients_lose_their_connections(tmp_path: Path) -> None:
    """A TCP connection that never starts TLS is closed by the header deadline (not asyncio's
    60 s); a body that keeps trickling in after its 408 loses its connection, and the server
    does not hold it either (it stops at once, though this client never closes)."""
    with serve(tmp_path, "--body-timeout", "0.5", "--header-timeout", "1") as served:
        port = httpx.URL(served.proc.url).port
        with socket.create_connection(("127.0.0.1", port), timeout=5) as silent:
            # The 1 s header deadline, not asyncio's 60 s handshake timeout.
            assert closed_within(silent, STALL), f"not closed within {STALL} s"

        sock = tls_connect(served)
        sock.sendall(
            b"POST /mutate--v1-pod HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json"
            b"\r\ncontent-length: 100000\r\n\r\n"
        )
        answer = b""
        sock.settimeout(0.1)
        deadline = time.monotonic() + STALL
        while b"\r\n\r\n" not in answer and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                sock.sendall(b"{")
                answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b"connection: close" in answer.lower(), answer
        trickled = 0
        closed = False
        deadline = time.monotonic() + STALL
        while time.monotonic() < deadline and not closed:
            try:
                sock.sendall(b"{")
                trickled += 1
                closed = sock.recv(65536) == b""
            except TimeoutError:
                continue
            except (ConnectionError, ssl.SSLError, OSError):
                closed = True
        assert closed, f"still open after trickling {trickled} more bytes"
        served.proc.process.send_signal(signal.SIGTERM)
        # At once, not after the 25 s its shutdown timeout would let a held connection take.
        assert served.proc.process.wait(timeout=STALL) == 0
        sock.close()


# --- 6. SIGTERM under keep-alive load ---------------------------------------------------------


class NotSent(Exception):
    """The request never reached a connection (refused, or the handshake failed)."""


class Lost(Exception):
    """The request was written on a connection that then gave no full answer."""


@dataclass
class KeepAlive:
    """An HTTP/1.1 client on one TLS connection at a time, as the API server's is: a new
    connection only when the last answer said `Connection: close` (or there is none yet)."""

    port: int
    context: ssl.SSLContext
    sock: ssl.SSLSocket | None = None
    closes: int = 0

    def request(self, body: bytes) -> int:
        if self.sock is None:
            try:
                raw = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                self.sock = self.context.wrap_socket(raw, server_hostname="localhost")
            except (OSError, ssl.SSLError) as err:
                raise NotSent(repr(err)) from None
        head = (
            f"POST {POD_PATH} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        try:
            self.sock.sendall(head + body)
            status, close = self._read_answer()
        except (OSError, ssl.SSLError, ValueError) as err:
            self.drop()
            raise Lost(repr(err)) from None
        if close:
            self.closes += 1
            self.drop()
        return status

    def _read_answer(self) -> tuple[int, bool]:
        assert self.sock is not None
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ValueError(f"closed after {len(data)} bytes of an answer")
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        length = int(headers["content-length"])
        while len(rest) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ValueError("closed inside an answer's body")
            rest += chunk
        return int(lines[0].split()[1]), headers.get("connection") == "close"

    def drop(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None


@dataclass
class Load:
    answered: int = 0
    lost: list[str] = field(default_factory=list)
    closes: int = 0


def keep_alive_load(
    proc: ServerProcess, ca_file: Path, clients: int, until: threading.Event
) -> tuple[list[threading.Thread], Load]:
    load = Load()
    lock = threading.Lock()
    body = orjson.dumps(fixture(POD_REVIEW))
    port = httpx.URL(proc.url).port
    assert port is not None
    context = ssl.create_default_context(cafile=str(ca_file))

    def run() -> None:
        client = KeepAlive(port, context)
        while True:
            try:
                status = client.request(body)
            except NotSent:
                if until.is_set():
                    break  # the listener is gone: a real client would try another replica
                time.sleep(0.01)
                continue
            except Lost as err:
                with lock:
                    load.lost.append(str(err))
                continue
            with lock:
                load.answered += status == 200
        with lock:
            load.closes += client.closes

    threads = [threading.Thread(target=run) for _ in range(clients)]
    for t in threads:
        t.start()
    return threads, load


@pytest.mark.parametrize("delay", ["0", "1"])
def test_sigterm_under_keep_alive_load_leaves_no_request_unanswered(
    tmp_path: Path, delay: str
) -> None:
    cert_dir = tmp_path / "certs"
    cert_dir.mkdir()
    ca_file = make_certs(cert_dir)
    with server_process(cert_dir, "--shutdown-delay", delay) as proc:
        stopping = threading.Event()
        threads, load = keep_alive_load(proc, ca_file, clients=8, until=stopping)
        deadline = time.monotonic() + STALL
        while load.answered <= 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        before = load.answered
        proc.process.send_signal(signal.SIGTERM)
        stopping.set()
        assert proc.process.wait(timeout=30) == 0
        for t in threads:
            t.join(timeout=30)
    assert before > 50, before  # the load was real
    assert load.lost == [], load.lost
    assert load.closes >= 8, load.closes  # each client was told to close, not cut off

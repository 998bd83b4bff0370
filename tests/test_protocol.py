"""The webhook server's connection bounds, over real TLS connections to the running service.

An answer closes its connection (`Connection: close`) once the connection has carried
`connection_max_requests` requests or is `connection_max_age` seconds old, so that clients dial
again and reviews spread over the replicas after a rollout; the closing answer is a whole,
correct answer and no request is lost by it. And the server stands on uvicorn's public API only.
"""

from __future__ import annotations

import ast
import base64
import inspect
import socket
import ssl
import threading
import time
from pathlib import Path

import httpx
import orjson
import uvicorn

from webhook.core import naming

from .builders import TRAINJOB_UID
from .harness import (
    RunningServer,
    fixture,
    fixture_cache,
    make_certs,
    running_server,
    server_process,
)
from .paths import REPO

POD_PATH = "/mutate--v1-pod"
# The PodGroup the fixture pod is put in (its TrainJob frozen at plan version 2: by its uid).
POD_GROUP = naming.workload_name("team-a", "my-job", TRAINJOB_UID)
STALL = 30.0  # seconds: only a stalled server takes this long


def review_body(uid: str) -> bytes:
    doc = fixture("pod-create-by-job-controller.mutate.json")
    doc["request"]["uid"] = uid
    return orjson.dumps(doc)


def request(uid: str) -> bytes:
    body = review_body(uid)
    return (
        b"POST %s HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%b" % (POD_PATH.encode(), len(body), body)
    )


class Answer:
    def __init__(self, head: bytes, body: bytes) -> None:
        lines = head.split(b"\r\n")
        self.status_line = lines[0]
        self.headers: list[tuple[bytes, bytes]] = []
        for line in lines[1:]:
            name, _, value = line.lower().partition(b": ")
            self.headers.append((name, value))
        self.body = body

    @property
    def closes(self) -> bool:
        return (b"connection", b"close") in self.headers

    def check_review(self, uid: str, patched: bool = True) -> None:
        """A whole, correct answer to the pod review `uid` (`patched`: into its PodGroup, which
        a service without the fixtures' TrainJob in its cache does not know)."""
        assert self.status_line == b"HTTP/1.1 200 OK", self.status_line
        response = orjson.loads(self.body)["response"]
        assert response["uid"] == uid and response["allowed"] is True, response
        if patched:
            assert POD_GROUP.encode() in base64.b64decode(response["patch"])


def read_answer(sock: ssl.SSLSocket, buffered: bytearray) -> Answer:
    while b"\r\n\r\n" not in buffered:
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {bytes(buffered[:200])!r}"
        buffered += chunk
    end = buffered.index(b"\r\n\r\n")
    head = bytes(buffered[:end])
    length = int(dict(Answer(head, b"").headers)[b"content-length"])
    while len(buffered) < end + 4 + length:
        chunk = sock.recv(65536)
        assert chunk, f"closed within an answer: {head!r}"
        buffered += chunk
    body = bytes(buffered[end + 4 : end + 4 + length])
    del buffered[: end + 4 + length]
    return Answer(head, body)


def closed_by_server(sock: ssl.SSLSocket) -> bool:
    """Whether the server closes the connection (rather than leaving it open) in `STALL` s."""
    sock.settimeout(STALL)
    try:
        return sock.recv(65536) == b""
    except (ConnectionError, ssl.SSLError):
        return True
    except TimeoutError:
        return False


def connect(served: RunningServer) -> ssl.SSLSocket:
    port = int(served.url.rsplit(":", 1)[1])
    context = ssl.create_default_context(cafile=str(served.ca_file))
    raw = socket.create_connection(("127.0.0.1", port), timeout=STALL)
    return context.wrap_socket(raw, server_hostname="localhost")


def test_an_answer_closes_the_connection_after_its_request_bound(tmp_path: Path) -> None:
    with running_server(fixture_cache(), tmp_path / "certs", connection_max_requests=3) as srv:
        for _ in range(2):  # and again on a new connection: the count is per connection
            sock = connect(srv)
            buffered = bytearray()
            answers = []
            for n in range(3):
                sock.sendall(request(f"uid-{n}"))
                answer = read_answer(sock, buffered)
                answer.check_review(f"uid-{n}")  # the closing answer too: whole and correct
                answers.append(answer)
            assert [a.closes for a in answers] == [False, False, True]
            assert not buffered
            assert closed_by_server(sock)
            sock.close()


def test_an_answer_closes_the_connection_after_its_age_bound(tmp_path: Path) -> None:
    """Requests every 0.1 s: answers keep the connection until it is 1 s old, then one closes
    it. Its age is measured from before the connection is made, so never less than the
    server's."""
    age = 1.0
    with running_server(fixture_cache(), tmp_path / "certs", connection_max_age=age) as srv:
        opened = time.monotonic()
        sock = connect(srv)
        buffered = bytearray()
        n = 0
        while True:
            uid = f"uid-{n}"
            sock.sendall(request(uid))
            answer = read_answer(sock, buffered)
            answer.check_review(uid)
            if answer.closes:
                break
            n += 1
            assert time.monotonic() - opened < STALL, "no answer closed the connection"
            time.sleep(0.1)
        assert time.monotonic() - opened >= age, "closed before its age bound"
        assert n >= 1  # the first answers kept it (on a machine so slow it is not: a stall)
        assert closed_by_server(sock)
        sock.close()


def test_the_serve_flag_bounds_the_running_process(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    make_certs(certs)
    with server_process(certs, "--connection-max-requests", "2") as proc:
        port = int(proc.url.rsplit(":", 1)[1])
        context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        raw = socket.create_connection(("127.0.0.1", port), timeout=STALL)
        sock = context.wrap_socket(raw, server_hostname="localhost")
        buffered = bytearray()
        closes = []
        for n in range(2):
            sock.sendall(request(f"uid-{n}"))
            answer = read_answer(sock, buffered)
            answer.check_review(f"uid-{n}", patched=False)  # no cluster: nothing to patch
            closes.append(answer.closes)
        assert closes == [False, True]
        assert closed_by_server(sock)
        sock.close()


def test_no_review_is_lost_to_the_bounds_under_concurrent_load(tmp_path: Path) -> None:
    """Clients that keep their connections, as the API server does, get every review
    answered while the server closes each connection every 5 requests."""
    failures: list[str] = []
    answered: list[int] = []

    def client(served: RunningServer, worker: int) -> None:
        with served.client() as http:
            for n in range(40):
                uid = f"w{worker}-{n}"
                try:
                    resp = http.post(POD_PATH, content=review_body(uid))
                    if resp.status_code != 200 or resp.json()["response"]["uid"] != uid:
                        failures.append(f"{uid}: {resp.status_code} {resp.text[:200]}")
                    else:
                        answered.append(1)
                except httpx.HTTPError as err:
                    failures.append(f"{uid}: {err!r}")

    with running_server(fixture_cache(), tmp_path / "certs", connection_max_requests=5) as srv:
        workers = [threading.Thread(target=client, args=(srv, w)) for w in range(4)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(timeout=120)
    assert not failures, failures
    assert len(answered) == 4 * 40


def test_zero_turns_the_bounds_off(tmp_path: Path) -> None:
    with running_server(
        fixture_cache(), tmp_path / "certs", connection_max_requests=0, connection_max_age=0
    ) as srv:
        sock = connect(srv)
        buffered = bytearray()
        for n in range(20):
            sock.sendall(request(f"uid-{n}"))
            answer = read_answer(sock, buffered)
            answer.check_review(f"uid-{n}")
            assert not answer.closes, n
        sock.close()


def test_the_server_imports_no_private_uvicorn_module() -> None:
    """uvicorn's `protocols` and underscored modules are its internals: a release may change
    them. The service uses `uvicorn.Config` and `uvicorn.Server` only."""
    private = []
    for source in sorted((REPO / "webhook").rglob("*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                parts = name.split(".")
                if parts[0] == "uvicorn" and any(
                    p == "protocols" or p.startswith("_") for p in parts[1:]
                ):
                    private.append(f"{source.relative_to(REPO)}: {name}")
    assert not private, private


def test_uvicorn_still_makes_its_protocol_as_the_server_does() -> None:
    """`servers.QuietServer.startup` makes uvicorn's protocol as uvicorn's own `startup` does:
    its `Config.http_protocol_class`, called with these names (`app_state` becomes each
    request's `scope["state"]`, the ASGI lifespan state, where `CloseWhenDue` finds the
    connection: the bounds tests above show it arrives). A uvicorn release that changes the
    call fails here, by name."""

    async def app(scope: object, receive: object, send: object) -> None:
        pass

    config = uvicorn.Config(app, http="httptools", lifespan="off", log_config=None)
    config.load()
    parameters = inspect.signature(config.http_protocol_class).parameters
    assert {"config", "server_state", "app_state", "_loop"} <= set(parameters), parameters

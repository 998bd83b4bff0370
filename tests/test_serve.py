"""`serve` as a platform engineer runs it: certificate rotation, probes, SIGTERM."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import os
import signal
import socket
import ssl
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from webhook.server.run import listen
from webhook.tls.certs import CertSpec, IssuedCerts, issue, write

from .harness import fixture, fixture_cache, make_certs, running_server, server_process
from .timing import STALL

REVIEW = fixture("pod-create-by-job-controller.mutate.json")
BODY = orjson.dumps(REVIEW)
PATH = "/mutate--v1-pod"


def fingerprint_of_file(cert_file: Path) -> str:
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    return hashlib.sha256(cert.public_bytes(Encoding.DER)).hexdigest()


def review_over_new_connection(port: int, ctx: ssl.SSLContext) -> tuple[int, bytes, str]:
    """One review on a fresh TLS connection: status, body, and the certificate it presented."""
    conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=10)
    try:
        conn.request("POST", PATH, body=BODY, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        assert conn.sock is not None
        der = conn.sock.getpeercert(binary_form=True)
        assert der is not None
        return response.status, response.read(), hashlib.sha256(der).hexdigest()
    finally:
        conn.close()


def trusting(*ca_files: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    for ca in ca_files:
        ctx.load_verify_locations(cafile=str(ca))
    return ctx


def test_certificate_rotation_without_failed_requests(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    old_ca = make_certs(certs)
    (tmp_path / "old-ca.crt").write_bytes(old_ca.read_bytes())
    old_print = fingerprint_of_file(certs / "tls.crt")
    new = issue(CertSpec())  # a new CA too: clients of the old one must not matter
    (tmp_path / "new-ca.crt").write_bytes(new.ca_cert_pem)
    ctx = trusting(tmp_path / "old-ca.crt", tmp_path / "new-ca.crt")

    with running_server(fixture_cache(), certs, cert_poll_seconds=0.05) as srv:
        port = int(srv.url.rsplit(":", 1)[1])
        # A keep-alive connection opened before the rotation keeps working after it.
        with httpx.Client(base_url=srv.url, verify=ctx) as kept:
            assert kept.post(PATH, content=BODY).status_code == 200

            seen: list[str] = []
            failures: list[str] = []
            stop = threading.Event()

            def hammer() -> None:
                while not stop.is_set():
                    try:
                        status, body, presented = review_over_new_connection(port, ctx)
                        doc = orjson.loads(body)
                        if status != 200 or doc["response"]["uid"] != REVIEW["request"]["uid"]:
                            failures.append(f"{status}: {body[:200]!r}")
                        seen.append(presented)
                    except Exception as err:  # any failed request fails the test
                        failures.append(repr(err))

            clients = [threading.Thread(target=hammer) for _ in range(2)]
            for t in clients:
                t.start()
            time.sleep(0.5)
            before = len(seen)
            write(new, certs)  # key first, then cert: a mismatched pair exists for a moment
            new_print = fingerprint_of_file(certs / "tls.crt")
            deadline = time.monotonic() + 10
            while new_print not in seen[before:] and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)
            stop.set()
            for t in clients:
                t.join()
            assert kept.post(PATH, content=BODY).status_code == 200

    assert not failures, failures[:5]
    assert before > 5 and seen[0] == old_print
    switched = seen.index(new_print)
    # New connections after the switch present the new certificate, and only that.
    assert set(seen[: switched - 2]) == {old_print}
    assert set(seen[switched + 2 :]) == {new_print}
    assert len(seen) - switched > 5


def test_a_mismatched_pair_is_not_served(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    ca = make_certs(certs)
    old_print = fingerprint_of_file(certs / "tls.crt")
    with running_server(fixture_cache(), certs, cert_poll_seconds=0.05) as srv:
        port = int(srv.url.rsplit(":", 1)[1])
        other = issue(CertSpec())
        (certs / "tls.key").write_bytes(other.key_pem)  # a key without its certificate
        time.sleep(0.5)
        status, _, presented = review_over_new_connection(port, trusting(ca))
        assert (status, presented) == (200, old_print)
        assert httpx.get(f"{srv.health_url}/readyz").status_code == 200


def test_readyz_waits_for_the_certificate(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    with server_process(certs, "--cert-poll-seconds", "0.1", wait=False) as proc:
        deadline = time.monotonic() + 20
        while True:
            try:
                health = httpx.get(f"{proc.health_url}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, proc.log_file.read_text()
                time.sleep(0.1)
        assert health.status_code == 200
        ready = httpx.get(f"{proc.health_url}/readyz")
        assert ready.status_code == 503
        assert ready.json()["failing"] == ["certificate"]
        ca = make_certs(certs)
        deadline = time.monotonic() + 10
        while httpx.get(f"{proc.health_url}/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        with httpx.Client(verify=trusting(ca)) as client:
            assert client.post(f"{proc.url}{PATH}", content=BODY).status_code == 200


def test_sigterm_finishes_in_flight_reviews_then_exits(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    ca = make_certs(certs)
    with server_process(certs) as proc:
        port = int(proc.url.rsplit(":", 1)[1])
        raw = socket.create_connection(("127.0.0.1", port))
        sock = trusting(ca).wrap_socket(raw, server_hostname="localhost")
        head = (
            f"POST {PATH} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(BODY)}\r\n\r\n"
        ).encode()
        sock.sendall(head + BODY[:100])  # a review in flight: half its body sent
        time.sleep(0.3)
        proc.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.process.poll() is None, "exited with a review in flight"
        deadline = time.monotonic() + STALL
        while (draining := httpx.get(f"{proc.health_url}/readyz")).status_code != 503:
            assert time.monotonic() < deadline, "still ready after SIGTERM"
            time.sleep(0.02)
        assert "not-stopping" in draining.json()["failing"]
        with pytest.raises((httpx.ConnectError, httpx.ReadError)):  # the listener closes
            while time.monotonic() < deadline:
                httpx.post(f"{proc.url}{PATH}", content=BODY, verify=trusting(ca), timeout=STALL)
                time.sleep(0.02)
        sock.sendall(BODY[100:])
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
        sock.close()
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
        body = orjson.loads(reply.split(b"\r\n\r\n", 1)[1])
        assert body["response"]["uid"] == REVIEW["request"]["uid"]
        assert proc.process.wait(timeout=20) == 0
        messages = [line["msg"] for line in proc.log_lines()]
        assert "closing the listener: finishing in-flight reviews" in messages
        assert messages[-1] == "stopped"


def test_slow_headers_get_408_and_others_are_served(tmp_path: Path) -> None:
    """Slowloris: a connection that sends nothing, or headers a byte at a time, is cut off."""
    certs = tmp_path / "certs"
    ca = make_certs(certs)
    with server_process(certs, "--header-timeout", "0.5") as proc:
        port = int(proc.url.rsplit(":", 1)[1])
        ctx = trusting(ca)
        silent = ctx.wrap_socket(
            socket.create_connection(("127.0.0.1", port)), server_hostname="localhost"
        )
        trickle = ctx.wrap_socket(
            socket.create_connection(("127.0.0.1", port)), server_hostname="localhost"
        )
        for byte in f"POST {PATH} HTTP/1.1\r\nHost: localhost\r\n"[:12]:
            trickle.sendall(byte.encode())
            time.sleep(0.02)
        status, _, _ = review_over_new_connection(port, ctx)  # others are served meanwhile
        assert status == 200
        for sock in (silent, trickle):
            sock.settimeout(STALL)  # the 0.5 s deadline, or the connection would stay
            reply = sock.recv(4096)
            assert reply.startswith(b"HTTP/1.1 408"), reply
            assert sock.recv(4096) == b""  # closed
            sock.close()


def test_shutdown_delay_keeps_serving_while_not_ready(tmp_path: Path) -> None:
    """With --shutdown-delay, SIGTERM first only turns /readyz false (so Kubernetes can take the
    pod out of the Service's endpoints) while reviews are still served; then the process exits."""
    certs = tmp_path / "certs"
    ca = make_certs(certs)
    # 3 s: ten times what turning not ready and one review take on a loaded machine.
    with server_process(certs, "--shutdown-delay", "3") as proc:
        proc.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STALL
        while httpx.get(f"{proc.health_url}/readyz").status_code != 503:
            assert time.monotonic() < deadline, "still ready after SIGTERM"
            time.sleep(0.02)
        with httpx.Client(verify=trusting(ca)) as client:
            assert client.post(f"{proc.url}{PATH}", content=BODY).status_code == 200
        assert proc.process.wait(timeout=20) == 0


def test_a_port_in_use_is_a_clean_error(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    make_certs(certs)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with server_process(certs, "--port", str(port), wait=False) as proc:
            assert proc.process.wait(timeout=20) == 2
        text = proc.log_file.read_text()
        assert f"error: cannot listen on 127.0.0.1:{port}" in text
        assert "Traceback" not in text


def mount_like_kubelet(root: Path, issued: IssuedCerts, version: str) -> None:
    """The pair laid out as the kubelet mounts a Secret: `tls.crt -> ..data/tls.crt`, with
    `..data` a symlink to a timestamped directory, swapped atomically on every update."""
    data = root / f"..{version}"
    data.mkdir(parents=True)
    (data / "tls.crt").write_bytes(issued.cert_pem)
    (data / "tls.key").write_bytes(issued.key_pem)
    staged = root / "..data_tmp"
    staged.symlink_to(data.name)
    os.replace(staged, root / "..data")
    for name in ("tls.crt", "tls.key"):
        if not (root / name).is_symlink():
            (root / name).symlink_to(f"..data/{name}")


def test_rotation_of_a_kubelet_mounted_secret_in_the_real_process(tmp_path: Path) -> None:
    """The production loop (uvloop, `python -m webhook serve`) and the production file layout."""
    certs = tmp_path / "secret"
    old, new = issue(CertSpec()), issue(CertSpec())
    for i, pair in enumerate((old, new)):
        (tmp_path / f"ca-{i}.crt").write_bytes(pair.ca_cert_pem)
    ctx = trusting(tmp_path / "ca-0.crt", tmp_path / "ca-1.crt")
    mount_like_kubelet(certs, old, "2026_11_29_10_00_00.1")
    prints = [hashlib.sha256(_der(p.cert_pem)).hexdigest() for p in (old, new)]
    with server_process(certs, "--cert-poll-seconds", "0.1") as proc:
        port = int(proc.url.rsplit(":", 1)[1])
        seen: list[str] = []
        for _ in range(20):
            status, _, presented = review_over_new_connection(port, ctx)
            assert status == 200
            seen.append(presented)
        mount_like_kubelet(certs, new, "2026_11_29_11_00_00.2")
        deadline = time.monotonic() + 10
        while prints[1] not in seen[-5:]:
            assert time.monotonic() < deadline, "the new certificate was never served"
            status, _, presented = review_over_new_connection(port, ctx)
            assert status == 200
            seen.append(presented)
        for _ in range(20):
            status, _, presented = review_over_new_connection(port, ctx)
            assert (status, presented) == (200, prints[1])
    assert set(seen[:20]) == {prints[0]}


def _der(pem: bytes) -> bytes:
    return x509.load_pem_x509_certificate(pem).public_bytes(Encoding.DER)


def test_served_connections_have_nagle_off() -> None:
    """The listener is made so that asyncio sets TCP_NODELAY on each connection; with Nagle on,
    an answer written as headers + body waits for a delayed ACK: 40 ms a review."""
    listener = listen("127.0.0.1", 0)
    nodelay: list[int] = []

    class Record(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            nodelay.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Record, sock=listener)
        port = listener.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        while not nodelay:
            await asyncio.sleep(0.01)
        writer.close()
        server.close()

    asyncio.run(main())
    assert nodelay == [1]

"""The service with exactly the chart's RBAC: `python -m webhook serve` with the rendered
Deployment's flags and its ServiceAccount's token, against the API emulator enforcing the
rendered ClusterRoles, Roles and bindings (tests/kube_rbac.py), through what a cluster does to
it: certificate creation and caBundle injection, leader election, a Node watched for
feasibility, TrainJobs created, drifted, suspended, resumed, finished and deleted, a gang of
gangs made and repaired, every other backend's PodGroup made, repaired and removed, a damaged
certificate Secret, scrapes by an allowed, a foreign and an anonymous client, the `helm test`
scripts and the pre-delete hook. Nothing the service, the scraper or the hook does is refused,
and every rule and every verb of the chart's RBAC is needed: without any one of them, a request
the run made would have been refused."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import copy
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import kmock
import pytest
import yaml
from cryptography import x509

from tests.chart import BASE, NAMESPACE, Json, Rendered, render
from tests.harness import OnLoop, ServerProcess, fixture, server_process
from tests.kube_emulator import (
    CLUSTER_RUNTIMES,
    COMPOSITE_POD_GROUPS,
    LEASES,
    MUTATING_CONFIGS,
    NODES,
    POD_GROUPS,
    SECRETS,
    TRAINJOBS,
    VALIDATING_CONFIGS,
    WORKLOADS,
    create,
    delete,
    get,
    json_patch,
    patch,
    recreate,
    replace,
)
from tests.kube_rbac import RBAC, Attributes, RbacEmulator, rbac_emulator, service_account
from tests.nodes import node
from tests.test_metrics_serve import cluster_runtime, trainjob
from tests.test_trees import zone_block_rack
from webhook.backends.base import Kind
from webhook.backends.registry import all_backends
from webhook.core.plan import JOBSET_NAME
from webhook.core.snapshot import SNAPSHOT_ANNOTATION

T = TypeVar("T")

SERVICE = service_account(NAMESPACE, BASE)
CLEANUP = service_account(NAMESPACE, f"{BASE}-cleanup")
PROMETHEUS = service_account("monitoring", "prometheus")
INTRUDER = service_account("team-a", "intruder")
TOKENS = {
    "service-token": SERVICE,
    "cleanup-token": CLEANUP,
    "prometheus-token": PROMETHEUS,
    "intruder-token": INTRUDER,
}
SECRET = f"{BASE}-cert"
HOST = f"{BASE}.{NAMESPACE}.svc"
VALUES = {
    "metricsReader": {
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}]
    }
}
# Short periods, so leadership, renewals and retries happen within seconds.
FAST = ("--lease-duration=2", "--renew-deadline=1.5", "--retry-period=0.2", "--shutdown-delay=0")
# The Service's DNS name resolves to this machine, as cluster DNS resolves it to the pods.
RESOLVE_SVC = (
    "import socket\n"
    "_resolve = socket.getaddrinfo\n"
    "socket.getaddrinfo = lambda host, *a, **k: _resolve("
    "'127.0.0.1' if str(host).endswith('.svc') else host, *a, **k)\n"
)


@dataclass
class Cluster(OnLoop):
    k: RbacEmulator
    url: str
    loop: asyncio.AbstractEventLoop

    def get(self, resource: Any, namespace: str | None, name: str) -> Json | None:
        return self.run(get(self.k, resource, namespace, name))

    def eventually(
        self, check: Callable[[], T | None], what: str, served: ServerProcess, timeout: float = 15.0
    ) -> T:
        """`check()`'s first truthy result; fails at once if the service was refused anything."""
        deadline = time.monotonic() + timeout
        while True:
            result = check()
            if result:
                return result
            assert served.process.poll() is None, f"serve exited\n{_tail(served)}"
            denied = self.call(lambda: self.k.denials(SERVICE.name))
            assert not denied, f"the service was refused: {[str(d.attributes) for d in denied]}"
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout}s: {what}\n{_tail(served)}")
            time.sleep(0.05)

    def scheduling_objects(self) -> list[Json]:
        """The Workloads and PodGroups stored now."""
        return self.call(
            lambda: [
                copy.deepcopy(o.raw)
                for key, o in self.k.objects.items()
                if key[0] in (WORKLOADS, POD_GROUPS) and not o.deleted
            ]
        )


def _tail(served: ServerProcess) -> str:
    return served.log_file.read_text(errors="replace")[-3000:]


@contextlib.contextmanager
def cluster(rbac: RBAC) -> Iterator[Cluster]:
    """The RBAC-enforcing emulator on its own event loop in a thread."""
    ready: concurrent.futures.Future[tuple[Cluster, asyncio.Event]] = concurrent.futures.Future()

    async def main() -> None:
        stop = asyncio.Event()
        async with rbac_emulator(rbac, TOKENS, "admin-token") as (k, url):
            ready.set_result((Cluster(k, url, asyncio.get_running_loop()), stop))
            await stop.wait()

    def target() -> None:
        try:
            asyncio.run(main())
        except BaseException as err:
            if not ready.done():
                ready.set_exception(err)

    thread = threading.Thread(target=target, name="rbac-emulator", daemon=True)
    thread.start()
    found, stop = ready.result(timeout=10)
    try:
        yield found
    finally:
        found.loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=10)


def kubeconfig(url: str, token: str) -> str:
    """A kubeconfig as a ServiceAccount's token gives one (plain HTTP: the emulator)."""
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "emulator", "user": "sa"}}],
    })  # fmt: skip


def serve_args(rendered: Rendered, config: Path) -> list[str]:
    """The Deployment's flags as rendered, but the ports (the harness picks free ones)."""
    ports = ("--port=", "--metrics-port=", "--health-port=")
    args = [a for a in rendered.args if not a.startswith(ports)]
    return [*args, f"--kubeconfig={config}", *FAST]


@contextlib.contextmanager
def service(
    tmp_path: Path, rendered: Rendered, api: Cluster, wait: bool
) -> Iterator[ServerProcess]:
    config = tmp_path / "kubeconfig"
    config.write_text(kubeconfig(api.url, "service-token"))
    cert_dir = tmp_path / "unused-certs"  # self-managed: the pair comes from the Secret
    cert_dir.mkdir()
    with server_process(cert_dir, *serve_args(rendered, config), wait=wait) as proc:
        yield proc


def install(api: Cluster, rendered: Rendered) -> None:
    """What `helm install` creates that the service reads: both webhook configurations."""
    api.run(create(api.k, MUTATING_CONFIGS, rendered.one("MutatingWebhookConfiguration")))
    api.run(create(api.k, VALIDATING_CONFIGS, rendered.one("ValidatingWebhookConfiguration")))


def bundle(api: Cluster) -> bytes:
    secret = api.get(SECRETS, NAMESPACE, SECRET)
    assert secret is not None and secret["type"] == "kubernetes.io/tls"
    return base64.b64decode(secret["data"]["ca.crt"])


def injected(api: Cluster) -> bool:
    """Every webhook of both configurations carries the Secret's CA bundle."""
    secret = api.get(SECRETS, NAMESPACE, SECRET)
    if secret is None:
        return False
    ca = secret["data"]["ca.crt"]
    for resource in (MUTATING_CONFIGS, VALIDATING_CONFIGS):
        config = api.get(resource, None, BASE)
        assert config is not None
        if any(h["clientConfig"].get("caBundle") != ca for h in config["webhooks"]):
            return False
    return True


def run_script(
    rendered: Rendered, pod_name: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """A rendered test or hook pod's `python -c` script, as the pod would run it."""
    pods = [p["spec"] for p in rendered.kinds("Pod") if p["metadata"]["name"] == pod_name]
    pods += [
        j["spec"]["template"]["spec"]
        for j in rendered.kinds("Job")
        if j["metadata"]["name"] == pod_name
    ]
    (pod,) = pods
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-c"]
    given = {e["name"]: e["value"] for e in container.get("env", [])}
    script = RESOLVE_SVC + container["args"][0]
    return subprocess.run(
        [sys.executable, "-c", script], env={**given, **env}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def scrape(served: ServerProcess, ca: Path, token: str | None) -> httpx.Response:
    """GET /metrics over TLS, verifying the certificate for the Service's name."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    port = served.metrics_url.rsplit(":", 1)[1]
    context = ssl.create_default_context(cafile=str(ca))
    with httpx.Client(verify=context, timeout=10) as client:
        return client.get(f"https://127.0.0.1:{port}/metrics", headers=headers,
                          extensions={"sni_hostname": HOST})  # fmt: skip


def needed(attrs: list[Attributes], rbac: RBAC) -> bool:
    """Whether `rbac` would refuse at least one of the requests the run made."""
    return any(not rbac.decide(a).allowed for a in attrs)


@pytest.fixture(scope="module")
def rendered() -> Rendered:
    return render(VALUES)


SNAPSHOT_GUARD = "/validate-trainer-kubeflow-org-v1alpha1-trainjob-snapshot"


def test_the_service_runs_on_the_charts_rbac_alone(tmp_path: Path, rendered: Rendered) -> None:
    rbac = RBAC.of(rendered.objects)  # release and hook objects, as during `helm uninstall`
    with cluster(rbac) as api:
        install(api, rendered)
        with service(tmp_path, rendered, api, wait=True) as served:
            # Ready: the Secret made, its CA injected into every webhook of both configurations.
            assert injected(api)
            ca_file = tmp_path / "ca.crt"
            ca_file.write_bytes(bundle(api))

            def holder() -> str | None:
                lease = api.get(LEASES, NAMESPACE, BASE) or {}
                found: str | None = lease.get("spec", {}).get("holderIdentity")
                return found

            assert api.eventually(holder, "a leader", served)
            # A Node: listed and watched for feasibility (the metrics below count it).
            api.run(create(api.k, NODES, node("gpu-0", gpus=8)))

            # A TrainJob: Workload and PodGroup (ownerReferences with blockOwnerDeletion), the
            # runtime snapshot, Events.
            api.run(create(api.k, CLUSTER_RUNTIMES, cluster_runtime()))
            job = trainjob()
            ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
            api.run(create(api.k, TRAINJOBS, job))

            def gang() -> list[Json] | None:
                found = api.scheduling_objects()
                return found if len(found) == 2 else None

            objects = api.eventually(gang, "the Workload and its PodGroup", served)
            group = next(o for o in objects if o["kind"] == "PodGroup")
            assert group["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True

            # Drift: the minCounts put back in place (patches of both kinds).
            wanted = group["spec"]["schedulingPolicy"]["gang"]["minCount"]
            pg = group["metadata"]["name"]
            workload = next(o for o in objects if o["kind"] == "Workload")["metadata"]["name"]
            drifted = {"spec": {"schedulingPolicy": {"gang": {"minCount": wanted + 1}}}}
            api.run(patch(api.k, POD_GROUPS, ns, pg, drifted))
            path = "/spec/podGroupTemplates/0/schedulingPolicy/gang/minCount"
            op = {"op": "replace", "path": path, "value": wanted + 1}
            api.run(json_patch(api.k, WORKLOADS, ns, workload, [op]))

            def restored() -> bool:
                group = api.get(POD_GROUPS, ns, pg) or {}
                load = api.get(WORKLOADS, ns, workload) or {}
                counts = [
                    group.get("spec", {}).get("schedulingPolicy", {}).get("gang", {}),
                    (load.get("spec", {}).get("podGroupTemplates") or [{}])[0]
                    .get("schedulingPolicy", {})
                    .get("gang", {}),
                ]
                return [c.get("minCount") for c in counts] == [wanted, wanted]

            api.eventually(restored, "minCount patched back", served)

            # Suspend, resume, finish: deleted, created again, deleted.
            api.run(patch(api.k, TRAINJOBS, ns, name, {"spec": {"suspend": True}}))
            api.eventually(lambda: not api.scheduling_objects(), "deleted on suspend", served)
            api.run(patch(api.k, TRAINJOBS, ns, name, {"spec": {"suspend": False}}))
            api.eventually(gang, "created again on resume", served)
            finished = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
            api.run(patch(api.k, TRAINJOBS, ns, name, finished))
            api.eventually(lambda: not api.scheduling_objects(), "released when finished", served)
            api.run(delete(api.k, TRAINJOBS, ns, name))

            # A gang of gangs: CompositePodGroups made, a changed one made again (immutable).
            api.run(
                create(api.k, CLUSTER_RUNTIMES, zone_block_rack() | {"metadata": {"name": "tree"}})
            )
            tree = trainjob()
            tree["metadata"]["name"] = "tree-job"
            tree["spec"] = {"runtimeRef": {"name": "tree"}, "trainer": {"numNodes": 4}}
            api.run(create(api.k, TRAINJOBS, tree))

            def composites() -> list[Json] | None:
                found = api.call(lambda: [
                    copy.deepcopy(o.raw) for key, o in api.k.objects.items()
                    if key[0] == COMPOSITE_POD_GROUPS and not o.deleted
                ])  # fmt: skip
                return found if len(found) == 2 else None

            block = api.eventually(composites, "the tree's two CompositePodGroups", served)[1]
            # Someone replaces it with another constraint (the API server refuses to change
            # it in place).
            changed = copy.deepcopy(block)
            changed["spec"]["schedulingConstraints"] = {"topology": [{"key": "other"}]}
            replaced = api.run(recreate(api.k, COMPOSITE_POD_GROUPS, changed))
            earlier = (None, block["metadata"]["uid"], replaced["metadata"]["uid"])

            def remade() -> bool:
                now = api.get(COMPOSITE_POD_GROUPS, ns, block["metadata"]["name"]) or {}
                uid = now.get("metadata", {}).get("uid")
                return uid not in earlier and now["spec"] == block["spec"]

            api.eventually(remade, "the changed CompositePodGroup made again", served)
            api.run(delete(api.k, TRAINJOBS, ns, "tree-job"))

            # Every other backend the chart runs: its PodGroup made, repaired, and removed on
            # suspend, for a TrainJob whose pods name its scheduler.
            for backend in all_backends():
                if backend.name != "native":
                    other_backend(api, served, backend.name, backend.kinds[0], ns)

            # A damaged Secret is made whole again (update), and the new CA injected.
            secret = api.get(SECRETS, NAMESPACE, SECRET)
            assert secret is not None
            damaged = {
                **secret,
                "data": {**secret["data"], "tls.crt": base64.b64encode(b"x").decode()},
            }
            api.run(replace(api.k, SECRETS, damaged))

            def repaired() -> bool:
                now = api.get(SECRETS, NAMESPACE, SECRET) or {}
                data = now.get("data", {})
                try:
                    x509.load_pem_x509_certificate(base64.b64decode(data.get("tls.crt", "")))
                except ValueError:
                    return False
                return injected(api)

            api.eventually(repaired, "the Secret repaired and its CA injected", served)
            ca_file.write_bytes(bundle(api))

            # Scrapers: the bound one reads, another is refused (403), nobody gets 401.
            allowed = scrape(served, ca_file, "prometheus-token")
            assert allowed.status_code == 200, allowed.text
            assert "controller_runtime_reconcile_total" in allowed.text
            assert "trainjob_scheduling_feasibility_nodes 1.0" in allowed.text
            assert scrape(served, ca_file, "intruder-token").status_code == 403
            assert scrape(served, ca_file, None).status_code == 401

            # A JobSet pod whose TrainJob the cache lacks: the API server is asked (get) and,
            # with no TrainJob of that name, the pod passes untouched.
            webhook_port = served.url.rsplit(":", 1)[1]
            plain = fixture("pod-create-by-job-controller.mutate.json")
            plain["request"]["object"]["metadata"]["labels"][JOBSET_NAME] = "plain-jobset"
            context = ssl.create_default_context(cafile=str(ca_file))
            with httpx.Client(verify=context, timeout=10) as client:
                url = f"https://127.0.0.1:{webhook_port}/mutate--v1-pod"
                answer = client.post(url, json=plain, extensions={"sni_hostname": HOST}).json()
            assert answer["response"]["allowed"] is True and "patch" not in answer["response"]
            # A TrainJob created with a snapshot the service did not freeze: before denying it,
            # the snapshot check reads the runtime it names (get), in case the replica that
            # froze it saw a version this one has not yet.
            for kind in ("ClusterTrainingRuntime", "TrainingRuntime"):
                forged = fixture("trainjob-create.validate.json")
                obj = forged["request"]["object"]
                obj["spec"]["runtimeRef"]["kind"] = kind
                obj["metadata"].setdefault("annotations", {})[SNAPSHOT_ANNOTATION] = "{}"
                with httpx.Client(verify=context, timeout=10) as client:
                    url = f"https://127.0.0.1:{webhook_port}{SNAPSHOT_GUARD}"
                    answer = client.post(url, json=forged, extensions={"sni_hostname": HOST})
                response = answer.json()["response"]
                assert response["allowed"] is False and response["status"]["code"] == 403

            # The `helm test` pods' scripts, against the Service's name.
            env = {"CA_FILE": str(ca_file), "WEBHOOK_URL": f"https://{HOST}:{webhook_port}"}
            done = run_script(rendered, f"{BASE}-test-webhook", env)
            assert done.returncode == 0 and "denied as expected" in done.stdout, (
                done.stdout + done.stderr
            )
            env = {
                "CA_FILE": str(ca_file),
                "METRICS_URL": f"https://{HOST}:{served.metrics_url.rsplit(':', 1)[1]}",
            }
            done = run_script(rendered, f"{BASE}-test-metrics", env)
            assert done.returncode == 0 and "(401)" in done.stdout, done.stdout + done.stderr

            # The pre-delete hook, with its own account: both configurations go, and the
            # service, still running, leaves them gone.
            hook_env = {
                "API_SERVER": api.url,
                "TOKEN_FILE": str(_token(tmp_path, "intruder-token")),
            }
            refused = run_script(rendered, f"{BASE}-cleanup", hook_env)
            assert refused.returncode == 1 and "HTTP 403" in refused.stderr, refused.stderr
            hook_env["TOKEN_FILE"] = str(_token(tmp_path, "cleanup-token"))
            for _ in range(2):  # the second run finds nothing left, and succeeds
                done = run_script(rendered, f"{BASE}-cleanup", hook_env)
                assert done.returncode == 0, done.stdout + done.stderr
            assert "already gone" in done.stdout
            assert api.get(MUTATING_CONFIGS, None, BASE) is None
            assert api.get(VALIDATING_CONFIGS, None, BASE) is None
        # serve has stopped (SIGTERM): the leader released its Lease on the way out.
        released = api.get(LEASES, NAMESPACE, BASE)
        assert released is not None and not released["spec"].get("holderIdentity")

        denials = api.call(lambda: list(api.k.decisions))
        for user in (SERVICE, CLEANUP, PROMETHEUS):
            refused_for = [
                str(d.attributes) for d in denials if not d.allowed and d.attributes.user == user
            ]
            assert not refused_for, (user.name, refused_for)
        assert [d for d in denials if not d.allowed and d.attributes.user == INTRUDER]

        # Every rule, and every verb of every rule, was needed by a request of this run.
        granted = [d.attributes for d in denials if d.allowed]
        _assert_every_rule_and_verb_needed(rendered, granted)


SCHEDULER_OF = {"coscheduling": "scheduler-plugins-scheduler", "volcano": "volcano",
                "kai": "kai-scheduler"}  # fmt: skip


def other_backend(api: Cluster, served: ServerProcess, name: str, kind: Kind, ns: str) -> None:
    rt = cluster_runtime()
    rt["metadata"]["name"] = f"rt-{name}"
    for rj in rt["spec"]["template"]["spec"]["replicatedJobs"]:
        rj["template"]["spec"]["template"]["spec"]["schedulerName"] = SCHEDULER_OF[name]
    api.run(create(api.k, CLUSTER_RUNTIMES, rt))
    job = trainjob()
    job["metadata"]["name"] = f"job-{name}"
    job["spec"]["runtimeRef"] = {"name": f"rt-{name}", "kind": "ClusterTrainingRuntime"}
    api.run(create(api.k, TRAINJOBS, job))
    resource = kmock.resource(kind.group, kind.version, kind.plural)

    def made() -> list[Json]:
        return api.call(lambda: [
            copy.deepcopy(o.raw) for key, o in api.k.objects.items()
            if key[0] == resource and not o.deleted
        ])  # fmt: skip

    (group,) = api.eventually(made, f"the {name} PodGroup", served)
    wanted = group["spec"]["minMember"]
    pg = group["metadata"]["name"]
    api.run(patch(api.k, resource, ns, pg, {"spec": {"minMember": wanted + 1}}))
    api.eventually(
        lambda: (api.get(resource, ns, pg) or {}).get("spec", {}).get("minMember") == wanted,
        f"the {name} PodGroup's minMember patched back",
        served,
    )
    api.run(patch(api.k, TRAINJOBS, ns, job["metadata"]["name"], {"spec": {"suspend": True}}))
    api.eventually(lambda: not made(), f"the {name} PodGroup deleted on suspend", served)
    api.run(delete(api.k, TRAINJOBS, ns, job["metadata"]["name"]))


def _token(tmp_path: Path, token: str) -> Path:
    path = tmp_path / f"{token}.txt"
    path.write_text(token)
    return path


def _roles(rendered: Rendered) -> list[tuple[str, str, str, Json]]:
    """(kind, namespace, name, object) of the chart's ClusterRoles and Roles."""
    found = []
    for o in rendered.objects:
        if o["kind"] in ("ClusterRole", "Role"):
            ns = o["metadata"].get("namespace", "") if o["kind"] == "Role" else ""
            found.append((o["kind"], ns, o["metadata"]["name"], o))
    return found


# The emulator serves neither JobSets nor Jobs (it stops growing): the JobSet watch and the
# waking of held Jobs use these rules on a real API server, in `make e2e` (tests/e2e).
EXERCISED_ON_A_REAL_SERVER = frozenset({"jobsets", "jobs"})


def _assert_every_rule_and_verb_needed(rendered: Rendered, everything: list[Attributes]) -> None:
    """Replays every allowed request of the run against the chart's RBAC less one rule, then
    less one verb of one resource: each removal must refuse at least one of them."""
    rbac = RBAC.of(rendered.objects)
    assert all(rbac.decide(a).allowed for a in everything)
    unneeded: list[str] = []
    checked = 0
    for kind, ns, name, role in _roles(rendered):
        for index, rule in enumerate(role["rules"]):
            if set(rule.get("resources") or ()) <= EXERCISED_ON_A_REAL_SERVER:
                continue
            source = rbac.sources(kind, ns, name)[index]
            if not needed(everything, rbac.without(source)):
                unneeded.append(source)
            # Each verb of each resource on its own (a rule may name several resources).
            for resource in rule.get("resources") or rule.get("nonResourceURLs"):
                for verb in rule["verbs"]:
                    objects = [copy.deepcopy(o) for o in rendered.objects]
                    target = next(
                        o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name
                    )
                    target["rules"][index : index + 1] = _split(rule, resource, verb)
                    if not needed(everything, RBAC.of(objects)):
                        unneeded.append(f"{source}: {verb} {resource}")
                    checked += 1
    assert checked >= 25, checked
    assert not unneeded, f"granted but never used: {unneeded}"


def _split(rule: Json, resource: str, verb: str) -> list[Json]:
    """`rule` as one rule per resource, with `verb` taken from `resource` alone."""
    key = "resources" if "resources" in rule else "nonResourceURLs"
    split = []
    for each in rule[key]:
        verbs = [v for v in rule["verbs"] if not (each == resource and v == verb)]
        if verbs:
            split.append({**rule, key: [each], "verbs": verbs})
    return split


def test_a_missing_rule_is_refused_and_the_service_says_which(
    tmp_path: Path, rendered: Rendered
) -> None:
    """The same start with one rule less (Secrets create): the emulator answers 403, the service
    logs the rule it needs and stays not ready."""
    objects = copy.deepcopy(list(rendered.objects))
    role = next(o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == BASE)
    role["rules"] = [
        r for r in role["rules"] if not (r["resources"] == ["secrets"] and r["verbs"] == ["create"])
    ]
    with cluster(RBAC.of(objects)) as api:
        install(api, rendered)
        with service(tmp_path, rendered, api, wait=False) as served:

            def refused() -> list[str]:
                return api.call(lambda: [str(d.attributes) for d in api.k.denials(SERVICE.name)])

            deadline = threading.Event()
            for _ in range(200):
                if refused():
                    break
                deadline.wait(0.05)
            # The one request the missing rule allowed, refused (again on each retry).
            assert set(refused()) == {f"create secrets in {NAMESPACE}"}, refused()
            # The service logs the refusal just after the emulator counts it: wait for the line.
            forbidden: list[Json] = []
            for _ in range(200):
                lines = served.log_lines()
                forbidden = [line for line in lines if "forbidden to create" in line["msg"]]
                if forbidden:
                    break
                deadline.wait(0.05)
            assert forbidden and "verbs: [create]" in forbidden[0]["rbac"], _tail(served)
            assert httpx.get(f"{served.health_url}/readyz", timeout=5).status_code == 503

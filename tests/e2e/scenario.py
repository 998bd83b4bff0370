"""The end-to-end scenario's moving parts: the service under test (a `python -m webhook serve`
subprocess, or one deployed in the cluster) and the reads and waits the tests are written in."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from tests.harness import ServerProcess, make_certs, server_process
from webhook.core.plan import Plan

from .cluster import (
    EVENTS_GROUP,
    EVENTS_VERSION,
    SCHEDULING_GROUP,
    SCHEDULING_VERSION,
    TRAINER_GROUP,
    TRAINER_VERSION,
    Cluster,
    Json,
    NotYet,
    poll,
    timeout,
)

T = TypeVar("T")
LOG_LINES = 40  # of the service's log, shown when a wait fails


class Service:
    """The service under test, as far as the tests can see it."""

    def describe(self) -> str:
        return ""

    def check_running(self) -> None:
        """Fails the test at once when the service has died (rather than at a deadline)."""


class ExternalService(Service):
    def describe(self) -> str:
        return (
            "(the service is deployed in the cluster, E2E_EXTERNAL_SERVICE=1: see its pod's log; "
            "it must watch this namespace)"
        )


@dataclass
class LocalService(Service):
    """`python -m webhook serve` in a subprocess, reconciling the test namespace only. No
    webhook configuration is registered with the API server, so only the reconciler is tested."""

    process: ServerProcess

    def log_tail(self, lines: int = LOG_LINES) -> str:
        try:
            text = self.process.log_file.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip("\n").split("\n")[-lines:])

    def describe(self) -> str:
        return f"service log ({self.process.log_file}), last lines:\n{self.log_tail()}"

    def check_running(self) -> None:
        code = self.process.process.poll()
        if code is not None:
            raise AssertionError(f"the service exited with code {code}\n{self.describe()}")


@contextlib.contextmanager
def local_service(workdir: Path, kubeconfig: str, namespace: str) -> Iterator[LocalService]:
    """Starts the service with dev certificates and free ports (tests.harness), pointed at the
    cluster, leader election and metrics authentication off, watching `namespace` only (so it
    never touches other TrainJobs on a shared cluster)."""
    cert_dir = workdir / "certs"
    cert_dir.mkdir(parents=True, exist_ok=True)
    make_certs(cert_dir)
    args = [
        "--kubeconfig", kubeconfig,
        "--namespace", namespace,
        "--watch-namespaces", namespace,
        "--metrics-auth=false",
        "--leader-elect=false",
    ]  # fmt: skip
    try:
        with server_process(cert_dir, *args) as process:
            yield LocalService(process)
    except TimeoutError as err:  # /readyz never turned 200: show why
        logs = sorted(workdir.glob("serve-*.log"))
        text = logs[-1].read_text(errors="replace") if logs else "(no log)"
        tail = "\n".join(text.rstrip("\n").split("\n")[-LOG_LINES:])
        raise AssertionError(f"the service did not become ready: {err}\n{tail}") from None


@dataclass
class Scenario:
    """The test namespace, the ClusterTrainingRuntime (as stored) and the service."""

    cluster: Cluster
    namespace: str
    runtime: Json
    service: Service
    trainjobs: list[str] = field(default_factory=list)

    # --- reads --------------------------------------------------------------------------------

    def trainjob(self, name: str) -> Json | None:
        return self.cluster.get(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", name, self.namespace)

    def workload(self, name: str) -> Json | None:
        return self.cluster.get(
            SCHEDULING_GROUP, SCHEDULING_VERSION, "workloads", name, self.namespace
        )

    def pod_group(self, name: str) -> Json | None:
        return self.cluster.get(
            SCHEDULING_GROUP, SCHEDULING_VERSION, "podgroups", name, self.namespace
        )

    def events(self) -> list[Json]:
        return self.cluster.list(EVENTS_GROUP, EVENTS_VERSION, "events", self.namespace)

    # --- writes -------------------------------------------------------------------------------

    def create_trainjob(self, body: Json) -> Json:
        self.trainjobs.append(body["metadata"]["name"])
        return self.cluster.create(
            TRAINER_GROUP, TRAINER_VERSION, "trainjobs", body, self.namespace
        )

    def set_suspend(self, name: str, suspend: bool) -> Json:
        """`spec.suspend` by merge patch, as `kubectl patch --type=merge` (Kueue does the same)."""
        return self.cluster.merge_patch(
            TRAINER_GROUP, TRAINER_VERSION, "trainjobs", self.namespace, name,
            {"spec": {"suspend": suspend}},
        )  # fmt: skip

    def delete_trainjob(self, name: str) -> bool:
        return self.cluster.delete(
            TRAINER_GROUP, TRAINER_VERSION, "trainjobs", name, self.namespace
        )

    # --- waiting ------------------------------------------------------------------------------

    def wait(self, check: Callable[[], T | None], what: str, seconds: float | None = None) -> T:
        def checked() -> T | None:
            self.service.check_running()
            return check()

        return poll(checked, what, timeout() if seconds is None else seconds,
                    describe=self.service.describe)  # fmt: skip

    def converged(
        self, name: str, plan: Plan, *, not_uids: frozenset[str] = frozenset()
    ) -> tuple[Json, Json, list[Json]]:
        """Waits until the TrainJob's Workload and every PodGroup of `plan` exist, live (no
        deletionTimestamp), with the planned minCount, and none has a uid in `not_uids` (the
        objects of before a suspend may linger while they are being deleted)."""

        def live(obj: Json | None, what: str) -> Json:
            if obj is None:
                raise NotYet(f"no {what}")
            meta = obj["metadata"]
            if meta.get("deletionTimestamp"):
                raise NotYet(f"{what} is being deleted (finalizers {meta.get('finalizers')})")
            if meta["uid"] in not_uids:
                raise NotYet(f"{what} is still the old object (uid {meta['uid']})")
            return obj

        def check() -> tuple[Json, Json, list[Json]]:
            trainjob = self.trainjob(name)
            if trainjob is None:
                raise NotYet(f"no TrainJob {name}")
            workload = live(self.workload(plan.workload_name), f"Workload {plan.workload_name}")
            groups = []
            for group in plan.groups:
                what = f"PodGroup {group.pod_group_name}"
                pod_group = live(self.pod_group(group.pod_group_name), what)
                gang = pod_group["spec"].get("schedulingPolicy", {}).get("gang") or {}
                if gang.get("minCount") != group.min_count:
                    raise NotYet(f"{what} has gang {gang}, not minCount {group.min_count}")
                groups.append(pod_group)
            return trainjob, workload, groups

        return self.wait(check, f"TrainJob {self.namespace}/{name}: its Workload and PodGroups")

    def gone(self, plan: Plan, why: str, seconds: float | None = None, stable: float = 3.0) -> None:
        """Waits until the Workload and PodGroups of `plan` are gone or being deleted (a
        deletionTimestamp: the delete was issued; finalizers of other controllers may keep
        the object a while), and stay so for `stable` seconds: an object made again (say by a
        reconciler whose cache still holds a deleted TrainJob) and not collected again in
        that time counts as not gone."""
        since: list[float] = []

        def check() -> bool:
            left = []
            for kind, obj in [
                ("Workload", self.workload(plan.workload_name)),
                *(("PodGroup", self.pod_group(g.pod_group_name)) for g in plan.groups),
            ]:
                if obj is not None and not obj["metadata"].get("deletionTimestamp"):
                    meta = obj["metadata"]
                    left.append(
                        f"{kind} {meta['name']} (uid {meta['uid']}, created "
                        f"{meta.get('creationTimestamp')}, owners {meta.get('ownerReferences')})"
                    )
            if left:
                since.clear()
                raise NotYet(", ".join(left) + " still there")
            since.append(time.monotonic())
            if since[-1] - since[0] < stable:
                raise NotYet(f"gone for {since[-1] - since[0]:.1f}s of {stable:.0f}s")
            return True

        self.wait(check, f"the Workload and PodGroups removed: {why}", seconds)

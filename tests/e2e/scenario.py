"""The end-to-end scenario's moving parts, as the tests are written in them: one test module's
namespace, the service, the server's facts, the pod recorder; fake nodes, runtimes, TrainJobs
and their pods; the reads and the waits (every wait polls with a generous deadline, E2E_TIMEOUT,
and fails with what it saw last and the service's log)."""

from __future__ import annotations

import contextlib
import datetime
import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from kubernetes.client.exceptions import ApiException

from webhook.core.condition import CONDITION_TYPE
from webhook.core.fields import parse
from webhook.core.plan import JOBSET_NAME, Plan, build_plan
from webhook.core.snapshot import from_annotations
from webhook.core.trainer import TrainJob

from .cluster import (
    EVENTS_GROUP,
    EVENTS_VERSION,
    JOBSET_GROUP,
    JOBSET_VERSION,
    STRATEGIC_PATCH,
    TRAINER_GROUP,
    TRAINER_VERSION,
    Cluster,
    Json,
    NotYet,
    ServerFacts,
    keep,
    poll,
    timeout,
)
from .objects import (
    CREATED_BY,
    IMAGE,
    fake_node,
    level1,
    min_count,
    node_status,
    plan_for,
    planned_pod_group,
    trainjob,
)
from .recorder import JOBSET_UID, PodRecord, PodRecorder
from .registration import OWNER_ANNOTATION, RUN_LABEL, owner
from .service import Service, total

T = TypeVar("T")
UNTIED_METRIC = "trainjob_scheduling_pods_untied_total"
HELD_METRIC = "trainjob_scheduling_pods_held_total"  # by reason (webhook/metrics/registry.py)


@dataclass
class Run:
    """One run of the suite: its id (in every name and label it makes) and the namespace of
    each test module (known at the start: the service watches exactly these)."""

    id: str
    namespaces: dict[str, str]  # module name -> namespace
    fake_nodes: set[str] = field(default_factory=set)
    node_numbers: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def labels(self) -> dict[str, str]:
        return {**CREATED_BY, RUN_LABEL: self.id}


@dataclass
class Pool:
    """A test's own fake nodes (label and taint `POOL_KEY=<name>`)."""

    scenario: Scenario
    name: str
    nodes: list[str] = field(default_factory=list)

    def add(self, count: int, cpu: int = 4, labels: dict[str, str] | None = None) -> list[str]:
        made = [self.scenario.make_node(self.name, cpu, labels) for _ in range(count)]
        self.nodes += made
        return made


@dataclass
class Scenario:
    """One test module's world."""

    cluster: Cluster
    namespace: str
    service: Service
    facts: ServerFacts
    run: Run
    recorder: PodRecorder
    plans: dict[str, list[Plan]] = field(default_factory=dict)  # by TrainJob uid: each run's
    names: dict[str, list[str]] = field(default_factory=dict)  # TrainJob name -> its uids
    nodes: list[str] = field(default_factory=list)
    cluster_runtimes: list[str] = field(default_factory=list)
    untied_at_start: float = 0.0
    pools: itertools.count[int] = field(default_factory=itertools.count)

    # --- nodes --------------------------------------------------------------------------------

    def pool(self) -> Pool:
        return Pool(self, f"{self.namespace}-{next(self.pools)}")

    def make_node(self, pool: str, cpu: int, labels: dict[str, str] | None = None) -> str:
        name = f"e2e-{self.run.id}-{next(self.run.node_numbers)}"
        body = fake_node(
            name, pool, {**(labels or {}), RUN_LABEL: self.run.id}, {OWNER_ANNOTATION: owner()}
        )
        self.run.fake_nodes.add(name)
        self.nodes.append(name)
        self.cluster.create("", "v1", "nodes", body)
        self.cluster.patch("", "v1", "nodes", None, name, node_status(cpu), sub="status")
        return name

    def delete_nodes(self) -> None:
        for name in self.nodes:
            with contextlib.suppress(ApiException):
                self.cluster.delete("", "v1", "nodes", name)

    # --- runtimes and TrainJobs ----------------------------------------------------------------

    def apply_runtime(self, body: Json) -> Json:
        """Creates a TrainingRuntime (in this namespace) or a ClusterTrainingRuntime (labelled
        with the run, deleted at the end): as the API server stored it."""
        meta = body["metadata"]
        meta["labels"] = {**(meta.get("labels") or {}), **self.run.labels}
        if body["kind"] == "ClusterTrainingRuntime":
            self.cluster_runtimes.append(meta["name"])
            return self.cluster.create(TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes",
                                       body)  # fmt: skip
        meta["namespace"] = self.namespace
        return self.cluster.create(
            TRAINER_GROUP, TRAINER_VERSION, "trainingruntimes", body, self.namespace
        )

    def delete_cluster_runtimes(self) -> None:
        for name in self.cluster_runtimes:
            with contextlib.suppress(ApiException):
                self.cluster.delete(TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", name)

    def create_trainjob(self, body: Json) -> Json:
        return self.cluster.create(
            TRAINER_GROUP, TRAINER_VERSION, "trainjobs", body, self.namespace
        )

    def start_gang(self, pool: Pool, name: str, runtime_obj: Json | None = None) -> Plan:
        """A running gang: a level-1 TrainJob of 4 pods (3 nodes and a param-server, on two
        4-CPU nodes added to the pool when it has none) or of `runtime_obj`, all bound, its
        condition True/Scheduled. Its plan."""
        if not pool.nodes:
            pool.add(2, cpu=4)
        stored = self.apply_runtime(runtime_obj or level1(name, pool.name, self.namespace))
        self.create_trainjob(trainjob(name, self.namespace, stored, num_nodes=3))
        plan = self.frozen_plan(name)
        self.gang_objects(plan)
        self.wait_bound(name, 4)
        self.wait_condition(name, "True", "Scheduled")
        return plan

    def trainjob(self, name: str) -> Json | None:
        return self.cluster.get(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", name, self.namespace)

    def set_suspend(self, name: str, suspend: bool) -> Json:
        """`spec.suspend` by merge patch, as `kubectl patch --type=merge` (Kueue does the same)."""
        return self.cluster.merge_patch(
            TRAINER_GROUP, TRAINER_VERSION, "trainjobs", self.namespace, name,
            {"spec": {"suspend": suspend}},
        )  # fmt: skip

    def delete_trainjob(self, name: str, propagation: str = "Background") -> bool:
        return self.cluster.delete(
            TRAINER_GROUP, TRAINER_VERSION, "trainjobs", name, self.namespace,
            propagation=propagation,
        )  # fmt: skip

    def jobset(self, name: str) -> Json | None:
        return self.cluster.get(JOBSET_GROUP, JOBSET_VERSION, "jobsets", name, self.namespace)

    def jobs(self, trainjob: str | None = None) -> list[Json]:
        labels = f"{JOBSET_NAME}={trainjob}" if trainjob else None
        return self.cluster.list_objects("batch", "v1", "jobs", self.namespace, labels=labels)

    # --- the gang -----------------------------------------------------------------------------

    def workload(self, name: str) -> Json | None:
        return self.cluster.gang("workloads", name, self.namespace)

    def pod_group(self, name: str) -> Json | None:
        return self.cluster.gang("podgroups", name, self.namespace)

    def frozen_plan(self, name: str) -> Plan:
        """Waits for the service to freeze the runtime into the TrainJob; the plan of that
        snapshot for the TrainJob as it is now (the service's plan: its version's names; from
        plan version 3 they carry the run, the generation, once past 1), remembered by the
        TrainJob's uid so that its pods can be judged after it is gone. Call it again after a
        resume: the run has a plan of its own."""

        def frozen() -> tuple[Json, Plan]:
            stored = self.trainjob(name)
            if stored is None:
                raise NotYet(f"no TrainJob {name}")
            snapshot = from_annotations(stored["metadata"].get("annotations"))
            if snapshot is None:
                raise NotYet("no runtime snapshot yet")
            assert snapshot.runtime is not None, f"{name} was frozen without a gang"
            job, errors = parse(TrainJob, stored)
            assert job is not None, errors
            plan = build_plan(job, snapshot.runtime, snapshot.version)
            assert plan is not None, "the frozen runtime has no spec.scheduling"
            return stored, plan

        stored, plan = self.wait(frozen, f"the service freezes the runtime into TrainJob {name}")
        uid = str(stored["metadata"]["uid"])
        runs = self.plans.setdefault(uid, [])
        if plan not in runs:
            runs.append(plan)
        uids = self.names.setdefault(name, [])
        if uid not in uids:
            uids.append(uid)
        return plan

    def plan_of_runtime(self, trainjob_obj: Json, runtime_obj: Json) -> Plan:
        return plan_for(trainjob_obj, runtime_obj)

    def gang_objects(self, plan: Plan, *, not_uids: frozenset[str] = frozenset()) -> list[Json]:
        """Waits until the Workload and every PodGroup of `plan` exist, live (no
        deletionTimestamp), with the planned minCount, none with a uid in `not_uids`: the
        Workload, then the PodGroups in the plan's order."""

        def live(obj: Json | None, what: str) -> Json:
            if obj is None:
                raise NotYet(f"no {what}")
            meta = obj["metadata"]
            if meta.get("deletionTimestamp"):
                raise NotYet(f"{what} is being deleted (finalizers {meta.get('finalizers')})")
            if meta["uid"] in not_uids:
                raise NotYet(f"{what} is still the old object (uid {meta['uid']})")
            return obj

        def check() -> list[Json]:
            found = [live(self.workload(plan.workload_name), f"Workload {plan.workload_name}")]
            for group in plan.groups:
                what = f"PodGroup {group.pod_group_name}"
                pod_group = live(self.pod_group(group.pod_group_name), what)
                if min_count(pod_group["spec"]) != group.min_count:
                    raise NotYet(f"{what}: minCount {min_count(pod_group['spec'])}, "
                                 f"not {group.min_count}")  # fmt: skip
                found.append(pod_group)
            return found

        return self.wait(check, f"{self.namespace}/{plan.trainjob_name}: Workload and PodGroups")

    # --- pods ---------------------------------------------------------------------------------

    def pods(self, trainjob: str) -> list[Json]:
        """The TrainJob's pods now (not being deleted)."""
        pods = self.cluster.list_objects(
            "", "v1", "pods", self.namespace, labels=f"{JOBSET_NAME}={trainjob}"
        )
        return [p for p in pods if not p["metadata"].get("deletionTimestamp")]

    def wait_bound(
        self,
        trainjob: str,
        count: int,
        *,
        where: Callable[[Json], bool] = lambda pod: True,
        seconds: float | None = None,
    ) -> list[Json]:
        """Waits until exactly `count` live pods of the TrainJob (those `where` accepts) exist
        and every one is bound to a node; returns them."""

        def check() -> list[Json]:
            pods = [p for p in self.pods(trainjob) if where(p)]
            bound = [p for p in pods if p["spec"].get("nodeName")]
            if len(pods) != count or len(bound) != count:
                raise NotYet(f"{len(pods)} pods, {len(bound)} bound, of {count}: "
                             + describe_pods(pods))  # fmt: skip
            return pods

        return self.wait(check, f"{count} pods of {trainjob} bound", seconds)

    def unbound_for(self, trainjob: str, seconds: float, expect: int | None = None) -> list[Json]:
        """Checks for `seconds` that no pod of the TrainJob gets bound; the pods at the end
        (`expect` of them, when given, all created by then)."""
        deadline = time.monotonic() + seconds
        pods: list[Json] = []
        while time.monotonic() < deadline:
            self.service.check_running()
            pods = self.pods(trainjob)
            bound = [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")]
            assert not bound, f"bound while the gang should not fit: {describe_pods(pods)}"
            time.sleep(1)
        if expect is not None:
            assert len(pods) == expect, describe_pods(pods)
        return pods

    def set_pod_status(self, pods: Iterable[Json], state: str) -> None:
        """Plays the kubelet of a fake node: `Ready` (Running and ready), `Succeeded` or
        `Failed`, through pods/status."""
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for pod in pods:
            container = pod["spec"]["containers"][0]["name"]
            ready = "True" if state == "Ready" else "False"
            base = {"name": container, "image": IMAGE, "imageID": "", "restartCount": 0,
                    "ready": state == "Ready", "started": state == "Ready"}  # fmt: skip
            status: Json
            if state == "Ready":
                phase, status = "Running", {"running": {"startedAt": now}}
            else:
                code = 0 if state == "Succeeded" else 1
                reason = "Completed" if code == 0 else "Error"
                phase = state
                status = {"terminated": {"exitCode": code, "reason": reason,
                                         "startedAt": now, "finishedAt": now}}  # fmt: skip
            patch = {"status": {
                "phase": phase,
                "conditions": [
                    {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": ready, "lastTransitionTime": now},
                    {"type": "Ready", "status": ready, "lastTransitionTime": now},
                ],
                "containerStatuses": [{**base, "state": status}],
                "startTime": now,
            }}  # fmt: skip
            self.cluster.patch(
                "", "v1", "pods", self.namespace, pod["metadata"]["name"], patch,
                content_type=STRATEGIC_PATCH, sub="status",
            )  # fmt: skip

    # --- what the service says ------------------------------------------------------------------

    def condition(self, name: str) -> Json | None:
        stored = self.trainjob(name) or {}
        for condition in (stored.get("status") or {}).get("conditions") or []:
            if condition.get("type") == CONDITION_TYPE:
                return dict(condition)
        return None

    def wait_condition(
        self, name: str, status: str, reason: str | None = None, seconds: float | None = None
    ) -> Json:
        def check() -> Json:
            found = self.condition(name)
            if (
                found is None
                or found.get("status") != status
                or (reason is not None and found.get("reason") != reason)
            ):
                raise NotYet(f"condition {found}")
            return found

        want = f"{status}/{reason}" if reason else status
        return self.wait(check, f"TrainJob {name}: {CONDITION_TYPE}={want}", seconds)

    def events(self, regarding_uid: str | None = None, reason: str | None = None) -> list[Json]:
        found = self.cluster.list_objects(EVENTS_GROUP, EVENTS_VERSION, "events", self.namespace)
        return [
            e for e in found
            if (regarding_uid is None or (e.get("regarding") or {}).get("uid") == regarding_uid)
            and (reason is None or e.get("reason") == reason)
        ]  # fmt: skip

    def failed_creates(self, trainjob: str) -> list[str]:
        """The messages of the Job controller's FailedCreate Events on the TrainJob's Jobs (a
        pod creation denied: held, or refused while the service was down)."""
        return [
            str(e.get("message"))
            for e in self.cluster.list_objects("", "v1", "events", self.namespace)
            if e.get("reason") == "FailedCreate"
            and (e.get("involvedObject") or {}).get("kind") == "Job"
            and str((e.get("involvedObject") or {}).get("name")).startswith(f"{trainjob}-")
        ]  # fmt: skip

    def metric(self, name: str, **labels: str) -> float | None:
        """The sum of the samples of `name` carrying these labels on the service's /metrics;
        None when the suite cannot read them (a deployed service)."""
        samples = self.service.metrics()
        return None if samples is None else total(samples, name, **labels)

    def held_count(self, reason: str) -> float | None:
        """Pod creations the service held (denied) for `reason`, so far."""
        return self.metric(HELD_METRIC, reason=reason)

    def untied_count(self) -> float:
        samples = self.service.metrics()
        assert samples is not None and any(name == UNTIED_METRIC for name, _ in samples), (
            f"the service's /metrics has no {UNTIED_METRIC}"
        )
        return total(samples, UNTIED_METRIC)

    # --- the invariant --------------------------------------------------------------------------

    def assert_tied(self, *trainjobs: str) -> None:
        """Every pod of these TrainJobs that the API server ever admitted named its planned
        PodGroup (of its TrainJob's incarnation and its JobSet restart attempt), and none of an
        untargeted ReplicatedJob named one; and the service counted no pod admitted untied
        since the module started."""
        problems = []
        seen = 0
        for name in trainjobs:
            for record in self.recorder.of(name):
                seen += 1
                wanted = self._planned(name, record)
                if wanted is _UNKNOWN:
                    problems.append(f"{record.name}: no known plan of its TrainJob (uid) "
                                    f"{record.labels.get(JOBSET_UID)}")  # fmt: skip
                elif record.pod_group != wanted:
                    where = f"bound to {record.node}" if record.node else "never bound"
                    problems.append(
                        f"{record.name} (of Job {record.owner}, created {record.created}, "
                        f"{where}, {record.phase}) names {record.pod_group!r}, planned "
                        f"{wanted!r} (runs planned: {self._runs(name)})"
                    )
        assert seen, f"no pod of {trainjobs} was ever seen"
        assert not problems, "pods not tied to their planned PodGroup:\n" + "\n".join(problems)
        if self.service.local:
            untied = self.untied_count() - self.untied_at_start
            assert untied == 0, f"{UNTIED_METRIC} grew by {untied} in this module"

    def _runs(self, name: str) -> list[str]:
        return [
            f"uid {p.trainjob_uid} groups {[g.pod_group_name for g in p.groups]}"
            for u in self.names.get(name, [])
            for p in self.plans.get(u, [])
        ]

    def _planned(self, name: str, record: PodRecord) -> str | object | None:
        """The PodGroup the pod must name: its TrainJob incarnation's (by the JobSet's owner),
        of any run of it the test planned (a pod does not carry its run), at its attempt."""
        uid = self.recorder.jobset_owner.get(record.labels.get(JOBSET_UID, ""))
        uids = [uid] if uid in self.plans else self.names.get(name, [])
        answers = {
            planned_pod_group(plan, record.labels) for u in uids for plan in self.plans.get(u, [])
        }
        if record.pod_group in answers:
            return record.pod_group
        if len(answers) == 1:
            return answers.pop()
        return _UNKNOWN if not answers else sorted(map(str, answers))

    # --- waiting ------------------------------------------------------------------------------

    def describe(self) -> str:
        return self.service.describe()

    def wait(self, check: Callable[[], T | None], what: str, seconds: float | None = None) -> T:
        def checked() -> T | None:
            self.service.check_running()
            return check()

        return poll(checked, what, timeout() if seconds is None else seconds,
                    describe=self.describe)  # fmt: skip

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

    def absent(self, plan: Plan, why: str, seconds: float | None = None) -> None:
        """Waits until the Workload and PodGroups of `plan` are gone from the API server: not
        Terminating (a finalizer, such as podgroup-protection, kept), gone."""

        def check() -> bool:
            left = [
                f"{kind} {obj['metadata']['name']} (deleting since "
                f"{obj['metadata'].get('deletionTimestamp')}, finalizers "
                f"{obj['metadata'].get('finalizers')})"
                for kind, obj in [
                    ("Workload", self.workload(plan.workload_name)),
                    *(("PodGroup", self.pod_group(g.pod_group_name)) for g in plan.groups),
                ]
                if obj is not None
            ]
            if left:
                raise NotYet(", ".join(left) + " still there")
            return True

        self.wait(check, f"the Workload and PodGroups gone: {why}", seconds)

    def cleanup(self) -> None:
        """The module's namespace deleted (with everything in it), its pods waited for (the
        recorder force-deletes those of fake nodes), then its fake nodes and cluster-scoped
        runtimes deleted. E2E_KEEP=1 keeps everything but the webhooks."""
        if keep():
            return
        self.cluster.delete_namespace(self.namespace)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if not self.cluster.list_objects("", "v1", "pods", self.namespace):
                    break
            except Exception:
                pass
            time.sleep(1)
        self.delete_nodes()
        self.delete_cluster_runtimes()


_UNKNOWN = object()


def describe_pods(pods: Iterable[Json]) -> str:
    """One line per pod: name, PodGroup, node, phase, deletion."""
    lines = []
    for pod in pods:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        group = (spec.get("schedulingGroup") or {}).get("podGroupName")
        lines.append(
            f"{meta['name']} group={group} node={spec.get('nodeName')} "
            f"phase={(pod.get('status') or {}).get('phase')}"
            + (" deleting" if meta.get("deletionTimestamp") else "")
        )
    return "[" + "; ".join(lines) + "]"


def objects_dump(scenario: Scenario) -> str:
    """The namespace's TrainJobs (their GangScheduling condition), gang objects and pods, one
    line each (a failed test's report ends with it)."""
    lines = []
    cluster, namespace = scenario.cluster, scenario.namespace
    for tj in cluster.list_objects(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", namespace):
        meta = tj["metadata"]
        conditions = {
            c.get("type"): f"{c.get('status')}/{c.get('reason')}: {c.get('message')}"
            for c in (tj.get("status") or {}).get("conditions") or []
        }
        lines.append(
            f"TrainJob {meta['name']} uid={meta['uid']} generation={meta.get('generation')} "
            f"suspend={tj['spec'].get('suspend')} deleting={bool(meta.get('deletionTimestamp'))} "
            f"conditions={conditions}"
        )
    for plural in ("workloads", "podgroups"):
        for obj in cluster.gangs(plural, namespace):
            meta, spec = obj["metadata"], obj.get("spec") or {}
            status = [
                f"{c.get('type')}={c.get('status')}/{c.get('reason')}"
                for c in (obj.get("status") or {}).get("conditions") or []
            ]
            lines.append(
                f"{obj['kind']} {meta['name']} uid={meta['uid']} "
                f"deleting={bool(meta.get('deletionTimestamp'))} "
                f"minCount={min_count(spec) if plural == 'podgroups' else '-'} {status}"
            )
    pods = cluster.list_objects("", "v1", "pods", namespace)
    lines.append(f"pods: {describe_pods(pods)}")
    return "\n".join(lines)

"""Part A (issue 36): how long a gang takes to be bound after each disturbance, beyond what the
cluster needs without the service in the way.

Every round plays one scenario with one TrainJob of 4 pods in one gang (the end-to-end suite's
level 1: 3 `node` pods and a `param-server`, two Jobs) and reads off a watch of the pods, Jobs
and PodGroups (`timeline.py`, this process's clock):

* S, when the gang's pods could first be created: the last of its Jobs exists and is not
  suspended, and the service (the reconciler, for the failover) is back;
* T, when the last of its pods is bound (4 live pods created after the disturbance);
* L = T - S, and the **excess** E = L - the baseline's median L, where the baseline is the
  same gang created on an undisturbed service (S: its Jobs exist; T: its pods bound).

The scenarios, two service replicas with leader election behind one address throughout (the
chart's default, `Front`):

* `resume`: a running TrainJob whose pods (on the harness's real node, so a real kubelet honours
  the grace period) ignore SIGTERM with terminationGracePeriodSeconds 30 is suspended; once all
  its pods are Terminating it is resumed at once;
* `failover`: the leader is killed (SIGKILL: it cannot release the Lease) and a TrainJob is
  created at once; S is also when the other replica takes the Lease (after the Lease's 15 s);
* `outage`: every replica stopped for 30 s; a TrainJob created meanwhile; S is also the moment
  a replica is ready again;
* `restart`: a pod of a running gang fails; its Job (backoffLimit 0) fails and JobSet restarts
  the attempt (failurePolicy maxRestarts 3);
* `reapply`: a running TrainJob deleted and created again under its name at once.

Per round it also reads each replica's counters: pods held (by reason), Jobs woken (by reason),
pods untied; and the Job controller's FailedCreate Events (held and refused creations alike).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from tests.e2e.cluster import TRAINER_GROUP, TRAINER_VERSION, Json, NotYet
from tests.e2e.objects import level1, replicated_job, runtime, trainjob
from tests.e2e.scenario import Scenario
from tests.e2e.service import total
from webhook.core.plan import JOBSET_NAME, Plan

from .session import LEASE, Replica, Session, force_delete_pods
from .stats import Samples, by_label, summary
from .timeline import PodSeen, Timeline

GANG_PODS = 4  # level 1: numNodes 3 `node` pods and a `param-server`
GANG_JOBS = 2
NUM_NODES = 3
OUTAGE = 30.0  # seconds every replica is down
GRACE = 30  # terminationGracePeriodSeconds of the resume scenario's pods
ROUND_DEADLINE = 240.0  # seconds a round may take to bind its gang
SCENARIOS = ("baseline", "resume", "failover", "outage", "restart", "reapply")
REAL_NODE_LABEL = "tjs.dev/real-node"
HELD = "trainjob_scheduling_pods_held_total"
WOKEN = "trainjob_scheduling_jobs_woken_total"
UNTIED = "trainjob_scheduling_pods_untied_total"


@dataclass
class Round:
    scenario: str
    round: int
    ok: bool = False
    error: str = ""
    # seconds from the disturbance (`at`: the resume, the kill, the stop, the failure, the
    # delete; the creation for the baseline)
    jobs_ready: float = math.nan  # the last Job there and not suspended
    back: float = math.nan  # the service (or the reconciler) back
    start: float = math.nan  # S = max(jobs_ready, back)
    first_pod: float = math.nan
    last_pod: float = math.nan  # the last of the gang's pods created (admitted)
    gang_ready: float = math.nan  # the last of its PodGroups created
    bound: float = math.nan  # T
    latency: float = math.nan  # L = T - S
    excess: float = math.nan  # L - the baseline's median L
    scheduler: float = math.nan  # T - max(last_pod, gang_ready): kube-scheduler's own part
    held: dict[str, float] = field(default_factory=dict)
    woken: dict[str, float] = field(default_factory=dict)
    untied: float = 0.0
    failed_creates: int = 0
    untied_pods: list[str] = field(default_factory=list)  # pods not naming the planned gang
    notes: dict[str, Any] = field(default_factory=dict)


def level1_real(name: str, namespace: str) -> Json:
    """Level 1 with its pods on the harness's real node: they run, ignore SIGTERM (`trap ''
    TERM`, inherited by the loop's sleeps) and have 30 s to stop."""

    def pod(container: str) -> dict[str, Any]:
        return {
            "containers": [
                {
                    "name": container,
                    "image": "busybox",
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "trap '' TERM; while true; do sleep 1; done"],
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                }
            ],
            "nodeSelector": {REAL_NODE_LABEL: "true"},
            "tolerations": [{"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": GRACE,
        }

    return runtime(
        name,
        {"schedulingPolicy": {"gang": {}}},
        [
            replicated_job("node", None, ancestor="trainer", **pod("node")),
            replicated_job("param-server", None, container="ps", **pod("ps")),
        ],
        namespace=namespace,
    )


def level1_restartable(name: str, pool: str, namespace: str) -> Json:
    """Level 1 whose Jobs fail at their first failed pod, and a JobSet that restarts."""
    return runtime(
        name,
        {"schedulingPolicy": {"gang": {}}},
        [
            replicated_job("node", pool, ancestor="trainer", backoff_limit=0),
            replicated_job("param-server", pool, container="ps", backoff_limit=0),
        ],
        namespace=namespace,
        jobset={"failurePolicy": {"maxRestarts": 3}},
    )


def _delta(
    after: dict[tuple[int, int], Samples],
    before: dict[tuple[int, int], Samples],
    name: str,
    label: str | None,
) -> dict[str, float]:
    """A counter's growth over every replica process alive at the end (a process started
    meanwhile counts from 0), by `label` (or under "" without)."""
    out: dict[str, float] = {}
    for key, samples in after.items():
        old = before.get(key, {})
        if label is None:
            grown = {"": total(samples, name) - total(old, name)}
        else:
            now, then = by_label(samples, name, label), by_label(old, name, label)
            grown = {k: v - then.get(k, 0.0) for k, v in now.items()}
        for k, v in grown.items():
            if v:
                out[k] = out.get(k, 0.0) + v
    return out


@dataclass
class PartA:
    session: Session
    timeline: Timeline
    pool: str
    runtimes: dict[str, Json] = field(default_factory=dict)
    log: Callable[[str], None] = print

    # --- helpers -----------------------------------------------------------------------------

    def sc(self, key: str) -> Scenario:
        return self.session.scenario(key)

    def runtime_for(self, key: str) -> Json:
        if key not in self.runtimes:
            ns = self.session.namespace(key)
            if key == "resume":
                body = level1_real("gang", ns)
            elif key == "restart":
                body = level1_restartable("gang", self.pool, ns)
            else:
                body = level1("gang", self.pool, ns)
            self.runtimes[key] = self.sc(key).apply_runtime(body)
        return self.runtimes[key]

    def create(self, key: str, name: str) -> float:
        """Creates the TrainJob; the moment the API server answered."""
        body = trainjob(
            name, self.session.namespace(key), self.runtime_for(key), num_nodes=NUM_NODES
        )
        self.sc(key).create_trainjob(body)
        return time.monotonic()

    def bound_gang(self, key: str, name: str, since: float) -> list[PodSeen]:
        """Waits until the TrainJob's 4 live pods created after `since` are all bound (the
        timeline, polled every 50 ms); returns them."""
        ns = self.session.namespace(key)
        deadline = time.monotonic() + ROUND_DEADLINE
        while True:
            pods = [
                p
                for p in self.timeline.pods_of(ns, name)
                if p.added >= since and p.deleting is None
            ]
            if len(pods) == GANG_PODS and all(p.bound for p in pods):
                return pods
            if time.monotonic() > deadline:
                raise TimeoutError(f"{ns}/{name}: gang not bound: {_pods(pods)}")
            time.sleep(0.05)

    def wait_running(self, key: str, name: str, since: float, phase: bool = False) -> None:
        """Until the TrainJob's 4 pods created after `since` are bound (and Running, with
        `phase`: on the real node)."""
        self.bound_gang(key, name, since)
        if phase:
            sc = self.sc(key)

            def all_running() -> bool:
                pods = sc.pods(name)
                phases = [(p.get("status") or {}).get("phase") for p in pods]
                if len(pods) != GANG_PODS or any(ph != "Running" for ph in phases):
                    raise NotYet(f"phases {phases}")
                return True

            sc.wait(all_running, f"{name}'s pods Running on the real node", ROUND_DEADLINE)

    def measure(
        self,
        result: Round,
        key: str,
        name: str,
        at: float,
        since: float,
        plan: Plan,
        back: float | None = None,
    ) -> float:
        """Fills `result` from the timeline once the gang of `plan` is bound: 4 live pods of
        the TrainJob created after `since`; the times relative to `at`. Returns T."""
        ns = self.session.namespace(key)
        groups = {g.pod_group_name for g in plan.groups}
        pods = self.bound_gang(key, name, since)
        bound = max(p.bound or 0.0 for p in pods)
        jobs = [
            j
            for j in self.timeline.jobs_of(ns, name)
            if j.deleting is None and j.running_since is not None and j.running_since >= since
        ]
        if len(jobs) != GANG_JOBS:
            raise AssertionError(f"{ns}/{name}: {len(jobs)} Jobs made after the disturbance")
        jobs_ready = max(j.running_since or 0.0 for j in jobs)
        start = max(jobs_ready, back if back is not None else -math.inf)
        made = self.timeline.group_named(ns, groups)
        gang_ready = max((g.added for g in made), default=math.nan)
        result.untied_pods = [f"{p.name}: {p.group}" for p in pods if p.group not in groups]
        result.jobs_ready = jobs_ready - at
        result.back = (back - at) if back is not None else math.nan
        result.start = start - at
        result.first_pod = min(p.added for p in pods) - at
        result.last_pod = max(p.added for p in pods) - at
        result.gang_ready = gang_ready - at
        result.bound = bound - at
        result.latency = bound - start
        result.scheduler = bound - max(max(p.added for p in pods), gang_ready)
        return bound

    def failed_creates(self, key: str, name: str) -> int:
        ns = self.session.namespace(key)
        count = 0
        for event in self.session.cluster.list_objects("", "v1", "events", ns):
            involved = event.get("involvedObject") or {}
            if (
                event.get("reason") == "FailedCreate"
                and involved.get("kind") == "Job"
                and str(involved.get("name", "")).startswith(f"{name}-")
            ):
                count += int(event.get("count") or 1)
        return count

    def teardown(self, key: str, name: str) -> None:
        """The round's TrainJob deleted and its pods gone (those that would take their grace
        period force-deleted: the next round must not wait on them)."""
        sc, ns = self.sc(key), self.session.namespace(key)
        with contextlib.suppress(ApiException):
            sc.delete_trainjob(name)
        cluster = self.session.cluster
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pods = cluster.list_objects("", "v1", "pods", ns, labels=f"{JOBSET_NAME}={name}")
            if not pods and sc.trainjob(name) is None:
                return
            force_delete_pods(
                cluster, ns, [p for p in pods if p["metadata"].get("deletionTimestamp")]
            )
            time.sleep(0.5)
        self.log(f"  (teardown of {ns}/{name}: pods still there after 120 s)")

    def counters(self, result: Round, before: dict[tuple[int, int], Samples]) -> None:
        after = self.session.samples()
        result.held = _delta(after, before, HELD, "reason")
        result.woken = _delta(after, before, WOKEN, "reason")
        result.untied = sum(_delta(after, before, UNTIED, None).values())

    # --- the scenarios -----------------------------------------------------------------------

    def baseline(self, r: int, result: Round) -> str:
        name = f"base-{r}"
        before = self.session.samples()
        at = self.create("baseline", name)
        plan = self.sc("baseline").frozen_plan(name)
        self.measure(result, "baseline", name, at, at, plan)
        self.counters(result, before)
        return name

    def resume(self, r: int, result: Round) -> str:
        key, name = "resume", f"resume-{r}"
        sc = self.sc(key)
        self.wait_running(key, name, self.create(key, name), phase=True)
        old = {p.name for p in self.timeline.pods_of(self.session.namespace(key), name)}
        before = self.session.samples()
        suspended = time.monotonic()
        sc.set_suspend(name, True)
        ns = self.session.namespace(key)

        def terminating() -> bool:
            pods = [p for p in self.timeline.pods_of(ns, name) if p.name in old]
            if len(pods) != GANG_PODS or any(p.deleting is None for p in pods):
                raise NotYet(_pods(pods))
            return True

        sc.wait(terminating, f"{name}'s pods Terminating", ROUND_DEADLINE)
        sc.set_suspend(name, False)
        at = time.monotonic()
        plan = sc.frozen_plan(name)  # the resumed run's own gang
        self.measure(result, key, name, at, at, plan)
        still = [
            p["metadata"]["name"]
            for p in sc.cluster.list_objects("", "v1", "pods", ns, labels=f"{JOBSET_NAME}={name}")
            if p["metadata"]["name"] in old
        ]
        result.notes["old pods still Terminating when the gang was bound"] = len(still)
        result.notes["suspend to resume (s)"] = round(at - suspended, 2)
        self.counters(result, before)
        return name

    def failover(self, r: int, result: Round) -> str:
        key, name = "failover", f"away-{r}"
        replicas = self.session.replicas
        leader = self.wait_leader()
        standby = next(x for x in replicas if x is not leader)
        self.session.scenario(key).wait(standby.ready, "the standby ready", 60)
        holder = self.timeline.holder()
        before = self.session.samples()
        killed = time.monotonic()
        leader.stop(kill=True)  # SIGKILL: the Lease is not released
        at = self.create(key, name)
        plan = self.sc(key).frozen_plan(name)

        def taken() -> float:
            for change in self.timeline.lease_changes(killed):
                if change.holder and change.holder != holder:
                    return change.at
            raise NotYet(f"the Lease still held by {self.timeline.holder()!r}")

        lead = self.sc(key).wait(taken, "the standby takes the Lease", 90)
        self.measure(result, key, name, at, at, plan, back=lead)
        result.notes["reconciler away (s)"] = round(lead - killed, 2)
        result.notes["the standby leads"] = standby.leading()
        self.counters(result, before)
        leader.start()  # the killed replica comes back as the standby
        return name

    def wait_leader(self) -> Replica:
        def one() -> Replica:
            leading = [x for x in self.session.replicas if x.running and x.leading()]
            if len(leading) != 1:
                raise NotYet(f"{len(leading)} replicas lead")
            return leading[0]

        return self.sc("failover").wait(one, "one replica leads", 90)

    def outage(self, r: int, result: Round) -> str:
        key, name = "outage", f"down-{r}"
        replicas = self.session.replicas
        before = self.session.samples()
        _together([x.stop for x in replicas])
        down = time.monotonic()
        try:
            self.create(key, name)
        except ApiException as err:  # the chart lets it in; say so if it did not
            result.notes["created while down"] = f"refused: {err.status}"
            raise
        at = time.monotonic()
        time.sleep(max(0.0, down + OUTAGE - time.monotonic()))
        ready_at: list[float] = []
        started = time.monotonic()
        for replica in replicas:  # one after the other, as a rollout brings them back
            replica.start()  # (from this thread: see session.session)
            ready_at.append(time.monotonic())
        back = min(ready_at)
        plan = self.sc(key).frozen_plan(name)
        self.measure(result, key, name, at, at, plan, back=back)
        result.notes["down (s)"] = round(back - down, 2)
        result.notes["process start to ready (s)"] = round(back - started, 2)
        self.counters(result, before)
        return name

    def restart(self, r: int, result: Round) -> str:
        key, name = "restart", f"restart-{r}"
        sc = self.sc(key)
        self.wait_running(key, name, self.create(key, name))
        plan = sc.frozen_plan(name)
        before = self.session.samples()
        victim = sc.pods(name)[0]
        sc.set_pod_status([victim], "Failed")
        at = time.monotonic()
        self.measure(result, key, name, at, at, plan.at_attempt(1))
        self.counters(result, before)
        return name

    def reapply(self, r: int, result: Round) -> str:
        key, name = "reapply", f"again-{r}"
        sc = self.sc(key)
        self.wait_running(key, name, self.create(key, name))
        before = self.session.samples()
        at = time.monotonic()
        assert sc.delete_trainjob(name)
        sc.wait(lambda: sc.trainjob(name) is None, f"{name} deleted", 60)
        created = self.create(key, name)
        plan = sc.frozen_plan(name)
        self.measure(result, key, name, at, at, plan)
        result.notes["deleted to created again (s)"] = round(created - at, 2)
        self.counters(result, before)
        return name

    def play(self, scenario: str, r: int) -> Round:
        result = Round(scenario, r)
        play: Callable[[int, Round], str] = getattr(self, scenario)
        name = ""
        key = scenario
        try:
            name = play(r, result)
            result.ok = True
        except Exception as err:
            result.error = f"{type(err).__name__}: {err}"[:2000]
            self.log(traceback.format_exc())
        finally:
            prefix = {
                "baseline": "base",
                "resume": "resume",
                "failover": "away",
                "outage": "down",
                "restart": "restart",
                "reapply": "again",
            }[scenario]
            name = name or f"{prefix}-{r}"
            with contextlib.suppress(Exception):
                result.failed_creates = self.failed_creates(key, name)
            for replica in self.session.replicas:  # whatever a failed round left stopped
                if not replica.running:
                    with contextlib.suppress(Exception):
                        replica.start()
            self.teardown(key, name)
        return result


def _together(calls: list[Callable[[], None]]) -> None:
    errors: list[BaseException] = []

    def wrap(call: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                call()
            except BaseException as err:
                errors.append(err)

        return run

    threads = [threading.Thread(target=wrap(c)) for c in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _pods(pods: list[PodSeen]) -> str:
    return (
        "["
        + "; ".join(
            f"{p.name} group={p.group} bound={p.bound is not None} "
            f"deleting={p.deleting is not None}"
            for p in pods
        )
        + "]"
    )


def run_part_a(
    session: Session, rounds: int, scenarios: tuple[str, ...], log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Every scenario `rounds` times, interleaved (round 1 of each, then round 2, ...), so that
    the machine's drift is spread over them; the figures."""
    cluster = session.cluster
    namespaces = set(session.run.namespaces.values())
    timeline = Timeline(cluster, namespaces, session.namespace("failover"), LEASE)
    timeline.start()
    pool = session.scenario("baseline").pool()
    pool.add(4, cpu=4)  # 16 CPUs: the gang (4) and the one being replaced (4) fit at once
    part = PartA(session, timeline, pool.name, log=log)
    for scenario in scenarios:  # up front: a runtime is not created while the service is down
        part.runtime_for(scenario)
    real = cluster.get("", "v1", "nodes", "real-0")
    order = list(scenarios)
    if "resume" in order and real is None:
        session.notes.append("no real node (real-0): the resume scenario was skipped")
        order.remove("resume")
    results: list[Round] = []
    try:
        for r in range(rounds):
            for scenario in order:
                result = part.play(scenario, r)
                results.append(result)
                log(
                    f"  {scenario:9} round {r}: "
                    + (
                        f"L {result.latency:.2f} s (S at {result.start:.2f}, bound at "
                        f"{result.bound:.2f}), held {sum(result.held.values()):.0f}, woken "
                        f"{sum(result.woken.values()):.0f}, FailedCreate {result.failed_creates} "
                        f"{result.notes}"
                        if result.ok
                        else f"FAILED {result.error}"
                    )
                )
    finally:
        timeline.stop()
    base = [x.latency for x in results if x.scenario == "baseline" and x.ok]
    reference = summary(base)["p50"] if base else math.nan
    for x in results:
        if x.ok:
            x.excess = x.latency - reference
    figures: dict[str, Any] = {"baseline_p50": reference, "scenarios": {}}
    for scenario in order:
        mine = [x for x in results if x.scenario == scenario]
        good = [x for x in mine if x.ok]
        held: dict[str, float] = {}
        woken: dict[str, float] = {}
        for x in good:
            for k, v in x.held.items():
                held[k] = held.get(k, 0) + v
            for k, v in x.woken.items():
                woken[k] = woken.get(k, 0) + v
        figures["scenarios"][scenario] = {
            "rounds": len(mine),
            "failed": len(mine) - len(good),
            "latency": summary([x.latency for x in good]),
            "excess": summary([x.excess for x in good]),
            "start": summary([x.start for x in good]),
            "scheduler": summary([x.scheduler for x in good]),
            "held_per_round": summary([sum(x.held.values()) for x in good]),
            "woken_per_round": summary([sum(x.woken.values()) for x in good]),
            "failed_creates_per_round": summary([float(x.failed_creates) for x in good]),
            "held_by_reason": held,
            "woken_by_reason": woken,
            "untied": sum(x.untied for x in good),
            "untied_pods": [p for x in good for p in x.untied_pods],
        }
    figures["rounds"] = [asdict(x) for x in results]
    figures["watch_errors"] = timeline.errors()[-10:]
    return figures


def trainjob_names(cluster: Any, namespace: str) -> list[str]:
    return [
        t["metadata"]["name"]
        for t in cluster.list_objects(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", namespace)
    ]

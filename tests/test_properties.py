"""Property-based tests over generated runtimes and TrainJobs.

* validation and planning never raise and agree: the planner refuses just what validation rejects;
* names are valid, unique within a TrainJob and stable;
* 1 <= minCount <= the group's pod count;
* every pod maps to exactly one group, or to none when its ReplicatedJob is untargeted;
* the rendered Workload and PodGroups pass the Kubernetes 1.37 schema (strict) and the API rules.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from tests import reference
from tests.apiserver_rules import dns_label, objects_errors, templates_of
from tests.builders import Json, rj
from webhook.backends.base import Context
from webhook.backends.native import NativeBackend
from webhook.core.plan import Plan, PlanningError, build_plan, pod_group_for_labels
from webhook.core.trainer import Runtime, TrainJob
from webhook.core.validation import validate_runtime, validate_trainjob

RJ_NAMES = [
    "node",
    "launcher",
    "dataset-initializer",
    "model-initializer",
    "a-b",
    "a",
    "b",
    "eval",
    "w" * 20,
    "0x",
]
TOPOLOGY_KEYS = ["topology.kubernetes.io/zone", "example.com/rack", "rack", "Bad Key", ""]
# Counts a tenant may write that the work must never grow with: int32 and int64 extremes.
EXTREMES = [2**31 - 1, 2**31, 2**63 - 1, 2**64 - 1, -(2**31), -(2**63)]


def count(draw: st.DrawFn, usual: list[int | None], sloppy: bool) -> int | None:
    """Mostly a usual count; in sloppy runtimes now and then an extreme one."""
    if sloppy and draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(EXTREMES))
    return draw(st.sampled_from(usual))


@st.composite
def group_settings(draw: st.DrawFn, sloppy: bool) -> Json:
    out: Json = {}
    policy = draw(
        st.sampled_from(["absent", "basic", "gang"] + (["both", "empty"] if sloppy else []))
    )
    if policy == "basic":
        out["schedulingPolicy"] = {"basic": {}}
    elif policy == "gang":
        gang: Json = {"minCount": draw(st.integers(0, 5))} if sloppy and draw(st.booleans()) else {}
        out["schedulingPolicy"] = {"gang": gang}
    elif policy == "both":
        out["schedulingPolicy"] = {"basic": {}, "gang": {}}
    elif policy == "empty":
        out["schedulingPolicy"] = {}
    if draw(st.booleans()):
        keys = TOPOLOGY_KEYS if sloppy else TOPOLOGY_KEYS[:3]
        n = draw(st.integers(1, 2 if sloppy else 1))
        out["schedulingConstraints"] = {
            "topology": [{"key": draw(st.sampled_from(keys))} for _ in range(n)]
        }
    if draw(st.booleans()):
        out["disruptionMode"] = draw(
            st.sampled_from([{"single": {}}, {"all": {}}] + ([{}] if sloppy else []))
        )
    if draw(st.integers(0, 3)) == 0:
        n = draw(st.integers(1, 5 if sloppy else 4))
        out["resourceClaims"] = [
            {"name": f"claim-{i}", "resourceClaimTemplateName": "gpu-slice"} for i in range(n)
        ]
    return out


@st.composite
def runtimes(draw: st.DrawFn, sloppy: bool = True) -> Json:
    names = draw(st.lists(st.sampled_from(RJ_NAMES), min_size=1, max_size=6, unique=True))
    mpi = draw(st.booleans())
    if mpi and draw(st.booleans()):
        names = list(dict.fromkeys(["launcher", "node", *names]))
    jobs = []
    for i, name in enumerate(names):
        deps: list[tuple[str, str]] = []
        candidates = names if sloppy else names[:i]  # later names may make cycles
        if candidates:
            deps = [
                (draw(st.sampled_from(candidates)), draw(st.sampled_from(["Ready", "Complete"])))
                for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2])))
            ]
            deps = list(dict(deps).items())  # one edge per prerequisite
        jobs.append(
            rj(
                name,
                ancestor=draw(st.sampled_from([None, "trainer", "dataset-initializer"])),
                replicas=count(draw, [None, 1, 2, 3] + ([0] if sloppy else []), sloppy),
                parallelism=count(draw, [None, 1, 2, 4] + ([0] if sloppy else []), sloppy),
                depends=[d for d in deps if d[0] != name],
                priority_class=draw(st.sampled_from([None, None, "high"] if sloppy else [None])),
            )
        )
    ml: Json = {"numNodes": count(draw, [1, 2, 3, 4], sloppy)} if draw(st.booleans()) else {}
    if mpi:
        ml["mpi"] = {"runLauncherAsNode": draw(st.booleans())}
    else:
        ml["torch"] = {}
    spec: Json = {"template": {"spec": {"replicatedJobs": jobs}}}
    if draw(st.integers(0, 4)):  # now and then no mlPolicy at all
        spec["mlPolicy"] = ml
    if draw(st.booleans()):
        spec["template"]["spec"]["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
    level = draw(st.sampled_from(["none", "one", "entries"]))
    if level == "one":
        spec["scheduling"] = draw(group_settings(sloppy))
    elif level == "entries":
        pool = list(draw(st.permutations(names)))
        entries: list[Json] = []
        while pool and (not entries or draw(st.booleans())):
            k = draw(st.integers(1, min(3, len(pool))))
            targets, pool = pool[:k], pool[k:]
            if draw(st.booleans()):
                entry: Json = {
                    "targetReplicatedJobs": targets[:1],
                    "job": draw(group_settings(sloppy)),
                }
                pool = targets[1:] + pool
            else:
                entry = {"targetReplicatedJobs": targets, **draw(group_settings(sloppy))}
            entries.append(entry)
        if sloppy and draw(st.integers(0, 4)) == 0:
            entries.append({"targetReplicatedJobs": [draw(st.sampled_from(RJ_NAMES))]})
        spec["scheduling"] = {"replicatedJobs": entries}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "generated"},
        "spec": spec,
    }


dns1035 = st.from_regex(r"\A[a-z]([-a-z0-9]{0,61}[a-z0-9])?\Z")


@st.composite
def trainjobs(draw: st.DrawFn) -> Json:
    spec: Json = {"runtimeRef": {"name": "generated"}}
    num_nodes = count(draw, [None, 0, 1, 2, 3, 8, 100], sloppy=True)
    if num_nodes is not None:
        spec["trainer"] = {"numNodes": num_nodes}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": draw(dns1035),
            "namespace": draw(st.sampled_from(["default", "team-a", "n" * 63])),
            "uid": "00000000-0000-0000-0000-000000000001",
        },
        "spec": spec,
    }


def _plan(raw_runtime: Json, raw_trainjob: Json) -> Plan | None:
    return build_plan(TrainJob.model_validate(raw_trainjob), Runtime.model_validate(raw_runtime))


@settings(max_examples=300, deadline=None)
@given(runtimes(), trainjobs())
def test_validation_and_planning_agree_and_never_crash(
    raw_runtime: Json, raw_trainjob: Json
) -> None:
    verdict = validate_runtime(raw_runtime)
    runtime = Runtime.model_validate(raw_runtime)
    tj_verdict = validate_trainjob(raw_trainjob, runtime)
    valid = verdict.allowed and tj_verdict.allowed
    event(f"valid={valid}")
    assert all(len(w) <= 120 for w in verdict.warnings), verdict.warnings
    try:
        plan = _plan(raw_runtime, raw_trainjob)
    except PlanningError as exc:
        assert not valid, f"validation passed but planning failed: {exc}"
        assert exc.errors
        return
    assert valid, [str(e) for e in verdict.errors + tj_verdict.errors]
    assert (plan is None) == ("scheduling" not in raw_runtime["spec"])
    if plan is not None:
        _check_plan(plan, raw_runtime, raw_trainjob)


def _num_nodes(raw_trainjob: Json) -> int | None:
    num_nodes: int | None = (raw_trainjob["spec"].get("trainer") or {}).get("numNodes")
    return num_nodes


def _never_runs(plan: Plan, raw_runtime: Json, num_nodes: int | None) -> set[str]:
    """Plays JobSet and kube-scheduler forward, apart from the planner's own reasoning: a Job's
    pods are created once all its prerequisites run; a gang is admitted once at least minCount
    of its pods exist; a pod of a gang runs once its gang is admitted. Returns what never runs."""
    jobset = raw_runtime["spec"]["template"]["spec"]
    jobs = jobset["replicatedJobs"]
    prereqs = {j["name"]: {d["name"] for d in j.get("dependsOn", [])} for j in jobs}
    if (jobset.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder":
        for before, after in itertools.pairwise(jobs):
            prereqs[after["name"]].add(before["name"])
    counts = reference.pods_per_job(raw_runtime, num_nodes)
    running: set[str] = set()
    while True:
        created = {name for name, deps in prereqs.items() if deps <= running}
        blocked: set[str] = set()
        for g in plan.groups:
            if g.policy != "gang":
                continue
            present = tuple(m for m in g.replicated_jobs if m in created)
            existing = (
                reference.group_pods(counts, present, g.job_index is not None) if present else 0
            )
            if existing < (g.min_count or 0):
                blocked.update(g.replicated_jobs)
        now = created - blocked
        if now == running:
            return set(prereqs) - running
        running = now


def _check_plan(plan: Plan, raw_runtime: Json, raw_trainjob: Json) -> None:
    """Every property of a plan, judged by the reference reading of the spec."""
    num_nodes = _num_nodes(raw_trainjob)
    counts = reference.pods_per_job(raw_runtime, num_nodes)
    templates = [g.template_name for g in plan.groups]
    pod_groups = [g.pod_group_name for g in plan.groups]
    assert len(set(templates)) == len(templates)
    assert len(set(pod_groups)) == len(pod_groups)
    for name in [plan.workload_name, *templates, *pod_groups]:
        assert dns_label(name), name
    for g in plan.groups:
        pods = reference.group_pods(counts, g.replicated_jobs, g.job_index is not None)
        assert g.pod_count == pods
        if g.policy == "gang":
            assert g.min_count is not None and 1 <= g.min_count <= pods
            if not g.joins_later:
                assert g.min_count == pods
        else:
            assert g.min_count is None
    # Every pod of the TrainJob is in exactly one group, or none when untargeted.
    for job in raw_runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        replicas = job.get("replicas", 1)
        # The first Jobs and the last (replicas may be 2**31 - 1: the check must not loop).
        for index in sorted({i for i in (0, 1, 2, replicas - 1) if 0 <= i < replicas}):
            holders = [
                g
                for g in plan.groups
                if job["name"] in g.replicated_jobs and g.job_index in (None, index)
            ]
            expected = 0 if job["name"] in plan.untargeted else 1
            assert len(holders) == expected, (job["name"], index, holders)
            labels = {
                "jobset.sigs.k8s.io/jobset-name": plan.trainjob_name,
                "jobset.sigs.k8s.io/replicatedjob-name": job["name"],
                "jobset.sigs.k8s.io/job-index": str(index),
            }
            found = pod_group_for_labels(plan, labels)
            assert found == (holders[0].pod_group_name if holders else None)
    # The objects carry what the runtime asked for, and the API accepts them.
    parent = {("Workload", plan.workload_name): "00000000-0000-0000-0000-000000000002"}
    objects = NativeBackend().render(plan, Context(), parent)
    assert objects_errors(objects) == []
    by_name = templates_of(objects[0])  # flat, or the leaves of a tree
    for g in plan.groups:
        template = by_name[g.template_name]
        want = reference.expected_template_fields(
            reference.group_settings(raw_runtime, g.replicated_jobs, g.job_index is not None)
        )
        assert list(template["schedulingPolicy"]) == [want["policy"]]
        for key in ("schedulingConstraints", "disruptionMode", "resourceClaims"):
            assert template.get(key) == want[key], key
    # No deadlock: every ReplicatedJob with pods eventually runs.
    if all(per_job * replicas > 0 for per_job, replicas in counts.values()):
        assert _never_runs(plan, raw_runtime, num_nodes) == set()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(runtimes(sloppy=False), trainjobs())
def test_valid_input_plans_to_objects_the_api_accepts(
    raw_runtime: Json, raw_trainjob: Json
) -> None:
    assume("scheduling" in raw_runtime["spec"])
    assume(validate_runtime(raw_runtime).allowed)
    assume(validate_trainjob(raw_trainjob, Runtime.model_validate(raw_runtime)).allowed)
    plan = _plan(raw_runtime, raw_trainjob)
    assert plan is not None
    event(f"levels={sorted({g.kind.name for g in plan.groups})}")
    _check_plan(plan, raw_runtime, raw_trainjob)
    # Stable: the same inputs, freshly parsed, give the same plan.
    assert _plan(copy.deepcopy(raw_runtime), copy.deepcopy(raw_trainjob)) == plan


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
scheduling_keys = st.sampled_from(
    [
        "schedulingPolicy",
        "schedulingConstraints",
        "disruptionMode",
        "resourceClaims",
        "replicatedJobs",
        "targetReplicatedJobs",
        "job",
        "gang",
        "basic",
        "topology",
        "minCount",
    ]
)
garbage = st.recursive(
    json_values,
    lambda inner: st.dictionaries(scheduling_keys, inner, max_size=4) | st.lists(inner, max_size=3),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(runtimes(), garbage, trainjobs())
def test_garbage_scheduling_never_crashes(raw_runtime: Json, junk: Any, raw_trainjob: Json) -> None:
    raw_runtime["spec"]["scheduling"] = junk
    verdict = validate_runtime(raw_runtime)
    if verdict.allowed:
        # What validates must plan.
        runtime = Runtime.model_validate(raw_runtime)
        if validate_trainjob(raw_trainjob, runtime).allowed:
            plan = _plan(raw_runtime, raw_trainjob)
            if plan is not None:
                _check_plan(plan, raw_runtime, raw_trainjob)


@st.composite
def gang_pipelines(draw: st.DrawFn) -> Json:
    """Runtimes of gang entries whose members wait on other entries' members: where deadlocks
    between gangs hide. dependsOn points backwards only (acyclic) and across groups."""
    names = draw(st.lists(st.sampled_from(RJ_NAMES[:8]), min_size=2, max_size=6, unique=True))
    count = draw(st.sampled_from([2, 2, 3]))
    group_of = {n: draw(st.integers(0, count - 1)) for n in names}
    jobs = []
    for i, name in enumerate(names):
        others = [d for d in names[:i] if group_of[d] != group_of[name]]
        deps = draw(st.lists(st.sampled_from(others), max_size=1)) if others else []
        status = draw(st.sampled_from(["Ready", "Complete"]))
        jobs.append(
            rj(name, parallelism=draw(st.integers(1, 3)), depends=[(d, status) for d in deps])
        )
    groups = [[n for n in names if group_of[n] == g] for g in range(count)]
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "generated"},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "scheduling": {"replicatedJobs": [{"targetReplicatedJobs": g} for g in groups if g]},
            "template": {"spec": {"replicatedJobs": jobs}},
        },
    }


@settings(max_examples=400, deadline=None)
@given(gang_pipelines())
def test_gangs_that_validate_never_wait_on_each_other(raw_runtime: Json) -> None:
    verdict = validate_runtime(raw_runtime)
    stuck = any("could never start" in str(e) for e in verdict.errors)
    event("rejected: gangs wait on each other" if stuck else f"valid={verdict.allowed}")
    if verdict.allowed:
        raw_trainjob = {"metadata": {"name": "job"}, "spec": {"runtimeRef": {"name": "generated"}}}
        plan = _plan(raw_runtime, raw_trainjob)
        assert plan is not None
        _check_plan(plan, raw_runtime, raw_trainjob)
        assert _never_runs(plan, raw_runtime, None) == set()


def depth_of(value: Any) -> int:
    """Nesting depth in objects and lists, counted apart from the service's own walk."""
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    return 0


def containers(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The paths of every object in `value` (where a key can be added)."""
    found = [path] if isinstance(value, dict) else []
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in items:
        found += containers(child, (*path, key))
    return found


@settings(max_examples=200, deadline=None)
@given(runtimes(), trainjobs(), st.data())
def test_deep_values_anywhere_are_denied_never_crash(
    raw_runtime: Json, raw_trainjob: Json, data: st.DataObject
) -> None:
    """A value nested up to a few hundred levels put anywhere in a runtime or TrainJob: no
    exception, and denied (naming the depth) exactly when the object nests deeper than 64."""
    target = data.draw(st.sampled_from(["runtime", "trainjob"]))
    obj = raw_runtime if target == "runtime" else raw_trainjob
    where = data.draw(st.sampled_from(containers(obj)))
    value: Any = data.draw(st.sampled_from([0, "x", [], {}]))
    for _ in range(data.draw(st.sampled_from([1, 30, 55, 62, 63, 64, 65, 100, 300]))):
        value = {"a": value} if data.draw(st.booleans()) else [value]
    parent = obj
    for key in where:
        parent = parent[key]
    parent[data.draw(st.sampled_from(["deep", "scheduling", "numNodes", "labels"]))] = value
    too_deep = depth_of(obj) > 64
    runtime_verdict = validate_runtime(raw_runtime)
    runtime = Runtime.model_validate(raw_runtime) if target == "trainjob" else None
    verdict = runtime_verdict if target == "runtime" else validate_trainjob(raw_trainjob, runtime)
    if too_deep:
        assert not verdict.allowed
        assert any("nested more than 64 levels deep" in str(e) for e in verdict.errors)
    event(f"{target} too deep={too_deep} allowed={verdict.allowed}")

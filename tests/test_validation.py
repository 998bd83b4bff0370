"""Every validation rule: one valid and one invalid case, with the path and the message checked."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from tests.builders import Json, rj, runtime, torch_node, trainjob
from webhook.core.errors import ErrorType, render
from webhook.core.fields import parse
from webhook.core.trainer import Runtime
from webhook.core.validation import check_stored_runtime, validate_runtime, validate_trainjob

ZONE = {"topology": [{"key": "topology.kubernetes.io/zone"}]}
CLAIM = {"name": "slice", "resourceClaimTemplateName": "tpu-slice"}


def entries(*items: Json) -> Json:
    return {"replicatedJobs": list(items)}


def target(*names: str, **fields: Any) -> Json:
    return {"targetReplicatedJobs": list(names), **fields}


def two_jobs(scheduling: Json, **kw: Any) -> Json:
    return runtime(rj("init"), torch_node(), scheduling=scheduling, **kw)


@dataclass
class Rule:
    id: str
    valid: Json
    invalid: Json
    path: str
    type: ErrorType
    message: str
    old: Json | None = None


def in_order(raw: Json) -> Json:
    raw["spec"]["template"]["spec"]["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
    return raw


def with_preemption(raw: Json, **policies: list[int]) -> Json:
    """Sets pod templates' preemptionPolicy: with_preemption(rt, Never=[0, 1])."""
    jobs = raw["spec"]["template"]["spec"]["replicatedJobs"]
    for policy, indexes in policies.items():
        for i in indexes:
            jobs[i]["template"]["spec"]["template"]["spec"]["preemptionPolicy"] = policy
    return raw


def with_failure_policy(raw: Json, action: str, strategy: str | None = None) -> Json:
    """`raw` whose JobSet fails a Job by `action` (its second rule: the first is FailJobSet)."""
    out = copy.deepcopy(raw)
    policy: Json = {"rules": [{"action": "FailJobSet"}, {"action": action}]}
    if strategy is not None:
        policy["restartStrategy"] = strategy
    out["spec"]["template"]["spec"]["failurePolicy"] = policy
    return out


def with_jobset_scheduling(raw: Json) -> Json:
    raw["spec"]["template"]["spec"]["scheduling"] = {"schedulingPolicy": {"gang": {}}}
    return raw


def pod_path(index: int, field: str) -> str:
    return f"spec.template.spec.replicatedJobs[{index}].template.spec.template.spec.{field}"


def _many_rjs(n: int) -> list[Json]:
    return [rj(f"job{i}") for i in range(n)]


RULES = [
    Rule(
        "scheduling-xor-podgrouppolicy",
        runtime(torch_node(), podGroupPolicy={"coscheduling": {}}),
        runtime(torch_node(), scheduling={}, podGroupPolicy={"coscheduling": {}}),
        "spec.scheduling",
        ErrorType.FORBIDDEN,
        "scheduling and podGroupPolicy are mutually exclusive; remove podGroupPolicy",
    ),
    Rule(
        "tree-root-holds-no-claims",
        # Levels combined make a tree; its TrainJob level is a composite, which holds no claims.
        two_jobs(entries(target("init", "node")) | {"schedulingConstraints": ZONE}),
        two_jobs(entries(target("init", "node")) | {"resourceClaims": [CLAIM]}),
        "spec.scheduling.resourceClaims",
        ErrorType.FORBIDDEN,
        "the TrainJob level of a multi-level runtime is a CompositePodGroup, which holds no "
        "resource claims",
    ),
    Rule(
        "target-exists",
        two_jobs(entries(target("node"))),
        two_jobs(entries(target("nodes"))),
        "spec.scheduling.replicatedJobs[0].targetReplicatedJobs[0]",
        ErrorType.INVALID,
        '"nodes": no ReplicatedJob of that name in spec.template (it has: init, node)',
    ),
    Rule(
        "targeted-once",
        two_jobs(entries(target("init"), target("node"))),
        two_jobs(entries(target("init", "node"), target("node"))),
        "spec.scheduling.replicatedJobs[1].targetReplicatedJobs[0]",
        ErrorType.DUPLICATE,
        "a ReplicatedJob must not be targeted by more than one replicatedJobs entry",
    ),
    Rule(
        "target-listed-once-per-entry",
        two_jobs(entries(target("init", "node"))),
        two_jobs(entries(target("node", "node"))),
        "spec.scheduling.replicatedJobs[0].targetReplicatedJobs[1]",
        ErrorType.DUPLICATE,
        "list each ReplicatedJob once per entry",
    ),
    Rule(
        "targets-required",
        two_jobs(entries(target("node"))),
        two_jobs(entries(target())),
        "spec.scheduling.replicatedJobs[0].targetReplicatedJobs",
        ErrorType.REQUIRED,
        "name the ReplicatedJobs this entry schedules",
    ),
    Rule(
        "entries-required",
        two_jobs({}),
        two_jobs(entries()),
        "spec.scheduling.replicatedJobs",
        ErrorType.REQUIRED,
        "remove it to schedule the whole TrainJob as one group",
    ),
    Rule(
        "at-most-8-entries",
        runtime(*_many_rjs(8), scheduling=entries(*(target(f"job{i}") for i in range(8)))),
        runtime(*_many_rjs(9), scheduling=entries(*(target(f"job{i}") for i in range(9)))),
        "spec.scheduling.replicatedJobs",
        ErrorType.TOO_MANY,
        "9: must have at most 8 items",
    ),
    Rule(
        "at-most-8-targets",
        runtime(*_many_rjs(8), scheduling=entries(target(*(f"job{i}" for i in range(8))))),
        runtime(*_many_rjs(9), scheduling=entries(target(*(f"job{i}" for i in range(9))))),
        "spec.scheduling.replicatedJobs[0].targetReplicatedJobs",
        ErrorType.TOO_MANY,
        "9: must have at most 8 items",
    ),
    Rule(
        "policy-exactly-one",
        two_jobs({"schedulingPolicy": {"basic": {}}}),
        two_jobs({"schedulingPolicy": {"basic": {}, "gang": {}}}),
        "spec.scheduling.schedulingPolicy",
        ErrorType.INVALID,
        "set exactly one of basic: {} (pod by pod) or gang: {} (all or nothing)",
    ),
    Rule(
        "policy-not-empty",
        two_jobs(entries(target("node", schedulingPolicy={"gang": {}}))),
        two_jobs(entries(target("node", schedulingPolicy={}))),
        "spec.scheduling.replicatedJobs[0].schedulingPolicy",
        ErrorType.INVALID,
        "set exactly one of basic",
    ),
    Rule(
        "mincount-forbidden-level-1",
        two_jobs({"schedulingPolicy": {"gang": {}}}),
        two_jobs({"schedulingPolicy": {"gang": {"minCount": 4}}}),
        "spec.scheduling.schedulingPolicy.gang.minCount",
        ErrorType.FORBIDDEN,
        "gang.minCount is computed from numNodes and must not be set; remove it",
    ),
    Rule(
        "mincount-forbidden-level-2",
        two_jobs(entries(target("node", schedulingPolicy={"gang": {}}))),
        two_jobs(entries(target("node", schedulingPolicy={"gang": {"minCount": 2}}))),
        "spec.scheduling.replicatedJobs[0].schedulingPolicy.gang.minCount",
        ErrorType.FORBIDDEN,
        "gang.minCount is computed from numNodes and must not be set",
    ),
    Rule(
        "mincount-forbidden-level-3",
        two_jobs(entries(target("node", job={"schedulingPolicy": {"gang": {}}}))),
        two_jobs(entries(target("node", job={"schedulingPolicy": {"gang": {"minCount": 2}}}))),
        "spec.scheduling.replicatedJobs[0].job.schedulingPolicy.gang.minCount",
        ErrorType.FORBIDDEN,
        "gang.minCount is computed from numNodes and must not be set",
    ),
    Rule(
        "one-topology-constraint",
        two_jobs({"schedulingConstraints": ZONE}),
        two_jobs(
            {
                "schedulingConstraints": {
                    "topology": [{"key": "topology.kubernetes.io/zone"}, {"key": "rack"}]
                }
            }
        ),
        "spec.scheduling.schedulingConstraints.topology",
        ErrorType.TOO_MANY,
        "2: must have at most 1 items; keep one topology key per group",
    ),
    Rule(
        "topology-key-valid",
        two_jobs({"schedulingConstraints": {"topology": [{"key": "example.com/rack_1"}]}}),
        two_jobs({"schedulingConstraints": {"topology": [{"key": "Example.com/rack"}]}}),
        "spec.scheduling.schedulingConstraints.topology[0].key",
        ErrorType.INVALID,
        '"Example.com/rack": must be a node label key',
    ),
    Rule(
        "topology-key-name-at-most-63",
        two_jobs({"schedulingConstraints": {"topology": [{"key": "example.com/" + "r" * 63}]}}),
        two_jobs({"schedulingConstraints": {"topology": [{"key": "example.com/" + "r" * 64}]}}),
        "spec.scheduling.schedulingConstraints.topology[0].key",
        ErrorType.INVALID,
        "must be a node label key",
    ),
    Rule(
        "topology-key-required",
        two_jobs({"schedulingConstraints": ZONE}),
        two_jobs({"schedulingConstraints": {"topology": [{}]}}),
        "spec.scheduling.schedulingConstraints.topology[0].key",
        ErrorType.REQUIRED,
        "name a node label key such as topology.kubernetes.io/zone",
    ),
    Rule(
        "at-most-4-claims",
        two_jobs(
            entries(
                target(
                    "node",
                    resourceClaims=[{"name": f"c{i}", "resourceClaimName": "x"} for i in range(4)],
                )
            )
        ),
        two_jobs(
            entries(
                target(
                    "node",
                    resourceClaims=[{"name": f"c{i}", "resourceClaimName": "x"} for i in range(5)],
                )
            )
        ),
        "spec.scheduling.replicatedJobs[0].resourceClaims",
        ErrorType.TOO_MANY,
        "5: must have at most 4 items; a PodGroup shares at most 4 claims",
    ),
    Rule(
        "claim-one-source",
        two_jobs({"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpus"}]}),
        two_jobs(
            {
                "resourceClaims": [
                    {"name": "gpu", "resourceClaimTemplateName": "g", "resourceClaimName": "h"}
                ]
            }
        ),
        "spec.scheduling.resourceClaims[0]",
        ErrorType.INVALID,
        "set exactly one of resourceClaimName or resourceClaimTemplateName",
    ),
    Rule(
        "claim-name-dns-label",
        two_jobs({"resourceClaims": [{"name": "gpu", "resourceClaimName": "gpus"}]}),
        two_jobs({"resourceClaims": [{"name": "GPU", "resourceClaimName": "gpus"}]}),
        "spec.scheduling.resourceClaims[0].name",
        ErrorType.INVALID,
        '"GPU": must be a DNS label',
    ),
    Rule(
        "claim-name-required",
        two_jobs({"resourceClaims": [{"name": "gpu", "resourceClaimName": "gpus"}]}),
        two_jobs({"resourceClaims": [{"resourceClaimName": "gpus"}]}),
        "spec.scheduling.resourceClaims[0].name",
        ErrorType.REQUIRED,
        "name the claim (a DNS label)",
    ),
    Rule(
        "claim-source-dns-subdomain",
        two_jobs({"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "tpu.slice-1"}]}),
        two_jobs({"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "TPU_slice"}]}),
        "spec.scheduling.resourceClaims[0].resourceClaimTemplateName",
        ErrorType.INVALID,
        '"TPU_slice": must be a DNS subdomain',
    ),
    Rule(
        "claim-names-unique",
        two_jobs(
            {
                "resourceClaims": [
                    {"name": "a", "resourceClaimName": "x"},
                    {"name": "b", "resourceClaimName": "x"},
                ]
            }
        ),
        two_jobs(
            {
                "resourceClaims": [
                    {"name": "a", "resourceClaimName": "x"},
                    {"name": "a", "resourceClaimName": "y"},
                ]
            }
        ),
        "spec.scheduling.resourceClaims[1].name",
        ErrorType.DUPLICATE,
        "claim names must be unique",
    ),
    Rule(
        "disruption-mode-one-of",
        two_jobs({"disruptionMode": {"all": {}}}),
        two_jobs({"disruptionMode": {}}),
        "spec.scheduling.disruptionMode",
        ErrorType.INVALID,
        "set exactly one of single: {} (pods disrupted one by one) or all: {}",
    ),
    Rule(
        "at-most-8-templates-after-level-3",
        runtime(torch_node(replicas=8), scheduling=entries(target("node", job={}))),
        runtime(torch_node(replicas=9), scheduling=entries(target("node", job={}))),
        # The entry's job makes the templates: the message names what it counts (its
        # replicatedJobs list has one item, not 9).
        "spec.scheduling.replicatedJobs[0].job",
        ErrorType.TOO_MANY,
        "9 PodGroup templates, and a Workload holds at most 8; a job entry makes one per Job, "
        'and "node" has replicas 9: lower its replicas, or remove job',
    ),
    Rule(
        "job-needs-one-target",
        two_jobs(entries(target("node", job={}))),
        two_jobs(entries(target("init", "node", job={}))),
        "spec.scheduling.replicatedJobs[0].targetReplicatedJobs",
        ErrorType.INVALID,
        "an entry with job must target exactly one ReplicatedJob",
    ),
    Rule(
        "tree-entry-holds-no-claims",
        # An entry with job and fields of its own is a gang of its Jobs' groups (a composite).
        two_jobs(entries(target("node", job={}, schedulingConstraints=ZONE))),
        two_jobs(entries(target("node", job={}, resourceClaims=[CLAIM]))),
        "spec.scheduling.replicatedJobs[0].resourceClaims",
        ErrorType.FORBIDDEN,
        "with job, this entry is a CompositePodGroup over its Jobs' groups, which holds no "
        "resource claims; move them under job",
    ),
    Rule(
        "tree-composite-width",
        runtime(
            rj("init"),
            torch_node(replicas=8),
            scheduling=entries(target("node", job={}, schedulingConstraints=ZONE)),
        ),
        runtime(
            rj("init"),
            torch_node(replicas=9),
            scheduling=entries(target("node", job={}, schedulingConstraints=ZONE)),
        ),
        "spec.scheduling.replicatedJobs[0].job",
        ErrorType.TOO_MANY,
        '9 Job groups, and a composite holds at most 8; this entry is a gang of "node"\'s Jobs',
    ),
    Rule(
        "tree-gang-of-groups-never-together",
        two_jobs(
            entries(target("init"), target("node"))
            | {"schedulingPolicy": {"basic": {}}, "schedulingConstraints": ZONE},
        ),
        runtime(
            rj("init"),
            torch_node(depends=[("init", "Complete")]),
            scheduling=entries(target("init"), target("node"))
            | {"schedulingPolicy": {"gang": {}}, "schedulingConstraints": ZONE},
        ),
        "spec.scheduling",
        ErrorType.INVALID,
        '"node" starts only after "init" is Complete, so these groups never run together',
    ),
    Rule(
        "jobset-scheduling-owned",
        with_jobset_scheduling(runtime(torch_node())),
        with_jobset_scheduling(runtime(torch_node(), scheduling={})),
        "spec.template.spec.scheduling",
        ErrorType.FORBIDDEN,
        "JobSet scheduling must not be set, it is owned by the TrainJob controller",
    ),
    Rule(
        "restart-job-recreates-one-job-of-a-gang",
        # RestartJobSet (and InPlaceRestart, pods restarted where they are bound) restart a gang
        # whole; the same RestartJob without spec.scheduling is no gang's business.
        with_failure_policy(
            runtime(torch_node(), scheduling={}), "RestartJobSet", "InPlaceRestart"
        ),
        with_failure_policy(runtime(torch_node(), scheduling={}), "RestartJob"),
        "spec.template.spec.failurePolicy.rules[1].action",
        ErrorType.INVALID,
        "RestartJob recreates one Job of a running gang, whose new pods would join a gang the "
        "scheduler already admitted",
    ),
    Rule(
        "job-scheduling-owned",
        runtime(torch_node(job_scheduling={"schedulingPolicy": {"gang": {}}})),
        runtime(torch_node(job_scheduling={"schedulingPolicy": {"gang": {}}}), scheduling={}),
        "spec.template.spec.replicatedJobs[0].template.spec.scheduling",
        ErrorType.FORBIDDEN,
        "Job scheduling must not be set, it is owned by the TrainJob controller",
    ),
    Rule(
        "pod-scheduling-group-owned",
        runtime(torch_node(scheduling_group={"podGroupName": "x"})),
        runtime(torch_node(scheduling_group={"podGroupName": "x"}), scheduling={}),
        "spec.template.spec.replicatedJobs[0].template.spec.template.spec.schedulingGroup",
        ErrorType.FORBIDDEN,
        "Pod schedulingGroup must not be set, it is owned by the TrainJob controller",
    ),
    Rule(
        "replicated-job-name-at-most-20",
        runtime(rj("a" * 20), scheduling={}),
        runtime(rj("a" * 21), scheduling={}),
        "spec.template.spec.replicatedJobs[0].name",
        ErrorType.TOO_LONG,
        "may not be more than 20 characters; Trainer v2.4 caps ReplicatedJob names",
    ),
    Rule(
        "replicated-job-name-dns-label",
        runtime(rj("node-1"), scheduling={}),
        runtime(rj("Node_1"), scheduling={}),
        "spec.template.spec.replicatedJobs[0].name",
        ErrorType.INVALID,
        '"Node_1": must be a DNS label',
    ),
    Rule(
        "replicated-job-names-unique",
        runtime(rj("a"), rj("b"), scheduling={}),
        runtime(rj("a"), rj("a"), scheduling={}),
        "spec.template.spec.replicatedJobs[1].name",
        ErrorType.DUPLICATE,
        "ReplicatedJob names must be unique",
    ),
    Rule(
        "complete-dependency-inside-level-2-gang",
        runtime(
            rj("init"),
            torch_node(depends=[("init", "Complete")]),
            scheduling=entries(target("init", schedulingPolicy={"basic": {}}), target("node")),
        ),
        runtime(
            rj("init"),
            torch_node(depends=[("init", "Complete")]),
            scheduling=entries(target("init", "node")),
        ),
        "spec.scheduling.replicatedJobs[0].targetReplicatedJobs",
        ErrorType.INVALID,
        '"node" starts only after "init" is Complete, so their pods never run together and one '
        'gang would wait forever; give "init" its own replicatedJobs entry (typically basic)',
    ),
    Rule(
        "complete-dependency-through-a-chain",
        # "c" waits for "b" Ready, "b" for "a" Complete: "a" is gone before "c" exists.
        runtime(
            rj("a"),
            rj("b", depends=[("a", "Complete")]),
            rj("c", depends=[("b", "Ready")]),
            scheduling=entries(target("a", schedulingPolicy={"basic": {}}), target("b", "c")),
        ),
        runtime(
            rj("a"),
            rj("b", depends=[("a", "Complete")]),
            rj("c", depends=[("b", "Ready")]),
            scheduling=entries(target("a", "c"), target("b", schedulingPolicy={"basic": {}})),
        ),
        "spec.scheduling.replicatedJobs[0].targetReplicatedJobs",
        ErrorType.INVALID,
        '"c" starts only after "a" is Complete',
    ),
    Rule(
        "level-1-split-cannot-share-claims",
        runtime(
            rj("init"),
            torch_node(depends=[("init", "Ready")]),
            scheduling={"resourceClaims": [{"name": "c", "resourceClaimName": "x"}]},
        ),
        runtime(
            rj("init"),
            torch_node(depends=[("init", "Complete")]),
            scheduling={"resourceClaims": [{"name": "c", "resourceClaimName": "x"}]},
        ),
        "spec.scheduling.resourceClaims",
        ErrorType.FORBIDDEN,
        "a TrainJob-wide claim cannot be shared by them; move the claims into",
    ),
    Rule(
        "one-priority-class-per-group",
        runtime(
            rj("init", priority_class="high"), torch_node(priority_class="high"), scheduling={}
        ),
        runtime(rj("init", priority_class="low"), torch_node(priority_class="high"), scheduling={}),
        # As JobSet's webhook: at level 1, the pod template field of each that differs from
        # the first.
        pod_path(1, "priorityClassName"),
        ErrorType.INVALID,
        '"high": must match "low" of "init": the whole TrainJob is one PodGroup, whose pods '
        "share one priorityClassName",
    ),
    Rule(
        "one-priority-class-per-entry",
        # In an entry, the target that differs from the entry's first (JobSet's webhook).
        runtime(
            rj("init", priority_class="low"),
            rj("eval", priority_class="low"),
            torch_node(priority_class="high"),
            scheduling=entries(target("init", "eval"), target("node")),
        ),
        runtime(
            rj("init", priority_class="low"),
            rj("eval", priority_class="low"),
            torch_node(priority_class="high"),
            scheduling=entries(target("init", "node", "eval")),
        ),
        "spec.scheduling.replicatedJobs[0].targetReplicatedJobs[1]",
        ErrorType.INVALID,
        '"node": its pods\' priorityClassName "high" must match "low" of "init": pods of one '
        'PodGroup share one priorityClassName; give them the same one or put "node" in an '
        "entry of its own",
    ),
    Rule(
        "one-scheduler-per-group",
        runtime(rj("init"), torch_node(), scheduling=entries(target("init"), target("node"))),
        runtime(
            rj("init", scheduler="volcano"),
            torch_node(),
            scheduling=entries(target("init", "node")),
        ),
        # Only the pod template can fix a scheduler: it is named there, in an entry too.
        pod_path(1, "schedulerName"),
        ErrorType.INVALID,
        '"default-scheduler": must match "volcano" of "init": one TrainJob\'s groups are made '
        "for one scheduler",
    ),
    Rule(
        "one-scheduler-across-entries",
        runtime(rj("init"), torch_node(), scheduling=entries(target("init"), target("node"))),
        runtime(
            rj("init"),
            torch_node(scheduler="kai-scheduler"),
            scheduling=entries(target("init"), target("node")),
        ),
        pod_path(1, "schedulerName"),
        ErrorType.INVALID,
        '"kai-scheduler": must match "default-scheduler" of "init"',
    ),
    Rule(
        "one-preemption-policy-per-group",
        with_preemption(runtime(rj("init"), torch_node(), scheduling={}), Never=[0, 1]),
        with_preemption(runtime(rj("init"), torch_node(), scheduling={}), Never=[0]),
        pod_path(1, "preemptionPolicy"),
        ErrorType.INVALID,
        '"": must match "Never" of "init": the whole TrainJob is one PodGroup, whose pods share '
        "one preemptionPolicy",
    ),
    Rule(
        "gangs-must-not-wait-on-each-other",
        # [a, b] needs b, b waits for c; [c, d] needs d, d waits for a: neither gang can start.
        # (Each depends on one listed before it, as JobSet requires.)
        runtime(
            rj("c"),
            rj("a"),
            rj("b", depends=[("c", "Ready")]),
            rj("d", depends=[("a", "Ready")]),
            scheduling=entries(target("a", "b", "c", "d")),
        ),
        runtime(
            rj("c"),
            rj("a"),
            rj("b", depends=[("c", "Ready")]),
            rj("d", depends=[("a", "Ready")]),
            scheduling=entries(target("a", "b"), target("c", "d")),
        ),
        "spec.scheduling.replicatedJobs",
        ErrorType.INVALID,
        '["a","b","c","d"]: these ReplicatedJobs could never start: each waits, through '
        "dependsOn, for a gang that itself waits for one of them",
    ),
    Rule(
        "gangs-must-not-wait-on-each-other-complete",
        runtime(
            rj("a"),
            rj("b"),
            rj("c", depends=[("b", "Complete")]),
            rj("d", depends=[("a", "Complete")]),
            scheduling=entries(target("b"), target("c"), target("a"), target("d")),
        ),
        runtime(
            rj("a"),
            rj("b"),
            rj("c", depends=[("b", "Complete")]),
            rj("d", depends=[("a", "Complete")]),
            scheduling=entries(target("c", "a"), target("b", "d")),
        ),
        "spec.scheduling.replicatedJobs",
        ErrorType.INVALID,
        "these ReplicatedJobs could never start",
    ),
    Rule(
        "group-names-unique",
        runtime(rj("a"), rj("b"), rj("a-c"), scheduling=entries(target("a", "b"), target("a-c"))),
        runtime(rj("a"), rj("b"), rj("a-b"), scheduling=entries(target("a", "b"), target("a-b"))),
        "spec.scheduling.replicatedJobs[1].targetReplicatedJobs",
        ErrorType.DUPLICATE,
        'entry 0 already yields the group name "a-b"',
    ),
    Rule(
        "depends-on-existing",
        runtime(rj("init"), torch_node(depends=[("init", "Ready")]), scheduling={}),
        runtime(rj("init"), torch_node(depends=[("inti", "Ready")]), scheduling={}),
        "spec.template.spec.replicatedJobs[1].dependsOn[0].name",
        ErrorType.NOT_FOUND,
        '"inti": dependsOn must name a ReplicatedJob of this template',
    ),
    Rule(
        "depends-on-status",
        runtime(rj("init"), torch_node(depends=[("init", "Complete")]), scheduling={}),
        runtime(rj("init"), torch_node(depends=[("init", "Started")]), scheduling={}),
        "spec.template.spec.replicatedJobs[1].dependsOn[0].status",
        ErrorType.NOT_SUPPORTED,
        'Unsupported value: "Started": supported values: "Ready", "Complete"',
    ),
    Rule(
        "depends-on-not-self",
        runtime(rj("init"), torch_node(depends=[("init", "Ready")]), scheduling={}),
        runtime(rj("init"), torch_node(depends=[("node", "Ready")]), scheduling={}),
        "spec.template.spec.replicatedJobs[1].dependsOn[0].name",
        ErrorType.INVALID,
        '"node": a ReplicatedJob cannot depend on itself',
    ),
    Rule(
        "depends-on-not-on-the-first",
        # JobSet's webhook: "DependsOn can't be set for the first ReplicatedJob".
        runtime(rj("init"), torch_node(depends=[("init", "Ready")]), scheduling={}),
        runtime(torch_node(depends=[("init", "Ready")]), rj("init"), scheduling={}),
        "spec.template.spec.replicatedJobs[0].dependsOn",
        ErrorType.FORBIDDEN,
        'the first ReplicatedJob ("node") cannot have dependsOn: JobSet refuses the JobSet',
    ),
    Rule(
        "depends-on-one-listed-before",
        # JobSet's webhook: "replicatedJob: node cannot depend on replicatedJob: launcher".
        runtime(
            rj("init"), rj("launcher"), torch_node(depends=[("launcher", "Ready")]), scheduling={}
        ),
        runtime(
            rj("init"), torch_node(depends=[("launcher", "Ready")]), rj("launcher"), scheduling={}
        ),
        "spec.template.spec.replicatedJobs[1].dependsOn[0].name",
        ErrorType.INVALID,
        '"launcher": "launcher" is listed after "node": a ReplicatedJob may depend only on those '
        'listed before it (JobSet refuses the JobSet: "replicatedJob: node cannot depend on '
        'replicatedJob: launcher"), so no TrainJob of this runtime would start; move "launcher" '
        'above "node" in spec.template.spec.replicatedJobs',
    ),
    Rule(
        "depends-on-acyclic-with-in-order",
        in_order(runtime(rj("a"), rj("b", depends=[("a", "Ready")]), scheduling={})),
        in_order(runtime(rj("a", depends=[("b", "Ready")]), rj("b"), scheduling={})),
        "spec.template.spec.replicatedJobs[0].dependsOn",
        ErrorType.INVALID,
        "dependsOn forms a cycle, so none of these Jobs could ever start; remove one edge (InOrder "
        "startup also makes each wait for the one before it)",
    ),
    Rule(
        "depends-on-acyclic",
        runtime(rj("a"), rj("b", depends=[("a", "Ready")]), scheduling={}),
        runtime(
            rj("a", depends=[("b", "Ready")]), rj("b", depends=[("a", "Ready")]), scheduling={}
        ),
        "spec.template.spec.replicatedJobs[0].dependsOn",
        ErrorType.INVALID,
        '["a","b","a"]: dependsOn forms a cycle',
    ),
    Rule(
        "gang-needs-a-pod",
        runtime(rj("eval", parallelism=0), torch_node(), scheduling={}),
        runtime(rj("eval", parallelism=0), scheduling={}),
        "spec.template.spec.replicatedJobs[0].template.spec.parallelism",
        ErrorType.INVALID,
        '0: must be at least 1: "eval" is in a gang, and a gang needs a pod to wait for',
    ),
    Rule(
        "gang-needs-a-job",
        runtime(rj("eval", replicas=0), torch_node(), scheduling={}),
        runtime(rj("eval", replicas=0), scheduling={}),
        "spec.template.spec.replicatedJobs[0].replicas",
        ErrorType.INVALID,
        '0: must be at least 1: "eval" is in a gang, and a gang needs a pod to wait for',
    ),
    Rule(
        "group-fits-int32",
        runtime(rj("eval", parallelism=2**30, replicas=1), scheduling={}),
        runtime(rj("eval", parallelism=2**31 - 1, replicas=2), scheduling={}),
        "spec.template.spec.replicatedJobs[0]",
        ErrorType.INVALID,
        '"eval": runs 4294967294 pods in one group, more than a PodGroup can count',
    ),
    Rule(
        "replicas-not-negative",
        runtime(rj("eval", replicas=0), torch_node(), scheduling={}),
        runtime(rj("eval", replicas=-1), torch_node(), scheduling={}),
        "spec.template.spec.replicatedJobs[0].replicas",
        ErrorType.INVALID,
        "-1: must be >= 0",
    ),
    Rule(
        "parallelism-not-negative",
        runtime(rj("eval", parallelism=0), torch_node(), scheduling={}),
        runtime(rj("eval", parallelism=-2), torch_node(), scheduling={}),
        "spec.template.spec.replicatedJobs[0].template.spec.parallelism",
        ErrorType.INVALID,
        "-2: must be >= 0",
    ),
    Rule(
        "template-needs-replicated-jobs",
        runtime(rj("a"), scheduling={}),
        runtime(scheduling={}),
        "spec.template.spec.replicatedJobs",
        ErrorType.REQUIRED,
        "spec.scheduling needs at least one ReplicatedJob",
    ),
    Rule(
        "types-checked",
        two_jobs(entries(target("node"))),
        two_jobs({"replicatedJobs": [{"targetReplicatedJobs": "node"}]}),
        "spec.scheduling.replicatedJobs[0].targetReplicatedJobs",
        ErrorType.INVALID,
        '"node": must be a list',
    ),
]


@pytest.mark.parametrize("rule", RULES, ids=[r.id for r in RULES])
def test_rule(rule: Rule) -> None:
    ok = validate_runtime(rule.valid)
    assert ok.errors == (), [str(e) for e in ok.errors]

    bad = validate_runtime(rule.invalid, rule.old)
    matching = [e for e in bad.errors if e.path == rule.path and e.type is rule.type]
    assert matching, [str(e) for e in bad.errors]
    assert any(rule.message in str(e) for e in matching), [str(e) for e in matching]


def test_long_name_allowed_when_the_template_is_untouched() -> None:
    old = runtime(rj("a" * 21), scheduling={})
    new = runtime(rj("a" * 21), scheduling={"schedulingPolicy": {"basic": {}}})
    assert validate_runtime(new, old).errors == ()
    changed = runtime(rj("a" * 21, parallelism=2), scheduling={})
    assert validate_runtime(changed, old).errors[0].type is ErrorType.TOO_LONG


def test_a_stored_runtime_jobset_would_refuse_is_not_bricked() -> None:
    """JobSet's order rules are ratcheted: a runtime stored before them (its first ReplicatedJob
    has dependsOn) can still be updated, its template too, unless the update adds another such
    error; fixing the order is always allowed. A stored runtime is not judged by them at all
    (its TrainJobs' admission and the reconciler read it with `stored=True`)."""
    old = runtime(torch_node(depends=[("init", "Ready")]), rj("init"), scheduling={})
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"] = {"team": "a"}
    assert validate_runtime(relabelled, old).errors == ()
    rescheduled = runtime(
        torch_node(depends=[("init", "Ready")]), rj("init"), scheduling=entries(target("node"))
    )
    assert validate_runtime(rescheduled, old).errors == ()
    resized = runtime(
        torch_node(depends=[("init", "Ready")]), rj("init", parallelism=2), scheduling={}
    )
    assert validate_runtime(resized, old).errors == ()
    fixed = runtime(rj("init"), torch_node(depends=[("init", "Ready")]), scheduling={})
    assert validate_runtime(fixed, old).errors == ()
    worse = runtime(
        torch_node(depends=[("init", "Ready")]),
        rj("init", depends=[("eval", "Ready")]),
        rj("eval"),
        scheduling={},
    )
    (error,) = validate_runtime(worse, old).errors
    assert error.path == "spec.template.spec.replicatedJobs[1].dependsOn[0].name"
    parsed_old, _ = parse(Runtime, old)
    assert parsed_old is not None
    assert check_stored_runtime(parsed_old).verdict.errors == ()


def test_complete_dependency_inside_basic_entry_is_fine() -> None:
    rt = runtime(
        rj("init"),
        torch_node(depends=[("init", "Complete")]),
        scheduling=entries(target("init", "node", schedulingPolicy={"basic": {}})),
    )
    assert validate_runtime(rt).errors == ()


def test_message_reads_like_the_api_server() -> None:
    bad = validate_runtime(two_jobs(entries(target("init", "nodes"))))
    assert render("ClusterTrainingRuntime", "rt", bad.errors) == (
        'ClusterTrainingRuntime "rt" is invalid: '
        'spec.scheduling.replicatedJobs[0].targetReplicatedJobs[1]: Invalid value: "nodes": '
        "no ReplicatedJob of that name in spec.template (it has: init, node); fix the name"
    )


def test_runtime_without_scheduling_is_left_alone() -> None:
    assert validate_runtime(runtime(rj("node"), podGroupPolicy={"volcano": {}})).errors == ()


def test_garbage_is_a_field_error_not_a_crash() -> None:
    assert validate_runtime({}).errors == ()  # no spec.scheduling: nothing of the service's
    expected: dict[str, Json] = {
        "spec": {"spec": []},
        "spec.scheduling": {"spec": {"scheduling": "yes"}},
        "spec.template": {"spec": {"template": 3}},
    }
    for path, raw in expected.items():
        (err,) = validate_runtime(raw).errors
        assert err.path == path and "must be an object" in str(err)


# --- one mistake, one cause, at the item to fix -------------------------------------------------


def gang_of(*jobs: Json) -> Json:
    return runtime(*jobs, scheduling={})


ONE_CAUSE = {
    # JobSet's webhook: a target already taken by an earlier entry is that entry's only error.
    "targeted-twice": (
        two_jobs(entries(target("node"), target("node"))),
        ["spec.scheduling.replicatedJobs[1].targetReplicatedJobs[0]"],
    ),
    "missing-target-then-same-group-name": (
        runtime(rj("a"), rj("b"), scheduling=entries(target("a-b"), target("a", "b"))),
        ["spec.scheduling.replicatedJobs[0].targetReplicatedJobs[0]"],
    ),
    "negative-parallelism-in-a-gang": (
        gang_of(rj("eval", parallelism=-1)),
        ["spec.template.spec.replicatedJobs[0].template.spec.parallelism"],
    ),
    "negative-replicas-in-a-gang": (
        gang_of(rj("eval", replicas=-1)),
        ["spec.template.spec.replicatedJobs[0].replicas"],
    ),
    "replicas-past-int32-in-a-gang": (
        gang_of(rj("eval", replicas=2**31)),
        ["spec.template.spec.replicatedJobs[0].replicas"],
    ),
    "replicas-past-int32-with-others": (
        gang_of(rj("eval", replicas=2**31), torch_node(parallelism=5)),
        ["spec.template.spec.replicatedJobs[0].replicas"],
    ),
    "negative-replicas-of-a-job-entry": (
        runtime(torch_node(replicas=-1), scheduling=entries(target("node", job={}))),
        ["spec.template.spec.replicatedJobs[0].replicas"],
    ),
    "replicas-past-int32-of-a-job-entry": (
        runtime(torch_node(replicas=2**31), scheduling=entries(target("node", job={}))),
        ["spec.template.spec.replicatedJobs[0].replicas"],
    ),
    # One odd ReplicatedJob out is the one named, not the two that agree.
    "one-odd-priority-class-of-three": (
        gang_of(
            rj("init", priority_class="high"),
            rj("eval", priority_class="low"),
            torch_node(priority_class="high"),
        ),
        [pod_path(1, "priorityClassName")],
    ),
    # Named once, at its template, not once in its entry and again across entries.
    "one-odd-scheduler-in-and-across-entries": (
        runtime(
            rj("init", scheduler="volcano"),
            rj("eval"),
            torch_node(),
            scheduling=entries(target("init", "eval"), target("node")),
        ),
        [pod_path(0, "schedulerName")],
    ),
}


@pytest.mark.parametrize("case", ONE_CAUSE, ids=list(ONE_CAUSE))
def test_one_mistake_gives_one_cause(case: str) -> None:
    raw, paths = ONE_CAUSE[case]
    assert [e.path for e in validate_runtime(raw).errors] == paths, [
        str(e) for e in validate_runtime(raw).errors
    ]


def test_each_replicated_job_that_differs_is_named() -> None:
    rt = runtime(
        rj("a", priority_class="low"),
        rj("b", priority_class="high"),
        rj("c", priority_class="mid"),
        rj("d", priority_class="low"),
        scheduling=entries(target("a", "b", "c", "d")),
    )
    assert [str(e) for e in validate_runtime(rt).errors] == [
        f'spec.scheduling.replicatedJobs[0].targetReplicatedJobs[{i}]: Invalid value: "{t}": '
        f'its pods\' priorityClassName "{cls}" must match "low" of "a": pods of one PodGroup '
        f'share one priorityClassName; give them the same one or put "{t}" in an entry of its '
        "own"
        for i, t, cls in ((1, "b", "high"), (2, "c", "mid"))
    ]
    unset = runtime(rj("init", scheduler="volcano"), torch_node(), scheduling={})
    (err,) = validate_runtime(unset).errors
    assert str(err) == (
        f'{pod_path(1, "schedulerName")}: Invalid value: "default-scheduler": must match '
        '"volcano" of "init": one TrainJob\'s groups are made for one scheduler (its gang '
        "backend), so the pods of every scheduled ReplicatedJob name the same schedulerName"
    )


def test_an_overflow_names_each_replicated_job_of_its_group() -> None:
    full = 2**31 - 1
    pair = runtime(
        rj("a", parallelism=full), rj("b", parallelism=full), scheduling=entries(target("a", "b"))
    )
    (err,) = validate_runtime(pair).errors
    assert str(err) == (
        'spec.scheduling.replicatedJobs[0].targetReplicatedJobs: Invalid value: ["a","b"]: '
        f'together they run {2 * full} pods in one group ("a" {full}, "b" {full}), more than a '
        f"PodGroup can count ({full}); lower replicas or parallelism, or split them into several "
        "replicatedJobs entries"
    )
    whole = runtime(rj("a"), rj("b", parallelism=full), rj("c", parallelism=5), scheduling={})
    (err,) = validate_runtime(whole).errors
    assert err.path == "spec.scheduling"
    assert f'they run {full + 6} pods in one group ("a" 1, "b" {full}, "c" 5)' in str(err)
    # Only one of them runs pods: that one is the item to fix.
    alone = runtime(rj("a", replicas=0), rj("b", replicas=2, parallelism=full), scheduling={})
    (err,) = validate_runtime(alone).errors
    assert str(err).startswith(
        f'spec.template.spec.replicatedJobs[1]: Invalid value: "b": runs {2 * full} pods'
    ), str(err)


def test_a_gang_without_pods_points_at_the_count_that_is_0() -> None:
    (err,) = validate_runtime(gang_of(rj("eval", replicas=0))).errors
    assert str(err) == (
        "spec.template.spec.replicatedJobs[0].replicas: Invalid value: 0: must be at least 1: "
        '"eval" is in a gang, and a gang needs a pod to wait for; raise it, or make the gang '
        "schedulingPolicy basic"
    )
    both = runtime(
        rj("a", replicas=0), rj("b", parallelism=0), scheduling=entries(target("a", "b"))
    )
    (err,) = validate_runtime(both).errors
    assert str(err) == (
        'spec.scheduling.replicatedJobs[0].targetReplicatedJobs: Invalid value: ["a","b"]: a gang '
        'needs at least one pod, but these ReplicatedJobs run none ("a" replicas 0, "b" '
        "parallelism 0); raise one of them, or make the gang schedulingPolicy basic"
    )


# --- warnings ----------------------------------------------------------------------------------


def test_a_denied_runtime_warns_only_of_unknown_fields() -> None:
    # How a denied runtime would be scheduled is moot; a misspelt field may be why it is denied.
    typo = runtime(
        torch_node(),
        rj("eval"),
        scheduling={"replicatedJobs": [{"targetReplicatedJob": ["node"]}]},
    )
    verdict = validate_runtime(typo)
    assert [e.path for e in verdict.errors] == [
        "spec.scheduling.replicatedJobs[0].targetReplicatedJobs"
    ]
    assert verdict.warnings == (
        "spec.scheduling.replicatedJobs[0].targetReplicatedJob: unknown field, ignored",
    )
    fixed = runtime(torch_node(), rj("eval"), scheduling=entries(target("node")))
    assert validate_runtime(fixed).warnings == (
        'scheduling: replicatedJob "eval" is not targeted; it gets default scheduling',
    )


def test_untargeted_replicated_job_warns() -> None:
    rt = runtime(torch_node(), rj("eval"), scheduling=entries(target("node")))
    verdict = validate_runtime(rt)
    assert verdict.allowed
    assert verdict.warnings == (
        'scheduling: replicatedJob "eval" is not targeted; it gets default scheduling',
    )


def test_unknown_field_warnings_keep_their_order_across_processes() -> None:
    code = (
        "from webhook.core.validation import validate_runtime as v;"
        "from tests.test_validation import UNKNOWN_FIELDS as r;"
        "print(v(r).warnings)"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(outputs) == 1 and "zz" in outputs.pop()


UNKNOWN_FIELDS = two_jobs(
    {
        "zz": 1,
        "schedulingPolicy": {"gang": {}, "yy": 1},
        "disruptionMode": {"all": {}, "xx": 1},
        "schedulingConstraints": {"topology": [{"key": "k", "ww": 1}]},
    }
)


def test_unknown_scheduling_fields_warn() -> None:
    rt = two_jobs({"schedulingPolicies": {"gang": {}}, "replicatedJobs": [target("node", foo=1)]})
    verdict = validate_runtime(rt)
    assert verdict.allowed
    assert "spec.scheduling.schedulingPolicies: unknown field, ignored" in verdict.warnings
    assert "spec.scheduling.replicatedJobs[0].foo: unknown field, ignored" in verdict.warnings


def test_sample_warnings_fit_in_120_characters() -> None:
    rt = runtime(
        rj("dataset-initializer"),
        rj("node", depends=[("dataset-initializer", "Complete")]),
        rj("launcher", ancestor="trainer", depends=[("node", "Ready")]),
        ml={"mpi": {}},
        scheduling=entries(target("launcher", "node")),
    )
    verdict = validate_runtime(rt)
    assert verdict.warnings
    assert all(len(w) <= 120 for w in verdict.warnings), verdict.warnings


# --- TrainJobs ---------------------------------------------------------------------------------


def parsed_runtime(raw: Json) -> Runtime:
    return Runtime.model_validate(raw)


GANG = parsed_runtime(runtime(torch_node(), scheduling={}))


def test_gang_with_other_pods_still_needs_a_training_node() -> None:
    level_one = parsed_runtime(runtime(rj("init"), torch_node(), scheduling={}))
    (err,) = validate_trainjob(trainjob(num_nodes=0), level_one).errors
    assert err.path == "spec.trainer.numNodes"
    mpi = parsed_runtime(
        runtime(
            rj("launcher", ancestor="trainer"),
            rj("node"),
            ml={"mpi": {"runLauncherAsNode": True}},
            scheduling=entries(target("launcher", "node")),
        )
    )
    (err,) = validate_trainjob(trainjob(num_nodes=0), mpi).errors
    assert err.path == "spec.trainer.numNodes"
    # The trainer outside any gang: numNodes 0 is the Trainer's business, not a gang's.
    basic_trainer = parsed_runtime(
        runtime(
            rj("init"),
            torch_node(),
            scheduling=entries(target("init"), target("node", schedulingPolicy={"basic": {}})),
        )
    )
    assert validate_trainjob(trainjob(num_nodes=0), basic_trainer).errors == ()


def test_mpi_launcher_gang_does_not_need_nodes() -> None:
    # Only `node` is sized by numNodes under MPI; a gang of the launcher alone has its one pod.
    rt = parsed_runtime(
        runtime(
            rj("launcher", ancestor="trainer"),
            rj("node"),
            ml={"mpi": {}},
            scheduling=entries(target("launcher"), target("node", schedulingPolicy={"basic": {}})),
        )
    )
    assert validate_trainjob(trainjob(num_nodes=0), rt).errors == ()


def test_trainjob_num_nodes_must_fit_int32() -> None:
    rt = parsed_runtime(runtime(rj("init"), torch_node(), scheduling={}))
    assert validate_trainjob(trainjob(num_nodes=2**31 - 2), rt).errors == ()
    (err,) = validate_trainjob(trainjob(num_nodes=2**31 - 1), rt).errors
    assert err.path == "spec.trainer.numNodes"
    assert "a group would hold 2147483648 pods, more than a PodGroup can count" in str(err)


def test_stored_runtime_with_long_names_still_serves_its_trainjobs() -> None:
    # Accepted before the 20-character rule (or via a scheduling-only update): rule 8(g) applies
    # to template changes only, so its TrainJobs are judged and planned as usual.
    rt = parsed_runtime(runtime(rj("node-with-a-long-name", ancestor="trainer"), scheduling={}))
    assert validate_trainjob(trainjob(num_nodes=2), rt).errors == ()


def test_trainjob_update_is_not_blocked_by_its_runtime() -> None:
    old = trainjob(num_nodes=4)
    suspended = trainjob(num_nodes=4)
    suspended["spec"]["suspend"] = True
    assert validate_trainjob(suspended, None, old, gang_exists=True).errors == ()
    broken = parsed_runtime(two_jobs(entries(target("nodes"))))
    assert validate_trainjob(suspended, broken, old, gang_exists=True).errors == ()
    (err,) = validate_trainjob(trainjob(num_nodes=5), None, old, gang_exists=True).errors
    assert err.type is ErrorType.FORBIDDEN


def test_trainjob_update_is_denied_only_for_errors_it_did_not_have() -> None:
    """Ratcheted: a TrainJob that is wrong under its runtime as the runtime is now (edited since,
    or admitted while the service was away) still takes a label edit or the service's own write;
    an update that brings a new error is denied."""
    rt = parsed_runtime(runtime(rj("init"), torch_node(), scheduling={}))
    stored = trainjob(num_nodes=2**31 - 1)
    assert validate_trainjob(stored, rt).errors != ()
    labelled = trainjob(num_nodes=2**31 - 1)
    labelled["metadata"]["labels"] = {"team": "vision"}
    assert validate_trainjob(labelled, rt, stored).errors == ()
    (err,) = validate_trainjob(stored, rt, trainjob(num_nodes=2)).errors
    assert err.path == "spec.trainer.numNodes"
    # Another wrong value of the same field is a new error.
    assert validate_trainjob(trainjob(num_nodes=0), rt, trainjob(num_nodes=0)).errors == ()
    (err,) = validate_trainjob(stored, rt, trainjob(num_nodes=0)).errors
    assert err.path == "spec.trainer.numNodes" and "2147483648 pods" in err.detail


def test_template_cap_message_fits_the_level() -> None:
    split = runtime(
        rj("init"),
        *(rj(f"job{i}", depends=[("init", "Complete")]) for i in range(8)),
        scheduling={},
    )
    # The list whose length is counted: one gang (template) per ReplicatedJob.
    (err,) = [e for e in validate_runtime(split).errors if e.type is ErrorType.TOO_MANY]
    assert str(err).startswith(
        "spec.template.spec.replicatedJobs: Too many: 9: must have at most 8 items; "
        "spec.scheduling splits into 9 gangs, one per ReplicatedJob (a Complete dependency)"
    ), str(err)
    nine_entries = runtime(
        *_many_rjs(9), scheduling=entries(*(target(f"job{i}") for i in range(9)))
    )
    assert [e.type for e in validate_runtime(nine_entries).errors] == [ErrorType.TOO_MANY]
    # Entries and a job entry's Jobs together: the message counts templates, not entries.
    mixed = runtime(
        torch_node(replicas=4),
        *_many_rjs(5),
        scheduling=entries(target("node", job={}), *(target(f"job{i}") for i in range(5))),
    )
    (err,) = validate_runtime(mixed).errors
    assert str(err) == (
        "spec.scheduling.replicatedJobs: Too many: 9 PodGroup templates, and a Workload holds at "
        'most 8; these entries make one each, and a job entry one per Job ("node" has replicas '
        "4): merge entries or lower replicas"
    )


def test_default_scheduler_is_the_same_as_unset() -> None:
    rt = runtime(rj("init", scheduler="default-scheduler"), torch_node(), scheduling={})
    assert validate_runtime(rt).errors == ()


def test_trainjob_num_nodes_not_negative() -> None:
    (err,) = validate_trainjob(trainjob(num_nodes=-1), GANG).errors
    assert str(err) == "spec.trainer.numNodes: Invalid value: -1: must be >= 0"


def test_empty_priority_class_is_unset() -> None:
    rt = runtime(rj("init", priority_class=""), torch_node(), scheduling={})
    assert validate_runtime(rt).errors == ()


def test_parse_errors_are_worded_for_people() -> None:
    (missing,) = validate_runtime(runtime({"template": {}}, scheduling={})).errors
    assert str(missing) == (
        "spec.template.spec.replicatedJobs[0].name: Required value: this field is required"
    )
    (shape,) = validate_runtime(
        two_jobs({"schedulingConstraints": {"topology": {"key": "z"}}})
    ).errors
    assert str(shape) == (
        'spec.scheduling.schedulingConstraints.topology: Invalid value: {"key":"z"}: must be a list'
    )


def test_trainjob_runtime_must_exist() -> None:
    assert validate_trainjob(trainjob(num_nodes=2), GANG).errors == ()
    (err,) = validate_trainjob(trainjob(runtime_name="missing"), None).errors
    assert err.path == "spec.runtimeRef.name" and err.type is ErrorType.NOT_FOUND
    assert str(err) == (
        'spec.runtimeRef.name: Not found: "missing": no ClusterTrainingRuntime of that name; '
        "create the runtime first or fix spec.runtimeRef"
    )
    (err,) = validate_trainjob(trainjob(runtime_kind="TrainingRuntime"), None).errors
    assert 'no TrainingRuntime of that name in namespace "team-a"' in str(err)


def test_trainjob_num_nodes_at_least_one_under_a_gang() -> None:
    assert validate_trainjob(trainjob(num_nodes=1), GANG).errors == ()
    (err,) = validate_trainjob(trainjob(num_nodes=0), GANG).errors
    assert err.path == "spec.trainer.numNodes" and err.type is ErrorType.INVALID
    assert "must be at least 1: the runtime schedules the training nodes as a gang" in str(err)
    basic = parsed_runtime(runtime(torch_node(), scheduling={"schedulingPolicy": {"basic": {}}}))
    assert validate_trainjob(trainjob(num_nodes=0), basic).errors == ()


def test_trainjob_name_must_be_an_rfc1035_label() -> None:
    assert validate_trainjob(trainjob("j" * 63, num_nodes=1), GANG).errors == ()
    for bad in ("j" * 64, "0job", "My_Job"):
        (err,) = validate_trainjob(trainjob(bad, num_nodes=1), GANG).errors
        assert err.path == "metadata.name" and "RFC 1035 label" in str(err)


def test_trainjob_num_nodes_fallback_is_explained() -> None:
    zero_default = parsed_runtime(runtime(torch_node(), scheduling={}, ml={"numNodes": 0}))
    (err,) = validate_trainjob(trainjob(), zero_default).errors
    assert str(err) == (
        "spec.trainer.numNodes: Invalid value: null: must be at least 1 (unset, so the runtime's "
        "mlPolicy.numNodes applies): the runtime schedules the training nodes as a gang, which "
        "needs at least one pod"
    )


def test_trainjob_num_nodes_frozen_while_gang_exists() -> None:
    old, new = trainjob(num_nodes=4), trainjob(num_nodes=8)
    assert validate_trainjob(new, GANG, old, gang_exists=False).errors == ()
    assert validate_trainjob(old, GANG, old, gang_exists=True).errors == ()
    (err,) = validate_trainjob(new, GANG, old, gang_exists=True).errors
    assert err.path == "spec.trainer.numNodes" and err.type is ErrorType.FORBIDDEN
    assert "may not change from 4 to 8 while the TrainJob's gang exists" in str(err)


def test_trainjob_with_invalid_runtime_points_at_the_runtime() -> None:
    broken = parsed_runtime(two_jobs(entries(target("nodes"))))
    (err,) = validate_trainjob(trainjob(num_nodes=2), broken).errors
    assert err.path == "spec.runtimeRef.name"
    assert "the ClusterTrainingRuntime is invalid (spec.scheduling" in str(err)
    assert str(err).endswith("; fix the runtime")


def test_trainjob_gets_the_runtime_warnings() -> None:
    rt = parsed_runtime(runtime(torch_node(), rj("eval"), scheduling=entries(target("node"))))
    verdict = validate_trainjob(trainjob(num_nodes=2), rt)
    assert verdict.allowed
    assert verdict.warnings == (
        'scheduling: replicatedJob "eval" is not targeted; it gets default scheduling',
    )


def test_trainjob_garbage_is_a_field_error() -> None:
    verdict = validate_trainjob({"spec": {"trainer": {"numNodes": "many"}}}, GANG)
    assert [e.path for e in verdict.errors] == ["spec.trainer.numNodes"]

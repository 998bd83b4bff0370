"""Names are part of the API: running pods point at them, so they are pinned here."""

from __future__ import annotations

import hashlib

import pytest

from webhook.core import naming


def test_examples_from_the_reference() -> None:
    # was-api.md section 4, TrainJob my-job in namespace team-a.
    assert naming.workload_name("team-a", "my-job") == "my-job-f438be8c51"
    assert naming.group_template_name("team-a", "my-job", ["node"]) == "node-d1c371e3b1"
    assert (
        naming.group_template_name("team-a", "my-job", ["launcher", "node"])
        == "launcher-node-ccfe855b49"
    )
    assert (
        naming.group_template_name("team-a", "my-job", ["dataset-initializer", "model-initializer"])
        == "dataset-initializer-model-initializer-a2400d82a0"
    )
    assert naming.job_template_name("team-a", "my-job", "node", 0) == "node-0-33e00f497c"
    assert naming.split_template_name("team-a", "my-job", "node") == "node-a0cc56a224"
    assert (
        naming.pod_group_name("my-job", "launcher-node-ccfe855b49")
        == "my-job-launcher-node-ccfe855b49"
    )
    assert naming.pod_group_name("my-job", "node-d1c371e3b1") == "my-job-node-d1c371e3b1"


def test_group_names_keep_list_order_and_tell_groups_from_single_names() -> None:
    a = naming.group_template_name("ns", "tj", ["leader", "worker"])
    b = naming.group_template_name("ns", "tj", ["worker", "leader"])
    assert a != b
    # The hash kind keeps a group apart from a level-3 or split name with the same prefix.
    assert naming.group_template_name("ns", "tj", ["node"]) != naming.split_template_name(
        "ns", "tj", "node"
    )


def test_names_depend_on_namespace_and_trainjob() -> None:
    assert naming.workload_name("a", "job") != naming.workload_name("b", "job")
    assert naming.group_template_name("ns", "a", ["x"]) != naming.group_template_name(
        "ns", "b", ["x"]
    )


def test_long_prefixes_are_cut_to_stay_a_dns_label() -> None:
    tj = "j" * 63
    name = naming.workload_name("ns", tj)
    assert len(name) == 63
    assert name.startswith("j" * 52 + "-")
    group = naming.group_template_name("ns", "tj", ["abcdefghijklmnopqrst"] * 5)
    assert len(group) == 63 and naming.is_dns_label(group)


def test_pod_group_name_hashes_when_too_long() -> None:
    tj, tmpl = "t" * 40, "launcher-node-ccfe855b49"
    name = naming.pod_group_name(tj, tmpl)
    assert len(name) <= 63 and naming.is_dns_label(name)
    digest = hashlib.sha1(f"{tj}/{tmpl}".encode()).hexdigest()[:10]
    assert name == f"{tj}-{digest}"
    assert name != naming.pod_group_name(tj, "launcher-node-0000000000")
    # Within the limit the readable form is kept.
    assert naming.pod_group_name("t" * 20, tmpl) == "t" * 20 + "-" + tmpl


@pytest.mark.parametrize(
    ("value", "ok"),
    [("node", True), ("0node", True), ("a-b", True), ("-a", False), ("a-", False), ("A", False)],
)
def test_is_dns_label(value: str, ok: bool) -> None:
    assert naming.is_dns_label(value) is ok
    assert naming.is_dns_label("a" * 64) is False


def test_names_at_the_63_character_boundary_are_pinned() -> None:
    # Golden values: pods of running TrainJobs point at these names, so they must never change.
    assert naming.workload_name("ns", "j" * 52) == "j" * 52 + "-94a1d23ff9"  # exactly 63: kept
    assert naming.workload_name("ns", "j" * 53) == "j" * 52 + "-8f13915712"  # 64: prefix cut
    fits = "t" * 47  # 47 + 1 + 15 = 63
    assert naming.pod_group_name(fits, "node-d1c371e3b1") == fits + "-node-d1c371e3b1"
    assert naming.pod_group_name(fits + "x", "node-d1c371e3b1") == fits + "x-1db2e9842e"
    assert naming.pod_group_name("a" * 60, "node-d1c371e3b1") == "a" * 52 + "-6fb260aae8"


# --- plan version 2: incarnations (issue 26) ----------------------------------------------------

UID_A = "cc796b1d-9ea6-4b50-811c-c860fd20eaa5"
UID_B = "0b8f5a4e-1f0e-4a53-9d3c-5d7d0c1b2a39"


def test_version_2_names_are_pinned_and_carry_the_trainjobs_uid() -> None:
    # Pinned like the legacy names: running TrainJobs' pods point at these.
    assert (
        naming.workload_name("team-a", "my-job", UID_A)
        == "my-job-" + hashlib.sha1(f"TrainJob/team-a/my-job@{UID_A}".encode()).hexdigest()[:10]
    )
    template = "node-d1c371e3b1"
    digest = hashlib.sha1(f"my-job/{template}@{UID_A}".encode()).hexdigest()[:10]
    assert naming.pod_group_name("my-job", template, UID_A) == f"my-job-{template}-{digest}"


@pytest.mark.parametrize("trainjob", ["my-job", "a" * 63, "j" * 40])
def test_an_incarnation_gives_other_names_that_stay_dns_labels(trainjob: str) -> None:
    template = naming.group_template_name("team-a", trainjob, ["launcher", "node"])
    names = [
        naming.workload_name("team-a", trainjob, UID_A),
        naming.workload_name("team-a", trainjob, UID_B),
        naming.pod_group_name(trainjob, template, UID_A),
        naming.pod_group_name(trainjob, template, UID_B),
    ]
    assert len(set(names)) == 4
    assert naming.workload_name("team-a", trainjob) not in names
    assert naming.pod_group_name(trainjob, template) not in names
    assert all(naming.is_dns_label(n) for n in names), names


def test_each_restart_attempt_has_a_name_of_its_own() -> None:
    name = naming.pod_group_name("my-job", "node-d1c371e3b1", UID_A)
    assert naming.for_attempt(name, 0) == name
    attempts = [naming.for_attempt(name, a) for a in range(1, 50)]
    assert len(set(attempts)) == 49 and name not in attempts
    assert all(naming.is_dns_label(n) for n in attempts)
    assert naming.is_dns_label(naming.for_attempt("x" * 63, 2**31 - 1))


def test_a_restart_attempt_renames_the_pod_groups_not_the_workload_or_templates() -> None:
    from webhook.core.plan import build_plan

    from .builders import parsed, rj, runtime, torch_node, trainjob

    rt, tj = parsed(
        runtime(rj("initializer"), torch_node(), scheduling={"replicatedJobs": [
            {"targetReplicatedJobs": ["initializer"], "schedulingPolicy": {"basic": {}}},
            {"targetReplicatedJobs": ["node"]},
        ]}),
        trainjob(num_nodes=4),
    )  # fmt: skip
    tj.metadata.uid = UID_A
    plan = build_plan(tj, rt)
    assert plan is not None and plan.plan_version == 3
    again = plan.at_attempt(3)
    assert again.attempt == 3 and again.workload_name == plan.workload_name
    assert [g.template_name for g in again.groups] == [g.template_name for g in plan.groups]
    assert [g.pod_group_name for g in again.groups] == [
        naming.for_attempt(g.pod_group_name, 3) for g in plan.groups
    ]
    assert again.at_attempt(3) is again
    legacy = build_plan(tj, rt, plan_version=1)
    assert legacy is not None and legacy.at_attempt(3) is legacy  # version 1: one set of names
    assert legacy.workload_name == naming.workload_name(tj.namespace, "my-job")

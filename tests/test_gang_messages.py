"""The scheduler's own words for a waiting gang, as each backend reads them from its group
object (the GangScheduling condition carries them, shortened)."""

from __future__ import annotations

from webhook.backends import kai, native, volcano


def test_native_reads_the_podgroups_condition_message() -> None:
    said = "0/8 nodes are available: 8 Insufficient nvidia.com/gpu."
    obj = {"spec": {"schedulingPolicy": {"gang": {"minCount": 8}}}, "status": {"conditions": [
        {"type": "PodGroupInitiallyScheduled", "status": "False", "reason": "Unschedulable",
         "message": said}]}}  # fmt: skip
    status = native.pod_group_status(obj)
    assert (status.reason, status.message) == ("Unschedulable", said)


def test_volcano_reads_its_unschedulable_condition_message() -> None:
    said = "3/8 tasks in gang unschedulable: pod group is not ready, 8 Pending"
    obj = {"status": {"phase": "Pending", "conditions": [
        {"type": "Unschedulable", "status": "True", "reason": "NotEnoughResources",
         "message": said}]}}  # fmt: skip
    status = volcano.pod_group_status(obj)
    assert (status.reason, status.message) == ("Unschedulable", said)


def test_kai_reads_its_latest_verdicts_message() -> None:
    said = "Resources were found for 2 pods while 8 are required for gang scheduling."
    obj = {"status": {"schedulingConditions": [
        {"type": "UnschedulableOnNodePool", "status": "True", "message": "old"},
        {"type": "UnschedulableOnNodePool", "status": "True", "message": said}]}}  # fmt: skip
    status = kai.pod_group_status(obj)
    assert (status.reason, status.message) == ("Unschedulable", said)


def test_no_message_is_an_empty_one() -> None:
    obj = {"status": {"conditions": [
        {"type": "PodGroupInitiallyScheduled", "status": "False", "reason": "Unschedulable",
         "message": 7}]}}  # fmt: skip
    assert native.pod_group_status(obj).message == ""

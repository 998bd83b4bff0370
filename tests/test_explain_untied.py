"""`explain` of a gang some of whose pods it does not count: pending or running pods of its
grouped Jobs with no `spec.schedulingGroup` (admitted without the gang), or naming a PodGroup
that is not one of this TrainJob's live ones (being deleted, or another's). Listed by name, at
most MAX_UNTIED, with a count; the verdict says so. Over HTTP against the API emulator."""

from __future__ import annotations

import pytest

from tests.kube_emulator import POD_GROUPS, PODS, api_client, delete, emulator, patch
from tests.test_explain import NS, World
from webhook.backends.registry import default_backends
from webhook.explain.gather import gather
from webhook.explain.report import MAX_UNTIED, build, render


@pytest.mark.asyncio
async def test_pods_outside_the_gang_are_listed_bounded_with_a_verdict() -> None:
    async with emulator() as (k, url), api_client(url) as api:
        w = World(k, url, api)
        await w.trainjob(pods=4)
        await w.gang_objects(("True", "Scheduled", ""))
        await w.pods(4, bound=True)
        report = await w.explain()
        assert report["verdict"]["state"] == "scheduled"
        assert report["pods"]["untied"] == {"count": 0, "pods": []}
        assert "not in its gang" not in render(report)

        await w.pods(1, bound=True, group=None, first=4)
        await w.pods(1, group="someone-elses", first=5)
        report = await w.explain()
        assert report["pods"]["untied"] == {
            "count": 2,
            "pods": [
                {"name": "my-job-node-0-4", "podGroup": None, "why": "no schedulingGroup"},
                {"name": "my-job-node-0-5", "podGroup": "someone-elses",
                 "why": "PodGroup someone-elses is not this TrainJob's"},
            ],
        }  # fmt: skip
        assert report["verdict"] == {
            "state": "pods-untied",
            "text": "pods untied: 2 of its pods are not in its gang (my-job-node-0-4: no "
            "schedulingGroup); the gang counts only the pods that reference its PodGroup and may "
            "wait for ever while these hold nodes: delete them (JobSet recreates them through "
            "the pod webhook, tied)",
        }
        text = render(report)
        assert "  not in its gang (2):\n    my-job-node-0-4: no schedulingGroup\n" in text

        # Finished or being deleted, a pod holds nothing: not listed.
        await patch(k, PODS, NS, "my-job-node-0-5", {"status": {"phase": "Succeeded"}})
        await patch(k, PODS, NS, "my-job-node-0-4", {"metadata": {"finalizers": ["x/y"]}})
        await delete(k, PODS, NS, "my-job-node-0-4")
        report = await w.explain()
        assert report["pods"]["untied"]["count"] == 0
        assert report["verdict"]["state"] == "scheduled"

        # Many: at most MAX_UNTIED named, the rest counted.
        await w.pods(MAX_UNTIED + 3, group=None, first=10)
        report = await w.explain()
        untied = report["pods"]["untied"]
        assert untied["count"] == MAX_UNTIED + 3 and len(untied["pods"]) == MAX_UNTIED
        assert report["verdict"]["text"].startswith(f"pods untied: {MAX_UNTIED + 3} of its pods")
        assert "    and 3 more" in render(report)


@pytest.mark.asyncio
async def test_a_pod_naming_its_own_podgroup_being_deleted_is_untied() -> None:
    """Its PodGroup is Terminating (a previous incarnation's, kept by the protection finalizer
    while pods reference it): a new pod tied to it is not in a live gang."""
    async with emulator() as (k, url), api_client(url) as api:
        w = World(k, url, api)
        await w.trainjob(pods=2)
        await w.gang_objects(("True", "Scheduled", ""))
        await w.pods(2, bound=True)
        group = w.plan().pod_group_for("node", 0)
        protection = {"metadata": {"finalizers": ["scheduling.k8s.io/podgroup-protection"]}}
        await patch(k, POD_GROUPS, NS, group, protection)
        await delete(k, POD_GROUPS, NS, group)
        report = await w.explain()
        assert report["pods"]["untied"]["count"] == 2
        assert report["pods"]["untied"]["pods"][0]["why"] == f"PodGroup {group} is being deleted"
        assert report["verdict"]["state"] == "pods-untied"


@pytest.mark.asyncio
async def test_without_gang_objects_the_verdict_stays_waiting_for_them() -> None:
    async with emulator() as (k, url), api_client(url) as api:
        w = World(k, url, api)
        await w.trainjob(pods=2)
        await w.pods(2, group=None)
        report = await w.explain()
        assert report["verdict"]["state"] == "waiting-for-gang-objects"
        assert report["pods"]["untied"]["count"] == 2  # still listed: no live PodGroup of its own


@pytest.mark.asyncio
async def test_a_backend_that_ties_pods_otherwise_lists_none() -> None:
    """Volcano, coscheduling and KAI pods name their group in an annotation or label: no
    schedulingGroup is expected of them."""
    async with emulator() as (k, url), api_client(url) as api:
        w = World(k, url, api)
        await w.trainjob(pods=2)
        await w.pods(2, group=None)
        found = await gather(api, NS, "my-job")
        for name in ("volcano", "coscheduling", "kai"):
            found.backend = default_backends().named(name)
            assert build(found)["pods"]["untied"] is None, name

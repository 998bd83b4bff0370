"""`explain` of a gang that lost pods after admission: degraded while the service's
GangScheduling condition had said Scheduled, with each group's live pods shown; a gang still
filling up after admission (never said Scheduled) is not."""

from __future__ import annotations

import pytest

from tests.kube_emulator import POD_GROUPS, PODS, TRAINJOBS, api_client, delete, emulator, patch
from tests.test_explain import NS, World
from webhook.core import condition as cond
from webhook.explain.report import render


@pytest.mark.asyncio
async def test_a_gang_that_lost_a_pod_after_it_was_said_scheduled_is_degraded() -> None:
    async with emulator() as (k, url), api_client(url) as api:
        w = World(k, url, api)
        await w.trainjob(pods=4)
        await w.gang_objects(("True", "Scheduled", ""))
        await w.pods(4, bound=True)
        assert (await w.explain())["verdict"]["state"] == "scheduled"
        await delete(k, PODS, NS, "my-job-node-0-3")
        # Pods short, but the service never said Scheduled: still filling up, not degraded.
        assert (await w.explain())["verdict"]["state"] == "scheduled"
        said = {"type": cond.CONDITION_TYPE, "status": "True", "reason": cond.SCHEDULED,
                "message": "gang is scheduled",
                "lastTransitionTime": "2026-12-02T10:00:00Z"}  # fmt: skip
        await patch(k, TRAINJOBS, NS, "my-job", {"status": {"conditions": [said]}})
        report = await w.explain()
        (pod_group,) = [o[2] for o in list(k.objects) if o[0] == POD_GROUPS]
        assert report["verdict"] == {
            "state": "degraded",
            "text": f"degraded: gang {pod_group} was scheduled and now has 3 of the 4 live pods "
            "it needs (minCount); lost pods are usually recreated by JobSet, until then the rest "
            "of the gang waits on its nodes",
        }
        assert f"  {pod_group}: 3 of minCount 4 created, 3 bound, 3 live" in render(report)
        assert {"type": cond.CONDITION_TYPE, "status": "True", "reason": cond.SCHEDULED,
                "message": "gang is scheduled"} in report["trainJob"]["conditions"]  # fmt: skip

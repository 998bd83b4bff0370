"""Events go out through a client-side rate limit, like the reconciler's writes (issue 27)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes.aio.client import ApiClient, Configuration

from webhook.kube.events import EventRecorder
from webhook.kube.writer import TokenBucket

from .kube_emulator import EVENTS, emulator, eventually

pytestmark = pytest.mark.asyncio


async def test_events_wait_their_turn_in_the_bucket() -> None:
    """Six Events at once through a bucket of 20 a second with a burst of 1 (its clock held
    still): the first goes at once, each later one waits 1/20 s more than the one before, and
    all six are posted."""
    waited: list[float] = []

    async def sleep(seconds: float) -> None:
        waited.append(round(seconds, 6))
        await asyncio.sleep(0)

    bucket = TokenBucket(qps=20, burst=1, clock=lambda: 0.0, sleep=sleep)
    async with emulator() as (k, url):
        api = ApiClient(configuration=Configuration(host=url))
        recorder = EventRecorder(api, "trainjob-scheduling", "test", bucket=bucket)
        sender = asyncio.create_task(recorder.run())
        try:
            trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                        "metadata": {"name": "j", "namespace": "team-a", "uid": "u1"}}  # fmt: skip
            for i in range(6):
                recorder.record(trainjob, "Normal", "Created", "Create", f"created object {i}")
            await eventually(lambda: len(k[EVENTS]) >= 6, "six Events posted")
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            close: Any = api.close
            await close()
    assert sorted(waited) == [0.05, 0.1, 0.15, 0.2, 0.25]

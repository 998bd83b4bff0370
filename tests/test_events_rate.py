"""Events go out through a client-side rate limit, like the reconciler's writes (issue 27); one
the API server refuses is dropped, counted and said once, never retried (issue 36 part 5)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kmock
import pytest
from kubernetes.aio.client import ApiClient, Configuration

from webhook.kube.events import EventRecorder
from webhook.kube.refusal import FORBIDDEN, NAMESPACE_GONE
from webhook.kube.writer import TokenBucket

from .kube_emulator import EVENTS, emulator, eventually, status

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


def _trainjob(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"}}  # fmt: skip


def _refusals(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """What the recorder said of refusals at info or above (not the Events' own notes)."""
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name == "webhook.events"
        and r.levelno >= logging.INFO
        and ("refusal" in getattr(r, "fields", {}) or r.msg == "events are posted again")
    ]


async def test_an_event_refused_is_dropped_counted_said_once_and_its_namespace_held(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """RBAC refuses Events in team-a: the first is posted and refused, never retried; the next
    ones wait for no answer (dropped while the namespace is held, 1 s, then 2 s, ...); one
    warning names the rule; once granted, Events go out again, said once. team-b is not held."""
    caplog.set_level(logging.DEBUG, logger="webhook.events")
    now = [0.0]
    refused = asyncio.Event()
    refused.set()
    counted: list[str] = []
    async with emulator() as (k, url):
        forbidden = status(403, 'events.events.k8s.io is forbidden: User "x" cannot create '
                           'resource "events" in API group "events.k8s.io" in the namespace '
                           '"team-a"', "Forbidden")  # fmt: skip
        k[kmock.action.CREATE, EVENTS, kmock.namespace("team-a"), refused] << forbidden
        api = ApiClient(configuration=Configuration(host=url))
        recorder = EventRecorder(
            api, "trainjob-scheduling", "test", clock=lambda: now[0], on_refused=counted.append
        )
        sender = asyncio.create_task(recorder.run(senders=1))

        async def record(namespace: str, note: str) -> None:
            posted = len(k[kmock.action.CREATE, EVENTS])
            dropped = recorder.refused
            recorder.record(_trainjob(namespace, "j"), "Normal", "Created", "Create", note)
            await eventually(
                lambda: len(k[kmock.action.CREATE, EVENTS]) > posted or recorder.refused > dropped,
                f"the Event {note!r} handled",
            )
            await asyncio.sleep(0.05)  # its answer, if it was posted

        try:
            await record("team-a", "first")  # posted, refused
            for i in range(5):  # held: not posted
                await record("team-a", f"held {i}")
            await record("team-b", "elsewhere")  # another namespace: posted
            now[0] = 1.5  # the hold (1 s) is over: the next one is asked again, and refused
            await record("team-a", "second")
            now[0] = 2.5  # held for 2 s now
            await record("team-a", "held again")
            refused.clear()  # the rule is granted
            now[0] = 10.0
            await record("team-a", "third")
            await record("team-a", "fourth")
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            close: Any = api.close
            await close()
    posted = [r.data["note"] for r in k[kmock.action.CREATE, EVENTS]]
    assert posted == ["first", "elsewhere", "second", "third", "fourth"]
    assert recorder.refused == 8 and counted == [FORBIDDEN] * 8
    said = _refusals(caplog)
    assert len(said) == 2, said
    (level, warning), (info_level, again) = said
    assert level == logging.WARNING and "may not create events" in warning
    assert "'team-a'" in warning and "grant create on events.events.k8s.io" in warning
    assert info_level == logging.INFO and again == "events are posted again"


async def test_a_terminating_namespace_refuses_events_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="webhook.events")
    counted: list[str] = []
    async with emulator() as (k, url):
        terminating = status(
            403,
            'events.events.k8s.io "j.1" is forbidden: unable to create new content in '
            "namespace team-a because it is being terminated",
            "Forbidden",
            {"causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace"}]},
        )
        k[kmock.action.CREATE, EVENTS, kmock.namespace("team-a")] << terminating
        api = ApiClient(configuration=Configuration(host=url))
        recorder = EventRecorder(api, "c", "i", on_refused=counted.append)
        sender = asyncio.create_task(recorder.run())
        try:
            for i in range(20):
                recorder.record(_trainjob("team-a", f"j{i}"), "Normal", "Deleted", "Delete", "x")
            await eventually(lambda: recorder.refused == 20, "every Event refused or held")
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            close: Any = api.close
            await close()
    assert counted == [NAMESPACE_GONE] * 20
    assert len(k[kmock.action.CREATE, EVENTS]) <= 4  # the senders' first tries, then held
    ((level, said),) = _refusals(caplog)
    assert level == logging.INFO and "'team-a' is being deleted or gone" in said

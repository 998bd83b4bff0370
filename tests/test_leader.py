"""Leader election on a Lease against the API emulator over HTTP, with short durations (lease 1 s,
renew deadline 0.6 s, retry period 0.1 s): who leads, for how long, and that two replicas never
run `lead()` at once. Each replica has its own client with its own User-Agent, so kmock reactions
can fail one replica's requests and not the other's."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest

from tests.kube_emulator import (
    LEASES,
    ApiError,
    VersionedEmulator,
    api_client,
    create,
    emulator,
    eventually,
    get,
    next_requests,
    status,
)
from tests.timing import STALL
from webhook.kube.leader import LeaderElector, LeaseSettings

NS = "webhook-system"
NAME = "trainjob-scheduling-webhook"
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 1.0, 0.6, 0.1
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def settings(
    identity: str, lease: float = LEASE_DURATION, renew: float = RENEW_DEADLINE
) -> LeaseSettings:
    return LeaseSettings(NS, NAME, identity, lease, renew, RETRY_PERIOD)


class Stage:
    """Who runs lead() now; counts the moments when two did."""

    def __init__(self) -> None:
        self.on: set[str] = set()
        self.overlaps = 0

    def enter(self, identity: str) -> None:
        self.overlaps += bool(self.on)
        self.on.add(identity)

    def leave(self, identity: str) -> None:
        self.on.discard(identity)


class Replica:
    """An elector with its own client; records its leadership changes and its lead() runs."""

    def __init__(self, elector: LeaderElector, stage: Stage) -> None:
        self.elector = elector
        self.identity = elector.settings.identity
        self.stage = stage
        self.changes: list[bool] = []
        self.starts: list[float] = []
        self.stops: list[float] = []
        self.task: asyncio.Task[None] | None = None
        self.crash = asyncio.Event()  # set: lead() fails
        elector.on_change = self.changes.append

    @property
    def leading(self) -> bool:
        """lead() is running."""
        return len(self.starts) > len(self.stops)

    async def lead(self) -> None:
        self.starts.append(time.monotonic())
        self.stage.enter(self.identity)
        try:
            await self.crash.wait()
            raise RuntimeError(f"{self.identity}'s lead() crashed")
        finally:
            self.stage.leave(self.identity)
            self.stops.append(time.monotonic())

    def start(self) -> None:
        self.task = asyncio.create_task(self.elector.run(self.lead))

    async def shut_down(self) -> None:
        """Cancels run(), as the service does on shutdown; run() ends only so."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


@contextlib.asynccontextmanager
async def replicas(
    url: str, *identities: str, lease: float = LEASE_DURATION, renew: float = RENEW_DEADLINE
) -> AsyncIterator[tuple[Stage, list[Replica]]]:
    stage = Stage()
    async with contextlib.AsyncExitStack() as stack:
        started: list[Replica] = []
        for identity in identities:
            api = await stack.enter_async_context(api_client(url, user_agent=identity))
            started.append(Replica(LeaderElector(api, settings(identity, lease, renew)), stage))
        try:
            yield stage, started
        finally:
            for replica in started:
                await replica.shut_down()
    assert stage.overlaps == 0, "two replicas ran lead() at once"


async def lease_spec(k: VersionedEmulator) -> dict[str, Any]:
    lease = await get(k, LEASES, NS, NAME)
    assert lease is not None
    spec: dict[str, Any] = lease["spec"]
    return spec


def requests_of(k: VersionedEmulator, identity: str) -> kmock.View:
    return k[LEASES, kmock.headers({"User-Agent": identity})]


async def observed(k: VersionedEmulator, identity: str, reads: int = 2) -> None:
    """Waits until `identity` has read the lease `reads` times (it has seen who holds it)."""
    fetches = k[kmock.action.FETCH, LEASES, kmock.headers({"User-Agent": identity})]
    await eventually(lambda: len(fetches) >= reads, f"{identity} read the lease")


def test_settings_must_leave_time_to_renew_and_to_retry() -> None:
    for durations in ((1.0, 1.0, 0.1), (1.0, 0.6, 0.6), (1.0, 0.6, 0.0), (0.5, 0.6, 0.1)):
        with pytest.raises(ValueError):
            LeaseSettings(NS, NAME, "a", *durations)
    with pytest.raises(ValueError):
        LeaseSettings(NS, NAME, "")
    assert LeaseSettings(NS, NAME, "a").lease_duration == 15.0


@pytest.mark.asyncio
async def test_an_elector_creates_the_lease_leads_and_renews() -> None:
    async with emulator() as (k, url), replicas(url, "a") as (_, [a]):
        a.start()
        await eventually(lambda: a.leading, "a leads")
        assert a.elector.is_leader and a.changes == [True]
        spec = await lease_spec(k)
        assert spec["holderIdentity"] == "a"
        assert (spec["leaseDurationSeconds"], spec["leaseTransitions"]) == (1, 0)
        assert MICRO_TIME.match(spec["acquireTime"]) and MICRO_TIME.match(spec["renewTime"])
        puts = k[kmock.method.PUT, LEASES]
        await eventually(lambda: len(puts) >= 3, "three renewals")
        renewed = await lease_spec(k)
        assert renewed["renewTime"] > spec["renewTime"]
        assert (renewed["acquireTime"], renewed["leaseTransitions"]) == (spec["acquireTime"], 0)
        assert a.leading and a.changes == [True]


@pytest.mark.asyncio
async def test_a_second_elector_waits_while_the_first_renews() -> None:
    async with emulator() as (k, url), replicas(url, "a", "b") as (_, [a, b]):
        a.start()
        await eventually(lambda: a.leading, "a leads")
        b.start()
        await asyncio.sleep(2 * LEASE_DURATION)  # twice as long as the lease lasts unrenewed
        assert a.leading and not b.leading and not b.elector.is_leader
        assert (a.changes, b.changes) == ([True], [])
        assert len(k[kmock.method.PUT, LEASES, kmock.headers({"User-Agent": "b"})]) == 0
        assert (await lease_spec(k))["holderIdentity"] == "a"


@pytest.mark.asyncio
async def test_shutdown_releases_the_lease_and_another_replica_takes_over_at_once() -> None:
    # A long lease: b leads within its first half only if a released it (at expiry: after
    # 2 * STALL); a loaded machine delays b's next try by far less than STALL.
    lease, renew = 2 * STALL, STALL
    async with (
        emulator() as (k, url),
        replicas(url, "a", "b", lease=lease, renew=renew) as (_, [a, b]),
    ):
        a.start()
        await eventually(lambda: a.leading, "a leads")
        b.start()
        await observed(k, "b")
        await a.shut_down()
        stopped = time.monotonic()
        assert a.changes == [True, False] and not a.leading and not a.elector.is_leader
        await eventually(lambda: b.leading, "b leads", timeout=lease / 2)
        assert b.starts[0] - stopped < lease / 2  # not after the lease expired
        spec = await lease_spec(k)
        assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)


@pytest.mark.asyncio
async def test_shutdown_during_a_renewal_still_releases_the_lease() -> None:
    stored, answer = asyncio.Event(), asyncio.Event()
    lease, renew = 2 * STALL, STALL  # as above: b within half the lease only by a release
    async with (
        emulator() as (k, url),
        replicas(url, "a", "b", lease=lease, renew=renew) as (_, [a, b]),
    ):

        async def store_then_hold(request: kmock.Request) -> kmock.Payload:
            renewed = await k._serve_replace(request)
            stored.set()
            await answer.wait()
            return renewed

        a.start()
        await eventually(lambda: a.leading, "a leads")
        b.start()
        await observed(k, "b")
        next_requests(k[kmock.method.PUT, LEASES]) << store_then_hold
        await eventually(stored.is_set, "a renewal stored, its answer held back")
        try:
            await a.shut_down()  # a still has the resourceVersion before that renewal
        finally:
            answer.set()
        stopped = time.monotonic()
        await eventually(lambda: b.leading, "b leads", timeout=lease / 2)
        assert b.starts[0] - stopped < lease / 2


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["killed", "cut-off"])
async def test_a_leader_gone_without_releasing_is_replaced_once_the_lease_expires(
    how: str,
) -> None:
    async with emulator() as (k, url), replicas(url, "a", "b") as (_, [a, b]):
        a.start()
        await eventually(lambda: a.leading, "a leads")
        b.start()
        await observed(k, "b")
        requests_of(k, "a") << status(500)  # from now on, every request of a's fails
        gone = time.monotonic()
        if how == "killed":
            await a.shut_down()  # its release fails too: as a process that died
        await eventually(lambda: b.leading, "b leads", timeout=STALL)
        # b waited for the lease to expire: a full lease after a's last renewal, which came a
        # retry period before `gone` (half a lease: only a loop stalled that long between the
        # two could make it look shorter)
        assert b.starts[0] - gone > LEASE_DURATION / 2
        # a stopped leading on its own (at its renew deadline) before b could take over
        assert a.changes == [True, False] and a.stops[0] < b.starts[0]
        assert (await lease_spec(k))["holderIdentity"] == "b"


@pytest.mark.asyncio
async def test_failing_renewals_cancel_lead_at_the_renew_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="webhook.leader")
    async with emulator() as (k, url), replicas(url, "a") as (_, [a]):
        a.start()
        await eventually(lambda: a.leading, "a leads")
        next_requests(k[kmock.method.PUT, LEASES], 15) << status(500)  # ~1.5 s of failures
        failing = time.monotonic()
        await eventually(lambda: not a.leading, "a stops leading", timeout=STALL)
        # Not at the first failure (half the renew deadline, as above); that it was the deadline
        # is in the log (below).
        assert a.stops[0] - failing > RENEW_DEADLINE / 2
        assert a.changes == [True, False] and not a.elector.is_leader
        await eventually(lambda: a.leading, "a leads again once renewals work", timeout=STALL)
        assert a.changes == [True, False, True]
    logged = [(r.getMessage(), r.__dict__["fields"]) for r in caplog.records]
    changes = [(message, fields.get("reason")) for message, fields in logged if "lead" in message]
    assert changes[:3] == [
        ("leading", "acquired the lease"),
        ("stopped leading", f"no renewal succeeded within {RENEW_DEADLINE}s"),
        ("leading", "acquired the lease"),
    ]
    failures = [fields["error"] for message, fields in logged if message == "lease request failed"]
    # Once per streak of failures, not every retry (15 failed): on a loaded machine a streak
    # may be split in two by a lead regained in between.
    assert set(failures) == {"HTTP 500: Internal Server Error"} and len(failures) <= 2, failures


@pytest.mark.asyncio
async def test_a_hung_api_server_cannot_keep_a_leader_leading() -> None:
    release = asyncio.Event()

    async def hang() -> kmock.Payload:
        await release.wait()
        return status(500)

    async with emulator() as (k, url), replicas(url, "a") as (_, [a]):
        a.start()
        await eventually(lambda: a.leading, "a leads")
        next_requests(k[kmock.method.PUT, LEASES]) << hang
        try:
            # While the renewal still hangs (released only below): at its renew deadline.
            await eventually(lambda: not a.leading, "a stops leading", timeout=STALL)
        finally:
            release.set()
        await eventually(lambda: a.leading, "a leads again", timeout=STALL)


@pytest.mark.asyncio
@pytest.mark.parametrize("race", ["create", "take-over"])
async def test_two_electors_started_at_once_one_leads(race: str) -> None:
    # Longer terms than the other tests: this one is about the race, not about timing, and a
    # loaded CI machine once let a 0.6 s renewal lapse while the test watched for a steady lead.
    lease, renew = 4 * LEASE_DURATION, 4 * RENEW_DEADLINE
    async with (
        emulator() as (k, url),
        replicas(url, "a", "b", lease=lease, renew=renew) as (
            stage,
            [a, b],
        ),
    ):
        if race == "take-over":  # a free lease, as a released one: both PUT the same version
            free = {"holderIdentity": "", "leaseDurationSeconds": 1, "leaseTransitions": 4}
            await create(k, LEASES, {"metadata": {"name": NAME, "namespace": NS}, "spec": free})
        reads: list[kmock.Request] = []

        async def read_together(request: kmock.Request) -> kmock.Payload:
            """Both replicas read the lease as it was before either wrote."""
            try:
                answer: kmock.Payload | ApiError = await k._serve_fetch(request)
            except ApiError as err:  # 404: there is none yet
                answer = err
            reads.append(request)
            await eventually(lambda: len(reads) == 2, "both read the lease")
            if isinstance(answer, ApiError):
                raise answer
            return answer

        next_requests(k[kmock.action.FETCH, LEASES], 2) << read_together
        a.start()
        b.start()
        await eventually(lambda: a.leading or b.leading, "one leads")
        writes = k[kmock.action.CREATE if race == "create" else kmock.method.PUT, LEASES]
        # both wrote the version they read: the API server let one win, the other got 409
        await eventually(lambda: len(writes) == 2, "both tried")
        await asyncio.sleep(2 * LEASE_DURATION)  # the loser has read the lease back and waits
        leader, other = (a, b) if a.leading else (b, a)
        assert leader.changes == [True] and other.changes == [] and stage.on == {leader.identity}
        spec = await lease_spec(k)
        assert spec["holderIdentity"] == leader.identity
        assert spec["leaseTransitions"] == (0 if race == "create" else 5)


@pytest.mark.asyncio
async def test_a_lead_that_fails_hands_the_lease_on(caplog: pytest.LogCaptureFixture) -> None:
    async with emulator() as (k, url), replicas(url, "a", "b") as (_, [a, b]):
        a.start()
        await eventually(lambda: a.leading, "a leads")
        b.start()
        await observed(k, "b")
        a.crash.set()  # a's lead() fails, now and whenever it leads again
        await eventually(lambda: b.leading, "b leads", timeout=STALL)
        assert a.changes[:2] == [True, False]
        releases = [
            r
            for r in requests_of(k, "a")
            if r.method == kmock.method.PUT and r.data["spec"]["holderIdentity"] == ""
        ]
        assert releases, "a released the lease rather than let it expire"
    errors = [r for r in caplog.records if r.getMessage() == "lead() failed"]
    assert errors and all(r.exc_info and "crashed" in str(r.exc_info[1]) for r in errors)

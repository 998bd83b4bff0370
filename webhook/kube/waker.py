"""Wakes the Jobs whose pod creations were held, the moment what held them has gone.

The pod webhook holds a ganged TrainJob's pod by denying its creation (`admission/handlers.py`);
the Job controller creates it again on its own backoff, 1 s doubling to 60 s per Job, so after a
hold of a minute its backoff, not the cluster, would decide when the gang starts. Each replica
remembers the Jobs it held (`held`), looks every `period` whether their pods would be tied now
(`judge`: the pod webhook's own decision, from the cache), and wakes each one that would: a
merge patch of one annotation on the Job, an update the Job controller syncs on within about a
second. A replica that starts also wakes, once what it needs is listed, the Jobs of ganged
TrainJobs that lack pods and have lost none (`sweep`): their creations were refused while no
replica answered, and nobody held them to remember.

Bounded: at most `max_jobs` Jobs remembered (the oldest forgotten first), `max_per_namespace`
of one namespace, each for at most `keep_for` seconds (then the Job controller's own retries
are left to it), and `judged_per_round` judged per look, in turn. A hold that can no longer end
in a tie (`moot`: its TrainJob gone, being deleted or suspended, its restart attempt over) is
forgotten once no pod of its Job was held for `moot_after` seconds (a cache that says
"suspended" may lag a resume: that Job is still woken when the cache catches up). The age
of the oldest hold is a gauge: holds are for faults, and one that lasts is
what to alert on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes.aio.client import ApiClient, BatchV1Api
from kubernetes.aio.client.exceptions import ApiException

log = logging.getLogger("webhook.waker")

WAKE_ANNOTATION = "trainjob-scheduling.dev/woken-at"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class HeldPod:
    """What placed a held pod (enough to judge a pod of its Job again) and its Job."""

    namespace: str
    job: str
    trainjob: str
    labels: Mapping[str, str]
    scheduler: str | None
    reason: str


@dataclass
class _Held:
    pod: HeldPod
    since: float  # when the first hold of its Job was
    last: float  # when the last one was
    failures: int = 0  # wakes that failed in a row (retried on later rounds)


@dataclass
class WakerSettings:
    period: float = 0.25  # seconds between looks at the held Jobs
    keep_for: float = 900.0  # seconds a held Job is remembered
    max_jobs: int = 10_000
    timeout: float = 5.0  # of one wake
    wakes_per_round: int = 64  # bounded work per look; the rest wait for the next
    judged_per_round: int = 512  # held Jobs judged per look (in turn): the loop stays free
    max_per_namespace: int = 1_000  # one namespace's pods cannot push out another's holds
    retries: int = 5  # failed wakes of one Job before it is left to the Job controller
    # A hold judged moot is forgotten only once no pod of its Job was held for this long: the
    # cache that says "suspended" or "gone" may lag a resume by a moment, and that Job must
    # still be woken once the cache catches up.
    moot_after: float = 30.0


@dataclass
class JobWaker:
    api: ApiClient | None
    judge: Callable[[HeldPod], bool]
    """True while a pod of the held Job would still be held."""
    settings: WakerSettings = field(default_factory=WakerSettings)
    moot: Callable[[HeldPod], bool] = lambda _: False
    """True when no pod of the held Job will come to be tied (its TrainJob gone, deleted or
    suspended, or its restart attempt over): forgotten, not woken."""
    on_wake: Callable[[str], None] | None = None  # the hold's reason, per Job woken
    on_round: Callable[[float], None] | None = None  # the oldest hold's age, after each look
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    _held: dict[tuple[str, str], _Held] = field(default_factory=dict)
    _per_namespace: dict[str, int] = field(default_factory=dict)
    _turn: int = 0  # where the next look starts judging
    _refused: bool = False  # a wake answered 403 (said once)

    def held(self, pod: HeldPod) -> None:
        """A pod of `pod.job` was held (called from the pod webhook: no I/O)."""
        key = (pod.namespace, pod.job)
        now = self.clock()
        found = self._held.pop(key, None)
        since = found.since if found is not None else now
        if found is None:
            count = self._per_namespace.get(pod.namespace, 0)
            if count >= self.settings.max_per_namespace:
                return  # its namespace has as many as it may: the Job controller retries
            self._per_namespace[pod.namespace] = count + 1
        self._held[key] = _Held(pod, since, now)  # the newest last: the oldest go first
        while len(self._held) > self.settings.max_jobs:
            self._forget(next(iter(self._held)))

    def _forget(self, key: tuple[str, str]) -> None:
        if self._held.pop(key, None) is None:
            return
        left = self._per_namespace.get(key[0], 1) - 1
        if left:
            self._per_namespace[key[0]] = left
        else:
            self._per_namespace.pop(key[0], None)

    def oldest(self) -> float:
        """Seconds since the oldest hold still remembered began (0 when none)."""
        now = self.clock()
        return max((now - h.since for h in self._held.values()), default=0.0)

    def __len__(self) -> int:
        return len(self._held)

    async def run(self) -> None:
        while True:
            await self.round()
            await asyncio.sleep(self.settings.period)

    async def round(self) -> None:
        """One look at every held Job: the ones whose pods would be tied now are woken."""
        now = self.clock()
        due: list[tuple[tuple[str, str], _Held]] = []
        entries = list(self._held.items())
        if not entries:
            self._turn = 0
        start = self._turn % len(entries) if entries else 0
        turn = entries[start:] + entries[:start]
        judged = 0
        for key, held in turn:
            if judged >= self.settings.judged_per_round:
                break
            judged += 1
            if now - held.since > self.settings.keep_for:
                self._forget(key)  # the Job controller's own retries have it from here
                continue
            try:
                if self.moot(held.pod):
                    if now - held.last > self.settings.moot_after:
                        self._forget(key)
                    continue
                still = self.judge(held.pod)
            except Exception:  # a judge that fails must not stop the others being woken
                log.exception("judging a held Job failed", extra=_fields(held.pod))
                continue
            if not still:
                due.append((key, held))
                if len(due) >= self.settings.wakes_per_round:
                    break
        self._turn = start + judged
        if due:
            await asyncio.gather(*(self._wake(key, held) for key, held in due))
        if self.on_round is not None:
            self.on_round(self.oldest())

    async def _wake(self, key: tuple[str, str], held: _Held) -> None:
        pod = held.pod
        if self.api is None:
            self._forget(key)
            return
        stamp = datetime.fromtimestamp(self.wall(), UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {"metadata": {"annotations": {WAKE_ANNOTATION: stamp}}}
        try:
            async with asyncio.timeout(self.settings.timeout):
                await BatchV1Api(self.api).patch_namespaced_job(
                    pod.job, pod.namespace, body, _content_type=MERGE_PATCH
                )
        except ApiException as err:
            if err.status == 403 and not self._refused:
                self._refused = True
                log.warning(
                    "may not patch Jobs to wake them: held pods come when the Job controller "
                    "retries on its own (grant patch on jobs, as the chart's ClusterRole does)",
                    extra=_fields(pod, error=f"HTTP {err.status}"),
                )
            if err.status in (403, 404, 422):  # not allowed, gone, or not a Job we can change
                self._forget(key)
                return
            self._failed(key, held, f"HTTP {err.status}")
            return
        except (TimeoutError, OSError) as err:
            self._failed(key, held, type(err).__name__)
            return
        except Exception as err:  # the client's own errors: keep the Job for a later round
            self._failed(key, held, f"{type(err).__name__}: {err}"[:200])
            return
        if self._held.get(key) is held:
            self._forget(key)
        if self.on_wake is not None:
            self.on_wake(pod.reason)
        log.info(
            "held Job woken",
            extra=_fields(pod, held_for_seconds=round(self.clock() - held.since, 3)),
        )

    def _failed(self, key: tuple[str, str], held: _Held, error: str) -> None:
        held.failures += 1
        if held.failures >= self.settings.retries:
            self._forget(key)
        log.debug("waking a held Job failed", extra=_fields(held.pod, error=error))


def _fields(pod: HeldPod, **more: Any) -> dict[str, Any]:
    return {"fields": {"job": f"{pod.namespace}/{pod.job}", "reason": pod.reason, **more}}

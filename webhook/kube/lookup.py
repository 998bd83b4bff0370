"""Whether a TrainJob exists, asked of the API server: only for a JobSet pod whose TrainJob this
replica's cache does not hold (a watch that lags, a replica that just started). Every other
admission answers from the cache alone.

A burst of pods of one JobSet asks once (one request in flight per name, its answer kept for a
few seconds), and the names remembered are bounded, so a flood of plain JobSets' pods costs a
bounded number of requests and bytes.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from urllib.parse import quote

from kubernetes.aio.client import ApiClient
from kubernetes.aio.client.exceptions import ApiException

from ..core.trainer import TRAINER_GROUP
from . import rest

Ask = Callable[[str, str], Awaitable[bool]]  # (namespace, name) -> exists; raises when unknown
MAX_REMEMBERED = 4096
TTL = 5.0  # seconds an answer is kept: far below a Job controller's retry of a held pod
TIMEOUT = 2.0  # well inside the webhook's own timeout (the chart's: 10 s)


class TrainJobLookup:
    def __init__(self, ask: Ask, clock: Callable[[], float] = time.monotonic) -> None:
        self._ask = ask
        self._clock = clock
        self._answers: OrderedDict[tuple[str, str], tuple[float, bool]] = OrderedDict()
        self._asking: dict[tuple[str, str], asyncio.Future[bool | None]] = {}

    def __len__(self) -> int:
        """The answers kept."""
        return len(self._answers)

    async def exists(self, namespace: str, name: str) -> bool | None:
        """True or False as the API server says; None when it could not be asked."""
        key = (namespace, name)
        kept = self._answers.get(key)
        if kept is not None and self._clock() - kept[0] < TTL:
            return kept[1]
        asking = self._asking.get(key)
        if asking is None:
            asking = self._asking[key] = asyncio.ensure_future(self._fetch(key))
            asking.add_done_callback(lambda _: self._asking.pop(key, None))
        return await asyncio.shield(asking)

    async def _fetch(self, key: tuple[str, str]) -> bool | None:
        try:
            found = await asyncio.wait_for(self._ask(*key), TIMEOUT)
        except Exception:  # the API server is slow or down: not known (the caller holds)
            return None
        self._answers[key] = (self._clock(), found)
        self._answers.move_to_end(key)
        while len(self._answers) > MAX_REMEMBERED:
            self._answers.popitem(last=False)
        return found


def api_ask(api: ApiClient) -> Ask:
    """A GET of the TrainJob: 200 exists, 404 does not; anything else raises."""

    async def ask(namespace: str, name: str) -> bool:
        path = rest.collection(TRAINER_GROUP, "v1alpha1", "trainjobs", namespace)
        try:
            await rest.get_json(api, f"{path}/{quote(name, safe='')}", timeout=TIMEOUT)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    return ask


RuntimeFetch = Callable[[str, str, str], Awaitable["dict[str, object] | None"]]


def runtime_fetch(api: ApiClient) -> RuntimeFetch:
    """A runtime as the API server has it now (kind, namespace, name), within TIMEOUT; None
    when it does not exist or cannot be read: the snapshot guard's one live read, for a snapshot
    another replica froze from a runtime this one has not seen yet."""

    async def fetch(kind: str, namespace: str, name: str) -> dict[str, object] | None:
        plural = "trainingruntimes" if kind == "TrainingRuntime" else "clustertrainingruntimes"
        path = rest.collection(
            TRAINER_GROUP, "v1alpha1", plural, namespace if kind == "TrainingRuntime" else None
        )
        try:
            found = await rest.get_json(api, f"{path}/{quote(name, safe='')}", timeout=TIMEOUT)
        except Exception:  # not there, forbidden, slow: the guard denies (it never guesses)
            return None
        return found

    return fetch

"""The JobSet watch, started once discovery says JobSets are served (`jobsets.py` keeps them)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from kubernetes.aio.client import ApiClient

from .discovery import api_state
from .informer import Informer
from .store import Store

log = logging.getLogger("webhook.jobsets")

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
NOT_SERVED_RECHECK = 60.0  # seconds between discovery checks while JobSet is not served
UNKNOWN_RECHECK = 5.0  # ... while discovery cannot say


async def watch_jobsets(
    api: ApiClient,
    store: Store,
    informers: Callable[[], list[Informer]],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """The JobSet watches, once discovery says JobSets are served. Until then (a cluster
    without JobSet: no TrainJob makes a pod there) they are listed as none, so nothing waits
    for them; looked for again every minute."""
    said = False
    while True:
        state = await api_state(api, JOBSET_API, frozenset({"jobsets"}))
        if state == "served":
            await asyncio.gather(*(i.run() for i in informers()))
            return
        if state == "not-served":
            if not store.synced:
                store.replace([])
            if not said:
                said = True
                log.info(
                    f"{JOBSET_API} jobsets is not served: no TrainJob pods here, restart "
                    "attempt 0 (looked for again every minute)",
                )
        await sleep(NOT_SERVED_RECHECK if state == "not-served" else UNKNOWN_RECHECK)

"""List, then watch, one resource into a `Store`, for as long as the service runs.

The watch resumes from the last resourceVersion it saw; `410 Gone` (that version is too old)
means list again; any other failure (dropped connection, 5xx, timeout) waits with exponential
backoff and resumes. Only this module and `client.py` talk to the API server for the cache.

"Too large resource version" (the API server's watch cache has not reached the version asked
for, routine for a few seconds after it restarts) is retried the same way, but logged at debug
until it persists (TRANSIENT_RETRIES failures in a row, or TRANSIENT_SECONDS).

The list comes in pages (`limit` and `continue`, as client-go's reflector lists; 100 at a time),
and a `Store` takes each page as it comes (`store.Listing`): a relist of 80,000 TrainJobs (every
replica at once, after an API server restart) holds the store and one page, never a second
list beside the store. A sink that keeps less (the Nodes' summary, the pods' counts) gets the
whole list at the end, each item trimmed as it arrives.

A refusal (`refusal.py`) is not a failure to retry in a loop: the API server answers the same
until someone acts. A 403, or a watched namespace that is gone, is said once (a warning naming
what to do; at debug while it lasts) and once more when it ends (info), counted while it lasts
(`on_refusal`), and retried with a backoff of its own, from 1 s up to a minute (a missing rule:
granted, the watch resumes within the minute) or five (a namespace gone: it may come back). A
watched namespace the API server says no longer exists is listed as empty, as client-go's
reflector syncs an empty list on a 404: its objects go, and readiness does not wait for it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from kubernetes.aio.client import ApiClient
from kubernetes.aio.client.exceptions import ApiException

from . import rest
from .refusal import (
    FORBIDDEN,
    NAMESPACE_GONE,
    NamespaceState,
    Refusal,
    namespace_state,
    refusal_of,
)
from .store import Relisting, Sink

log = logging.getLogger("webhook.informer")

Sleep = Callable[[float], Awaitable[None]]
MIN_WATCH_SECONDS = 1.0
TRANSIENT_RETRIES = 5  # "Too large resource version" in a row before it is a warning
TRANSIENT_SECONDS = 10.0  # or this long since the first of them
YIELD_EVERY = 64  # watch events handled between two turns of the event loop
NOT_SERVED = " (the resource is not served: is the Kubeflow Trainer CRD installed?)"
# Objects a list asks for at a time. client-go's reflector asks for 500; a page of 500 stored
# TrainJobs (4 KB of JSON each) peaks at about 32 MB while it is decoded (16 times its JSON:
# orjson's document and the objects), and a relist holds one page: 100 keep it near 6 MB.
PAGE_SIZE = 100
# Backoff caps of a refused list or watch: a rule granted is seen within a minute; a namespace
# gone may never come back, and asking every few minutes costs the API server nothing.
REFUSED_BACKOFF_MAX: dict[Refusal, float] = {FORBIDDEN: 60.0, NAMESPACE_GONE: 300.0}
REFUSED_BACKOFF_INITIAL = 1.0
# Told when a refusal starts (None, reason), changes (reason, reason) or ends (reason, None).
OnRefusal = Callable[[Refusal | None, Refusal | None], None]


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}/{self.version}" if self.group else self.plural


@dataclass
class Backoff:
    """Exponential backoff with full jitter, so replicas do not retry in step."""

    initial: float = 0.5
    maximum: float = 30.0
    attempt: int = 0

    def next_delay(self) -> float:
        ceiling = min(self.maximum, self.initial * 2**self.attempt)
        self.attempt += 1
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempt = 0


class Informer:
    def __init__(
        self,
        api: ApiClient,
        resource: Resource,
        store: Sink,
        *,
        namespace: str | None = None,
        watch_timeout: int = 300,
        backoff: Backoff | None = None,
        not_served_hint: str = NOT_SERVED,
        forbidden_hint: str = "",
        page_size: int | None = PAGE_SIZE,
        label_selector: str | None = None,
        on_restart: Callable[[], None] | None = None,
        on_refusal: OnRefusal | None = None,
        refused_backoff: Backoff | None = None,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.resource = resource
        self.store = store
        self.namespace = namespace  # None: all namespaces
        self.not_served_hint = not_served_hint
        self.forbidden_hint = forbidden_hint
        """Said with a 403 (what goes without the resource), after what to grant."""
        self.page_size = page_size  # None: the whole list in one answer
        self.selector = [("labelSelector", label_selector)] if label_selector else []
        self.watch_timeout = watch_timeout
        self.backoff = backoff or Backoff()
        self.sleep = sleep
        self.clock = clock
        self.resource_version: str | None = None
        self.restarts = 0  # lists and watches that ended in an error
        self.on_restart = on_restart
        # "Too large resource version" failures in a row, and when the first of them happened.
        self._lagging = 0
        self._lagging_since = 0.0
        # A refusal that lasts (`refusal.py`): why, since when, and its own backoff.
        self.refused: Refusal | None = None
        self.on_refusal = on_refusal
        self.refused_backoff = refused_backoff or Backoff(initial=REFUSED_BACKOFF_INITIAL)
        self._refused_since = 0.0
        self._ask_namespace = True  # until the API server will not say (no `get namespaces`)
        self._emptied = False  # its namespace's objects removed: the namespace is gone

    async def run(self) -> None:
        try:
            await self._run()
        finally:  # stopped (discovery, shutdown): a refusal no longer lasts
            self._refusal_over(quietly=True)

    async def _run(self) -> None:
        while True:
            step = "list"
            try:
                if self.resource_version is None:
                    await self._list()
                step = "watch"
                started = self.clock()
                events = await self._watch()
                self._lagging = 0  # a watch that ended well: the server had caught up
                if events == 0 and self.clock() - started < MIN_WATCH_SECONDS:
                    # Like client-go: a watch that ends at once with nothing is a failure, or a
                    # misbehaving server (or proxy) would have us re-watch in a hot loop.
                    await self._retry("watch", "ended at once without events")
            except ApiException as err:
                if err.status == 410:
                    log.info("watch expired, listing again", extra=self._fields())
                    self.resource_version = None
                    continue
                refusal = refusal_of(err, self.namespace)
                if refusal is not None:
                    await self._refused(step, refusal, err)
                    continue
                hint = self.not_served_hint if err.status == 404 and step == "list" else ""
                transient = too_large_resource_version(err)
                await self._retry(step, f"HTTP {err.status}: {err.reason}{hint}", transient)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # connection drops, timeouts, garbage on the stream
                await self._retry(step, f"{type(err).__name__}: {err}")

    def _path(self) -> str:
        r = self.resource
        return rest.collection(r.group, r.version, r.plural, self.namespace)

    async def _list(self) -> None:
        # A Store takes each page as it comes; a summary, the whole list once it is in.
        into = self.store.relist(self.namespace) if isinstance(self.store, Relisting) else None
        items: list[dict[str, Any]] = []
        count = 0
        token: str | None = None
        while True:
            query: list[tuple[str, Any]] = [*self.selector]
            if self.page_size:
                query.append(("limit", self.page_size))
            if token:
                query.append(("continue", token))
            answer = await rest.get_json(self.api, self._path(), query, timeout=60)
            page = rest.items_of(answer)
            count += len(page)
            if into is not None:
                into.add(page)
            else:
                items += [self.store.trim(item) for item in page]
            meta = answer.get("metadata")
            token = meta.get("continue") if isinstance(meta, dict) and self.page_size else None
            if not token:
                break
            page, answer = [], {}  # this page goes before the next one comes
        if into is not None:
            into.done()
        else:
            self.store.replace(items, self.namespace)
        self.resource_version = _resource_version(answer) or ""
        self.backoff.reset()
        self._lagging = 0
        self._refusal_over()
        log.info("listed", extra=self._fields(objects=len(self.store), listed=count))

    async def _watch(self) -> int:
        """One watch request, read line by line until the server ends it.

        The stream is read here rather than through `kubernetes.aio.watch.Watch`, which takes an
        HTTP error with an empty body (a proxy's 503) for a clean end and would retry at once,
        forever; here any status but 200 is an ApiException, and so is an ERROR event. Returns
        how many events arrived.
        """
        query: list[tuple[str, Any]] = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", self.watch_timeout),
            *self.selector,
        ]
        if self.resource_version:
            query.append(("resourceVersion", self.resource_version))
        # The request's own timeout outlasts the watch's, or long watches would be cut short.
        response: Any = await rest.request(
            self.api, "GET", self._path(), query=query, timeout=self.watch_timeout + 30
        )
        events = 0
        try:
            if response.status != 200:
                body = (await response.read())[:500].decode(errors="replace")
                raise ApiException(status=response.status, reason=response.reason, body=body)
            self._refusal_over()
            async for line in response.content:
                if line.strip():
                    self._apply(_event(line))
                    self.backoff.reset()
                    events += 1
                    if events % YIELD_EVERY == 0:  # a burst's buffered lines: let others run
                        await asyncio.sleep(0)
        finally:
            response.release()
        return events

    def _apply(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object")
        if not isinstance(obj, dict):
            return
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self.store.apply(kind, obj)
        rv = _resource_version(obj)
        if rv:
            self.resource_version = rv

    async def _retry(self, step: str, error: str, transient: bool = False) -> None:
        self._restarted()
        delay = self.backoff.next_delay()
        quiet = False
        more: dict[str, Any] = {}
        if transient:  # routine for a moment after an API server restart: warn if it persists
            now = self.clock()
            self._lagging_since = now if self._lagging == 0 else self._lagging_since
            self._lagging += 1
            lasted = now - self._lagging_since
            quiet = self._lagging < TRANSIENT_RETRIES and lasted < TRANSIENT_SECONDS
            more = {"failures_in_a_row": self._lagging, "for_seconds": round(lasted, 1)}
        else:
            self._lagging = 0
        log.log(
            logging.DEBUG if quiet else logging.WARNING,
            f"{step} failed, retrying",
            extra=self._fields(error=error, retry_in=round(delay, 2), **more),
        )
        await self.sleep(delay)

    def _restarted(self) -> None:
        self.restarts += 1
        if self.on_restart:
            self.on_restart()

    # --- refusals: said once, retried slowly ---------------------------------------------------

    async def _refused(self, step: str, refusal: Refusal, err: ApiException) -> None:
        self._restarted()
        self._lagging = 0
        state: NamespaceState = "unknown"
        if refusal == FORBIDDEN and self.namespace and self._ask_namespace:
            # RBAC refuses alike a missing rule and a namespace deleted with its Role: ask.
            state = await namespace_state(self.api, self.namespace)
            self._ask_namespace = state != "unknown"  # no `get namespaces`: not asked again
            if state in ("gone", "terminating"):
                refusal = NAMESPACE_GONE
        elif refusal == NAMESPACE_GONE and err.status == 404:
            state = "gone"  # the list's own answer names the namespace
        if state == "gone":
            # As client-go's reflector on a 404: the namespace has no objects. Listed as empty,
            # its objects go and readiness does not wait for it; listed again once it is back.
            if not self._emptied:
                self.store.replace([], self.namespace)
                self._emptied = True
            self.resource_version = None
        if refusal != self.refused:
            self._say_refused(step, refusal, err, state)
        backoff = self.refused_backoff
        backoff.maximum = REFUSED_BACKOFF_MAX[refusal]
        delay = backoff.next_delay()
        log.debug(
            f"{step} refused, retrying",
            extra=self._fields(reason=refusal, error=_error(err), retry_in=round(delay, 2)),
        )
        await self.sleep(delay)

    def _say_refused(
        self, step: str, refusal: Refusal, err: ApiException, state: NamespaceState
    ) -> None:
        before, self.refused = self.refused, refusal
        if before is None:
            self._refused_since = self.clock()
        if self.on_refusal:
            self.on_refusal(before, refusal)
        r, ns = self.resource, self.namespace
        where = f' in namespace "{ns}"' if ns else ""
        group = f' (API group "{r.group}")' if r.group else ""
        if refusal == NAMESPACE_GONE:
            going = "is being deleted" if state == "terminating" else "no longer exists"
            msg = (
                f"watched namespace {ns!r} {going}: its {r.plural} are not watched until it "
                "comes back (asked again every few minutes); take it out of --watch-namespaces "
                "(the chart's serve.watchNamespaces) if it is gone for good"
            )
        else:
            msg = (
                f"the service may not {step} {r.plural}{group}{where}: grant list and watch on "
                f"{r.plural}{group}{where} (the chart's "
                f"{'Role <name>-watched' if ns else 'ClusterRole'} does)"
            )
            if ns and state == "unknown":
                msg += (
                    f", or, if namespace {ns!r} was deleted, take it out of --watch-namespaces "
                    "(RBAC refuses both alike; with `get` on namespaces the service tells them "
                    "apart)"
                )
            msg += self.forbidden_hint
        log.warning(
            msg,
            extra=self._fields(
                reason=refusal,
                error=f"{_error(err)}{self.forbidden_hint}",
                retry_at_most=REFUSED_BACKOFF_MAX[refusal],
            ),
        )

    def _refusal_over(self, quietly: bool = False) -> None:
        """The list or watch was allowed again (or the informer stops)."""
        refusal = self.refused
        if refusal is None:
            return
        self.refused = None
        self.refused_backoff.reset()
        self._ask_namespace = True
        self._emptied = False
        if self.on_refusal:
            self.on_refusal(refusal, None)
        if not quietly:
            lasted = round(self.clock() - self._refused_since, 1)
            log.info(
                "allowed again after a refusal",
                extra=self._fields(reason=refusal, refused_for_seconds=lasted),
            )

    def _fields(self, **more: Any) -> dict[str, Any]:
        scope = {"namespace": self.namespace} if self.namespace else {}
        return {"fields": {"resource": str(self.resource), **scope, **more}}


def _error(err: ApiException) -> str:
    """The status and the Status's message (else the start of the body: cut short, it does not
    parse)."""
    body = err.body if isinstance(err.body, str) else ""
    message = rest.status_message(err) or body[:200]
    return f"HTTP {err.status}: {err.reason}" + (f": {message}" if message else "")


def _event(line: bytes) -> dict[str, Any]:
    event = orjson.loads(line)
    if not isinstance(event, dict):
        raise ValueError("a watch event is not a JSON object")
    if event.get("type") == "ERROR":  # e.g. 410 Gone: the resourceVersion is too old
        status = event.get("object")
        status = status if isinstance(status, dict) else {}
        body = orjson.dumps(status).decode()  # the Status, for its details
        raise ApiException(status=status.get("code"), reason=status.get("message"), body=body)
    return event


def too_large_resource_version(err: ApiException) -> bool:
    """Whether the API server's cache has not reached the resourceVersion asked for yet: its
    Status (a 504 Timeout; a real API server was also seen to send it as a 500) has the cause
    ResourceVersionTooLarge, or, before Kubernetes 1.18.6, only says so in its message. As
    client-go's reflector tells it."""
    try:
        status = orjson.loads(err.body) if isinstance(err.body, str | bytes) and err.body else {}
    except orjson.JSONDecodeError:
        status = {}
    status = status if isinstance(status, dict) else {}
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    if any(
        isinstance(c, dict) and c.get("reason") == "ResourceVersionTooLarge"
        for c in (causes if isinstance(causes, list) else [])[:16]
    ):
        return True
    message = status.get("message") or err.reason
    return isinstance(message, str) and "Too large resource version" in message


def _resource_version(obj: dict[str, Any]) -> str | None:
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return rv if isinstance(rv, str) else None

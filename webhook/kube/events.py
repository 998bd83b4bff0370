"""Kubernetes Events (`events.k8s.io/v1`) about TrainJobs, so `kubectl describe` tells the story.

Events are best effort, as in client-go: `record` never waits for the API server; a bounded
queue feeds the senders; the same event (object, reason, note) is posted once per `dedupe_for`
seconds, so a TrainJob that keeps failing does not flood etcd. With a `gate` (the writer's
`WriteLanes.report_turn`, as `serve` runs it), each post waits for it: Events report, so they
go after the writes that make gangs and within the reporting budget. A `bucket` of their own
limits them instead where there is no writer to share a budget with.

An Event the API server refuses (`refusal.py`: a 403 of RBAC, a namespace being deleted, a 404
of a namespace gone) is dropped, never retried, counted (`on_refused`) and said once per
namespace and reason, as client-go's recorder drops a refused Event and says nothing of one
refused because its namespace is terminating. The namespace's next Events are then dropped
unposted for a while (1 s, doubling to 5 minutes while it still refuses them): a namespace
being deleted refuses every one, and asking again for each would be a loop. An Event posted
there again says so once.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from kubernetes.aio.client import ApiClient, EventsV1Api
from kubernetes.aio.client.exceptions import ApiException

from .microtime import MicroTime
from .refusal import NAMESPACE_GONE, Refusal, refusal_of
from .rest import body_of, status_message
from .writer import TokenBucket

log = logging.getLogger("webhook.events")

EventKind = Literal["Normal", "Warning"]
MAX_NOTE = 1024  # the API server's limit on `note`
# How long a namespace that refused an Event gets none posted: from HOLD_INITIAL, doubling while
# it still refuses them, up to HOLD_MAX.
HOLD_INITIAL = 1.0
HOLD_MAX = 300.0
MAX_HELD_NAMESPACES = 10_000


@dataclass
class Hold:
    """A namespace that refused an Event: why, until when nothing is posted there, for how long
    the last time."""

    reason: Refusal
    until: float
    seconds: float


class EventRecorder:
    def __init__(
        self,
        api: ApiClient | None,
        controller: str,
        instance: str,
        *,
        queue_size: int = 1000,
        dedupe_for: float = 600.0,
        timeout: float = 5.0,
        on_event: Callable[[str], None] | None = None,
        on_drop: Callable[[], None] | None = None,
        on_refused: Callable[[Refusal], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        gate: Callable[[], Awaitable[None]] | None = None,
        bucket: TokenBucket | None = None,
    ) -> None:
        self.events = EventsV1Api(api) if api is not None else None
        self.gate = gate
        self.bucket = bucket  # None: posted as fast as the senders go (tests)
        self.controller = controller
        self.instance = instance
        self.dedupe_for = dedupe_for
        self.timeout = timeout
        self.on_event = on_event
        self.on_drop = on_drop
        self.on_refused = on_refused
        self.clock = clock
        self.dropped = 0
        self.refused = 0  # Events the API server refused, or that a hold kept from it
        self._holds: dict[str, Hold] = {}  # namespace -> its hold
        self._said: set[tuple[str, Refusal]] = set()  # (namespace, reason) logged
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(queue_size)
        self._recent: dict[tuple[str, str, str], float] = {}

    def record(
        self,
        regarding: Mapping[str, Any],
        kind: EventKind,
        reason: str,
        action: str,
        note: str,
    ) -> None:
        """Queues an Event about `regarding` (a stored object's JSON)."""
        meta = regarding.get("metadata") or {}
        key = (str(meta.get("uid")), reason, note)
        now = self.clock()
        if now - self._recent.get(key, -self.dedupe_for) < self.dedupe_for:
            return
        self._recent[key] = now
        if len(self._recent) > 10_000:  # bounded: forget the oldest half
            for old in sorted(self._recent, key=self._recent.__getitem__)[:5_000]:
                del self._recent[old]
        log_fields = {"trainjob": f"{meta.get('namespace')}/{meta.get('name')}", "reason": reason}
        log.log(
            logging.WARNING if kind == "Warning" else logging.INFO,
            note,
            extra={"fields": log_fields},
        )
        try:
            self._queue.put_nowait(self._event(regarding, kind, reason, action, note))
        except asyncio.QueueFull:
            self.dropped += 1
            if self.on_drop:
                self.on_drop()
            if self.dropped % 1000 == 1:  # the first, then every thousandth
                log.warning(
                    "event queue full, events dropped", extra={"fields": {"dropped": self.dropped}}
                )
            return
        if self.on_event:
            self.on_event(reason)

    async def run(self, senders: int = 4) -> None:
        """Posts queued events until cancelled, `senders` at a time (one at a time fell behind
        10,000 TrainJobs created at once); a failure is logged and the event dropped."""
        await asyncio.gather(*(self._send() for _ in range(senders)))

    async def _send(self) -> None:
        while True:
            event = await self._queue.get()
            if self.events is None:
                continue
            namespace: str = event["metadata"]["namespace"]
            held = self._holds.get(namespace)
            if held is not None and self.clock() < held.until:
                self._count_refused(held.reason)  # dropped unposted: the namespace refuses them
                continue
            if self.bucket is not None:
                await self.bucket.acquire()
            body: Any = event  # the client serialises a plain dict as it is
            try:
                if self.gate is not None:
                    await self.gate()
                # The client's own timeout (not wait_for, which on Python 3.11 can swallow the
                # cancellation that stops this loop).
                # The created Event comes back; decoding it into the client's models would
                # cost more than posting it, and nothing reads it.
                response = await self.events.create_namespaced_event_without_preload_content(
                    namespace, body, _request_timeout=self.timeout
                )
                await body_of(response)
            except asyncio.CancelledError:
                raise
            except ApiException as err:
                refusal = refusal_of(err, namespace)
                if refusal is not None:
                    self._refused(namespace, refusal, event, err)
                else:
                    self._failed(event, err)
            except Exception as err:
                self._failed(event, err)
            else:
                self._posted(namespace)

    def _failed(self, event: dict[str, Any], err: Exception) -> None:
        log.warning(
            "cannot post an event",
            extra={
                "fields": {
                    "reason": event["reason"],
                    "error": f"{type(err).__name__}: {err}"[:200],
                }
            },
        )

    def _count_refused(self, reason: Refusal) -> None:
        self.refused += 1
        if self.on_refused:
            self.on_refused(reason)

    def _refused(
        self, namespace: str, reason: Refusal, event: dict[str, Any], err: ApiException
    ) -> None:
        """Dropped, never retried; the namespace held; said once per namespace and reason."""
        self._count_refused(reason)
        before = self._holds.pop(namespace, None)  # (re-inserted: the newest last)
        seconds = min(HOLD_MAX, before.seconds * 2) if before else HOLD_INITIAL
        self._holds[namespace] = Hold(reason, self.clock() + seconds, seconds)
        if len(self._holds) > MAX_HELD_NAMESPACES:
            del self._holds[next(iter(self._holds))]
        fields = {
            "namespace": namespace,
            "refusal": reason,
            "reason": event["reason"],
            "error": f"HTTP {err.status}: {status_message(err) or err.reason}"[:300],
        }
        if (namespace, reason) in self._said:
            log.debug("event refused, dropped", extra={"fields": fields})
            return
        if len(self._said) >= MAX_HELD_NAMESPACES:  # bounded: at worst one is said again
            self._said.clear()
        self._said.add((namespace, reason))
        if reason == NAMESPACE_GONE:
            log.info(
                f"namespace {namespace!r} is being deleted or gone: Events about its TrainJobs "
                "are dropped, never retried",
                extra={"fields": fields},
            )
        else:
            log.warning(
                f"the service may not create events (API group events.k8s.io) in namespace "
                f"{namespace!r}: Events about its TrainJobs are dropped, never retried; grant "
                "create on events.events.k8s.io there (the chart's ClusterRole, or its Role "
                "<name>-watched with serve.watchNamespaces, does)",
                extra={"fields": fields},
            )

    def _posted(self, namespace: str) -> None:
        """An Event went out: a namespace that refused them takes them again."""
        if self._holds.pop(namespace, None) is None:
            return
        said = {key for key in self._said if key[0] == namespace}
        if said:
            self._said -= said
            log.info("events are posted again", extra={"fields": {"namespace": namespace}})

    def _event(
        self, regarding: Mapping[str, Any], kind: EventKind, reason: str, action: str, note: str
    ) -> dict[str, Any]:
        meta = regarding.get("metadata") or {}
        name = meta.get("name", "")
        return {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            # As client-go names them: the object's name and a unique suffix.
            "metadata": {"name": f"{name}.{secrets.token_hex(8)}", "namespace": meta["namespace"]},
            # A MicroTime object, not a string: the client re-parses strings and writes them back
            # with isoformat(), which drops a zero fraction the API server insists on.
            "eventTime": MicroTime.of(datetime.now(UTC)),
            "reportingController": self.controller,
            "reportingInstance": self.instance,
            "action": action,
            "reason": reason,
            "type": kind,
            "note": note.encode()[:MAX_NOTE].decode(errors="ignore"),  # the limit is in bytes
            "regarding": {
                "apiVersion": regarding.get("apiVersion"),
                "kind": regarding.get("kind"),
                "name": name,
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
        }

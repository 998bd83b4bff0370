"""Self-managed webhook certificates, the API side (what to hold is decided in
`tls/selfmanaged.py`).

Every replica runs one `SelfManagedCerts`. It watches the Secret and both webhook configurations
by name and, on every change and at least every `check_period`:

* decides what the Secret should hold and writes it when that differs: a create (409: another
  replica created it first) or an update carrying the resourceVersion it read (409: it changed
  meanwhile); either way it reads again and decides again, so of replicas racing one write wins
  and the others keep what it wrote;
* writes the serving pair and the bundle to a private directory and has the `ReloadingContext`
  load them at once: a renewal reaches new connections within seconds of the Secret's change;
* puts the bundle into every webhook of both configurations with a JSON Patch guarded by `test`s
  (422 when someone changed them meanwhile: read again, decide again), after a fresh GET of the
  Secret, so a replica whose watch lags never puts back an older bundle.

Readiness: `tls.loaded` (a usable certificate is served) and `bundle_ready` (every webhook
carries the bundle). A failing request is logged once (a 403 as an error naming the verb, the
object and the RBAC rule), retried with backoff, and logged again only when it changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from kubernetes.aio.client import ApiClient
from kubernetes.aio.client.exceptions import ApiException

from ..tls import selfmanaged as sm
from ..tls.certs import CA_CERT, TLS_CERT, TLS_KEY, write_atomic
from ..tls.reload import ReloadingContext
from .informer import Backoff
from .named import MUTATING, SECRETS, VALIDATING, Json, Named, NamedWatch, Ref, secret

log = logging.getLogger("webhook.certs")

Clock = Callable[[], dt.datetime]
RETRIES = 5  # conflicts in a row before a pass counts as failed (and backs off)


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class SelfCertSettings:
    secret: str  # the kubernetes.io/tls Secret's name ...
    namespace: str  # ... and namespace
    mutating: str  # the MutatingWebhookConfiguration's name ("": none)
    validating: str  # the ValidatingWebhookConfiguration's name ("": none)
    check_period: float = 3600.0  # seconds; at least this often, whatever the watches say

    def __post_init__(self) -> None:
        if not (self.secret and self.namespace):
            raise ValueError("self-managed certificates need the Secret's name and namespace")
        if self.check_period <= 0:
            raise ValueError(f"the certificate check period must be positive: {self.check_period}")


def rbac_rule(ref: Ref) -> str:
    """What the service account needs for `ref`, worded as the rules in the README."""
    if ref.resource == SECRETS:
        return (
            f'{{apiGroups: [""], resources: [secrets], resourceNames: ["{ref.name}"], '
            f'verbs: [get, watch, update]}} and {{apiGroups: [""], resources: [secrets], '
            f'verbs: [create]}} in a Role in namespace "{ref.namespace}"'
        )
    return (
        f"{{apiGroups: [admissionregistration.k8s.io], resources: [{ref.resource}], "
        f'resourceNames: ["{ref.name}"], verbs: [get, watch, patch]}} in a ClusterRole'
    )


def describe(err: BaseException) -> str:
    if isinstance(err, ApiException):
        try:  # the API server's Status says why (e.g. a Secret of another type: immutable)
            message = orjson.loads(err.body or b"").get("message")
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            message = None
        return f"HTTP {err.status}: {message or err.reason}"
    if isinstance(err, TimeoutError):
        return "no answer in time"
    return f"{type(err).__name__}: {err}"


class _Again(Exception):
    """Someone else wrote first: read again and decide again, now."""


class SelfManagedCerts:
    def __init__(
        self,
        api: ApiClient,
        settings: SelfCertSettings,
        policy: sm.Policy,
        tls: ReloadingContext,
        directory: Path,
        *,
        clock: Clock = utc_now,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        backoff: Callable[[], Backoff] = lambda: Backoff(initial=1.0, maximum=60.0),
    ) -> None:
        self.settings = settings
        self.policy = policy
        self.tls = tls
        self.directory = directory
        self.clock = clock
        self.named = Named(api)
        self.secret_ref = Ref(SECRETS, settings.secret, settings.namespace)
        self.config_refs = [
            Ref(resource, name)
            for resource, name in ((MUTATING, settings.mutating), (VALIDATING, settings.validating))
            if name
        ]
        self.watches = {
            ref: NamedWatch(
                self.named,
                ref,
                self._changed,
                self._reporter(ref),
                backoff=backoff(),
                sleep=sleep,
            )
            for ref in (self.secret_ref, *self.config_refs)
        }
        self._retry = backoff()
        self._wake = asyncio.Event()
        self._errors: dict[tuple[Ref, str], str] = {}
        self._missing: set[Ref] = set()
        self._lost: sm.Material | None = None  # the last usable contents, should the Secret go
        self._in_place: tuple[bytes, dt.datetime] | None = None  # bundle every webhook carries
        self._served = b""  # digest of the files last written
        self.bundle_ready = False
        self.material: sm.Material | None = None
        self.passes = 0  # sync() calls so far

    # --- running ---

    async def run(self) -> None:
        await asyncio.gather(*(watch.run() for watch in self.watches.values()), self._loop())

    async def _loop(self) -> None:
        conflicts = 0
        while True:
            self._wake.clear()
            try:
                delay = await self.sync()
                conflicts = 0
                self._retry.reset()
            except _Again:
                conflicts += 1
                delay = 0.0 if conflicts < RETRIES else self._retry.next_delay()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # reported where it happened; anything else here
                if not isinstance(err, ApiException | TimeoutError | OSError):
                    log.exception("certificate pass failed")
                delay = self._retry.next_delay()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)

    def _changed(self, obj: Json | None) -> None:
        self._wake.set()

    # --- one pass ---

    async def sync(self) -> float:
        """Decide, write, serve, inject; returns the seconds until the next pass is due."""
        self.passes += 1
        watch = self.watches[self.secret_ref]
        if not watch.loaded:
            return self.settings.check_period  # woken once the first GET answers
        current = watch.object
        stored = sm.read(sm.decode(current.get("data"))) if current is not None else None
        now = self.clock()
        decision = sm.decide(
            stored,
            self.policy,
            now,
            bundle_in_place=self._in_place,
            lost=self._lost if current is None else None,
        )
        if not decision.keep:
            await self._write(current, decision)
        material = decision.material
        self.material = self._lost = material
        self._serve(material)
        await self._inject(material.bundle)
        return self._next_pass(material, now)

    async def _write(self, current: Json | None, decision: sm.Decision) -> None:
        ref, watch = self.secret_ref, self.watches[self.secret_ref]
        data = sm.encode(decision.material.data())
        try:
            if current is None:
                request = self.named.create(ref, secret(ref, data))
                written = await self._call(ref, "create", request, handled=(409,))
            else:
                rv = current.get("metadata", {}).get("resourceVersion")
                body = secret(ref, data, rv)
                written = await self._call(ref, "update", self.named.replace(ref, body), (404, 409))
        except ApiException as err:
            if err.status not in (404, 409):
                raise
            watch.seen(await self._call(ref, "get", self.named.get(ref)))
            raise _Again() from None
        watch.seen(written)
        m = decision.material
        fields = {
            "secret": f"{ref.namespace}/{ref.name}",
            "changes": list(decision.changes),
            "ca_expires": m.ca_key.cert.not_valid_after_utc.isoformat(),
            "serving_expires": m.serving.cert.not_valid_after_utc.isoformat(),
            "bundle_cas": len(m.cas),
        }
        if decision.problems:
            fields["replaced"] = list(decision.problems)
        verb = "created" if current is None else "updated"
        log.info(
            f"{verb} the certificate Secret: {', '.join(decision.changes)}",
            extra={"fields": fields},
        )

    def _serve(self, material: sm.Material) -> None:
        pair = material.serving
        digest = hashlib.sha256(pair.cert_pem + b"\0" + pair.key_pem + b"\0" + material.bundle)
        if digest.digest() == self._served:
            return
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(self.directory / CA_CERT, material.bundle, 0o644)
        write_atomic(
            self.directory / TLS_KEY, pair.key_pem, 0o600
        )  # the key first: see certs.write
        write_atomic(self.directory / TLS_CERT, pair.cert_pem, 0o644)
        self.tls.reload()
        self._served = digest.digest()

    async def _inject(self, bundle: bytes) -> None:
        in_place = True
        for ref in self.config_refs:
            watch = self.watches[ref]
            config = watch.object
            if not watch.loaded or config is None:
                if watch.loaded and ref not in self._missing:
                    self._missing.add(ref)
                    log.warning(f"{ref} does not exist (yet): the CA bundle goes in once it does")
                in_place = False
                continue
            self._missing.discard(ref)
            ops = sm.bundle_ops(config, bundle)
            if ops:
                await self._patch(ref, config, ops, bundle)
        if not in_place:
            self._in_place = None
        elif self._in_place is None or self._in_place[0] != bundle:
            self._in_place = (bundle, self.clock())
        self.bundle_ready = in_place

    async def _patch(self, ref: Ref, config: Json, ops: list[Json], bundle: bytes) -> None:
        # Our view of the Secret may lag another replica's write: never inject an older bundle.
        secret_watch = self.watches[self.secret_ref]
        fresh = await self._call(self.secret_ref, "get", self.named.get(self.secret_ref))
        held = secret_watch.object
        if (fresh or {}).get("data") != (held or {}).get("data"):
            secret_watch.seen(fresh)
            raise _Again()
        try:
            request = self.named.json_patch(ref, ops)
            patched = await self._call(ref, "patch", request, handled=(404, 409, 422))
        except ApiException as err:
            if err.status not in (404, 409, 422):
                raise
            self.watches[ref].seen(await self._call(ref, "get", self.named.get(ref)))
            raise _Again() from None
        self.watches[ref].seen(patched)
        hooks = sorted({op["path"].split("/")[2] for op in ops}, key=int)
        was = [config["webhooks"][int(i)].get("clientConfig", {}).get("caBundle") for i in hooks]
        log.info(
            f"injected the CA bundle into {ref}",
            extra={
                "fields": {
                    "webhooks": [config["webhooks"][int(i)].get("name") for i in hooks],
                    "was": "empty" if not any(was) else "another bundle",
                    "bundle_cas": bundle.count(b"BEGIN CERTIFICATE"),
                }
            },
        )

    def _next_pass(self, material: sm.Material, now: dt.datetime) -> float:
        """Seconds until the next moment something may fall due (at most the check period).
        Moments already past are waiting on something else (the bundle, a write): the watches
        wake the loop for those, so it never spins."""
        p, signer, serving = self.policy, material.ca_key.cert, material.serving.cert
        moments = [sm.renewal_time(signer)]
        if sm.signed_by(serving, signer):
            moments.append(sm.renewal_time(serving))
            if len(material.cas) > 1:
                moments.append(sm.issued_at(serving) + p.overlap)
        elif self._in_place is not None:
            moments.append(self._in_place[1] + p.settle)
        ahead = [(m - now).total_seconds() for m in moments if m > now]
        return min([self.settings.check_period, *ahead]) + 0.01

    # --- errors ---

    async def _call(
        self, ref: Ref, verb: str, request: Awaitable[Any], handled: tuple[int, ...] = ()
    ) -> Any:
        """`request`, its failure reported unless its status is one the caller handles (a
        conflict: read again, decide again)."""
        try:
            result = await request
        except Exception as err:
            if not (isinstance(err, ApiException) and err.status in handled):
                self._report(ref, verb, err)
            raise
        self._report(ref, verb, None)
        return result

    def _reporter(self, ref: Ref) -> Callable[[str, Exception | None], None]:
        return lambda verb, err: self._report(ref, verb, err)

    def _report(self, ref: Ref, verb: str, err: Exception | None) -> None:
        key = (ref, verb)
        if err is None:
            if self._errors.pop(key, None) is not None:
                log.info(f"can {verb} {ref} again")
            return
        message = describe(err)
        if self._errors.get(key) == message:
            return  # said already
        self._errors[key] = message
        fields: dict[str, Any] = {"error": message}
        if isinstance(err, ApiException) and err.status == 422 and ref.resource == SECRETS:
            fields["hint"] = "delete the Secret: the service makes it anew (kubernetes.io/tls)"
            log.error(
                f"cannot {verb} {ref}: it cannot hold the certificates", extra={"fields": fields}
            )
        elif isinstance(err, ApiException) and err.status in (401, 403):
            fields["rbac"] = f"the service account needs {rbac_rule(ref)}"
            log.error(
                f"forbidden to {verb} {ref}: certificates cannot be managed",
                extra={"fields": fields},
            )
        else:
            log.warning(f"cannot {verb} {ref}, retrying", extra={"fields": fields})

"""`kubectl trainjob-scheduling uninstall`: what the service wrote on TrainJobs, taken off again,
with the user's credentials, after `helm uninstall` (a running service would write it back).

Two things per TrainJob, and nothing else:

* the `GangScheduling` status condition: the service's field manager server-side applies a
  status with an empty condition list, which removes the conditions it owns (and only those:
  Trainer's stay). If another writer has taken the condition's fields over (a merge patch from
  Trainer's cache can), the apply leaves it, and a JSON patch removes it, its place and type
  checked (`test`) so a list changed meanwhile is never cut at the wrong item;
* the `trainjob-scheduling.dev/runtime-snapshot` annotation: a merge patch setting it to null,
  the TrainJob's uid in the patch, so a TrainJob recreated under the name is never touched.

Workloads and PodGroups (and the other backends' gang objects) are left alone: a running gang
keeps its pods where they are, and each object goes with its TrainJob (owner references: the
garbage collector deletes it when the TrainJob is deleted).

Bounded: TrainJobs are listed in pages of `PAGE`; one request at a time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kubernetes.aio.client import ApiClient, CustomObjectsApi
from kubernetes.aio.client.exceptions import ApiException

from ..core.condition import CONDITION_TYPE, FIELD_MANAGER
from ..core.snapshot import SNAPSHOT_ANNOTATION
from ..core.trainer import TRAINER_API_VERSION, TRAINJOB_KIND
from .client import TRAINJOBS
from .rest import status_message

Json = dict[str, Any]
PAGE = 500


@dataclass
class Cleaned:
    """What was (or, with dry_run, would be) removed from one TrainJob, or why it could not."""

    namespace: str
    name: str
    condition: bool = False
    annotation: bool = False
    error: str = ""

    def sentence(self, dry_run: bool) -> str:
        removed = [
            *([f"condition {CONDITION_TYPE}"] if self.condition else []),
            *([f"annotation {SNAPSHOT_ANNOTATION}"] if self.annotation else []),
        ]
        verb = "would remove" if dry_run else "removed"
        said = f"trainjob {self.namespace}/{self.name}: {verb} {' and '.join(removed)}"
        return f"{said}; error: {self.error}" if self.error else said


@dataclass
class Summary:
    examined: int = 0
    cleaned: list[Cleaned] = field(default_factory=list)
    stopped: str = ""  # why the walk stopped short (the list or the connection failed)

    @property
    def failed(self) -> list[Cleaned]:
        return [c for c in self.cleaned if c.error]


def _conditions(obj: Mapping[str, Any]) -> list[Any]:
    found = (obj.get("status") or {}).get("conditions")
    return found if isinstance(found, list) else []


def _condition_index(obj: Mapping[str, Any]) -> int | None:
    for index, condition in enumerate(_conditions(obj)):
        if isinstance(condition, dict) and condition.get("type") == CONDITION_TYPE:
            return index
    return None


def _annotated(obj: Mapping[str, Any]) -> bool:
    annotations = (obj.get("metadata") or {}).get("annotations")
    return isinstance(annotations, dict) and SNAPSHOT_ANNOTATION in annotations


async def trainjobs(api: ApiClient, namespace: str | None) -> AsyncIterator[Json]:
    """Every TrainJob in `namespace` (None: all), page by page."""
    objects: Any = CustomObjectsApi(api)  # its answers are typed as object
    r = TRAINJOBS
    token: str | None = None
    while True:
        options: dict[str, Any] = {"limit": PAGE, **({"_continue": token} if token else {})}
        page: Json
        if namespace is None:
            page = await objects.list_cluster_custom_object(r.group, r.version, r.plural, **options)
        else:
            page = await objects.list_namespaced_custom_object(
                r.group, r.version, namespace, r.plural, **options
            )
        for item in page.get("items") or []:
            if isinstance(item, dict):
                yield item
        token = (page.get("metadata") or {}).get("continue") or None
        if token is None:
            return


async def _remove_condition(objects: Any, namespace: str, name: str) -> None:
    r = TRAINJOBS
    body = {
        "apiVersion": TRAINER_API_VERSION,
        "kind": TRAINJOB_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "status": {"conditions": []},
    }
    applied: Json = await objects.patch_namespaced_custom_object_status(
        r.group, r.version, namespace, r.plural, name, body,
        field_manager=FIELD_MANAGER, force=True,
        _content_type="application/apply-patch+yaml",
    )  # fmt: skip
    index = _condition_index(applied)
    if index is None:
        return
    # Another writer owns it now: removed by place, the place checked first.
    ops = [
        {"op": "test", "path": f"/status/conditions/{index}/type", "value": CONDITION_TYPE},
        {"op": "remove", "path": f"/status/conditions/{index}"},
    ]
    await objects.patch_namespaced_custom_object_status(
        r.group, r.version, namespace, r.plural, name, ops,
        _content_type="application/json-patch+json",
    )  # fmt: skip


async def _remove_annotation(objects: Any, namespace: str, name: str, uid: str | None) -> None:
    r = TRAINJOBS
    meta: Json = {"annotations": {SNAPSHOT_ANNOTATION: None}}
    if uid:
        meta["uid"] = uid
    await objects.patch_namespaced_custom_object(
        r.group, r.version, namespace, r.plural, name, {"metadata": meta},
        _content_type="application/merge-patch+json",
    )  # fmt: skip


def describe(err: Exception) -> str:
    if isinstance(err, ApiException):
        return f"HTTP {err.status}: {status_message(err) or err.reason}"
    return f"{type(err).__name__}: {err}"


async def clean_up(api: ApiClient, namespace: str | None, *, dry_run: bool) -> Summary:
    """Removes the service's condition and annotation from every TrainJob in `namespace` (None:
    all) that carries either; with `dry_run`, only says which it would touch. A TrainJob gone
    meanwhile is skipped; an API error on one is noted on it and the rest goes on; a list or
    connection that fails stops the walk, what was done until then kept in the summary."""
    objects = CustomObjectsApi(api)
    summary = Summary()
    try:
        async for obj in trainjobs(api, namespace):
            summary.examined += 1
            found = await _clean(objects, obj, dry_run)
            if found is not None:
                summary.cleaned.append(found)
    except (ApiException, aiohttp.ClientError, OSError) as err:  # OSError: timeouts too
        summary.stopped = describe(err)
    return summary


async def _clean(objects: CustomObjectsApi, obj: Json, dry_run: bool) -> Cleaned | None:
    """What came off one TrainJob (None: nothing of the service's was on it, or it is gone)."""
    meta = obj.get("metadata") or {}
    found = Cleaned(
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        condition=_condition_index(obj) is not None,
        annotation=_annotated(obj),
    )
    if not (found.condition or found.annotation) or dry_run:
        return found if found.condition or found.annotation else None
    try:
        if found.condition:
            await _remove_condition(objects, found.namespace, found.name)
        if found.annotation:
            uid = meta.get("uid")
            await _remove_annotation(
                objects, found.namespace, found.name, uid if isinstance(uid, str) else None
            )
    except ApiException as err:
        if err.status == 404:  # deleted (or recreated) meanwhile: nothing of ours on it
            return None
        found.error = describe(err)
    return found


# Every object the chart makes carries it (charts/.../_helpers.tpl `tjs.labels`), whatever the
# release's name or fullnameOverride: the webhook configurations are named after those.
PART_OF_SELECTOR = "app.kubernetes.io/part-of=trainjob-scheduling"


async def installed_configurations(api: ApiClient) -> list[str]:
    """The service's webhook configurations still installed, as "Kind name" (then it would write
    the condition and annotation back, or refuse the annotation's removal): the chart's, found
    by its label under any release name; without `list` on them, the default release's name
    (FIELD_MANAGER) read by `get`. Unreadable counts as absent: this is advice only."""
    from kubernetes.aio.client import AdmissionregistrationV1Api

    admission: Any = AdmissionregistrationV1Api(api)  # its answers are typed as object
    # The validating one matters on its own: its TrainJob webhook (the snapshot guard) refuses
    # the annotation's removal by anyone but the service.
    kinds = (
        ("MutatingWebhookConfiguration", admission.list_mutating_webhook_configuration,
         admission.read_mutating_webhook_configuration),
        ("ValidatingWebhookConfiguration", admission.list_validating_webhook_configuration,
         admission.read_validating_webhook_configuration),
    )  # fmt: skip
    found: list[str] = []
    for kind, list_them, read_one in kinds:
        found += [f"{kind} {name}" for name in await _installed(list_them, read_one)]
    return found


async def _installed(list_them: Any, read_one: Any) -> list[str]:
    try:
        listed = await list_them(label_selector=PART_OF_SELECTOR, limit=PAGE)
        return sorted(str(c.metadata.name) for c in listed.items or [] if c.metadata is not None)
    except Exception:  # 403 (no list), not served: the fixed name is all there is to ask for
        pass
    try:
        await read_one(FIELD_MANAGER)
    except Exception:  # 404, 403, not served: nothing to say
        return []
    return [FIELD_MANAGER]

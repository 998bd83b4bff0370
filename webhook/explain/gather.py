"""What `explain` reads of the cluster, with the user's credentials: get and list only.

The kubeconfig is found as kubectl finds it (`--kubeconfig`, else `$KUBECONFIG`, else
`~/.kube/config`, else the pod's service account); the namespace defaults to the context's.
A TrainJob that cannot be read (missing, forbidden, no cluster) is an `ExplainError` with one
clear sentence; anything else that cannot be read (the nodes, Kueue's Workload, the pods'
events) becomes a note in the report and the rest goes on.

Bounded: pods and events are read in pages of 500, at most `MAX_PODS` and `MAX_EVENTS`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from kubernetes.aio.client import ApiClient, Configuration
from kubernetes.aio.client.exceptions import ApiException

from ..backends.base import TRAINJOB_LABEL, GangBackend, Kind
from ..backends.registry import default_backends
from ..core.fields import parse
from ..core.kueue import QUEUE_LABEL
from ..core.nodes import NodeSummary
from ..core.plan import JOBSET_NAME, Plan, PlanningError, build_plan
from ..core.snapshot import PLAN_VERSION, from_text, snapshot_of
from ..core.trainer import (
    NAMESPACED_RUNTIME_KIND,
    Runtime,
    TrainJob,
)
from ..core.validation import check_stored_runtime
from ..kube import rest
from ..kube.client import CLUSTER_RUNTIMES, TRAINING_RUNTIMES, TRAINJOBS
from ..kube.discovery import Versioned, newest_served
from ..kube.gangpods import attempt_of
from ..kube.jobsets import restart_attempt

Json = dict[str, Any]
PAGE = 500
MAX_PODS = 5000
MAX_EVENTS = 2000
MAX_NODES = 50_000
KUEUE_GROUP, KUEUE_VERSIONS = "kueue.x-k8s.io", ("v1beta1", "v1beta2")
KUEUE_JOB_UID = "kueue.x-k8s.io/job-uid"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ExplainError(Exception):
    """The TrainJob cannot be explained at all; the message says why, in one sentence."""


@dataclass
class Findings:
    namespace: str
    name: str
    trainjob: Json
    parsed: TrainJob | None = None
    runtime: Runtime | None = None
    runtime_note: str = ""
    plan_version: int = PLAN_VERSION
    plan: Plan | None = None
    plan_note: str = ""
    backend: GangBackend | None = None
    gang_objects: list[tuple[Kind, Json]] = field(default_factory=list)
    pods: list[Json] = field(default_factory=list)
    events: list[Json] = field(default_factory=list)
    kueue_workload: Json | None = None
    unserved: list[str] = field(default_factory=list)  # group/versions of its backend not served
    nodes: NodeSummary | None = None
    notes: dict[str, str] = field(default_factory=dict)
    """What could not be read, by part of the report (gangs, pods, events, kueue, nodes)."""


@dataclass(frozen=True)
class Cluster:
    api: ApiClient
    namespace: str  # the context's (or the service account's), for a missing -n


async def connect(
    kubeconfig: str | None, context: str | None, environ: Mapping[str, str] | None = None
) -> Cluster:
    from kubernetes.aio import config as kube_config

    env = os.environ if environ is None else environ
    cfg = Configuration()
    home = Path(env.get("HOME", "~")).expanduser() / ".kube" / "config"
    path = kubeconfig or env.get("KUBECONFIG") or (str(home) if home.exists() else None)
    try:
        if path:
            load: Any = kube_config.load_kube_config  # untyped in the client
            await load(
                config_file=path, context=context, client_configuration=cfg, persist_config=False
            )
            listed: Any = kube_config.list_kube_config_contexts
            contexts, current = listed(path)
            chosen = next((c for c in contexts if c.get("name") == context), current) or {}
            namespace = (chosen.get("context") or {}).get("namespace") or "default"
        elif env.get("KUBERNETES_SERVICE_HOST") and (SERVICE_ACCOUNT / "token").exists():
            incluster: Any = kube_config.load_incluster_config
            incluster(client_configuration=cfg)
            namespace = (SERVICE_ACCOUNT / "namespace").read_text().strip() or "default"
        else:
            raise ExplainError(
                "no cluster configured: pass --kubeconfig, set KUBECONFIG, or create "
                f"{home} (as kubectl reads them)"
            )
    except ExplainError:
        raise
    except Exception as err:  # the loaders raise anything from ConfigException to OSError
        raise ExplainError(f"cannot load the cluster configuration: {err}") from None
    return Cluster(ApiClient(configuration=cfg), namespace)


def _why(err: Exception) -> str:
    """An API error as the one sentence its Status carries (or the transport's error)."""
    if isinstance(err, ApiException):
        return f"HTTP {err.status}: {rest.status_message(err) or err.reason}"
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


async def _list(
    api: ApiClient,
    path: str,
    most: int,
    selector: str | None = None,
    keep: Callable[[Json], Json] = lambda item: item,
) -> tuple[list[Json], bool]:
    """Every item (in pages, each `keep`-trimmed as it comes), up to `most`; and whether more
    were left unread."""
    items: list[Json] = []
    token: str | None = None
    while True:
        query: list[tuple[str, Any]] = [("limit", PAGE)]
        if selector:
            query.append(("labelSelector", selector))
        if token:
            query.append(("continue", token))
        page = await rest.get_json(api, path, query)
        items += [keep(i) for i in rest.items_of(page)]
        meta = page.get("metadata")
        token = meta.get("continue") if isinstance(meta, dict) else None
        if not token or len(items) >= most:
            return items[:most], bool(token) or len(items) > most


async def gather(api: ApiClient, namespace: str, name: str) -> Findings:
    path = rest.collection(TRAINJOBS.group, TRAINJOBS.version, TRAINJOBS.plural, namespace)
    try:
        raw = await rest.get_json(api, f"{path}/{quote(name, safe='')}")
    except ApiException as err:
        if err.status == 404:
            raise ExplainError(f'TrainJob "{name}" not found in namespace "{namespace}"') from None
        raise ExplainError(f'cannot read TrainJob "{namespace}/{name}": {_why(err)}') from None
    except Exception as err:  # connection refused, DNS, TLS, timeouts
        host = api.configuration.host
        raise ExplainError(f"cannot reach the cluster at {host}: {_why(err)}") from None
    found = Findings(namespace, name, raw)
    found.parsed = parse(TrainJob, raw)[0]
    await _runtime(api, found)
    if found.parsed is not None and found.runtime is not None:
        try:
            checked = check_stored_runtime(found.runtime)
            found.plan = build_plan(found.parsed, checked, found.plan_version)
        except PlanningError as err:
            found.plan_note = f"the TrainJob does not validate: {err.errors[0]}"
    if found.plan is not None:
        found.backend = default_backends().for_plan(found.plan)
        await _gang_objects(api, found)
    await _pods_and_events(api, found)
    if found.plan is not None:  # the PodGroups of the JobSet's current restart attempt
        attempt = await _jobset_attempt(api, found)
        found.plan = found.plan.at_attempt(attempt if attempt is not None else _attempt(found.pods))
    await _kueue(api, found)
    await _nodes(api, found)
    return found


async def _jobset_attempt(api: ApiClient, found: Findings) -> int | None:
    """The restart attempt the TrainJob's JobSet is at (its status.restarts), as the service
    reads it; None when the JobSet cannot be read (not made yet, or no `get` on jobsets)."""
    path = rest.collection("jobset.x-k8s.io", "v1alpha2", "jobsets", found.namespace)
    try:
        jobset = await rest.get_json(api, f"{path}/{quote(found.name, safe='')}")
    except Exception:  # not found, forbidden, not served: the pods say it instead
        return None
    uid = (found.trainjob.get("metadata") or {}).get("uid")
    return restart_attempt(jobset, uid if isinstance(uid, str) else None)


def _attempt(pods: list[Json]) -> int:
    """The newest JobSet restart attempt among pods not being deleted (0 without any)."""
    present = (p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp"))
    return max(map(attempt_of, present), default=0)


async def _runtime(api: ApiClient, found: Findings) -> None:
    """The runtime the TrainJob was planned under: its frozen snapshot (as the service plans
    it), else the runtime as it is now."""
    frozen = snapshot_of(found.trainjob)
    if frozen is not None and (read := from_text(frozen)) is not None:
        found.plan_version = read.version
        found.runtime = read.runtime
        if read.runtime is None:
            found.runtime_note = "the TrainJob started without a gang and keeps none (frozen)"
        return
    tj = found.parsed
    if tj is None:
        found.runtime_note = "the TrainJob does not parse"
        return
    kind, ref = tj.runtime_kind, tj.spec.runtime_ref.name or ""
    namespaced = kind == NAMESPACED_RUNTIME_KIND
    r = TRAINING_RUNTIMES if namespaced else CLUSTER_RUNTIMES
    path = rest.collection(r.group, r.version, r.plural, found.namespace if namespaced else None)
    try:
        found.runtime = parse(Runtime, await rest.get_json(api, f"{path}/{quote(ref, safe='')}"))[0]
    except ApiException as err:
        why = "does not exist" if err.status == 404 else f"cannot be read ({_why(err)})"
        found.runtime_note = f'its {kind} "{ref}" {why}'
    except Exception as err:
        found.runtime_note = f'its {kind} "{ref}" cannot be read ({_why(err)})'


async def _gang_objects(api: ApiClient, found: Findings) -> None:
    backend = found.backend
    if backend is None:
        return
    if isinstance(backend, Versioned):  # speak the version this cluster serves (1.36: v1alpha2)
        version = await newest_served(api, backend)
        if version is not None:
            backend.use_version(version)
    selector = f"{TRAINJOB_LABEL}={found.name}"
    for kind in backend.kinds:
        path = rest.collection(kind.group, kind.version, kind.plural, found.namespace)
        try:
            items, _ = await _list(api, path, 1000, selector)
        except Exception as err:
            not_served = isinstance(err, ApiException) and err.status == 404
            if not_served and not kind.optional:
                found.unserved.append(kind.group_version)
            elif not not_served:
                found.notes[f"gangs:{kind.kind}"] = f"{kind} cannot be listed: {_why(err)}"
            continue
        found.gang_objects += [(kind, item) for item in items]


async def _pods_and_events(api: ApiClient, found: Findings) -> None:
    pods = rest.collection("", "v1", "pods", found.namespace)
    try:
        found.pods, more = await _list(api, pods, MAX_PODS, f"{JOBSET_NAME}={found.name}")
        if more:
            found.notes["pods"] = f"only the first {MAX_PODS} pods are counted"
    except Exception as err:
        found.notes["pods"] = f"the pods cannot be listed: {_why(err)}"
    events = rest.collection("events.k8s.io", "v1", "events", found.namespace)
    try:
        listed, more = await _list(api, events, MAX_EVENTS)
    except Exception as err:
        found.notes["events"] = f"the events cannot be listed: {_why(err)}"
        return
    if more:
        found.notes["events"] = f"only the first {MAX_EVENTS} events of the namespace are read"
    names = {("Pod", _name(p)) for p in found.pods} | {("TrainJob", found.name)}
    names |= {(kind.kind, _name(obj)) for kind, obj in found.gang_objects}
    found.events = [e for e in listed if _regarding(e) in names]


async def _kueue(api: ApiClient, found: Findings) -> None:
    labels = (found.trainjob.get("metadata") or {}).get("labels") or {}
    uid = (found.trainjob.get("metadata") or {}).get("uid")
    if not labels.get(QUEUE_LABEL) or not uid:
        return
    for version in KUEUE_VERSIONS:
        path = rest.collection(KUEUE_GROUP, version, "workloads", found.namespace)
        try:
            items, _ = await _list(api, path, 10, f"{KUEUE_JOB_UID}={uid}")
        except ApiException as err:
            if err.status == 404:
                continue  # this version is not served; try the next
            found.notes["kueue"] = f"Kueue's Workload cannot be read: {_why(err)}"
            return
        except Exception as err:
            found.notes["kueue"] = f"Kueue's Workload cannot be read: {_why(err)}"
            return
        found.kueue_workload = items[0] if items else None
        if not items:
            found.notes["kueue"] = "Kueue has no Workload for it (yet)"
        return
    found.notes["kueue"] = "Kueue's Workload API (kueue.x-k8s.io) is not served"


async def _nodes(api: ApiClient, found: Findings) -> None:
    summary = NodeSummary()
    try:
        path = rest.collection("", "v1", "nodes")
        items, more = await _list(api, path, MAX_NODES, keep=summary.trim)
    except Exception as err:
        found.notes["nodes"] = f"the nodes cannot be listed ({_why(err)}): feasibility unknown"
        return
    summary.replace(items)
    found.nodes = summary
    if more:
        found.notes["nodes"] = f"only the first {MAX_NODES} nodes are judged"


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""


def _regarding(event: Mapping[str, Any]) -> tuple[str, str]:
    about = event.get("regarding")
    if not isinstance(about, dict):
        return ("", "")
    return (str(about.get("kind") or ""), str(about.get("name") or ""))

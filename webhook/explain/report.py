"""One report of why a TrainJob is, or is not, running, built from what `gather` read (pure: no
I/O): its plan, its gang objects with their conditions, its pods (created, bound, pending with
the scheduler's reasons), the scheduler's events, Kueue's admission, the feasibility numbers
per domain, and a one-line verdict.

The verdict, first that holds: finished; no gang (no spec.scheduling, an invalid TrainJob, a
missing runtime, no backend for its scheduler); can never fit as configured (a gang that no
domain holds even empty); suspended by Kueue (queued: the queue label) or suspended; waiting
for its gang objects to be created; pods untied (pending or running pods of a grouped Job with
no `spec.schedulingGroup`, or naming a PodGroup that is not one of this TrainJob's live ones:
the gang may wait for them for ever; native backend only); waiting for pods to be created (a
gang has fewer pods than its minCount); waiting for capacity in a domain; degraded (a gang
placed, and said Scheduled by the service's GangScheduling condition, now has fewer live pods
than its minCount); scheduled (every gang placed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..backends.base import Context, api_versions, is_managed, spec_of
from ..backends.native import POD_GROUP
from ..core import condition, feasibilityview, planview
from ..core.feasibility import Fit, Gang, gangs_of, judge
from ..core.feasibility import Nodes as NodeView
from ..core.kueue import QUEUE_LABEL
from ..core.lifecycle import is_finished, runs_elsewhere
from ..core.plan import group_for_labels
from ..core.trainer import CLUSTER_RUNTIME_KIND
from ..kube.constraints import FIELD as CONSTRAINT
from ..kube.constraints import unenforced
from ..kube.feasibility import domains_by_node_labels
from ..kube.gangpods import LIVE, PRESENT, SUCCEEDED, state_of
from .gather import Findings

Json = dict[str, Any]
MAX_REASONS = 5
MAX_EVENTS = 10
MAX_UNTIED = 10  # untied pods named; the rest counted


def build(found: Findings) -> Json:
    tj, plan, backend = found.parsed, found.plan, found.backend
    meta = found.trainjob.get("metadata") or {}
    spec = found.trainjob.get("spec") or {}
    ref = spec.get("runtimeRef") or {}
    conditions = ((found.trainjob.get("status") or {}).get("conditions")) or []
    report: Json = {
        "trainJob": {
            "namespace": found.namespace,
            "name": found.name,
            "uid": meta.get("uid"),
            "runtime": {
                "kind": ref.get("kind") or CLUSTER_RUNTIME_KIND,
                "name": ref.get("name"),
            },
            "suspended": spec.get("suspend") is True,
            "conditions": [_condition(c) for c in conditions if isinstance(c, dict)],
        },
        "plan": None,
        "gangObjects": [_gang_object(found, kind, obj) for kind, obj in found.gang_objects],
        "pods": _pods(found),
        "events": _events(found.events),
        "kueue": _kueue(found),
        "feasibility": None,
        "notes": [n for n in (found.runtime_note, found.plan_note) if n]
        + list(found.notes.values()),
    }
    if plan is not None:
        report["plan"] = {
            "workload": plan.workload_name,
            "scheduler": plan.scheduler_name,
            "backend": backend.name if backend else None,
            "tree": planview.tree(plan).splitlines(),
            "groups": [
                {
                    "podGroup": g.pod_group_name,
                    "policy": g.policy,
                    "minCount": g.min_count,
                    "pods": g.pod_count,
                    "topologyKey": g.topology_key,
                }
                for g in plan.groups
            ],
        }
    judged: list[tuple[Gang, Fit]] = []
    if plan is not None and backend is not None and tj is not None and found.runtime is not None:
        if found.nodes is not None and len(found.nodes):
            kept = _topology_kept(found)
            topology = domains_by_node_labels(backend, Context.of(found.trainjob), kept)
            said = unenforced(plan, backend, kept, True)
            report["notes"] += [said] if said else []
            gangs, notes = gangs_of(plan, found.runtime, tj, topology=topology)
            view = NodeView(found.nodes.shapes, found.nodes.dropped_keys)
            judged = [(g, judge(g.demand, view)) for g in gangs]
            report["notes"] += notes
            report["feasibility"] = feasibilityview.section(
                judged, len(found.nodes), len(found.nodes.shapes)
            )
        elif found.nodes is not None:
            report["notes"].append("the cluster has no nodes: feasibility is not judged")
    report["verdict"] = _verdict(found, report, judged)
    return report


def _topology_kept(found: Findings) -> bool | None:
    """Whether the API server kept the topology constraint of the TrainJob's PodGroups that
    asked for one (None: none is stored): a gang whose constraint was dropped is placed, and
    judged, over the whole cluster."""
    plan = found.plan
    if plan is None or found.backend is None or found.backend.name != "native":
        return None
    keyed = {g.pod_group_name for g in plan.groups if g.topology_key}
    seen = [
        bool(spec_of(obj).get(CONSTRAINT))
        for kind, obj in found.gang_objects
        if kind == POD_GROUP and (obj.get("metadata") or {}).get("name") in keyed
    ]
    return all(seen) if seen else None


def _condition(c: Mapping[str, Any]) -> Json:
    return {k: c.get(k) for k in ("type", "status", "reason", "message") if c.get(k) is not None}


def _gang_object(found: Findings, kind: Any, obj: Json) -> Json:
    status = found.backend.status(kind, obj) if found.backend else None
    raw = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    assert isinstance(raw, dict)
    out: Json = {
        "kind": kind.kind,
        "name": (obj.get("metadata") or {}).get("name"),
        "conditions": [_condition(c) for c in raw.get("conditions") or [] if isinstance(c, dict)],
    }
    if raw.get("phase"):
        out["phase"] = raw["phase"]
    if status is not None:
        out["state"] = "scheduled" if status.scheduled else "waiting"
        out["reason"] = status.reason
    return out


def _pods(found: Findings) -> Json:
    plan = found.plan
    groups: dict[str, Json] = {}
    if plan is not None:
        for g in plan.groups:
            groups[g.pod_group_name] = {
                "podGroup": g.pod_group_name, "minCount": g.min_count, "created": 0, "bound": 0,
                "live": 0, "succeeded": 0,
            }  # fmt: skip
    reasons: dict[tuple[str, str], Json] = {}
    bound = 0
    for pod in found.pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        on_node = bool(spec.get("nodeName"))
        bound += on_node
        group = group_for_labels(plan, meta.get("labels") or {}) if plan else None
        if group is not None and group.pod_group_name in groups:
            groups[group.pod_group_name]["created"] += 1
            groups[group.pod_group_name]["bound"] += on_node
            state = state_of(pod)
            groups[group.pod_group_name]["live"] += state == LIVE
            groups[group.pod_group_name]["succeeded"] += state == SUCCEEDED
        if on_node:
            continue
        for c in (pod.get("status") or {}).get("conditions") or []:
            if (
                isinstance(c, dict)
                and c.get("type") == "PodScheduled"
                and c.get("status") == "False"
            ):
                key = (str(c.get("reason") or ""), str(c.get("message") or ""))
                seen = reasons.setdefault(
                    key,
                    {"reason": key[0], "message": key[1], "pods": 0, "example": meta.get("name")},
                )
                seen["pods"] += 1
    ordered = sorted(reasons.values(), key=lambda r: -int(r["pods"]))
    return {
        "created": len(found.pods),
        "bound": bound,
        "pending": len(found.pods) - bound,
        "byGroup": list(groups.values()),
        "pendingReasons": ordered[:MAX_REASONS],
        "untied": _untied(found),
    }


def _untied(found: Findings) -> Json | None:
    """The pending or running pods of its grouped Jobs that its gang does not count: no
    `spec.schedulingGroup` (immutable: admitted without the gang), or one naming a PodGroup that
    is not this TrainJob's (being deleted: a previous incarnation's; or another's). None when
    its backend ties pods otherwise (an annotation, a label)."""
    plan, backend = found.plan, found.backend
    if plan is None or backend is None or POD_GROUP not in backend.kinds:
        return None
    uid = (found.trainjob.get("metadata") or {}).get("uid")
    ours: set[str] = set()
    gone: set[str] = set()
    for kind, obj in found.gang_objects:
        meta = obj.get("metadata") or {}
        owners = meta.get("ownerReferences") or []
        owned = any(isinstance(o, dict) and o.get("uid") == uid for o in owners)
        if kind != POD_GROUP or not is_managed(obj) or not owned:
            continue
        (gone if meta.get("deletionTimestamp") else ours).add(str(meta.get("name")))
    listed: list[Json] = []
    count = 0
    for pod in found.pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if state_of(pod) not in PRESENT or group_for_labels(plan, meta.get("labels") or {}) is None:
            continue
        tied = spec.get("schedulingGroup") if isinstance(spec, dict) else None
        name = tied.get("podGroupName") if isinstance(tied, dict) else None
        if isinstance(name, str) and name in ours:
            continue
        count += 1
        if len(listed) < MAX_UNTIED:
            if not isinstance(name, str):
                why = "no schedulingGroup"
            elif name in gone:
                why = f"PodGroup {name} is being deleted"
            else:
                why = f"PodGroup {name} is not this TrainJob's"
            listed.append({"name": meta.get("name"), "podGroup": name, "why": why})
    return {"count": count, "pods": listed}


def _events(events: Iterable[Json]) -> list[Json]:
    grouped: dict[tuple[str, str, str], Json] = {}
    for e in events:
        series = e.get("series") if isinstance(e.get("series"), dict) else {}
        assert isinstance(series, dict)
        count = series.get("count") or e.get("deprecatedCount") or 1
        when = (
            series.get("lastObservedTime") or e.get("eventTime") or e.get("deprecatedLastTimestamp")
        )
        key = (str(e.get("type") or ""), str(e.get("reason") or ""), str(e.get("note") or ""))
        kind = str((e.get("regarding") or {}).get("kind") or "")
        seen = grouped.setdefault(
            key,
            {"type": key[0], "reason": key[1], "note": key[2], "count": 0, "last": None,
             "regarding": kind},
        )  # fmt: skip
        seen["count"] += int(count) if isinstance(count, int) else 1
        if isinstance(when, str) and (seen["last"] is None or when > seen["last"]):
            seen["last"] = when
    ordered = sorted(grouped.values(), key=lambda e: e["last"] or "", reverse=True)
    return ordered[:MAX_EVENTS]


def _kueue(found: Findings) -> Json | None:
    labels = (found.trainjob.get("metadata") or {}).get("labels") or {}
    queue = labels.get(QUEUE_LABEL)
    if not queue:
        return None
    workload = found.kueue_workload
    out: Json = {"queue": queue, "workload": None, "admitted": None, "conditions": []}
    if workload is not None:
        status = workload.get("status") or {}
        conditions = [_condition(c) for c in status.get("conditions") or [] if isinstance(c, dict)]
        out["workload"] = (workload.get("metadata") or {}).get("name")
        out["conditions"] = conditions
        out["admitted"] = any(
            c.get("type") == "Admitted" and c.get("status") == "True" for c in conditions
        )
    return out


# --- the verdict --------------------------------------------------------------------------------


def _verdict(found: Findings, report: Json, judged: list[tuple[Gang, Fit]]) -> Json:
    state, text = _decide(found, report, judged)
    return {"state": state, "text": text}


def _decide(found: Findings, report: Json, judged: list[tuple[Gang, Fit]]) -> tuple[str, str]:
    tj, plan, backend = found.parsed, found.plan, found.backend
    if tj is not None and is_finished(tj):
        return "finished", "finished: it ran to completion or failed; its gang is released"
    if plan is None:
        why = found.runtime_note or found.plan_note or "its runtime has no spec.scheduling"
        return "no-gang", f"no gang: {why}"
    elsewhere = tj is not None and runs_elsewhere(tj)
    # A dispatched TrainJob's gang is judged on the worker's nodes, not on these.
    never = None if elsewhere else next((fit for _, fit in judged if not fit.fits), None)
    if never is not None:
        gang = next(g for g, f in judged if f is never)
        return "never-fits", f"can never fit as configured: {_message(report, gang.label)}"
    if report["trainJob"]["suspended"]:
        kueue = report["kueue"]
        if kueue is not None:
            return "suspended-by-kueue", f"suspended by Kueue: {_kueue_state(kueue, found)}"
        return "suspended", "suspended: spec.suspend is true (no Kueue queue label on it)"
    if elsewhere:
        return "multikueue", "dispatched by MultiKueue: its pods run on a worker cluster"
    if backend is None:
        return "no-gang", f"no gang: no gang backend serves the scheduler {plan.scheduler_name!r}"
    if found.unserved:
        return "no-gang", (
            f"no gang: {backend.name} gang scheduling is unavailable ({api_versions(backend)} is "
            "not served): its pods are held until it is"
        )
    objects = {o["name"]: o for o in report["gangObjects"] if "state" in o}  # not the Workload
    gangs = [g for g in plan.groups if g.policy == "gang"]
    missing = [g.pod_group_name for g in plan.groups if g.pod_group_name not in objects]
    if missing:
        return "waiting-for-gang-objects", (
            f"waiting for its gang objects to be created ({missing[0]} is missing): is the "
            "trainjob-scheduling reconciler running?"
        )
    untied = report["pods"]["untied"]
    if untied is not None and untied["count"]:
        first = untied["pods"][0]
        some = "1 of its pods is" if untied["count"] == 1 else f"{untied['count']} of its pods are"
        return "pods-untied", (
            f"pods untied: {some} not in its gang ({first['name']}: {first['why']}); the gang "
            "counts only the pods that reference its PodGroup and may wait for ever while these "
            "hold nodes: delete them (JobSet recreates them through the pod webhook, tied)"
        )
    by_group = {g["podGroup"]: g for g in report["pods"]["byGroup"]}
    for g in gangs:
        state = objects[g.pod_group_name].get("state")
        if state == "scheduled":
            continue
        pods = by_group.get(g.pod_group_name, {}).get("created", 0)
        if g.min_count is not None and pods < g.min_count:
            return "waiting-for-pods", (
                f"waiting for pods to be created: gang {g.pod_group_name} has {pods} of the "
                f"{g.min_count} pods it waits for (Trainer, JobSet, quota, the pod webhook)"
            )
        return "waiting-for-capacity", _capacity_text(g.pod_group_name, report, judged)
    said = condition.stored_condition(found.trainjob) or {}
    for g in gangs:
        pods = by_group.get(g.pod_group_name, {})
        have = pods.get("live", 0) + pods.get("succeeded", 0)
        if (
            g.min_count is not None
            and have < g.min_count
            and said.get("reason")
            in (
                condition.SCHEDULED,
                condition.DEGRADED,
            )
        ):
            return "degraded", (
                f"degraded: gang {g.pod_group_name} was scheduled and now has {have} of the "
                f"{g.min_count} live pods it needs (minCount); lost pods are usually recreated "
                "by JobSet, until then the rest of the gang waits on its nodes"
            )
    bound = report["pods"]["bound"]
    return "scheduled", f"scheduled: every gang is placed ({bound} pods bound)"


def _message(report: Json, label: str) -> str:
    for gang in (report["feasibility"] or {}).get("gangs", []):
        if gang["gang"] == label:
            return str(gang["message"])
    return label


def _kueue_state(kueue: Json, found: Findings) -> str:
    queue = f"queue {kueue['queue']}"
    if kueue["workload"] is None:
        return f"{queue}; {found.notes.get('kueue', 'no Workload read')}"
    pending = [c for c in kueue["conditions"] if c.get("status") == "False" and c.get("message")]
    said = pending[0]["message"] if pending else "not admitted yet"
    return f"{queue}, Workload {kueue['workload']}: {said}"


def _capacity_text(group: str, report: Json, judged: list[tuple[Gang, Fit]]) -> str:
    text = f"waiting for capacity in a domain: gang {group} fits"
    fit = next((f for g, f in judged if group in g.groups), None)
    best = fit.best if fit is not None else None
    if best is not None and best.value is not None:
        text += (
            f" in {best.value} (room for {best.capacity} of its pods when empty) once enough of "
            "it is free"
        )
    else:
        text += " once enough nodes are free"
    reasons = report["pods"]["pendingReasons"]
    if reasons:
        text += f"; the scheduler says: {reasons[0]['message'] or reasons[0]['reason']}"
    return text


# --- text ---------------------------------------------------------------------------------------


def render(report: Json) -> str:
    tj = report["trainJob"]
    runtime = tj["runtime"]
    plan = report["plan"]
    lines = [
        f"TrainJob {tj['namespace']}/{tj['name']} (runtime {runtime['kind']} {runtime['name']}"
        + (f", backend {plan['backend']}" if plan and plan["backend"] else "")
        + ")",
        f"Verdict: {report['verdict']['text']}",
        "",
    ]
    if plan:
        lines += ["Plan:", *(f"  {line}" for line in plan["tree"]), ""]
    if report["gangObjects"]:
        lines.append("Gang objects:")
        for o in report["gangObjects"]:
            state = f": {o['state']} ({o['reason']})" if "state" in o else ""
            phase = f", phase {o['phase']}" if "phase" in o else ""
            lines.append(f"  {o['kind']} {o['name']}{state}{phase}")
            for c in o["conditions"]:
                lines.append("    " + _condition_text(c))
        lines.append("")
    pods = report["pods"]
    lines.append(
        f"Pods: {pods['created']} created, {pods['bound']} bound, {pods['pending']} pending"
    )
    for g in pods["byGroup"]:
        wanted = f" of minCount {g['minCount']}" if g["minCount"] is not None else ""
        lines.append(
            f"  {g['podGroup']}: {g['created']}{wanted} created, {g['bound']} bound, "
            f"{g['live']} live"
        )
    for r in pods["pendingReasons"]:
        lines.append(f"  pending ({r['pods']}, e.g. {r['example']}): {r['reason']}: {r['message']}")
    untied = pods["untied"]
    if untied is not None and untied["count"]:
        lines.append(f"  not in its gang ({untied['count']}):")
        lines += [f"    {p['name']}: {p['why']}" for p in untied["pods"]]
        if untied["count"] > len(untied["pods"]):
            lines.append(f"    and {untied['count'] - len(untied['pods'])} more")
    lines.append("")
    if report["events"]:
        lines.append("Events:")
        for e in report["events"]:
            lines.append(
                f"  {e['type']} {e['reason']} x{e['count']} ({e['regarding']}): {e['note']}"
            )
        lines.append("")
    kueue = report["kueue"]
    if kueue is not None:
        head = f"Kueue: queue {kueue['queue']}, suspended: {str(tj['suspended']).lower()}"
        if kueue["workload"]:
            head += f", Workload {kueue['workload']} (admitted: {str(kueue['admitted']).lower()})"
        lines.append(head)
        lines += ["  " + _condition_text(c) for c in kueue["conditions"]]
        lines.append("")
    if report["feasibility"] is not None:
        lines += [*feasibilityview.lines(report["feasibility"]), ""]
    if report["notes"]:
        lines += ["Notes:", *(f"  {n}" for n in report["notes"])]
    return "\n".join(lines).rstrip("\n") + "\n"


def _condition_text(c: Json) -> str:
    text = f"{c.get('type')}={c.get('status')}"
    if c.get("reason"):
        text += f" {c['reason']}"
    if c.get("message"):
        text += f": {c['message']}"
    return text

"""Feasibility per domain, for people and tools (`plan --nodes`, `explain`): pure, no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .feasibility import Fit, Gang, message, requests_text

MAX_DOMAINS = 10  # shown per gang, largest first (the rest are counted)
_LEFT_OUT = {
    "cordoned": "cordoned",
    "tainted": "with taints its pods do not tolerate",
    "unselected": "outside its pods' nodeSelector/affinity",
    "unlabelled": "without the topology label",
}

Json = dict[str, Any]


def section(judged: Sequence[tuple[Gang, Fit]], nodes: int, shapes: int) -> Json:
    """The feasibility part of a report: every gang, its domains, and what left nodes out."""
    gangs = []
    for gang, fit in judged:
        demand = gang.demand
        domains = [
            {"value": d.value, "nodes": d.nodes, "usableNodes": d.usable, "holds": d.capacity}
            for d in fit.domains[:MAX_DOMAINS]
        ]
        gangs.append(
            {
                "gang": gang.label,
                "groups": list(gang.groups),
                "pods": demand.pods,
                "podRequests": {p.replicated_job: requests_text(p.needs) for p in demand.parts},
                "topologyKey": demand.topology_key,
                "fits": fit.fits,
                "reason": fit.reason,
                "message": message(gang, fit),
                "headroom": fit.headroom(demand),
                "domains": domains,
                "moreDomains": max(len(fit.domains) - MAX_DOMAINS, 0),
                "leftOut": dict(fit.left_out),
            }
        )
    return {"nodes": nodes, "nodeShapes": shapes, "gangs": gangs}


def lines(found: Json) -> list[str]:
    """The section as indented text lines."""
    shapes = found["nodeShapes"]
    out = [
        f"Feasibility ({found['nodes']} nodes, {shapes} node shape{'' if shapes == 1 else 's'}; "
        "as if empty):"
    ]
    for gang in found["gangs"]:
        key = gang["topologyKey"]
        where = f"in one {key}" if key else "in the cluster"
        verdict = "fits" if gang["fits"] else f"can never fit ({gang['reason']})"
        each = "; ".join(f"{rj}: {text}" for rj, text in gang["podRequests"].items())
        out.append(f"  gang {gang['gang']}: {gang['pods']} pods ({each}) {where}: {verdict}")
        if gang["message"]:
            out.append(f"    {gang['message']}")
        for d in gang["domains"]:
            name = d["value"] if key else "the cluster"
            usable = d["nodes"] if d["usableNodes"] == d["nodes"] else f"{d['usableNodes']} usable"
            out.append(
                f"    {name}: room for {d['holds']} of its pods ({d['nodes']} nodes"
                + ("" if usable == d["nodes"] else f", {usable}")
                + ")"
            )
        if gang["moreDomains"]:
            out.append(f"    ... and {gang['moreDomains']} smaller domains")
        left = [f"{n} {_LEFT_OUT.get(why, why)}" for why, n in gang["leftOut"].items() if n]
        if left:
            out.append(f"    left out: {', '.join(left)}")
    return out

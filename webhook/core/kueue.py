"""How a gang's topology combines with Kueue's topology-aware scheduling (pure: no I/O).

Kueue admits a queued TrainJob (`kueue.x-k8s.io/queue-name`) by unsuspending it; with TAS it
also chooses the nodes of each pod set (a ReplicatedJob) by the annotations on its pod template
and writes them into the pods' node selectors. The gang's own topology constraint (all its
pods in one domain of a node label) must hold on the nodes Kueue chose, or the gang never fits.
Each way the two can disagree is a warning at `kubectl apply` of the TrainJob.
"""

from __future__ import annotations

from collections.abc import Mapping

from .plan import Plan
from .trainer import Runtime

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
REQUIRED = "kueue.x-k8s.io/podset-required-topology"
PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
UNCONSTRAINED = "kueue.x-k8s.io/podset-unconstrained-topology"
GROUP = "kueue.x-k8s.io/podset-group-name"


def topology_warnings(plan: Plan, runtime: Runtime, labels: Mapping[str, str]) -> list[str]:
    if not labels.get(QUEUE_LABEL):
        return []
    annotations: dict[str, Mapping[str, str]] = {}
    for rj in runtime.replicated_jobs:
        template = rj.template.spec.template if rj.template and rj.template.spec else None
        meta = template.metadata if template else None
        annotations[rj.name] = (meta.annotations if meta else None) or {}
    warnings: list[str] = []
    for group in plan.groups:
        key = group.topology_key
        if group.policy != "gang" or not key:
            continue
        placed = [t for t in group.replicated_jobs if _tas(annotations[t])]
        for name in placed:
            found = annotations[name]
            if found.get(REQUIRED) and found[REQUIRED] != key:
                warnings.append(
                    f'Kueue keeps "{name}" in one {found[REQUIRED]}, the gang in one {key}: that '
                    f"holds only if each {found[REQUIRED]} lies inside one {key}"
                )
            elif not found.get(REQUIRED):
                warnings.append(
                    f'Kueue may spread "{name}" over several {key} domains (no required '
                    "topology): its gang would never fit; set podset-required-topology"
                )
        groups = {annotations[t].get(GROUP) for t in placed}
        if len(placed) > 1 and (len(groups) > 1 or None in groups):
            warnings.append(
                f"Kueue places {', '.join(placed)} apart, their gang wants one {key}: give them "
                "one kueue.x-k8s.io/podset-group-name"
            )
    return warnings


def _tas(annotations: Mapping[str, str]) -> bool:
    return any(k in annotations for k in (REQUIRED, PREFERRED, UNCONSTRAINED))

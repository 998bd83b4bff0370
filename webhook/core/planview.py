"""A plan as a compact tree, for people (`plan -o tree`): pure, no I/O."""

from __future__ import annotations

from .plan import CompositePlan, GroupPlan, Plan


def tree(plan: Plan) -> str:
    lines = [
        f"TrainJob {plan.namespace}/{plan.trainjob_name}: Workload {plan.workload_name}, "
        f"scheduler {plan.scheduler_name}"
    ]
    leaves = {g.template_name: g for g in plan.groups}
    composites = {c.template_name: c for c in plan.composites}
    if plan.composites:
        roots = [plan.composites[0].template_name]
    else:
        roots = [g.template_name for g in plan.groups]

    def walk(name: str, prefix: str, last: bool) -> None:
        branch = "└─ " if last else "├─ "
        node = composites.get(name)
        lines.append(prefix + branch + (_composite(node) if node else _leaf(leaves[name])))
        if node is not None:
            below = prefix + ("   " if last else "│  ")
            for i, child in enumerate(node.children):
                walk(child, below, i == len(node.children) - 1)

    for i, root in enumerate(roots):
        walk(root, "", i == len(roots) - 1)
    for name in plan.untargeted:
        lines.append(f"   (default scheduling: {name})")
    return "\n".join(lines) + "\n"


def _composite(c: CompositePlan) -> str:
    policy = (
        f"gang of {c.min_group_count}/{len(c.children)} groups" if c.policy == "gang" else ("basic")
    )
    return f"{c.name} (CompositePodGroup) {policy}{_where(c.topology_key)}{_later(c.joins_later)}"


def _leaf(g: GroupPlan) -> str:
    pods = f"{g.pod_count} pods"
    policy = f"gang minCount {g.min_count}, {pods}" if g.policy == "gang" else f"basic, {pods}"
    jobs = ", ".join(g.replicated_jobs)
    if g.job_index is not None:
        jobs += f" Job {g.job_index}"
    return f"{g.pod_group_name} (PodGroup) {policy} [{jobs}]{_where(g.topology_key)}" + _later(
        g.joins_later
    )


def _where(key: str | None) -> str:
    return f" in one {key}" if key else ""


def _later(names: tuple[str, ...]) -> str:
    return f" (joining later: {', '.join(names)})" if names else ""

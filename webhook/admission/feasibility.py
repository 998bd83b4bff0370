"""What feasibility says at `kubectl apply` of a TrainJob: a warning for each gang that could
never fit in any domain of the nodes the cache has, or, where the runtime's
`trainjob-scheduling.dev/feasibility: deny` annotation or the service's `--feasibility=deny` asks
for it, a denial. On a cluster whose API server drops a gang's topology constraint
(`kube/constraints.py`), a native gang with topology is judged over the whole cluster, as
kube-scheduler will place it, and a warning says its topology is not enforced. No I/O: the
judgement reads the cache's Node summary."""

from __future__ import annotations

from ..backends.base import Context, GangBackend
from ..core import errors as fe
from ..core.errors import FieldError, Path
from ..core.plan import Plan
from ..core.trainer import TrainJob
from ..core.validation import CheckedRuntime
from ..kube.cache import Cache
from ..kube.constraints import unenforced
from ..kube.feasibility import MODE_ANNOTATION, Judged, domains_by_node_labels, mode_of
from .review import MAX_WARNING


def feasibility_verdict(
    trainjob: TrainJob,
    runtime: CheckedRuntime,
    plan: Plan,
    backend: GangBackend,
    context: Context,
    cache: Cache,
) -> tuple[list[str], list[FieldError]]:
    """(warnings, errors) for the TrainJob's gangs that can never fit."""
    mode, note = mode_of(runtime.runtime, cache.feasibility.mode)
    warnings = [note] if note else []
    kept = cache.topology.kept
    judging = mode != "off" and cache.feasibility.unavailable() is None
    said = unenforced(plan, backend, kept, judging)  # said whatever the mode
    warnings += _lines(said) if said else []
    if mode == "off":
        return warnings, []
    topology = domains_by_node_labels(backend, context, kept)
    judged = cache.feasibility.plan(plan, runtime.runtime, trainjob, topology=topology)
    if judged is None:
        return warnings, []
    never = [j for j in judged[0] if not j.fit.fits]
    if mode == "deny":
        annotated = (runtime.runtime.metadata.annotations or {}).get(MODE_ANNOTATION) == "deny"
        by = f"the runtime's {MODE_ANNOTATION}" if annotated else "the service's --feasibility"
        return warnings, [_denial(j, trainjob, by) for j in never]
    return warnings + [line for j in never for line in _lines(f"can never fit: {j.message}")], []


def _lines(text: str) -> list[str]:
    """A warning as one or more of at most MAX_WARNING characters (the API server and clients
    may cut longer ones), split after a clause so each reads on its own line of kubectl."""
    head, sep, rest = text.partition("; ")
    if len(text) <= MAX_WARNING or not sep or len(head) >= MAX_WARNING:
        return [text]
    return [head + ";", *_lines("... " + rest)]


def _denial(judged: Judged, trainjob: TrainJob, by: str) -> FieldError:
    sized = judged.gang.sized_by_num_nodes and trainjob.num_nodes is not None
    path = Path("spec", "trainer", "numNodes") if sized else Path("spec", "runtimeRef", "name")
    return fe.forbidden(path, f"can never fit: {judged.message} (denied: {by} is deny)")

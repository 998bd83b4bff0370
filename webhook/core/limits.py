"""Bounds on the objects the service reads, checked before any work that grows with them.

Webhooks see objects before the API server's own schema checks, and a namespaced
TrainingRuntime may come from any tenant allowed to create one. Parsing, validation and planning
all take time that grows with nesting depth and with the lengths of the lists the models type,
so those are bounded here, on the raw JSON, before a model is built. The bounds are far above
what any real object has; the rules of validation (8 templates, 8 targets, ...) still report the
exact limits with their own messages.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson

from . import errors as fe
from .errors import FieldError, Path

MAX_DEPTH = 64
"""Nested objects and lists in one object; the Trainer CRDs' schemas nest about 20 deep."""
MAX_REPLICATED_JOBS = 1000
MAX_DEPENDS_ON = 5  # JobSet's schema: maxItems 5
MAX_SCHEDULING_LIST = 64
"""Lists inside spec.scheduling; validation then applies their real limits (8, 4, 1)."""
MAX_CONDITIONS = 8  # the TrainJob CRD's status.conditions maxItems
MAX_RUNTIME_PATCHES = 16  # the TrainJob CRD's spec.runtimePatches maxItems
MAX_CONTAINERS = 256  # containers (and init containers) of one pod template
MAX_FAILURE_RULES = 64  # JobSet failurePolicy rules; real runtimes have a handful

MAX_INT32 = 2**31 - 1


def within_int32(count: int) -> bool:
    """A count the JobSet and Trainer schemas type int32 (replicas, parallelism, numNodes)."""
    return 0 <= count <= MAX_INT32


def runtime_list_errors(raw: Mapping[str, Any]) -> list[FieldError]:
    """The lists of a raw runtime that the models type, each within its cap."""
    spec = _at(raw, "spec")
    rjs_path = Path("spec", "template", "spec", "replicatedJobs")
    rjs = _at(spec, "template", "spec", "replicatedJobs")
    errors = _over(rjs, MAX_REPLICATED_JOBS, lambda: rjs_path)
    if isinstance(rjs, list) and not errors:
        for i, rj in enumerate(rjs):
            deps = _at(rj, "dependsOn")
            if isinstance(deps, list) and len(deps) > MAX_DEPENDS_ON:
                errors += _over(deps, MAX_DEPENDS_ON, rjs_path.index(i).child("dependsOn"))
            pod = _at(rj, "template", "spec", "template", "spec")
            for key in ("containers", "initContainers"):
                listed = _at(pod, key)
                if isinstance(listed, list) and len(listed) > MAX_CONTAINERS:
                    pod_path = rjs_path.index(i).child("template", "spec", "template", "spec")
                    errors += _over(listed, MAX_CONTAINERS, pod_path.child(key))
    rules = _at(spec, "template", "spec", "failurePolicy", "rules")
    rules_path = Path("spec", "template", "spec", "failurePolicy", "rules")
    errors += _over(rules, MAX_FAILURE_RULES, lambda: rules_path)
    scheduling = _at(spec, "scheduling")
    where = Path("spec", "scheduling")
    errors += _group_list_errors(scheduling, lambda: where)
    entries = _at(scheduling, "replicatedJobs")
    entry_errors = _over(entries, MAX_SCHEDULING_LIST, lambda: where.child("replicatedJobs"))
    errors += entry_errors
    if isinstance(entries, list) and not entry_errors:
        for i, entry in enumerate(entries):

            def entry_path(i: int = i) -> Path:
                return where.child("replicatedJobs").index(i)

            targets = _at(entry, "targetReplicatedJobs")
            errors += _over(
                targets, MAX_SCHEDULING_LIST, lambda: entry_path().child("targetReplicatedJobs")
            )
            errors += _group_list_errors(entry, entry_path)
            errors += _group_list_errors(_at(entry, "job"), lambda: entry_path().child("job"))
    return errors


def trainjob_list_errors(raw: Mapping[str, Any]) -> list[FieldError]:
    conditions = _at(raw, "status", "conditions")
    errors = _over(conditions, MAX_CONDITIONS, lambda: Path("status", "conditions"))
    patches = _at(raw, "spec", "runtimePatches")
    patch_errors = _over(patches, MAX_RUNTIME_PATCHES, lambda: Path("spec", "runtimePatches"))
    errors += patch_errors
    if isinstance(patches, list) and not patch_errors:
        for i, patch in enumerate(patches):
            jobs = _at(patch, "trainingRuntimeSpec", "template", "spec", "replicatedJobs")
            if isinstance(jobs, list) and len(jobs) > MAX_REPLICATED_JOBS:
                where = Path("spec", "runtimePatches").index(i)
                where = where.child("trainingRuntimeSpec", "template", "spec", "replicatedJobs")
                errors += _over(jobs, MAX_REPLICATED_JOBS, where)
    return errors


def _group_list_errors(settings: Any, where: Callable[[], Path]) -> list[FieldError]:
    if not isinstance(settings, dict):
        return []
    claims = settings.get("resourceClaims")
    topology = _at(settings, "schedulingConstraints", "topology")
    return _over(claims, MAX_SCHEDULING_LIST, lambda: where().child("resourceClaims")) + _over(
        topology, MAX_SCHEDULING_LIST, lambda: where().child("schedulingConstraints", "topology")
    )


def _over(value: Any, cap: int, where: Path | Callable[[], Path]) -> list[FieldError]:
    """An error if `value` is a list longer than `cap` (a path given as a function is built
    only then)."""
    if not isinstance(value, list) or len(value) <= cap:
        return []
    path = where if isinstance(where, Path) else where()
    detail = "the service reads no more than this; real objects never need that many"
    return [fe.too_many(path, len(value), cap, detail)]


def _at(value: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def shape_errors(
    raw: Mapping[str, Any],
    list_errors: Callable[[Mapping[str, Any]], list[FieldError]] | None = None,
) -> list[FieldError]:
    """Why `raw` is too deep or has a list too long to read; [] when it is fine."""
    found = _depth_error(raw)
    if found is not None:
        return [found]
    return list_errors(raw) if list_errors is not None else []


def _depth_error(raw: Any) -> FieldError | None:
    if _within_depth(raw):
        return None
    return fe.invalid(
        _deep_path(raw),
        "(nested value)",
        f"nested more than {MAX_DEPTH} levels deep; no Kubernetes object the service reads "
        "needs that, flatten it",
    )


def _within_depth(raw: Any) -> bool:
    """Whether `raw` nests at most MAX_DEPTH deep, asked of orjson's encoder (C, about 10x a
    Python walk): it refuses values nested past a fixed depth, so `raw` wrapped in that depth
    minus MAX_DEPTH lists encodes exactly when `raw` itself is within MAX_DEPTH."""
    wrapped = raw
    for _ in range(_encoder_depth() - MAX_DEPTH):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except orjson.JSONEncodeError as err:
        if "ecursion" in str(err):
            return False
        return _walked_depth(raw) <= MAX_DEPTH  # a value orjson cannot write (YAML's big ints)
    return True


@functools.cache
def _encoder_depth() -> int:
    """The deepest nesting orjson encodes (254 in orjson 3), found once, by bisection."""
    low, high = 1, 4096
    while low < high:
        mid = (low + high + 1) // 2
        value: Any = 0
        for _ in range(mid):
            value = [value]
        try:
            orjson.dumps(value)
            low = mid
        except orjson.JSONEncodeError:
            high = mid - 1
    return low


def _walked_depth(raw: Any) -> int:
    level: list[Any] = [raw] if isinstance(raw, (dict, list)) else []
    depth = 0
    while level and depth <= MAX_DEPTH:
        depth += 1
        level = [
            c
            for v in level
            for c in (v.values() if isinstance(v, dict) else v)
            if isinstance(c, (dict, list))
        ]
    return depth


def _deep_path(raw: Any, shown: int = 8, budget: int = 100_000) -> Path:
    """The path to a value nested too deep, cut to its first `shown` steps (they name the field
    a person wrote). A depth-first search of at most `budget` containers, run only on error
    (past the budget the path is the root's)."""
    keys: list[str | int] = []
    stack = [_children(raw)]
    while stack and budget:
        step = next(stack[-1], None)
        if step is None:
            stack.pop()
            if keys:
                keys.pop()
            continue
        key, child = step
        if not isinstance(child, (dict, list)):
            continue
        budget -= 1
        keys.append(key)
        if len(stack) + 1 > MAX_DEPTH:
            break
        stack.append(_children(child))
    else:
        return Path()
    path = Path()
    for key in keys[:shown]:
        path = path.index(key) if isinstance(key, int) else path.child(key)
    return path.child("...") if len(keys) > shown else path


def _children(value: Any) -> Iterator[tuple[str | int, Any]]:
    return iter(value.items()) if isinstance(value, dict) else enumerate(value)

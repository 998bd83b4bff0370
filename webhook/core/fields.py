"""Rules for single fields: parsing into the typed models, names, and the four group fields
(schedulingPolicy, schedulingConstraints, disruptionMode, resourceClaims) at every level."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import pydantic

from . import errors as fe
from . import limits
from .errors import FieldError, Path
from .naming import is_dns_label
from .trainer import GroupSettings, Model, Runtime, TrainJob

MAX_CLAIMS = 4  # MaxPodGroupResourceClaims
MAX_TOPOLOGY = 1
MINCOUNT_FORBIDDEN = "gang.minCount is computed from numNodes and must not be set"

_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

M = TypeVar("M", bound=Model)

_TYPE_MESSAGES = {
    "model_type": "must be an object",
    "dict_type": "must be an object",
    "list_type": "must be a list",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "int_parsing_size": "must be an integer of at most 2147483647 (an int32)",
    "finite_number": "must be an integer",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
}


_LIST_BOUNDS: dict[type[Model], Callable[[Mapping[str, Any]], list[FieldError]]] = {
    Runtime: limits.runtime_list_errors,
    TrainJob: limits.trainjob_list_errors,
}


def parse(model: type[M], raw: Mapping[str, Any]) -> tuple[M | None, list[FieldError]]:
    """The typed object, or the field errors that stop it from being one.

    The raw object is bounded first (`limits`): depth, size and the typed lists, so neither
    building the model nor anything done with it later can grow past those bounds.
    """
    bounded = limits.shape_errors(raw, _LIST_BOUNDS.get(model))
    if bounded:
        return None, bounded
    try:
        return model.model_validate(raw), []
    except pydantic.ValidationError as exc:
        found = []
        for err in exc.errors():
            path = Path()
            for part in err["loc"]:
                path = path.index(part) if isinstance(part, int) else path.child(str(part))
            if err["type"] == "missing":
                found.append(fe.required(path, "this field is required"))
                continue
            detail = _TYPE_MESSAGES.get(err["type"], err["msg"])
            found.append(fe.invalid(path, _shown(err.get("input")), detail))
        return None, found


def _shown(value: Any) -> Any:
    """The offending value as the message shows it, cut short when it is large."""
    try:
        text = json.dumps(value, separators=(",", ":"), sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return repr(value)[:80]
    return value if len(text) <= 80 else text[:77] + "..."


def is_dns_subdomain(value: str) -> bool:
    return len(value) <= 253 and bool(_DNS_SUBDOMAIN.match(value))


def is_label_key(value: str) -> bool:
    """Kubernetes' IsQualifiedName: optional DNS-subdomain prefix, then a 63-character name."""
    prefix, _, name = value.rpartition("/")
    if "/" in value and not (prefix and is_dns_subdomain(prefix)):
        return False
    return len(name) <= 63 and bool(_QUALIFIED_NAME.match(name))


def check_group_settings(settings: GroupSettings, where: Path) -> list[FieldError]:
    """The type rules of the four group fields, the same at every level."""
    errs: list[FieldError] = []
    policy = settings.scheduling_policy
    if policy is not None:
        ppath = where.child("schedulingPolicy")
        chosen = [k for k in ("basic", "gang") if getattr(policy, k) is not None]
        if len(chosen) != 1:
            errs.append(
                fe.invalid(
                    ppath,
                    policy.dump(),
                    "set exactly one of basic: {} (pod by pod) or gang: {} (all or nothing)",
                )
            )
        if policy.gang is not None and policy.gang.min_count is not None:
            errs.append(
                fe.forbidden(ppath.child("gang", "minCount"), f"{MINCOUNT_FORBIDDEN}; remove it")
            )
    constraints = settings.scheduling_constraints
    topology = constraints.topology if constraints else None
    if topology:
        tpath = where.child("schedulingConstraints", "topology")
        if len(topology) > MAX_TOPOLOGY:
            errs.append(
                fe.too_many(tpath, len(topology), MAX_TOPOLOGY, "keep one topology key per group")
            )
        for i, item in enumerate(topology):
            if not item.key:
                errs.append(
                    fe.required(
                        tpath.index(i).child("key"),
                        "name a node label key such as topology.kubernetes.io/zone",
                    )
                )
            elif not is_label_key(item.key):
                errs.append(
                    fe.invalid(
                        tpath.index(i).child("key"),
                        item.key,
                        "must be a node label key (optional DNS prefix, '/', then at most 63 "
                        "alphanumerics, '-', '_' or '.'), e.g. topology.kubernetes.io/zone",
                    )
                )
    mode = settings.disruption_mode
    if mode is not None and (mode.single is None) == (mode.all is None):
        errs.append(
            fe.invalid(
                where.child("disruptionMode"),
                mode.dump(),
                "set exactly one of single: {} (pods disrupted one by one) or all: {} "
                "(the group is disrupted together)",
            )
        )
    errs.extend(_check_claims(settings, where.child("resourceClaims")))
    return errs


def _check_claims(settings: GroupSettings, cpath: Path) -> list[FieldError]:
    errs: list[FieldError] = []
    claims = settings.resource_claims or []
    if len(claims) > MAX_CLAIMS:
        errs.append(
            fe.too_many(cpath, len(claims), MAX_CLAIMS, "a PodGroup shares at most 4 claims")
        )
    seen: set[str] = set()
    for i, claim in enumerate(claims):
        ipath = cpath.index(i)
        if not claim.name:
            errs.append(fe.required(ipath.child("name"), "name the claim (a DNS label)"))
        elif not is_dns_label(claim.name):
            errs.append(
                fe.invalid(
                    ipath.child("name"),
                    claim.name,
                    "must be a DNS label: lower-case alphanumerics and '-', at most 63",
                )
            )
        elif claim.name in seen:
            errs.append(fe.duplicate(ipath.child("name"), claim.name, "claim names must be unique"))
        seen.add(claim.name or "")
        sources = [
            (k, v)
            for k, v in (
                ("resourceClaimName", claim.resource_claim_name),
                ("resourceClaimTemplateName", claim.resource_claim_template_name),
            )
            if v is not None
        ]
        if len(sources) != 1:
            errs.append(
                fe.invalid(
                    ipath,
                    claim.dump(),
                    "set exactly one of resourceClaimName or resourceClaimTemplateName",
                )
            )
        for key, value in sources:
            if not is_dns_subdomain(value):
                errs.append(
                    fe.invalid(
                        ipath.child(key), value, "must be a DNS subdomain (lower-case, '-', '.')"
                    )
                )
    return errs


def unknown_fields(model: Model, where: Path) -> list[str]:
    """Warnings for fields of spec.scheduling the service does not know (typos or newer APIs)."""
    found = [f"{where.child(k)}: unknown field, ignored" for k in (model.model_extra or {})]
    fields = type(model).model_fields
    for name in (n for n in fields if n in model.model_fields_set):  # declared order: stable
        value = getattr(model, name)
        here = where.child(fields[name].alias or name)
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if isinstance(item, Model):
                found += unknown_fields(item, here.index(i) if value is items else here)
    return found

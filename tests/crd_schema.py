"""Objects checked against a published CRD's schema, as the API server checks a custom resource.

`openAPIV3Schema` is turned into plain JSON Schema (draft 7, `jsonschema`): an object with
`properties` takes no other field unless it says `x-kubernetes-preserve-unknown-fields` (the
API server prunes such fields, and rejects them under strict field validation, `kubectl
apply`'s default), `x-kubernetes-int-or-string` takes an integer or a string, and an `int32`
or `int64` format bounds the integer.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from .paths import SHARED

THIRD_PARTY = SHARED / "reference" / "crds" / "third-party"
_BOUNDS = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def _strict(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    preserve = out.pop("x-kubernetes-preserve-unknown-fields", False)
    if out.get("type") == "object" and "properties" in out and not preserve:
        out.setdefault("additionalProperties", False)
    if out.get("type") == "integer" and out.get("format") in _BOUNDS:
        low, high = _BOUNDS[out["format"]]
        out.setdefault("minimum", low)
        out.setdefault("maximum", high)
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


@functools.cache
def crd_validator(file: str, version: str | None = None) -> jsonschema.Draft7Validator:
    """A validator for the served version (or `version`) of the CRD in `file` (a name in the
    third-party folder, or a path)."""
    path = Path(file) if "/" in file else THIRD_PARTY / file
    crd = next(d for d in yaml.safe_load_all(path.read_text()) if d)
    versions = crd["spec"]["versions"]
    chosen = next(
        v for v in versions if (v["name"] == version if version else v.get("storage", False))
    )
    schema = copy.deepcopy(chosen["schema"]["openAPIV3Schema"])
    # metadata is checked by the API server's own ObjectMeta rules, not the CRD's schema.
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(_strict(schema))


def crd_errors(obj: dict[str, Any], file: str, version: str | None = None) -> list[str]:
    """What the CRD's schema says is wrong with `obj` ([] when it is valid)."""
    validator = crd_validator(file, version)
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
        for e in validator.iter_errors(obj)
    ]

"""The Trainer CRDs the chart ships: Kubeflow Trainer's v2.3 CRDs (`../shared/reference/crds/`)
with a structural schema for the runtimes' v2.4 `spec.scheduling` (was-api.md 2.4, the 1.37
scheduling types), written as compact JSON into `charts/trainjob-scheduling/files/crds/`.

`python -m tests.chart_crds` writes them; `tests/test_chart.py` checks the files are what this
module makes, so the two never drift apart.

The reference copies of the runtime CRDs declare `scheduling` as an object with
`x-kubernetes-preserve-unknown-fields` (stored as written, validated by nobody). Here every field
is typed, as the upstream Go types are closed structs: a misspelt field is refused by `kubectl`'s
strict field validation (or pruned, with a warning, by a lenient client) instead of being stored
and ignored. The list bounds are the ones the service's rules enforce (8 entries, 8 targets, 4
claims, 1 topology key), so the API server refuses an oversized object before any webhook reads
it. The rules between fields (one level at a time, minCount forbidden, targets that exist) stay
with the validating webhook, whose messages say how to fix them.
"""

from __future__ import annotations

import copy
import functools
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.paths import REPO, SHARED

Json = dict[str, Any]
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # about 1.8 MB of YAML

SOURCE = SHARED / "reference" / "crds"
TARGET = REPO / "charts" / "trainjob-scheduling" / "files" / "crds"
FILES = (
    "trainer.kubeflow.org_clustertrainingruntimes.yaml",
    "trainer.kubeflow.org_trainingruntimes.yaml",
    "trainer.kubeflow.org_trainjobs.yaml",
)
RUNTIMES = FILES[:2]


def _object(description: str, properties: dict[str, Json], **extra: Any) -> Json:
    return {"description": description, "type": "object", "properties": properties, **extra}


def _empty(description: str) -> Json:
    return {"description": description, "type": "object"}


def _group_fields() -> dict[str, Json]:
    """The four fields of a PodGroupTemplate a runtime may set, at every level."""
    return {
        "schedulingPolicy": _object(
            "How the group's pods are admitted: exactly one of basic or gang (default gang).",
            {
                "basic": _empty("Pod by pod, still as one group."),
                "gang": _object(
                    "All or nothing.",
                    {
                        "minCount": {
                            "description": "Must not be set: it is computed from numNodes "
                            "(the webhook refuses it, saying so).",
                            "type": "integer",
                            "format": "int32",
                        }
                    },
                ),
            },
        ),
        "schedulingConstraints": _object(
            "Where the group's pods may land together.",
            {
                "topology": {
                    "description": "One node label key: every pod of a group lands in one "
                    "domain of it.",
                    "type": "array",
                    "maxItems": 1,
                    "x-kubernetes-list-type": "atomic",
                    "items": _object(
                        "A topology domain key.",
                        {
                            "key": {
                                "description": "A node label key, e.g. "
                                "topology.kubernetes.io/zone.",
                                "type": "string",
                                "minLength": 1,
                                "maxLength": 317,
                            }
                        },
                        required=["key"],
                    ),
                }
            },
        ),
        "disruptionMode": _object(
            "How the group's pods may be disrupted: exactly one of single or all.",
            {
                "single": _empty("Members are disrupted independently."),
                "all": _empty("Members are disrupted only together."),
            },
        ),
        "resourceClaims": {
            "description": "ResourceClaims shared by the group's pods.",
            "type": "array",
            "maxItems": 4,
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "items": _object(
                "A claim: exactly one of resourceClaimName or resourceClaimTemplateName.",
                {
                    "name": {"type": "string", "minLength": 1, "maxLength": 63},
                    "resourceClaimName": {"type": "string", "maxLength": 253},
                    "resourceClaimTemplateName": {"type": "string", "maxLength": 253},
                },
                required=["name"],
            ),
        },
    }


def scheduling_schema() -> Json:
    """`spec.scheduling` of a (Cluster)TrainingRuntime, Trainer v2.4 (KEP-3015)."""
    entry = _object(
        "A gang of ReplicatedJobs (level 2), or with job: one gang per Job of its single "
        "target (level 3).",
        {
            "targetReplicatedJobs": {
                "description": "The ReplicatedJobs of spec.template this entry schedules.",
                "type": "array",
                "minItems": 1,
                "maxItems": 8,
                "x-kubernetes-list-type": "set",
                "items": {"type": "string", "minLength": 1, "maxLength": 253},
            },
            **_group_fields(),
            "job": _object("Level 3: one PodGroup per Job of the target.", _group_fields()),
        },
        required=["targetReplicatedJobs"],
    )
    return _object(
        "Workload-aware scheduling of the runtime's TrainJobs: the Workload and PodGroups "
        "(scheduling.k8s.io/v1beta1) made for each. Level 1: the four group fields for all "
        "pods; level 2/3: replicatedJobs.",
        {
            **_group_fields(),
            "replicatedJobs": {
                "description": "Per-ReplicatedJob groups; excludes the level-1 fields.",
                "type": "array",
                "minItems": 1,
                "maxItems": 8,
                "x-kubernetes-list-type": "atomic",
                "items": entry,
            },
        },
    )


def _spec_properties(crd: Json) -> Json:
    version = crd["spec"]["versions"][0]
    props: Json = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    return props


@functools.cache
def _source(name: str) -> Json:
    crd: Json = yaml.load((SOURCE / name).read_text(), Loader=_LOADER)
    return crd


def build(name: str) -> Json:
    """The chart's copy of one CRD."""
    crd = copy.deepcopy(_source(name))
    if name in RUNTIMES:
        _spec_properties(crd)["scheduling"] = scheduling_schema()
    return crd


def target(name: str) -> Path:
    return TARGET / name.replace(".yaml", ".json")


def render(name: str) -> str:
    return json.dumps(build(name), separators=(",", ":"), sort_keys=True) + "\n"


def main() -> int:
    TARGET.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        target(name).write_text(render(name))
        print(f"wrote {target(name).relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

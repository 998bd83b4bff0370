"""Deterministic names for Workloads, PodGroupTemplates and PodGroups (was-api.md section 4).

Names are a pure function of namespace, TrainJob name, ReplicatedJob names and Job index, so they
can be recomputed anywhere (for instance from a pod's JobSet labels) without an API call. They must
never change between releases: running TrainJobs' pods point at them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

MAX_NAME = 63
HASH_LEN = 10
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def is_dns_label(value: str) -> bool:
    return len(value) <= MAX_NAME and bool(_DNS_LABEL.match(value))


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:HASH_LEN]


def object_hash(kind: str, namespace: str, name: str) -> str:
    return _sha1(f"{kind}/{namespace}/{name}")


def hashed(prefix: str, digest: str) -> str:
    """`prefix-digest`, cutting the prefix so the whole stays within 63 characters."""
    if len(prefix) + 1 + len(digest) > MAX_NAME:
        prefix = prefix[: MAX_NAME - 1 - len(digest)]
    return f"{prefix}-{digest}"


def workload_name(namespace: str, trainjob: str) -> str:
    return hashed(trainjob, object_hash("TrainJob", namespace, trainjob))


def group_template_name(namespace: str, trainjob: str, targets: Sequence[str]) -> str:
    """Level 2: one template per `replicatedJobs` entry, named after its targets in list order."""
    group = "-".join(targets)
    return hashed(group, object_hash("ReplicatedJobGroup", namespace, f"{trainjob}/{group}"))


def job_template_name(namespace: str, trainjob: str, replicated_job: str, index: int) -> str:
    """Level 3: one template per Job (replica) of the target."""
    return hashed(
        f"{replicated_job}-{index}",
        object_hash("Job", namespace, f"{trainjob}/{replicated_job}/{index}"),
    )


def split_template_name(namespace: str, trainjob: str, replicated_job: str) -> str:
    """Level 1 split by a `Complete` dependency: one template per ReplicatedJob."""
    return hashed(
        replicated_job, object_hash("ReplicatedJob", namespace, f"{trainjob}/{replicated_job}")
    )


def pod_group_name(trainjob: str, template: str) -> str:
    """The PodGroup of a level-2, level-3 or split template."""
    name = f"{trainjob}-{template}"
    if len(name) <= MAX_NAME:
        return name
    return hashed(trainjob[: MAX_NAME - 1 - HASH_LEN], _sha1(f"{trainjob}/{template}"))

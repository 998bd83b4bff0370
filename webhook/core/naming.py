"""Deterministic names for Workloads, PodGroupTemplates and PodGroups (was-api.md section 4).

Names are a pure function of namespace, TrainJob name, ReplicatedJob names and Job index, so they
can be recomputed anywhere (for instance from a pod's JobSet labels) without an API call. They must
never change between releases: running TrainJobs' pods point at them.

Plan version 2 (`core/snapshot.py`) qualifies the Workload and PodGroup names by an incarnation,
the TrainJob's uid: a PodGroup keeps the finalizer `scheduling.k8s.io/podgroup-protection` while
any pod names it, so a TrainJob deleted and re-applied under the same name would otherwise point
its new pods at the old, Terminating PodGroup and keep it (and itself) stuck for ever. Template
names live inside one Workload and stay as they were. A JobSet restart's PodGroups are qualified
by the restart attempt too (`for_attempt`). Version 1 (incarnation "") keeps the old names.
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


def _incarnate(name: str, incarnation: str) -> str:
    return f"{name}@{incarnation}" if incarnation else name


def workload_name(namespace: str, trainjob: str, incarnation: str = "") -> str:
    """Also the level-1 template's and PodGroup's name."""
    return hashed(trainjob, object_hash("TrainJob", namespace, _incarnate(trainjob, incarnation)))


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


def pod_group_name(trainjob: str, template: str, incarnation: str = "") -> str:
    """The PodGroup of a level-2, level-3 or split template (readable prefix, then a hash of
    the TrainJob, the template and the incarnation when there is one)."""
    name = f"{trainjob}-{template}"
    if not incarnation and len(name) <= MAX_NAME:
        return name
    digest = _sha1(_incarnate(f"{trainjob}/{template}", incarnation))
    prefix = name if incarnation else trainjob
    return hashed(prefix[: MAX_NAME - 1 - HASH_LEN], digest)


def for_attempt(name: str, attempt: int) -> str:
    """A PodGroup's (or CompositePodGroup's) name in JobSet restart attempt `attempt`: attempt
    0 keeps the name, each later attempt gets one of its own (a new gang, admitted whole)."""
    if attempt <= 0:
        return name
    return hashed(name[: MAX_NAME - 1 - HASH_LEN], _sha1(f"{name}/restart/{attempt}"))

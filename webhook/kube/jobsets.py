"""The store of JobSets, each kept as the little the service reads of it: whose it is and which
restart attempt it is at (`status.restarts`).

A JobSet restart (its failure policy's RestartJobSet) deletes every Job and makes them again
with the label `jobset.sigs.k8s.io/restart-attempt` one higher, after it has counted the
restart in `status.restarts`. The gang of each attempt has PodGroups of its own. Which attempt
is current is read here, never from pod labels: anyone who may create a pod can label one
`restart-attempt: "9"`, and a gap with no pods at all (BlockingRecreate) would read as attempt 0.
"""

from __future__ import annotations

from typing import Any

from ..core.ownership import controller_ref
from ..core.plan import MAX_ATTEMPT
from .store import Store, without_bookkeeping

KEPT_METADATA = ("name", "namespace", "uid", "resourceVersion", "ownerReferences")


class JobSetStore(Store):
    def trim(self, raw: dict[str, Any]) -> dict[str, Any]:
        whole = without_bookkeeping(raw)
        meta = whole.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        kept: dict[str, Any] = {"metadata": {k: meta[k] for k in KEPT_METADATA if k in meta}}
        status = whole.get("status")
        restarts = status.get("restarts") if isinstance(status, dict) else None
        if isinstance(restarts, int) and not isinstance(restarts, bool):
            kept["status"] = {"restarts": restarts}
        return kept


def restart_attempt(jobset: dict[str, Any] | None, trainjob_uid: str | None) -> int | None:
    """The restart attempt of the JobSet of the TrainJob with `trainjob_uid`: its
    `status.restarts` (0 before its first restart, and while it has no JobSet yet); None when
    the JobSet of that name belongs to another TrainJob (an earlier one of the name, being
    collected) or says something no JobSet can (a count out of int32)."""
    if jobset is None:
        return 0
    owner = controller_ref(jobset)
    if owner is None or owner.get("kind") != "TrainJob" or owner.get("uid") != trainjob_uid:
        return None
    status = jobset.get("status")
    restarts = status.get("restarts", 0) if isinstance(status, dict) else 0
    if not isinstance(restarts, int) or isinstance(restarts, bool):
        return None
    return restarts if 0 <= restarts <= MAX_ATTEMPT else None

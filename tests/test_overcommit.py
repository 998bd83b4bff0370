"""Which requests the API server refuses without an equal limit (core/overcommit.py), as its
`IsOvercommitAllowed` and `IsExtendedResourceName` tell them, and how a warning is cut into
lines. The warnings themselves are checked over HTTPS in tests/test_admission.py and through
`plan` in tests/test_cli.py."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.core import overcommit
from webhook.core.fields import parse
from webhook.core.trainer import TrainJob


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("nvidia.com/gpu", "an extended resource"),
        ("example.com/rdma-ib", "an extended resource"),
        ("hugepages-2Mi", "huge pages"),  # native, but not overcommittable either
        ("cpu", None),
        ("memory", None),
        ("ephemeral-storage", None),
        ("kubernetes.io/anything", None),  # *kubernetes.io/ is native
        ("example.kubernetes.io/thing", None),
        ("requests.nvidia.com/gpu", None),  # quota's prefix: not an extended resource name
        ("nvidia.com/", None),  # not a qualified name: refused for that, not for its limit
        ("Example.COM/gpu", None),  # the domain must be lower-case
        ("a/b/c", None),
    ],
)
def test_what_may_not_be_overcommitted(name: str, kind: str | None) -> None:
    assert overcommit.not_overcommittable(name) == kind


def warnings(per_node: dict[str, Any]) -> list[overcommit.Said]:
    raw = {
        "metadata": {"name": "tj"},
        "spec": {"runtimeRef": {"name": "rt"}, "trainer": {"resourcesPerNode": per_node}},
    }
    trainjob, errors = parse(TrainJob, raw)
    assert trainjob is not None, errors
    return overcommit.trainjob_warnings(trainjob, None)


def test_limits_equal_as_quantities_and_limits_alone_pass() -> None:
    gpu = "nvidia.com/gpu"
    assert warnings({"requests": {gpu: 2}, "limits": {gpu: "2000m"}}) == []
    assert (
        warnings({"requests": {"hugepages-1Gi": "2Gi"}, "limits": {"hugepages-1Gi": "2048Mi"}})
        == []
    )
    assert warnings({"limits": {gpu: 8}}) == []
    assert len(warnings({"requests": {gpu: 0}})) == 1  # even 0 needs its limit
    assert warnings({"requests": {gpu: "lots"}}) == []  # not a quantity: validation denies it


def test_a_warning_is_one_sentence_or_lines_cut_at_its_clauses() -> None:
    (warning,) = warnings({"requests": {"nvidia.com/gpu": 8}})
    sentence = overcommit.sentence(warning)
    assert sentence == (
        "spec.trainer.resourcesPerNode.requests[nvidia.com/gpu]: requests 8 without a limit; the "
        "API server refuses pods that request an extended resource without an equal limit, so "
        "the TrainJob would create no pods: set "
        "spec.trainer.resourcesPerNode.limits[nvidia.com/gpu] to 8"
    )
    assert overcommit.lines(warning, len(sentence)) == [sentence]
    for width in (60, 90, 120):
        lines = overcommit.lines(warning, width)
        assert " ".join(line.removeprefix("... ") for line in lines) == sentence
        longest_clause = max(len(clause) for clause in warning) + len("... ")
        assert all(len(line) <= max(width, longest_clause) for line in lines)
        assert len(lines) > 1

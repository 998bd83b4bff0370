"""The content-keyed memo behind runtime reviews: same content, same answer, bounded."""

from __future__ import annotations

import copy
from typing import Any

import orjson

from tests.harness import fixture, fixture_cache
from webhook.admission.handlers import validate_runtime_review
from webhook.admission.review import parse
from webhook.core.memo import Memo, digest


def test_same_content_is_answered_once_and_other_content_again() -> None:
    memo: Memo[str] = Memo(size=2)
    calls: list[str] = []

    def answer(tag: str) -> str:
        calls.append(tag)
        return tag

    doc = {"spec": {"a": 1, "b": [1, 2]}, "metadata": {"name": "x"}}
    same_reordered = {"metadata": {"name": "x"}, "spec": {"b": [1, 2], "a": 1}}
    assert memo.get(lambda: answer("first"), doc, None) == "first"
    assert memo.get(lambda: answer("again"), same_reordered, None) == "first"  # key order: same
    # The old object is part of the key: an update from elsewhere is judged anew.
    assert memo.get(lambda: answer("update"), doc, {"spec": {}}) == "update"
    assert memo.get(lambda: answer("changed"), {**doc, "spec": {"a": 2}}, None) == "changed"
    assert calls == ["first", "update", "changed"] and (memo.hits, memo.misses) == (1, 3)
    assert len(memo) == 2  # the least recently used went first
    assert memo.get(lambda: answer("evicted"), doc, None) == "evicted"


def test_what_cannot_be_written_as_json_is_never_remembered() -> None:
    deep: Any = {}
    for _ in range(300):  # past orjson's depth
        deep = {"x": deep}
    assert digest(deep) is None
    memo: Memo[int] = Memo()
    assert memo.get(lambda: 1, deep) == 1 and memo.get(lambda: 2, deep) == 2
    assert len(memo) == 0 and memo.misses == 2


def test_a_runtime_review_sent_again_is_answered_the_same_from_the_memo() -> None:
    """The dry run and the apply of one version: judged once, answered alike, denial included;
    a tree's served-or-not question is still asked each time."""
    cache = fixture_cache()
    good = fixture("clustertrainingruntime-create-level3-server-side-apply.validate.json")
    bad = copy.deepcopy(good)
    bad["request"]["object"]["spec"]["scheduling"]["replicatedJobs"][0]["targetReplicatedJobs"] = [
        "x"
    ]
    for sent in (good, bad):
        body = orjson.dumps(sent)
        first = validate_runtime_review(parse(body), cache)
        hits = cache.runtime_verdicts.hits
        again = validate_runtime_review(parse(body), cache)
        assert cache.runtime_verdicts.hits == hits + 1
        assert again == first
    assert not validate_runtime_review(parse(orjson.dumps(bad)), cache).allowed


def test_an_answer_not_worth_its_memory_is_not_kept() -> None:
    memo: Memo[str] = Memo()
    assert memo.get(lambda: "x" * 10_000, {"a": 1}, keep=lambda a: len(a) < 100) == "x" * 10_000
    assert len(memo) == 0
    assert memo.get(lambda: "small", {"a": 2}, keep=lambda a: len(a) < 100) == "small"
    assert len(memo) == 1

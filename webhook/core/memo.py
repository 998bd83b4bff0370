"""A small bounded memo of answers worked out from JSON documents, keyed by their content.

The API server sends a runtime's review more than once for one version (a server-side dry run
before the apply, reinvocation, a retried request, `kubectl apply` of an unchanged file): each
time the whole validation would run again for the same answer. The key is a digest of the
documents' canonical JSON, so only the same content finds an answer; the memo holds at most
`size` answers (least recently used go first), and the caller says which are small enough to
keep, whatever tenants send.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import orjson

T = TypeVar("T")


def digest(*documents: Any) -> bytes | None:
    """The documents' content digest; None for what orjson cannot write (too deep, not JSON)."""
    try:
        canonical = orjson.dumps(documents, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        return None
    return hashlib.blake2b(canonical, digest_size=16).digest()


class Memo(Generic[T]):
    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._answers: OrderedDict[bytes, T] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._answers)

    def get(
        self, compute: Callable[[], T], *documents: Any, keep: Callable[[T], bool] | None = None
    ) -> T:
        """The answer for these documents: remembered, or `compute()`d and remembered (unless
        `keep` says it is not worth its memory)."""
        key = digest(*documents)
        if key is None:
            self.misses += 1
            return compute()
        answer = self._answers.get(key)
        if answer is not None:
            self._answers.move_to_end(key)
            self.hits += 1
            return answer
        self.misses += 1
        answer = compute()
        if keep is not None and not keep(answer):
            return answer
        self._answers[key] = answer
        if len(self._answers) > self.size:
            self._answers.popitem(last=False)
        return answer

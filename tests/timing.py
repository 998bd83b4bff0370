"""Time in tests: a bound that only a stall crosses, never one a loaded machine can miss.

Tests assert behaviour; how fast something is belongs in `tests/bench/`. Where a test must say
"at once" or "bounded work", it compares with a baseline measured in the same test (`grows`),
or bounds by `STALL`, many times what the work takes even on a slow, shared machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# Seconds: the API server's default webhook timeout; an answer this late fails the admission.
# Each bound below is at least ten times what the work takes on a loaded 2-core machine.
STALL = 10.0


def fastest(work: Callable[[], object], runs: int = 3) -> float:
    """The least time of `runs` calls of `work` (preemption and load only ever add time)."""
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def growth(work: Callable[[int], object], small: int, large: int, runs: int = 5) -> float:
    """How many times longer `work(large)` takes than `work(small)`: about large / small for
    linear work, its square for quadratic work. The two alternate, so that load on the machine
    meanwhile falls on both, and each counts at its fastest."""
    least = {small: float("inf"), large: float("inf")}
    for _ in range(runs):
        for n in (small, large):
            least[n] = min(least[n], fastest(lambda: work(n), 1))  # noqa: B023 (called at once)
    return least[large] / max(least[small], 1e-6)

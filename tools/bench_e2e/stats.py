"""Percentiles of measured samples and quantiles of Prometheus histograms (the service's own and
kube-apiserver's), as the report states them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

Samples = Mapping[tuple[str, tuple[tuple[str, str], ...]], float]


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..100): the smallest value with at least q% of the
    values at or below it. With fewer than 100 values p99 is the largest one: what was seen,
    never an interpolation between rounds."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(values: Sequence[float]) -> dict[str, float]:
    """n, p50, p99, min and max of `values` (NaN when there are none)."""
    return {
        "n": float(len(values)),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "min": min(values) if values else math.nan,
        "max": max(values) if values else math.nan,
    }


def buckets_of(
    samples: Samples, name: str, match: Mapping[str, str] | None = None
) -> dict[float, float]:
    """A histogram's cumulative bucket counts (`name`_bucket, by `le`), summed over every series
    whose labels include `match`."""
    found: dict[float, float] = {}
    for (sample, labels), value in samples.items():
        if sample != f"{name}_bucket":
            continue
        got = dict(labels)
        if match and any(got.get(k) != v for k, v in match.items()):
            continue
        le = float(got["le"]) if got.get("le") not in (None, "+Inf") else math.inf
        found[le] = found.get(le, 0.0) + value
    return found


def bucket_delta(after: Mapping[float, float], before: Mapping[float, float]) -> dict[float, float]:
    return {le: count - before.get(le, 0.0) for le, count in after.items()}


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float:
    """Prometheus' histogram_quantile (q in 0..1) over cumulative buckets: linear within the
    bucket the rank falls in; the highest finite bound when it falls in +Inf. NaN when empty."""
    bounds = sorted(buckets)
    if not bounds:
        return math.nan
    total = buckets[bounds[-1]]
    if total <= 0:
        return math.nan
    rank = q * total
    lower, below = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return lower
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    """A counter's samples summed by one label's value."""
    out: dict[str, float] = {}
    for (sample, labels), value in samples.items():
        if sample == name:
            key = dict(labels).get(label, "")
            out[key] = out.get(key, 0.0) + value
    return out


def fmt(seconds: float, unit: str = "s") -> str:
    """A figure for the report: seconds to 2 decimals (ms below 1 s when unit is 'ms')."""
    if math.isnan(seconds):
        return "-"
    if unit == "ms":
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f} s"

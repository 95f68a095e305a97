"""Small statistics for benchmark tables: nearest-rank percentiles, medians."""

from __future__ import annotations

import statistics


def percentile(values: list[float], pct: float) -> float:
    """The nearest-rank percentile (`pct` in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0

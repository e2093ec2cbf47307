"""Percentile summaries, computed the way numpy's default (linear interpolation) does."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True)
class Dist:
    """Summary of one metric over many samples (seconds or tokens/s)."""

    n: int
    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Dist | None:
        data = sorted(v for v in values if not math.isnan(v))
        if not data:
            return None
        return cls(len(data), sum(data) / len(data), percentile(data, 50), percentile(data, 90), percentile(data, 99))

    def to_json(self) -> dict[str, float]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: object) -> Dist | None:
        if not isinstance(data, Mapping):
            return None
        try:
            return cls(int(data["n"]), float(data["mean"]), float(data["p50"]), float(data["p90"]), float(data["p99"]))
        except (KeyError, TypeError, ValueError):
            return None


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    if not values:
        return math.nan, math.nan
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, 0.0
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))

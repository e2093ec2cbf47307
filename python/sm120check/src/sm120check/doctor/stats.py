"""Latency statistics and collective bandwidth arithmetic."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class LatencyStats:
    """Per-call latency of one collective, in microseconds."""

    n: int
    median_us: float
    p10_us: float
    p90_us: float
    mean_us: float
    min_us: float

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(self).items()}


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of already sorted values."""
    if not sorted_values:
        raise ValueError("percentile of no samples: time at least one iteration")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q={q} is outside 0..100")
    pos = (len(sorted_values) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def latency_stats(samples_us: Sequence[float]) -> LatencyStats:
    values = sorted(float(v) for v in samples_us)
    if not values:
        raise ValueError("latency_stats needs at least one sample")
    return LatencyStats(
        n=len(values),
        median_us=percentile(values, 50),
        p10_us=percentile(values, 10),
        p90_us=percentile(values, 90),
        mean_us=sum(values) / len(values),
        min_us=values[0],
    )


def allreduce_busbw_gbps(nbytes: int, seconds: float, world_size: int) -> float:
    """Bus bandwidth of an allreduce, as nccl-tests defines it: algbw * 2 (n - 1) / n, in GB/s (1e9 B/s).

    Each rank sends and receives 2 (n - 1) / n of the buffer in a ring allreduce, so bus bandwidth is
    comparable across world sizes and with the link's rated speed.
    """
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: an allreduce needs at least one rank")
    if seconds <= 0:
        raise ValueError(f"seconds={seconds}: a timed allreduce takes positive time")
    return algbw_gbps(nbytes, seconds) * 2 * (world_size - 1) / world_size


def algbw_gbps(nbytes: int, seconds: float) -> float:
    if seconds <= 0:
        raise ValueError(f"seconds={seconds}: a timed operation takes positive time")
    return nbytes / seconds / 1e9


def slowest_median(per_rank: Sequence[LatencyStats]) -> float:
    """A collective is as fast as its slowest rank: the largest median across ranks."""
    if not per_rank:
        raise ValueError("no ranks reported latencies")
    return max(s.median_us for s in per_rank)

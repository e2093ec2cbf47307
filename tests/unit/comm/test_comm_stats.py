"""Result arithmetic: latency statistics and nccl-tests' bus bandwidth."""

from __future__ import annotations

import pytest

from sm120check.doctor.stats import allreduce_busbw_gbps, latency_stats, percentile, slowest_median


def test_busbw_of_two_ranks_equals_algbw() -> None:
    # 2 (n - 1) / n = 1 for n = 2: 64 MiB in 1 ms is 67.1 GB/s either way.
    assert allreduce_busbw_gbps(64 * 2**20, 1e-3, 2) == pytest.approx(67.108864)


def test_busbw_of_eight_ranks_is_seven_quarters_of_algbw() -> None:
    assert allreduce_busbw_gbps(10**9, 1.0, 8) == pytest.approx(1.75)


def test_busbw_rejects_zero_time() -> None:
    with pytest.raises(ValueError, match="positive time"):
        allreduce_busbw_gbps(1024, 0.0, 2)


def test_latency_stats_median_and_tails() -> None:
    stats = latency_stats([float(v) for v in range(1, 101)])
    assert stats.median_us == pytest.approx(50.5)
    assert stats.p10_us == pytest.approx(10.9)
    assert stats.p90_us == pytest.approx(90.1)
    assert stats.min_us == 1.0 and stats.n == 100


def test_one_outlier_moves_the_mean_not_the_median() -> None:
    stats = latency_stats([12.0] * 99 + [5000.0])
    assert stats.median_us == 12.0
    assert stats.mean_us > 60


def test_no_samples_is_an_error_that_says_so() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        latency_stats([])
    with pytest.raises(ValueError, match=r"outside 0\.\.100"):
        percentile([1.0], 101)


def test_a_collective_is_as_fast_as_its_slowest_rank() -> None:
    assert slowest_median([latency_stats([10.0]), latency_stats([14.0])]) == 14.0

"""Open-loop arrival schedules: seeded, with the mean gap 1/rate and the spread 1/sqrt(burstiness) they promise.

Statistics are over many samples of the generator itself (no clock): vLLM's gamma(shape=b, scale=1/(rate*b)) has
mean 1/rate and coefficient of variation 1/sqrt(b); with 20 000 gaps the sample mean is within 1.5 % and the CV
within 3 % at the 4-sigma level for the shapes used here.
"""

from __future__ import annotations

import itertools
import math

import pytest

from sm120check.bench.arrivals import Arrivals, realized_rate

N = 20_000


def _mean_cv(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var) / mean


@pytest.mark.parametrize(("rate", "burstiness"), [(4.0, 1.0), (20.0, 0.5), (0.5, 4.0)])
def test_gaps_have_the_mean_and_spread_of_the_asked_rate_and_burstiness(rate: float, burstiness: float) -> None:
    offsets = Arrivals(rate, burstiness, seed=7).schedule(N + 1)
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    mean, cv = _mean_cv(gaps)
    assert mean == pytest.approx(1 / rate, rel=0.015)
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.03)
    # the offered rate is recovered from the schedule alone
    got = realized_rate(offsets)
    assert got is not None and got == pytest.approx(rate, rel=0.015)


def test_poisson_arrivals_in_fixed_windows_have_variance_equal_to_mean() -> None:
    # a Poisson process: counts per unit window have index of dispersion 1; burstiness 0.25 bunches them (>1)
    def dispersion(burstiness: float) -> float:
        offsets = Arrivals(10.0, burstiness, seed=3).schedule(N)
        counts = [0] * int(offsets[-1])
        for t in offsets:
            if int(t) < len(counts):
                counts[int(t)] += 1
        mean = sum(counts) / len(counts)
        return sum((c - mean) ** 2 for c in counts) / (len(counts) - 1) / mean

    assert dispersion(1.0) == pytest.approx(1.0, abs=0.15)
    assert dispersion(0.25) > 2.5


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    a = Arrivals(5.0, 0.7, seed=11).schedule(200)
    assert a == Arrivals(5.0, 0.7, seed=11).schedule(200)
    assert a != Arrivals(5.0, 0.7, seed=12).schedule(200)
    # arrivals are in order, the first at the start, and a prefix does not depend on how many were asked for
    assert a[0] == 0.0 and all(x <= y for x, y in itertools.pairwise(a))
    assert Arrivals(5.0, 0.7, seed=11).schedule(50) == a[:50]


def test_infinite_rate_sends_all_at_once_and_infinite_burstiness_evenly() -> None:
    assert Arrivals(math.inf).schedule(5) == [0.0] * 5
    assert Arrivals(4.0, math.inf).schedule(4) == pytest.approx([0.0, 0.25, 0.5, 0.75])
    assert realized_rate([0.0, 0.0]) is None and realized_rate([1.0]) is None


@pytest.mark.parametrize(
    ("rate", "burstiness", "words"),
    [
        (0.0, 1.0, "request rate 0.0"),
        (-2.0, 1.0, "request rate -2.0"),
        (math.nan, 1.0, "request rate nan"),
        (True, 1.0, "request rate True"),
        (1.0, 0.0, "burstiness 0.0"),
        (1.0, math.nan, "burstiness nan"),
        (1.0, -1.0, "1 = Poisson"),
    ],
)
def test_bad_parameters_are_refused_naming_the_value(rate: float, burstiness: float, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Arrivals(rate, burstiness)


def test_a_schedule_length_out_of_bounds_is_refused() -> None:
    with pytest.raises(ValueError, match="arrivals"):
        Arrivals(1.0).schedule(-1)
    with pytest.raises(ValueError, match="arrivals"):
        Arrivals(1.0).schedule(10**9)

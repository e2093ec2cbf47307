"""Open-loop arrival times: Poisson, or gamma-distributed gaps with a burstiness factor, from a seed.

The gaps follow vLLM's `get_request` (vllm/benchmarks/serve.py): gamma with shape = burstiness and
scale = 1 / (rate * burstiness), so the mean gap is 1/rate whatever the burstiness and the coefficient of
variation is 1/sqrt(burstiness). Burstiness 1 is the exponential (a Poisson process), which is all SGLang 0.5.23's
`bench_serving` offers (`np.random.exponential(1.0 / request_rate)` in sglang/benchmark/serving.py `get_request`);
below 1 arrivals bunch up, above 1 they even out, infinity gives constant gaps of 1/rate (vLLM special-cases it).
A rate of infinity sends everything at once (both tools do). Unlike vLLM this does not rescale the schedule so
the last arrival lands on n/rate: the process stays a true renewal process, and the realized rate is reported.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

MAX_ARRIVALS = 10_000_000  # a bound on one level's schedule (one float each)


@dataclass(frozen=True)
class Arrivals:
    """Parameters of one level's arrival process; validated on construction."""

    rate: float  # requests per second; math.inf: all at once
    burstiness: float = 1.0  # gamma shape; 1: Poisson; math.inf: constant gaps
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.rate, bool) or not isinstance(self.rate, (int, float)) or not self.rate > 0:
            raise ValueError(f"request rate {self.rate!r} must be a number > 0 (requests per second, or inf)")
        if isinstance(self.burstiness, bool) or not isinstance(self.burstiness, (int, float)):
            raise ValueError(f"burstiness {self.burstiness!r} must be a number > 0 (1 = Poisson)")
        if not self.burstiness > 0:
            raise ValueError(
                f"burstiness {self.burstiness!r} must be > 0: 1 = Poisson, below 1 burstier, above 1 more even"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed {self.seed!r} must be a whole number")

    def gaps(self) -> Iterator[float]:
        """Inter-arrival times in seconds, endless; the same sequence for the same parameters."""
        rng = random.Random(self.seed)
        if math.isinf(self.rate):
            while True:
                yield 0.0
        if math.isinf(self.burstiness):
            while True:
                yield 1.0 / self.rate
        scale = 1.0 / (self.rate * self.burstiness)
        while True:
            yield rng.gammavariate(self.burstiness, scale)

    def offsets(self) -> Iterator[float]:
        """Arrival times from the level's start: the first at 0 (as SGLang sends its first request at once)."""
        t = 0.0
        for gap in self.gaps():
            yield t
            t += gap

    def schedule(self, n: int) -> list[float]:
        """The first n arrival times (seconds from the start)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_ARRIVALS:
            raise ValueError(f"{n!r} arrivals: give a whole number from 0 to {MAX_ARRIVALS}")
        out: list[float] = []
        for t in self.offsets():
            if len(out) >= n:
                break
            out.append(t)
        return out

    @property
    def describe(self) -> str:
        kind = "Poisson" if self.burstiness == 1 else f"gamma, burstiness {self.burstiness:g}"
        return f"{self.rate:g} req/s ({kind})" if math.isfinite(self.rate) else "all at once (rate inf)"


def realized_rate(offsets: list[float]) -> float | None:
    """Arrivals per second a schedule offers: (n - 1) / span; None with fewer than two or a span of 0."""
    if len(offsets) < 2 or not offsets[-1] > offsets[0]:
        return None
    return (len(offsets) - 1) / (offsets[-1] - offsets[0])

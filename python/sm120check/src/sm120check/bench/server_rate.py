"""The server's own throughput over the bench's steady window: its generation counter, read from /metrics while a
level runs, against the bench's figure for the same window.

Engines count a request's output tokens when it is released (SGLang `sglang:generation_tokens_total`, llama.cpp
`llamacpp:tokens_predicted_total`, vLLM `vllm:generation_tokens_total`), so the counter's rate over a window is a
completion rate: over a window of many request lifetimes it equals the streaming rate the bench measures, over a
short one it differs by up to one lifetime's tokens at each edge. The comparison is therefore reported with the
window's lifetimes, and only called a disagreement where the window spans at least MIN_LIFETIMES.

On a real SGLang 0.5.16 server the level figure reconstructed from its decode log could not be cut at the bench's
window (whole-second timestamps): off by up to 59 % on short levels (docs/validation/2026-12-01-h200-sglang-server).
The counter, read here every SAMPLE_S on the bench's own clock, can.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import math
import time
from dataclasses import dataclass, field

from sm120check.bench.engines import scrape_metrics
from sm120check.bench.http import Endpoint

GENERATION_COUNTERS = {
    "sglang": "sglang:generation_tokens_total",
    "llama.cpp": "llamacpp:tokens_predicted_total",
    "vllm": "vllm:generation_tokens_total",
}
# Engines whose scheduler publishes its own streaming rate: SGLang sets sglang:gen_throughput at every decode log
# line (tokens of the last --decode-log-interval steps over their seconds), so its mean over the window is the
# server's streaming throughput, comparable at any window length (measured on the H200: the completion counter was
# 5-10 % off at 4-11 lifetimes where the gauge is not limited by lifetimes)
RATE_GAUGES = {"sglang": "sglang:gen_throughput"}
SAMPLE_S = 0.25
TOLERANCE = 0.05  # the bench's throughput and the server's counter agree within this, over a long enough window
MIN_LIFETIMES = 8.0  # shorter windows: the completion counter's edge error can exceed the tolerance


@dataclass
class CounterTrace:
    """(time on the bench's perf_counter clock, counter value), in time order."""

    name: str
    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def add(self, when: float, value: float) -> None:
        if self.times and (when <= self.times[-1] or value < self.values[-1]):
            return  # out of order, or a counter that went back (a restart): keep the trace monotonic
        self.times.append(when)
        self.values.append(value)

    def at(self, when: float) -> float | None:
        """The counter at `when`, linearly between the samples around it; None outside the trace."""
        if not self.times or when < self.times[0] or when > self.times[-1]:
            return None
        i = bisect.bisect_left(self.times, when)
        if self.times[i] == when:
            return self.values[i]
        t0, t1, v0, v1 = self.times[i - 1], self.times[i], self.values[i - 1], self.values[i]
        return v0 + (v1 - v0) * (when - t0) / (t1 - t0)

    def rate(self, lo: float, hi: float) -> float | None:
        start, end = self.at(lo), self.at(hi)
        if start is None or end is None or hi <= lo:
            return None
        return (end - start) / (hi - lo)


@dataclass
class GaugeTrace:
    """(time on the bench's perf_counter clock, gauge value), in time order: a step function, each value holding
    until the next sample."""

    name: str
    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def add(self, when: float, value: float) -> None:
        if (self.times and when <= self.times[-1]) or not math.isfinite(value) or value < 0:
            return
        self.times.append(when)
        self.values.append(value)

    def mean(self, lo: float, hi: float) -> float | None:
        """The time-weighted mean over [lo, hi]; None without a sample at or before lo and two inside."""
        if hi <= lo or not self.times or self.times[0] > lo:
            return None
        inside = [i for i, t in enumerate(self.times) if lo < t < hi]
        if len(inside) < 2:
            return None
        start = bisect.bisect_right(self.times, lo) - 1  # the value in force at lo
        edges = [lo, *(self.times[i] for i in inside), hi]
        held = [self.values[start], *(self.values[i] for i in inside)]
        return sum(v * (b - a) for v, a, b in zip(held, edges, edges[1:], strict=False)) / (hi - lo)


@dataclass(frozen=True)
class WindowCheck:
    """The server's counter rate (and its rate gauge's mean, where it has one) over the bench's window, and what
    the comparison says."""

    counter: str
    server_tok_s: float | None
    warning: str  # "" when they agree, the window is too short to judge, or there is no counter
    gauge: str = ""
    server_gauge_tok_s: float | None = None

    def to_meta(self) -> dict[str, object]:
        rate = None if self.server_tok_s is None else round(self.server_tok_s, 3)
        meta: dict[str, object] = {"server_counter": self.counter, "server_window_tok_s": rate}
        if self.gauge:
            gauge = None if self.server_gauge_tok_s is None else round(self.server_gauge_tok_s, 3)
            meta |= {"server_gauge": self.gauge, "server_window_gauge_tok_s": gauge}
        return meta


def judge(
    trace: CounterTrace,
    lo: float | None,
    hi: float | None,
    bench: float,
    lifetimes: float | None,
    gauge: GaugeTrace | None = None,
) -> WindowCheck:
    """The bench's window throughput against the server's own figures over the same window (pure): its rate gauge's
    mean where it has one (judged at any window length), else its completion counter (judged from MIN_LIFETIMES)."""
    window = lo is not None and hi is not None
    rate = trace.rate(lo, hi) if lo is not None and hi is not None else None
    mean = gauge.mean(lo, hi) if gauge is not None and lo is not None and hi is not None else None
    name = gauge.name if gauge is not None else ""
    if window and mean is not None and mean > 0:
        off = (bench - mean) / mean
        if abs(off) <= TOLERANCE:
            return WindowCheck(trace.name, rate, "", name, mean)
        return WindowCheck(trace.name, rate, _disagrees(name, "averaged", mean, bench, off), name, mean)
    if rate is None or rate <= 0:
        return WindowCheck(trace.name, rate, "", name, mean)
    off = (bench - rate) / rate
    if abs(off) <= TOLERANCE or lifetimes is None or lifetimes < MIN_LIFETIMES:
        return WindowCheck(trace.name, rate, "", name, mean)
    return WindowCheck(trace.name, rate, _disagrees(trace.name, "grew", rate, bench, off), name, mean)


def _disagrees(name: str, verb: str, server: float, bench: float, off: float) -> str:
    return (
        f"the server's own {name} {verb} {server:.1f} tok/s over the steady window, the bench measured "
        f"{bench:.1f} ({off:+.1%}): check the client (CPU-bound or lagging) and the server's other traffic"
    )


class CounterSampler:
    """Reads one counter (and a rate gauge, when named) from /metrics every SAMPLE_S while a level runs (bounded:
    each read has its timeout)."""

    def __init__(self, endpoint: Endpoint, headers: dict[str, str], name: str, timeout: float, gauge: str = "") -> None:
        self.trace = CounterTrace(name)
        self.gauge = GaugeTrace(gauge) if gauge else None
        self._endpoint, self._headers, self._timeout = endpoint, headers, timeout
        self._task: asyncio.Task[None] | None = None

    async def _read(self) -> None:
        scrape = await scrape_metrics(self._endpoint, self._headers, self._timeout)
        value = scrape.value(self.trace.name) if scrape is not None else None
        now = time.perf_counter()
        if value is not None:
            self.trace.add(now, value)
        rate = scrape.value(self.gauge.name) if scrape is not None and self.gauge is not None else None
        if rate is not None and self.gauge is not None:
            self.gauge.add(now, rate)

    async def _loop(self) -> None:
        while True:
            await self._read()
            await asyncio.sleep(SAMPLE_S)

    async def __aenter__(self) -> CounterSampler:
        await self._read()
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            # a read that failed as it was cancelled changes nothing
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._read()  # the level's last releases

"""The server's own throughput over the bench's steady window: its generation counter, read from /metrics while a
level runs, against the bench's figure for the same window.

Engines count a request's output tokens when it is released (SGLang `sglang:generation_tokens_total`, llama.cpp
`llamacpp:tokens_predicted_total`, vLLM `vllm:generation_tokens_total`), so the counter's rate over a window is a
completion rate: over a window of many request lifetimes it equals the streaming rate the bench measures, over a
short one it differs by up to one lifetime's tokens at each edge. The comparison is therefore reported with the
window's lifetimes, and only called a disagreement where the window spans at least MIN_LIFETIMES.

The counter is read every SAMPLE_S, so its value at a window edge is only known to lie between the samples around
the edge: the rate over an 8 s window is then known to about +-2 x SAMPLE_S / 8 s (6 %) of the interpolated figure.
A disagreement is called only outside that bracket (widened by TOLERANCE); see finding
bench-counter-sampling-bracket.

A level figure rebuilt from SGLang's decode log cannot be cut at the bench's window (whole-second timestamps; see
finding sglang-decode-log-window-error); the counter, read here every SAMPLE_S on the bench's own clock, can.
SGLang's `sglang:gen_throughput` gauge (the rate of its last decode log interval) is no reference: it is biased both
ways against the bench and the counter (see finding sglang-gen-throughput-gauge-bias).
"""

from __future__ import annotations

import asyncio
import bisect
import math
import time
from dataclasses import dataclass, field

from sm120check.aio import stop
from sm120check.bench.engines import scrape_metrics
from sm120check.bench.http import Endpoint, HttpError

GENERATION_COUNTERS = {
    "sglang": "sglang:generation_tokens_total",
    "llama.cpp": "llamacpp:tokens_predicted_total",
    "vllm": "vllm:generation_tokens_total",
}
SAMPLE_S = 0.25
TOLERANCE = 0.05  # the bench's throughput and the server's counter agree within this, over a long enough window
# Shorter windows: the completion counter's edge error (up to one lifetime's releases at each edge, bunched in a
# closed loop) can exceed the tolerance (see finding bench-counter-short-windows).
MIN_LIFETIMES = 20.0


@dataclass
class CounterTrace:
    """(time on the bench's perf_counter clock, counter value), in time order."""

    name: str
    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)  # samples left out: not a number, or going back

    def add(self, when: float, value: float) -> None:
        if not math.isfinite(value):
            self.faults.append(f"read {value}")
            return
        if self.times and value < self.values[-1]:  # a restart, or a counter that is not one: keep it monotonic
            self.faults.append(f"went back from {self.values[-1]:.0f} to {value:.0f}")
            return
        if self.times and when <= self.times[-1]:
            return  # out of order
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

    def bracket(self, lo: float, hi: float) -> tuple[float, float] | None:
        """The least and most the counter can have grown per second over [lo, hi], knowing it only at its samples
        and that it never goes back; None outside the trace."""
        if self.rate(lo, hi) is None:
            return None
        before_lo = bisect.bisect_right(self.times, lo) - 1  # last sample at or before lo
        after_lo = bisect.bisect_left(self.times, lo)  # first sample at or after lo
        before_hi = bisect.bisect_right(self.times, hi) - 1
        after_hi = bisect.bisect_left(self.times, hi)
        least = max(0.0, self.values[before_hi] - self.values[after_lo])
        most = self.values[after_hi] - self.values[before_lo]
        return least / (hi - lo), most / (hi - lo)


@dataclass(frozen=True)
class WindowCheck:
    """The server's counter rate over the bench's window, and what the comparison says."""

    counter: str
    server_tok_s: float | None  # interpolated between the samples around the window's edges
    server_range: tuple[float, float] | None  # the least and most the samples allow (CounterTrace.bracket)
    warning: str  # "" when they agree, the window is too short to judge, or there is no counter

    def to_meta(self) -> dict[str, object]:
        rate = None if self.server_tok_s is None else round(self.server_tok_s, 3)
        span = None if self.server_range is None else [round(v, 3) for v in self.server_range]
        return {"server_counter": self.counter, "server_window_tok_s": rate, "server_window_tok_s_range": span}


def outside(bench: float, span: tuple[float, float]) -> float:
    """How far `bench` lies outside the counter's bracket widened by TOLERANCE, as a fraction (0 inside)."""
    least, most = span[0] * (1 - TOLERANCE), span[1] * (1 + TOLERANCE)
    if bench < least:
        return (least - bench) / least
    if bench > most:
        return (bench - most) / most
    return 0.0


def judge(
    trace: CounterTrace, lo: float | None, hi: float | None, bench: float, lifetimes: float | None
) -> WindowCheck:
    """The bench's window throughput against the server's counter over the same window (pure)."""
    rate = trace.rate(lo, hi) if lo is not None and hi is not None else None
    span = trace.bracket(lo, hi) if lo is not None and hi is not None else None
    if trace.faults:
        return WindowCheck(
            trace.name,
            None,
            None,
            f"the server's own {trace.name} {trace.faults[0]} during the level ({len(trace.faults)} sample(s) left "
            "out): not a counter the bench can hold its throughput against, so it is not used",
        )
    if rate == 0 and bench > 0 and lifetimes is not None and lifetimes >= MIN_LIFETIMES:
        return WindowCheck(
            trace.name,
            rate,
            span,
            f"the server's own {trace.name} did not grow over the steady window while the bench measured "
            f"{bench:.1f} tok/s: the counter is stuck, or another server answered",
        )
    if rate is None or rate <= 0 or span is None:
        return WindowCheck(trace.name, rate, span, "")
    off = (bench - rate) / rate
    if not outside(bench, span) or lifetimes is None or lifetimes < MIN_LIFETIMES:
        return WindowCheck(trace.name, rate, span, "")
    return WindowCheck(
        trace.name,
        rate,
        span,
        f"the server's own {trace.name} grew {rate:.1f} tok/s over the steady window ({span[0]:.1f}-{span[1]:.1f} "
        f"between its samples), the bench measured {bench:.1f} ({off:+.1%}): check the client (CPU-bound or "
        "lagging) and the server's other traffic",
    )


class CounterSampler:
    """Reads one counter from /metrics every SAMPLE_S while a level runs (bounded: each read has its timeout)."""

    def __init__(self, endpoint: Endpoint, headers: dict[str, str], name: str, timeout: float) -> None:
        self.trace = CounterTrace(name)
        self._endpoint, self._headers, self._timeout = endpoint, headers, timeout
        self._task: asyncio.Task[None] | None = None
        self.failure: HttpError | None = None  # the last read, after the level, failed (a stall, a dead server)

    async def _read(self) -> None:
        scrape = await scrape_metrics(self._endpoint, self._headers, self._timeout)
        value = scrape.value(self.trace.name) if scrape is not None else None
        if value is not None:
            self.trace.add(time.perf_counter(), value)

    async def _loop(self) -> None:
        while True:
            await self._read()
            await asyncio.sleep(SAMPLE_S)

    async def __aenter__(self) -> CounterSampler:
        await self._read()
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:  # a read that failed as it was cancelled changes nothing
            await stop([self._task])
        try:  # the level's last releases; the level is measured whatever this read does
            await self._read()
        except HttpError as exc:
            self.failure = exc

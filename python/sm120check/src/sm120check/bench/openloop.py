"""Open-loop load at an offered request rate: requests arrive on a seeded schedule, whether or not the server keeps up.

Window (what `summarize` measures):
- warm-up: the first `warmup` arrivals; their requests load the server but are not measured.
- the window opens at the scheduled time of the first measured arrival and closes when the last measured request
  has finished. Arrivals go on through the whole window ("tail" arrivals, not measured) so every measured request
  runs under the offered load, not on a server draining after the last arrival; this keeps slow requests in the
  latency numbers (stopping at the last arrival would measure only the ones that finished early). The drain after
  the window is not measured: tail requests still running then are cut, their tokens inside the window count.
- at a rate of inf (everything at once) there is no tail: the window closes at the last measured completion, and
  the server drains as in SGLang's and vLLM's runs at rate inf.
Latency runs from the scheduled arrival, so time spent waiting for a free slot under `max_in_flight` (or behind a
late event loop) is part of TTFT and end-to-end latency and shows as client wait; vLLM and SGLang start their clock
after their semaphore instead, which hides the queue a capped client builds.
Bounds: each request has `request_timeout`; the level has `level_timeout` (then what finished is returned, the
window closes at that moment and `timed_out` is true); at most `max_in_flight` requests (each one connection) are
in flight, `HARD_MAX_IN_FLIGHT` when not given.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from sm120check.aio import stop, within
from sm120check.bench.apis import Api, RequestSpec
from sm120check.bench.arrivals import MAX_ARRIVALS, Arrivals, realized_rate
from sm120check.bench.closedloop import RequestRecord, one_request
from sm120check.bench.http import Connection, Endpoint

HARD_MAX_IN_FLIGHT = 4096  # as bench's MAX_CONCURRENCY: each in-flight request is one connection and one task


@dataclass(frozen=True)
class RatePlan:
    arrivals: Arrivals
    requests: int | None = None  # measured arrivals; None with a duration
    duration: float | None = None  # seconds of measured arrivals; None with a request count
    warmup: int = 8  # arrivals before the window
    max_in_flight: int | None = None  # cap on requests in flight; an arrival beyond it waits for a slot
    request_timeout: float = 600.0
    level_timeout: float = 3600.0
    fresh_connections: bool = False  # a new connection for every request (closedloop.LevelPlan says why)

    def __post_init__(self) -> None:
        if (self.requests is None) == (self.duration is None):
            raise ValueError("give exactly one of a request count or a duration per rate level")
        if self.requests is not None and not 1 <= self.requests <= MAX_ARRIVALS:
            raise ValueError(f"{self.requests} measured requests: give 1 to {MAX_ARRIVALS}")
        if self.duration is not None:
            if not (math.isfinite(self.duration) and self.duration > 0):
                raise ValueError(f"duration {self.duration!r} must be a finite number of seconds > 0")
            if math.isinf(self.arrivals.rate):
                raise ValueError(
                    "a request rate of inf sends every request at once, so a duration holds no fixed number of "
                    "them: give a request count (--requests-per-level) or a finite --request-rate"
                )
        if not 0 <= self.warmup <= MAX_ARRIVALS:
            raise ValueError(f"warm-up of {self.warmup} arrivals: give 0 to {MAX_ARRIVALS}")
        if self.max_in_flight is not None and not 1 <= self.max_in_flight <= HARD_MAX_IN_FLIGHT:
            raise ValueError(f"max in flight {self.max_in_flight}: give 1 to {HARD_MAX_IN_FLIGHT}, or leave it unset")
        for name in ("request_timeout", "level_timeout"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} {value!r} must be a finite number of seconds > 0")


@dataclass
class OpenLoopStats:
    """What the client did at one rate level (filled in by `run_rate_level` when passed one)."""

    arrivals: int = 0  # requests started (warm-up, measured and tail)
    measured: int = 0
    tail: int = 0
    waited_for_slot: int = 0  # arrivals that found every slot taken
    peak_in_flight: int = 0  # the most requests this client had on the wire at once
    offered_rate: float | None = None  # measured arrivals per second of the schedule (realized, not asked)
    served_rate: float | None = None  # requests that finished inside the window, per second of it
    measured_offsets: list[float] = field(default_factory=list)

    def warnings(self, plan: RatePlan) -> tuple[str, ...]:
        out: list[str] = []
        cap = plan.max_in_flight or HARD_MAX_IN_FLIGHT
        if self.offered_rate and self.served_rate is not None and self.served_rate < 0.9 * self.offered_rate:
            out.append(
                f"the server finished {self.served_rate:.3g} requests/s of the {self.offered_rate:.3g} offered: "
                "past saturation the queue, and with it latency, grows for as long as the level runs"
            )
        if self.waited_for_slot:
            out.append(
                f"{self.waited_for_slot} of {self.arrivals} arrivals found all {cap} in-flight slots taken and "
                "waited (counted in their latency): the server did not keep up with the offered rate, or "
                "--max-in-flight is below rate x latency"
            )
        return tuple(out)


@dataclass(frozen=True)
class _Arrival:
    """One arrival of a rate level's schedule and its role: warm-up, measured, or tail (after the measured ones)."""

    index: int
    offset: float  # seconds after the level's start
    measured: bool
    tail: bool


def _schedule(plan: RatePlan) -> Iterator[_Arrival]:
    """The level's arrivals in order, each with its role (at most MAX_ARRIVALS); the caller stops at the tail it
    does not need."""
    first_measured: float | None = None
    for index, offset in enumerate(plan.arrivals.offsets()):
        if index >= MAX_ARRIVALS:
            return
        measured = False
        if index >= plan.warmup:
            if first_measured is None:
                first_measured = offset
            if plan.requests is not None:
                measured = index < plan.warmup + plan.requests
            else:
                assert plan.duration is not None
                measured = offset < first_measured + plan.duration
        yield _Arrival(index, offset, measured, index >= plan.warmup and not measured)


@dataclass
class _Window:
    """The measured window as the level runs: it opens at the first measured arrival and closes when the last
    measured request is done after the schedule reached the tail (or ran out)."""

    finished: asyncio.Event = field(default_factory=asyncio.Event)  # closed, or a bug stopped the level
    start: float | None = None
    end: float | None = None
    measured_left: int = 0
    scheduling_done: bool = False
    in_flight: int = 0
    bugs: list[BaseException] = field(default_factory=list)

    def close(self) -> None:
        self.end = time.perf_counter()
        self.finished.set()

    def stop(self, bug: BaseException) -> None:
        self.bugs.append(bug)
        self.finished.set()


async def run_rate_level(
    endpoint: Endpoint,
    api: Api,
    plan: RatePlan,
    make_spec: Callable[[int], RequestSpec],
    headers: dict[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
    progress_every: float = 5.0,
    stats: OpenLoopStats | None = None,
) -> tuple[list[RequestRecord], float | None, float | None, bool]:
    """Run one rate level; returns the records, the window's start and end, and whether the level timed out.

    Records of warm-up and tail requests have `warmup=True` (not measured; their tokens inside the window count
    toward throughput, as the closed loop's do).
    """
    st = stats if stats is not None else OpenLoopStats()
    slots = asyncio.Semaphore(plan.max_in_flight or HARD_MAX_IN_FLIGHT)
    idle: list[Connection] = []
    opened: list[Connection] = []
    records: list[RequestRecord] = []
    tasks: list[asyncio.Task[None]] = []
    w = _Window()

    async def one(index: int, at: float, measured: bool) -> None:
        try:
            await send(index, at, measured)
        except Exception as exc:  # a bug, not a server failure (those come back as records): stop the level
            w.stop(exc)

    async def send(index: int, at: float, measured: bool) -> None:
        if slots.locked():
            st.waited_for_slot += 1
        async with slots:
            if idle:
                conn = idle.pop()
            else:
                conn = Connection(endpoint, headers)
                opened.append(conn)
            w.in_flight += 1
            st.peak_in_flight = max(st.peak_in_flight, w.in_flight)
            try:
                record = await one_request(
                    conn=conn,
                    api=api,
                    spec=make_spec(index),
                    warmup=not measured,
                    timeout=plan.request_timeout,
                    on_cut=lambda r: records.append(replace(r, scheduled=at)),
                )
            finally:
                w.in_flight -= 1
            if plan.fresh_connections:
                await conn.close()
            else:
                idle.append(conn)
        records.append(replace(record, scheduled=at))
        if measured:
            w.measured_left -= 1
            if w.measured_left == 0 and w.scheduling_done:
                w.close()

    async def dispatcher(start: float) -> None:
        try:
            await dispatch(start)
        except Exception as exc:
            w.stop(exc)

    async def dispatch(start: float) -> None:
        for arrival in _schedule(plan):
            if arrival.tail and not w.scheduling_done:
                w.scheduling_done = True
                if w.measured_left == 0:  # every measured request finished before the first tail arrival
                    w.close()
                if math.isinf(plan.arrivals.rate):
                    return
            at = start + arrival.offset
            delay = at - time.perf_counter()
            if arrival.tail:
                try:  # wait for the arrival time, or stop early when the window has closed
                    await within(w.finished.wait(), max(delay, 0.0))
                    return
                except asyncio.TimeoutError:
                    pass
                if w.finished.is_set():
                    return
            elif delay > 0:
                await asyncio.sleep(delay)
            if arrival.measured:
                if w.start is None:
                    w.start = at
                w.measured_left += 1
                st.measured += 1
                st.measured_offsets.append(arrival.offset)
            elif arrival.tail:
                st.tail += 1
            st.arrivals += 1
            tasks.append(asyncio.ensure_future(one(arrival.index, at, arrival.measured)))
            await asyncio.sleep(0)  # let a task started at the same instant reach its slot in arrival order
        # the schedule ran out (MAX_ARRIVALS) before a tail arrival: the window closes with the last measured request
        w.scheduling_done = True
        if w.measured_left == 0:
            w.close()

    async def reporter(start: float) -> None:
        while progress is not None:
            await asyncio.sleep(progress_every)
            progress(_progress_line(plan, records, w.in_flight, time.perf_counter() - start))

    start = time.perf_counter()
    helpers = [asyncio.ensure_future(dispatcher(start)), asyncio.ensure_future(reporter(start))]
    timed_out = False
    try:
        await within(w.finished.wait(), plan.level_timeout)
    except asyncio.TimeoutError:
        timed_out = True
        w.end = time.perf_counter()
    await stop([*helpers, *tasks])
    await asyncio.gather(*(conn.close() for conn in opened), return_exceptions=True)
    if w.bugs:
        raise w.bugs[0]
    st.offered_rate = realized_rate(st.measured_offsets)
    st.served_rate = _served_rate(records, w.start, w.end)
    return records, w.start, w.end, timed_out


def _progress_line(plan: RatePlan, records: Sequence[RequestRecord], in_flight: int, elapsed: float) -> str:
    done = [r for r in records if not r.warmup and not r.cut]
    errors = sum(1 for r in done if r.error)
    total = plan.requests if plan.requests is not None else "?"
    return (
        f"  rate {plan.arrivals.describe}: {len(done)}/{total} requests done, {errors} errors, "
        f"{in_flight} in flight, {elapsed:.0f} s elapsed"
    )


def _served_rate(records: Sequence[RequestRecord], lo: float | None, hi: float | None) -> float | None:
    """Requests that finished inside the window lo..hi, per second of it (None without a window)."""
    if lo is None or hi is None or hi <= lo:
        return None
    return sum(1 for r in records if not r.cut and lo <= r.end <= hi) / (hi - lo)


def peak_in_flight(records: Sequence[RequestRecord]) -> int:
    """The most requests on the wire at once, from the records' send and end times (at least 1 with any record)."""
    events = sorted([(r.sent, 1) for r in records] + [(r.end, -1) for r in records], key=lambda e: (e[0], e[1]))
    peak = now = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak

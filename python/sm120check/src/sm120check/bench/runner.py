"""Closed-loop load at a fixed concurrency: C workers, each with its own connection, always one request in flight.

Measurement follows the usual pitfalls' cures: each worker's first requests are warm-up; the steady window opens
when the last worker finished its warm-up and closes when the first worker runs out of work (or at the duration's
end), so neither the synchronized start nor the drain tail (fewer than C in flight) is measured. Throughput is the
tokens that arrived inside the window over its length.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sm120check.bench.apis import PATHS, Api, RequestSpec, StreamFormatError, StreamTally, build_body
from sm120check.bench.http import Connection, Endpoint, HttpError
from sm120check.bench.records import LevelSummary
from sm120check.bench.stats import Dist
from sm120check.bench.wire import SseDecoder, WireError

_MAX_ERROR_SAMPLES = 5


@dataclass(frozen=True)
class LevelPlan:
    concurrency: int
    requests: int | None = None  # measured requests at this level; None with a duration
    duration: float | None = None  # seconds of steady window; None with a request count
    warmup: int = 1  # requests per worker before measuring
    request_timeout: float = 600.0
    level_timeout: float = 3600.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency {self.concurrency} must be at least 1")
        if (self.requests is None) == (self.duration is None):
            raise ValueError("give exactly one of a request count or a duration per level")


@dataclass(frozen=True)
class RequestRecord:
    warmup: bool
    scheduled: float  # the worker was ready to send
    sent: float  # the request was on the wire
    end: float
    first: float | None = None  # first chunk that carried tokens
    chunks: tuple[tuple[float, int], ...] = ()
    error: str = ""
    prompt_tokens: int | None = None
    spec_verify_ct: int | None = None
    token_source: str = ""
    server_lag: tuple[float, ...] = ()
    cut: bool = False  # stopped at the end of a --duration window: its tokens count, its latency does not
    anomalies: tuple[str, ...] = ()  # token counts that cannot be true: the request is left out of the numbers

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.chunks)


@dataclass
class _LevelState:
    remaining: int | None
    warm_left: int
    t0: float | None = None
    t1: float | None = None
    deadline: float | None = None
    records: list[RequestRecord] = field(default_factory=list)


async def one_request(
    conn: Connection,
    api: Api,
    spec: RequestSpec,
    warmup: bool,
    timeout: float,
    on_cut: Callable[[RequestRecord], None] | None = None,
) -> RequestRecord:
    """Send one streaming request and tally its chunks; failures come back as a record with `error` set.

    When cancelled (the end of a duration window), the tokens received so far go to `on_cut` before re-raising.
    """
    scheduled = time.perf_counter()
    sent = [scheduled]
    tally = StreamTally()

    async def stream() -> str:
        response = await conn.request("POST", PATHS[api], build_body(api, spec), stream=True)
        sent[0] = conn.sent_at
        if response.status != 200:
            body = (await response.read())[:300].decode("utf-8", errors="replace")
            return f"HTTP {response.status}: {body}"
        decoder = SseDecoder()
        async for data in response.iter_body():
            now = time.perf_counter()
            for event in decoder.feed(data):
                tally.add_event(api, event, now)
        for event in decoder.flush():
            tally.add_event(api, event, time.perf_counter())
        return ""

    try:
        error = await asyncio.wait_for(stream(), timeout)
        chunks, source = tally.finish() if not error else ([], "")
    except (HttpError, WireError, StreamFormatError) as exc:
        error, chunks, source = str(exc), [], ""
    except asyncio.TimeoutError:
        error, chunks, source = f"timed out after {timeout:g} s", [], ""
    except asyncio.CancelledError:
        if on_cut is not None:
            got = tuple((t, n) for t, n, _ in tally.chunks if n)
            cut_anomalies = list(tally.anomalies)
            if sum(n for _, n in got) > spec.output_len:
                cut_anomalies.append(f"more tokens reported than --output-len {spec.output_len}")
            first_at = got[0][0] if got else None
            on_cut(
                RequestRecord(
                    warmup, scheduled, sent[0], time.perf_counter(), first_at, got, cut=True,
                    anomalies=tuple(cut_anomalies),
                )
            )  # fmt: skip
        raise
    end = time.perf_counter()
    if error:
        await conn.close()
        return RequestRecord(warmup, scheduled, sent[0], end, error=error)
    first = next((t for t, n in chunks if n > 0), None)
    anomalies = list(tally.anomalies)
    total = sum(n for _, n in chunks)
    if total > spec.output_len:
        anomalies.append(f"{total} tokens reported for a request of at most {spec.output_len} (--output-len)")
    return RequestRecord(
        warmup,
        scheduled,
        sent[0],
        end,
        first,
        tuple(chunks),
        "" if first is not None else "the response carried no tokens",
        tally.prompt_tokens,
        tally.spec_verify_ct,
        source,
        tuple(tally.server_lag),
        anomalies=tuple(anomalies),
    )


async def run_level(
    endpoint: Endpoint,
    api: Api,
    plan: LevelPlan,
    make_spec: Callable[[int], RequestSpec],
    headers: dict[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
    progress_every: float = 5.0,
) -> tuple[list[RequestRecord], float | None, float | None, bool]:
    """Run one level; returns the records, the window's start and end, and whether the level timed out."""
    c = plan.concurrency
    state = _LevelState(remaining=plan.requests, warm_left=c)
    counter = iter(range(1 << 62))

    async def worker() -> None:
        conn = Connection(endpoint, headers)
        try:
            for _ in range(plan.warmup):
                state.records.append(
                    await one_request(
                        conn, api, make_spec(next(counter)), True, plan.request_timeout, state.records.append
                    )
                )
            state.warm_left -= 1
            if state.warm_left == 0:
                state.t0 = time.perf_counter()
                if plan.duration is not None:
                    state.deadline = state.t0 + plan.duration
            while True:
                if state.remaining is not None:
                    if state.remaining <= 0:
                        break
                    state.remaining -= 1
                elif state.deadline is not None and time.perf_counter() >= state.deadline:
                    break
                record = await one_request(
                    conn, api, make_spec(next(counter)), False, plan.request_timeout, state.records.append
                )
                state.records.append(record)
            if state.t1 is None:
                state.t1 = state.deadline if state.deadline is not None else time.perf_counter()
        finally:
            await conn.close()

    async def reporter() -> None:
        start = time.perf_counter()
        while progress is not None:
            await asyncio.sleep(progress_every)
            done = [r for r in state.records if not r.warmup and not r.cut]
            errors = sum(1 for r in done if r.error)
            total = plan.requests if plan.requests is not None else "?"
            progress(
                f"  C={c}: {len(done)}/{total} requests done, {errors} errors, "
                f"{time.perf_counter() - start:.0f} s elapsed"
            )

    async def stopper() -> None:
        # With a duration, requests still running at the window's end are cut off: their tokens inside the window
        # are counted already, and waiting for them would only measure the drain.
        while state.deadline is None:
            await asyncio.sleep(0.01)
        await asyncio.sleep(max(0.0, state.deadline - time.perf_counter()))
        state.t1 = state.deadline
        for task in tasks:
            task.cancel()

    tasks = [asyncio.ensure_future(worker()) for _ in range(c)]
    helpers = [asyncio.ensure_future(reporter())]
    if plan.duration is not None:
        helpers.append(asyncio.ensure_future(stopper()))
    done, pending = await asyncio.wait(tasks, timeout=plan.level_timeout)
    timed_out = bool(pending)
    for task in [*pending, *helpers]:
        task.cancel()
    await asyncio.gather(*pending, *helpers, return_exceptions=True)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]  # a bug in the worker, not a server failure
    return state.records, state.t0, state.t1, timed_out


def summarize(
    concurrency: int,
    records: Sequence[RequestRecord],
    t0: float | None,
    t1: float | None,
    timed_out: bool = False,
) -> LevelSummary:
    """Reduce a level's request records to the numbers a user reads (see the module docstring for the window)."""
    warnings: list[str] = []
    measured = [r for r in records if not r.warmup and not r.cut]
    errors = [r for r in measured if r.error]
    suspect = [r for r in records if r.anomalies]
    flags: list[str] = []
    if suspect:
        flags.append("untrusted_token_counts")
        warnings.append(
            f"{len(suspect)} request(s) at C={concurrency} reported token counts that cannot be true "
            f"({suspect[0].anomalies[0]}); their tokens are left out of throughput, latency and accept length"
        )
        records = [r for r in records if not r.anomalies]
    ok = [r for r in measured if not r.error and not r.anomalies]
    window_valid = t0 is not None and t1 is not None and t1 > t0
    if timed_out:
        warnings.append("the level hit --level-timeout; its numbers cover what finished")
    if window_valid:
        assert t0 is not None and t1 is not None
        lo, hi = t0, t1
        steady = [r for r in ok if r.scheduled >= lo and r.end <= hi]
        if not steady:
            warnings.append(
                f"no request ran wholly inside the steady window at C={concurrency}; latency covers all measured "
                "requests - raise --requests-per-level or --duration"
            )
            steady = ok
    else:
        warnings.append(
            f"no steady window at C={concurrency} (a worker ran out of work before all finished warm-up); "
            "throughput covers all measured requests - raise --requests-per-level to several times C"
        )
        steady = ok
        lo = min((r.scheduled for r in ok), default=0.0)
        hi = max((r.end for r in ok), default=0.0)
    throughput, window, in_window = _window_rate(records, lo, hi)

    ttft = [r.first - r.scheduled for r in steady if r.first is not None]
    e2e = [r.end - r.scheduled for r in steady]
    per_req = [r.tokens / (r.end - r.scheduled) for r in steady if r.end > r.scheduled]
    tpot = [(r.end - r.first) / (r.tokens - 1) for r in steady if r.first is not None and r.tokens > 1]
    itl: list[float] = []
    for r in steady:
        prev = r.first
        for t, n in r.chunks:
            if prev is not None and t > prev and n > 0:
                itl.extend([(t - prev) / n] * n)  # a chunk of n tokens: n gaps of equal share
                prev = t
    accept, accept_source = _accept_length(steady)
    sources = sorted({r.token_source for r in ok if r.token_source})
    samples: list[str] = []
    for r in errors:
        if r.error not in samples:
            samples.append(r.error)
        if len(samples) >= _MAX_ERROR_SAMPLES:
            break
    return LevelSummary(
        concurrency=concurrency,
        throughput_tok_s=throughput,
        window_s=window,
        output_tokens=in_window,
        requests=len(measured),
        errors=len(errors),
        window_valid=window_valid,
        per_request_tok_s=Dist.of(per_req),
        ttft_s=Dist.of(ttft),
        itl_s=Dist.of(itl),
        tpot_s=Dist.of(tpot),
        e2e_s=Dist.of(e2e),
        client_wait_s=Dist.of(r.sent - r.scheduled for r in steady),
        server_lag_s=Dist.of(lag for r in steady for lag in r.server_lag),
        accept_length=accept,
        accept_source=accept_source,
        token_source="+".join(sources),
        error_samples=tuple(samples),
        warnings=tuple(warnings),
        flags=tuple(flags),
    )


def _window_rate(records: Sequence[RequestRecord], lo: float, hi: float) -> tuple[float, float, int]:
    """Output rate inside [lo, hi): the least-squares slope of cumulative tokens against arrival time.

    Servers emit in bursts (every running request gets its tokens at the end of a step), so a plain count over the
    window is off by up to one step's tokens, which matters when the window holds few steps; the slope of the
    staircase is not. Returns the rate, the span from first to last arrival, and the tokens inside the window.
    """
    arrivals = sorted((t, n) for r in records if not r.error for t, n in r.chunks if lo <= t < hi and n > 0)
    tokens = sum(n for _, n in arrivals)
    if len(arrivals) < 2 or arrivals[-1][0] <= arrivals[0][0]:
        return (tokens / (hi - lo) if hi > lo else 0.0), max(hi - lo, 0.0), tokens
    cumulative, total = [], 0
    for _, n in arrivals:
        total += n
        cumulative.append(total)
    times = [t for t, _ in arrivals]
    mt = sum(times) / len(times)
    mn = sum(cumulative) / len(cumulative)
    sxx = sum((t - mt) ** 2 for t in times)
    sxy = sum((t - mt) * (n - mn) for t, n in zip(times, cumulative, strict=True))
    return sxy / sxx, times[-1] - times[0], tokens


def _accept_length(records: Sequence[RequestRecord]) -> tuple[float | None, str]:
    """Tokens per verify step from SGLang's per-request meta_info (completion_tokens / spec_verify_ct)."""
    tokens = verify = 0
    for r in records:
        if r.spec_verify_ct:
            tokens += r.tokens
            verify += r.spec_verify_ct
    if verify == 0:
        return None, ""
    value = tokens / verify
    return (value, "meta_info.spec_verify_ct") if math.isfinite(value) else (None, "")

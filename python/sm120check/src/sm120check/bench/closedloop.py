"""Closed-loop load at a fixed concurrency: C workers, each with its own connection, always one request in flight.

Measurement follows the usual pitfalls' cures: each worker's first requests are warm-up; the steady window opens
when the last worker finished its warm-up and closes when the first worker runs out of work (or at the duration's
end, after which no worker sends and the requests in flight finish outside the window), so neither the
synchronized start nor the drain tail (fewer than C in flight) is measured. Throughput is the
slope of the tokens that arrived inside the window against time; its uncertainty is the relative difference of the
slopes of the window's two halves.

Accepted length per request, where the server says: SGLang `completion_tokens / spec_verify_ct`; llama.cpp
`(n - 1) / (n - 1 - draft_n_accepted)` for n output tokens (the first token comes from the prompt pass, and every
later target step gives one token of its own plus the drafts it accepted; steps where nothing was drafted count as
steps of one token, so this is tokens per target step, at most llama.cpp's own "mean len", which counts only steps
that had a draft; `bench` prefers llama.cpp's /metrics counters for the level's value).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from sm120check.aio import stop, within
from sm120check.bench.apis import PATHS, Api, RequestSpec, StreamFormatError, StreamTally, build_body
from sm120check.bench.http import Connection, Endpoint, HttpError, lost
from sm120check.bench.percentiles import Dist
from sm120check.bench.records import COHORTS, MAX_ACCEPT_LENGTH, LevelSummary, RequestRow
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
    # with a duration: extend the window until it spans this many mean request lifetimes (bounded by the level's
    # timeout), so a completion counter can confirm its throughput (bench/server_rate.py MIN_LIFETIMES)
    min_lifetimes: float | None = None
    # a new connection for every request: a server whose HTTP processes share one listening socket (uvicorn's
    # workers, SGLang's --tokenizer-worker-num) then takes them as its processes accept; one keep-alive connection a
    # worker stays on the process that accepted the level's first burst of connects, however unevenly they fell
    fresh_connections: bool = False

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency {self.concurrency} must be at least 1")
        if (self.requests is None) == (self.duration is None):
            raise ValueError("give exactly one of a request count or a duration per level")
        if self.min_lifetimes is not None and (self.duration is None or not self.min_lifetimes > 0):
            raise ValueError("min_lifetimes needs a duration and must be positive")


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
    cut: bool = False  # cancelled by --level-timeout: its tokens so far count, its latency does not
    anomalies: tuple[str, ...] = ()  # token counts that cannot be true: the request is left out of the numbers
    cached_prompt_tokens: int | None = None  # prompt tokens the server's cache served
    draft_accepted: int | None = None  # llama.cpp timings.draft_n_accepted
    uncounted: tuple[float, ...] = ()  # a cut request's text chunks whose tokens the server never counted
    partial: tuple[tuple[float, int], ...] = ()  # a failed request's token chunks before it failed (the soak's
    # tokens/s per second; the bench counts no token of a failed request)

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.chunks)

    @property
    def accept_length(self) -> float | None:
        """Tokens per verify step (see the module docstring); None where the server did not say."""
        if self.error or self.anomalies:
            return None
        if self.spec_verify_ct:
            return self.tokens / self.spec_verify_ct
        if self.draft_accepted is not None and self.tokens > 1:
            steps = self.tokens - 1 - self.draft_accepted
            return (self.tokens - 1) / steps if steps > 0 else None
        return None


@dataclass
class _LevelState:
    remaining: int | None
    warm_left: int
    started: float = field(default_factory=time.perf_counter)
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

    When cancelled (the level's timeout), the tokens received so far go to `on_cut` before re-raising.
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
        error = await within(stream(), timeout)
        chunks, source = tally.finish() if not error else ([], "")
    except (HttpError, WireError, StreamFormatError) as exc:
        error, chunks, source = str(exc), [], ""
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:  # the server went away
        error, chunks, source = lost(exc), [], ""
    except asyncio.TimeoutError:
        error, chunks, source = f"timed out after {timeout:g} s", [], ""
    except asyncio.CancelledError:
        if on_cut is not None:
            got = tuple((t, n) for t, n, _ in tally.chunks if n)
            uncounted = tuple(t for t, n, chars in tally.chunks if n is None and chars)
            cut_anomalies = list(tally.anomalies)
            if sum(n for _, n in got) > spec.output_len:
                cut_anomalies.append(f"more tokens reported than --output-len {spec.output_len}")
            first_at = got[0][0] if got else None
            on_cut(
                RequestRecord(
                    warmup, scheduled, sent[0], time.perf_counter(), first_at, got, cut=True,
                    anomalies=tuple(cut_anomalies), uncounted=uncounted, spec_verify_ct=tally.spec_verify_ct,
                )
            )  # fmt: skip
        raise
    end = time.perf_counter()
    if error:
        await conn.close()
        partial = tuple((t, n) for t, n, _ in tally.chunks if n)
        return RequestRecord(warmup, scheduled, sent[0], end, error=error, partial=partial)
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
        cached_prompt_tokens=tally.cached_prompt_tokens,
        draft_accepted=tally.draft_accepted,
    )


BACKOFF_FIRST_S = 0.05  # a worker's pause after a failed request, doubled per failure in a row
BACKOFF_MAX_S = 1.0


def back_off(failures: int, deadline: float | None, now: float) -> float:
    """Seconds a worker waits after `failures` failed requests in a row, never past the window's end: a server that
    died refuses a connection at once, and without a pause every worker would record thousands of failures a
    second until the window closed."""
    pause: float = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** min(failures - 1, 32))
    return pause if deadline is None else max(0.0, min(pause, deadline - now))


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
                if plan.fresh_connections:
                    await conn.close()
            state.warm_left -= 1
            if state.warm_left == 0:
                state.t0 = time.perf_counter()
                if plan.duration is not None:
                    state.deadline = state.t0 + plan.duration
            failures = 0  # this worker's failed requests in a row
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
                if plan.fresh_connections:
                    await conn.close()
                failures = failures + 1 if record.error else 0
                if failures:
                    await asyncio.sleep(back_off(failures, state.deadline, time.perf_counter()))
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
        # With a duration the window closes at the deadline and no worker sends again; requests still running then
        # finish (drain), their tokens after the deadline outside the window. A cancelled stream keeps generating on
        # the server, inside the next level's window and counters (see finding sglang-cancelled-streams-run-on);
        # draining costs at most one request lifetime per level.
        while state.deadline is None:
            await asyncio.sleep(0.01)
        while True:
            await asyncio.sleep(max(0.0, state.deadline - time.perf_counter()))
            later = _extended_deadline(plan, state)
            if later is None:
                break
            state.deadline = later
        state.t1 = state.deadline

    tasks = [asyncio.ensure_future(worker()) for _ in range(c)]
    helpers = [asyncio.ensure_future(reporter())]
    if plan.duration is not None:
        helpers.append(asyncio.ensure_future(stopper()))
    done, pending = await asyncio.wait(tasks, timeout=plan.level_timeout)
    timed_out = bool(pending)
    await stop([*pending, *helpers])
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]  # a bug in the worker, not a server failure
    return state.records, state.t0, state.t1, timed_out


NO_NUMBERS = "no_numbers"  # the flag of a level where no measured request can be counted


# The lifetimes the window is stretched to, over the ones asked for: the mean lifetime of the requests done so far
# runs short of the level's (the longest ones are still running), so windows aimed at exactly 20 closed short of the
# 20 the counter check needs (see finding bench-window-lifetimes-short)
LIFETIME_MARGIN = 1.05
# Cohorts: closed-loop requests of one output length that start together finish together, and their workers send
# again together; the level then times the server's turnaround between cohorts as much as its decode.
COHORT_SPAN = 0.05  # of the mean request lifetime
COHORT_WARN = 0.5  # of the level's workers finishing within one span
COHORT_MIN_C = 8  # below this a few requests finishing together is chance, not a cohort


def _extended_deadline(plan: LevelPlan, state: _LevelState) -> float | None:
    """A later window end when the window spans fewer than plan.min_lifetimes mean request lifetimes (with
    LIFETIME_MARGIN), leaving time for one more lifetime's drain inside the level's timeout; None to close it now."""
    if plan.min_lifetimes is None or state.t0 is None or state.deadline is None:
        return None
    done = [r for r in state.records if not r.cut and not r.error and r.end > r.scheduled]
    measured = [r for r in done if not r.warmup] or done
    if not measured:
        if any(r.error for r in state.records if not r.cut):
            return None  # requests fail, none succeeded: a longer window measures nothing, it only sends more
        return state.deadline + 1.0 if state.deadline + 1.0 < state.started + plan.level_timeout / 2 else None
    lifetime = sum(r.end - r.scheduled for r in measured) / len(measured)
    wanted = state.t0 + plan.min_lifetimes * LIFETIME_MARGIN * lifetime
    cap = state.started + plan.level_timeout - 2 * lifetime
    if wanted <= state.deadline + 1e-3 or state.deadline >= cap:
        return None
    return min(wanted, cap)


def summarize(
    concurrency: int,
    records: Sequence[RequestRecord],
    t0: float | None,
    t1: float | None,
    timed_out: bool = False,
) -> LevelSummary:
    """Reduce a level's request records to the numbers a user reads (see the module docstring for the window).

    Each step below adds its warnings and flags in this order, which is the order the record keeps."""
    warnings: list[str] = []
    flags: list[str] = []
    measured = [r for r in records if not r.warmup and not r.cut]
    errors = [r for r in measured if r.error]
    records = _drop_untrusted(concurrency, records, warnings, flags)
    records = _credit_cut_requests(concurrency, records, warnings, flags)
    ok = [r for r in measured if not r.error and not r.anomalies]
    if timed_out:
        warnings.append("the level hit --level-timeout; its numbers cover what finished")
    all_failed = _no_numbers(concurrency, records, measured, errors, timed_out, warnings, flags)
    window_valid = t0 is not None and t1 is not None and t1 > t0
    steady, lo, hi = _steady(concurrency, ok, t0, t1, all_failed, warnings)
    throughput, window, in_window = _window_rate(records, lo, hi)
    halves = _halves_rel_diff(records, lo, hi, throughput)
    e2e = [r.end - r.scheduled for r in steady]
    lifetimes = window / (sum(e2e) / len(e2e)) if e2e and sum(e2e) > 0 and window > 0 else None
    if lifetimes is not None and lifetimes < 4 and not all_failed:
        warnings.append(
            f"the steady window at C={concurrency} spans only {lifetimes:.1f} request lifetimes (mean latency "
            f"{sum(e2e) / len(e2e):.3g} s), so the slope is uncertain; raise --requests-per-level (4 or more per "
            "worker) or --duration"
        )
    cohorts = cohort_share([r.end for r in steady], sum(e2e) / len(e2e) if e2e else 0.0, concurrency)
    if cohorts is not None and cohorts >= COHORT_WARN and concurrency >= COHORT_MIN_C:
        flags.append(COHORTS)
        warnings.append(
            f"at C={concurrency}, {cohorts:.0%} of the workers' requests finished within {COHORT_SPAN:.0%} of a "
            "request's lifetime of each other: requests of one length come back in cohorts, so the level times the "
            "server's turnaround between cohorts as much as its decode (--output-len-spread 0.5 spreads them)"
        )
    cached_fraction = _cached_fraction(ok)
    if cached_fraction is not None and cached_fraction > 0.10:
        warnings.append(
            f"{cached_fraction:.0%} of the prompt tokens at C={concurrency} came from the server's prompt cache: "
            "TTFT and throughput are for cached prompts (prompts sent again, or sharing a long prefix)"
        )
    # cut requests' counts so far are consistent pairs (SGLang: tokens and spec_verify_ct of the same event)
    accept, accept_source = _trusted_accept(
        concurrency, [*steady, *(r for r in records if r.cut and not r.warmup)], warnings, flags
    )
    steady_ids = {id(r) for r in steady} if window_valid else set()
    return LevelSummary(
        concurrency=concurrency,
        throughput_tok_s=throughput,
        window_s=window,
        output_tokens=in_window,
        requests=len(measured),
        errors=len(errors),
        window_valid=window_valid,
        per_request_tok_s=Dist.of(r.tokens / (r.end - r.scheduled) for r in steady if r.end > r.scheduled),
        ttft_s=Dist.of(r.first - r.scheduled for r in steady if r.first is not None),
        itl_s=Dist.of(_inter_token_gaps(steady)),
        tpot_s=Dist.of((r.end - r.first) / (r.tokens - 1) for r in steady if r.first is not None and r.tokens > 1),
        e2e_s=Dist.of(e2e),
        client_wait_s=Dist.of(r.sent - r.scheduled for r in steady),
        server_lag_s=Dist.of(lag for r in steady for lag in r.server_lag),
        accept_length=accept,
        accept_source=accept_source,
        token_source="+".join(sorted({r.token_source for r in ok if r.token_source})),
        error_samples=_error_samples(errors),
        warnings=tuple(warnings),
        flags=tuple(flags),
        throughput_halves_rel_diff=halves,
        window_lifetimes=lifetimes,
        cached_prompt_fraction=cached_fraction,
        cohort_share=cohorts,
        accept_hist=_accept_hist(ok),
        per_request=tuple(_row(r, id(r) in steady_ids) for r in records),
    )


def _drop_untrusted(
    concurrency: int, records: Sequence[RequestRecord], warnings: list[str], flags: list[str]
) -> Sequence[RequestRecord]:
    """The records without those whose token counts cannot be true (said in a warning and a flag)."""
    suspect = [r for r in records if r.anomalies]
    if not suspect:
        return records
    flags.append("untrusted_token_counts")
    warnings.append(
        f"{len(suspect)} request(s) at C={concurrency} reported token counts that cannot be true "
        f"({suspect[0].anomalies[0]}); their tokens are left out of throughput, latency and accept length"
    )
    return [r for r in records if not r.anomalies]


def _no_numbers(
    concurrency: int,
    records: Sequence[RequestRecord],
    measured: Sequence[RequestRecord],
    errors: Sequence[RequestRecord],
    timed_out: bool,
    warnings: list[str],
    flags: list[str],
) -> bool:
    """Whether the level has no numbers (no measured request finished, or every one failed or cannot be trusted),
    flagged NO_NUMBERS with a warning saying which."""
    if not measured:  # no measured request finished (a stalled server, a short --level-timeout)
        flags.append(NO_NUMBERS)
        running = sum(1 for r in records if r.cut and not r.warmup)
        warnings.append(
            f"no measured request finished at C={concurrency} ({running} still running when the level ended"
            f"{' at --level-timeout' if timed_out else ''}); the level has no numbers - is the server stalled? "
            "raise --level-timeout if its requests are that slow"
        )
        return True
    if any(not r.error and not r.anomalies for r in measured):
        return False
    flags.append(NO_NUMBERS)
    untrusted = sum(1 for r in measured if r.anomalies and not r.error)
    if not errors:  # none failed: the server's token counts could not be believed
        warnings.append(
            f"no measured request at C={concurrency} can be trusted ({untrusted} of {len(measured)} reported "
            "token counts that cannot be true); the level has no numbers"
        )
    else:
        distrust = f", {untrusted} reported token counts that cannot be true" if untrusted else ""
        warnings.append(
            f"every measured request at C={concurrency} failed or cannot be trusted ({len(errors)} of "
            f"{len(measured)} failed{distrust}; first error: {errors[0].error[:200]}); the level has no numbers"
        )
    return True


def _steady(
    concurrency: int,
    ok: Sequence[RequestRecord],
    t0: float | None,
    t1: float | None,
    all_failed: bool,
    warnings: list[str],
) -> tuple[Sequence[RequestRecord], float, float]:
    """The requests latency is read from (those wholly inside the steady window, else every good one) and the
    window throughput is counted over (t0..t1, else the good requests' span), with a warning for each fallback."""
    if t0 is not None and t1 is not None and t1 > t0:
        steady = [r for r in ok if r.scheduled >= t0 and r.end <= t1]
        if not steady and not all_failed:
            warnings.append(
                f"no request ran wholly inside the steady window at C={concurrency}; latency covers all measured "
                "requests - raise --requests-per-level or --duration"
            )
        return steady or ok, t0, t1
    if not all_failed:
        warnings.append(
            f"no steady window at C={concurrency} (a worker ran out of work before all finished warm-up); "
            "throughput covers all measured requests - raise --requests-per-level to several times C"
        )
    return ok, min((r.scheduled for r in ok), default=0.0), max((r.end for r in ok), default=0.0)


def _inter_token_gaps(steady: Sequence[RequestRecord]) -> list[float]:
    """Every token's gap from the one before it; a chunk of n tokens counts as n gaps of equal share."""
    itl: list[float] = []
    for r in steady:
        prev = r.first
        for t, n in r.chunks:
            if prev is not None and t > prev and n > 0:
                itl.extend([(t - prev) / n] * n)
                prev = t
    return itl


def _trusted_accept(
    concurrency: int, counted: Sequence[RequestRecord], warnings: list[str], flags: list[str]
) -> tuple[float | None, str]:
    """The level's accept length and its source; one above MAX_ACCEPT_LENGTH cannot be true and is left out (a record
    crossover would refuse)."""
    accept, accept_source = _accept_length(counted)
    if accept is None or accept <= MAX_ACCEPT_LENGTH:
        return accept, accept_source
    warnings.append(
        f"the server's counts give {accept:.6g} accepted tokens per verify step at C={concurrency}, above "
        f"{MAX_ACCEPT_LENGTH:g}: they cannot be true; the accept length is left out"
    )
    flags.append("untrusted_server_accept_length")
    return None, ""


def _error_samples(errors: Sequence[RequestRecord]) -> tuple[str, ...]:
    """The first _MAX_ERROR_SAMPLES distinct errors, in the order they happened."""
    samples: list[str] = []
    for r in errors:
        if r.error not in samples:
            samples.append(r.error)
        if len(samples) >= _MAX_ERROR_SAMPLES:
            break
    return tuple(samples)


def _row(r: RequestRecord, in_window: bool) -> RequestRow:
    return RequestRow(
        output_tokens=r.tokens,
        e2e_s=max(r.end - r.scheduled, 0.0),
        prompt_tokens=r.prompt_tokens,
        cached_prompt_tokens=r.cached_prompt_tokens,
        ttft_s=None if r.first is None else r.first - r.scheduled,
        accept_length=r.accept_length,
        warmup=r.warmup,
        in_window=in_window,
        cut=r.cut,
        error=r.error[:300],
    )


def _credit_cut_requests(
    concurrency: int, records: Sequence[RequestRecord], warnings: list[str], flags: list[str]
) -> list[RequestRecord]:
    """Requests cut (open-loop tail requests at the window's end, or any request at --level-timeout) by a server
    that counts tokens only at the end of a response.

    When every finished request of the level had one token per text event (`usage-per-event`), a cut request's
    text events are credited one token each (flag `cut_tokens_estimated`); otherwise their tokens are unknown and
    left out, with a warning (flag `cut_tokens_uncounted`): throughput then reads low by up to C requests' tokens.
    """
    cut = [r for r in records if r.cut and r.uncounted]
    if not cut:
        return list(records)
    finished = {r.token_source for r in records if not r.cut and not r.error and r.token_source}
    if finished == {"usage-per-event"}:
        flags.append("cut_tokens_estimated")
        out = []
        for r in records:
            if r.cut and r.uncounted:
                chunks = tuple(sorted((*r.chunks, *((t, 1) for t in r.uncounted))))
                first = next((t for t, n in chunks if n > 0), None)
                r = replace(r, chunks=chunks, first=first, uncounted=(), token_source="per-event-estimate")
            out.append(r)
        return out
    flags.append("cut_tokens_uncounted")
    warnings.append(
        f"{len(cut)} request(s) cut at the end of the window at C={concurrency} had streamed text whose tokens the "
        "server counts only at the end of a response; they are left out, so throughput reads low (use "
        "--requests-per-level, or a server that sends continuous usage)"
    )
    return list(records)


def cohort_share(ends: Sequence[float], lifetime: float, concurrency: int) -> float | None:
    """The most requests that finished within COHORT_SPAN x `lifetime` of each other, over `concurrency`: near 1
    when the workers' requests come back as cohorts, near COHORT_SPAN when their finishes are spread; None without
    finishes or a lifetime."""
    if not ends or lifetime <= 0 or concurrency < 1:
        return None
    times = sorted(ends)
    span = COHORT_SPAN * lifetime
    most = first = 0
    for last, t in enumerate(times):
        while t - times[first] > span:
            first += 1
        most = max(most, last - first + 1)
    return min(1.0, most / concurrency)


def _cached_fraction(records: Sequence[RequestRecord]) -> float | None:
    pairs = [(r.prompt_tokens, r.cached_prompt_tokens) for r in records if r.cached_prompt_tokens is not None]
    prompt = sum(p for p, _ in pairs if p)
    cached = sum(c for p, c in pairs if p and c is not None)
    return min(cached / prompt, 1.0) if prompt > 0 else None


def _accept_hist(records: Sequence[RequestRecord]) -> tuple[tuple[float, int], ...]:
    counts: dict[float, int] = {}
    for r in records:
        value = r.accept_length
        if value is not None and math.isfinite(value):
            edge = math.floor(value * 2) / 2
            counts[edge] = counts.get(edge, 0) + 1
    return tuple(sorted(counts.items()))


def _window_rate(records: Sequence[RequestRecord], lo: float, hi: float) -> tuple[float, float, int]:
    """Output rate inside [lo, hi): the least-squares slope of cumulative tokens against arrival time.

    Servers emit in bursts (every running request gets its tokens at the end of a step), so a plain count over the
    window is off by up to one step's tokens, which matters when the window holds few steps; the slope of the
    staircase is not. Returns the rate, the span from first to last arrival, and the tokens inside the window.
    """
    arrivals = _arrivals(records, lo, hi)
    tokens = sum(n for _, n in arrivals)
    if len(arrivals) < 2 or arrivals[-1][0] <= arrivals[0][0]:
        return (tokens / (hi - lo) if hi > lo else 0.0), max(hi - lo, 0.0), tokens
    return _slope(arrivals), arrivals[-1][0] - arrivals[0][0], tokens


def _arrivals(records: Sequence[RequestRecord], lo: float, hi: float) -> list[tuple[float, int]]:
    return sorted((t, n) for r in records if not r.error for t, n in r.chunks if lo <= t < hi and n > 0)


def _halves_rel_diff(records: Sequence[RequestRecord], lo: float, hi: float, rate: float) -> float | None:
    """|slope of the first half - slope of the second half| / slope: how far the level's rate can be trusted."""
    arrivals = _arrivals(records, lo, hi)
    if len(arrivals) < 4 or rate <= 0:
        return None
    mid = (arrivals[0][0] + arrivals[-1][0]) / 2
    first = [a for a in arrivals if a[0] < mid]
    second = [a for a in arrivals if a[0] >= mid]
    if len(first) < 2 or len(second) < 2 or first[-1][0] <= first[0][0] or second[-1][0] <= second[0][0]:
        return None
    return abs(_slope(first) - _slope(second)) / rate


def _slope(arrivals: Sequence[tuple[float, int]]) -> float:
    """Least-squares slope of cumulative tokens against arrival time."""
    cumulative, total = [], 0
    for _, n in arrivals:
        total += n
        cumulative.append(total)
    times = [t for t, _ in arrivals]
    mt = sum(times) / len(times)
    mn = sum(cumulative) / len(cumulative)
    sxx = sum((t - mt) ** 2 for t in times)
    sxy = sum((t - mt) * (n - mn) for t, n in zip(times, cumulative, strict=True))
    return sxy / sxx


def _accept_length(records: Sequence[RequestRecord]) -> tuple[float | None, str]:
    """Tokens per verify step over the level's requests, from what each response said (module docstring)."""
    tokens = verify = 0
    for r in records:
        if r.spec_verify_ct:
            tokens += r.tokens
            verify += r.spec_verify_ct
    if verify:
        value = tokens / verify
        return (value, "meta_info.spec_verify_ct") if math.isfinite(value) else (None, "")
    for r in records:
        if r.draft_accepted is not None and r.tokens > 1 and r.tokens - 1 > r.draft_accepted:
            tokens += r.tokens - 1
            verify += r.tokens - 1 - r.draft_accepted
    if verify:
        return tokens / verify, "timings.draft_n_accepted"
    return None, ""

"""Drive a live server with the bench's closed loop for the soak, and cut its requests into per-second intervals.

Each of C workers keeps one request in flight (bench/closedloop.one_request, the bench's own request and stream
tally) until the soak's end or its stop event; a failed request is followed by a pause of ERROR_PAUSE_S, so a dead
server is asked about once a second per worker, not hammered. At the end the requests still in flight are cut: their
tokens so far are kept (closedloop's `on_cut`). `intervals` is a pure function of the request records.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sm120check import aio
from sm120check.bench.apis import Api, RequestSpec
from sm120check.bench.closedloop import RequestRecord, one_request
from sm120check.bench.http import Connection, Endpoint
from sm120check.soak.samples import ServerInterval

ERROR_PAUSE_S = 1.0


@dataclass
class Traffic:
    """The requests of one soak (perf_counter times) and the Unix time of perf_counter's zero."""

    records: list[RequestRecord] = field(default_factory=list)
    epoch: float = field(default_factory=lambda: time.time() - time.perf_counter())


async def drive(
    endpoint: Endpoint,
    api: Api,
    concurrency: int,
    duration: float,
    make_spec: Callable[[int], RequestSpec],
    traffic: Traffic,
    stop: asyncio.Event,
    *,
    headers: dict[str, str] | None = None,
    request_timeout: float = 600.0,
) -> None:
    """C closed-loop workers until `duration` has passed or `stop` is set; requests in flight then are cut."""
    counter = itertools.count()
    deadline = time.perf_counter() + duration

    async def worker() -> None:
        conn = Connection(endpoint, headers)
        try:
            while time.perf_counter() < deadline and not stop.is_set():
                record = await one_request(
                    conn, api, make_spec(next(counter)), False, request_timeout, traffic.records.append
                )
                traffic.records.append(record)
                if record.error:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await aio.within(stop.wait(), ERROR_PAUSE_S)
        finally:
            await conn.close()

    workers = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
    with contextlib.suppress(asyncio.TimeoutError):
        await aio.within(stop.wait(), max(0.0, deadline - time.perf_counter()))
    await aio.stop(workers)


def intervals(records: Sequence[RequestRecord], epoch: float, start: float, end: float) -> list[ServerInterval]:
    """One ServerInterval per second from `start` to `end` (Unix times): tokens that arrived in it (of finished, cut
    and failed requests alike), requests that finished and failed in it, and requests in flight at its end."""
    count = max(0, math.ceil(end - start))
    tokens = [0] * count
    done = [0] * count
    errors = [0] * count
    first_error = [""] * count
    in_flight = [0] * count

    def slot(t_perf: float) -> int | None:
        index = int((t_perf + epoch - start) // 1)
        return index if 0 <= index < count else None

    for r in records:
        for t, n in r.chunks or r.partial:
            if (i := slot(t)) is not None:
                tokens[i] += n
        if (i := slot(r.end)) is not None and not r.cut:
            if r.error:
                errors[i] += 1
                first_error[i] = first_error[i] or r.error
            else:
                done[i] += 1
        sent, ended = r.sent + epoch - start, r.end + epoch - start
        for i in range(max(0, math.ceil(sent - 1)), min(count, math.ceil(ended - 1))):
            if sent <= i + 1 < ended:
                in_flight[i] += 1
    return [
        ServerInterval(start + i, 1.0, tokens[i], done[i], errors[i], in_flight[i], first_error[i][:200])
        for i in range(count)
    ]

"""What the client itself costs at C=250: against a server whose steps take no time, one client process must keep
250 streams going, count every chunk, and add little latency of its own.

Bounds are deliberately loose (two shared cores here); the measured numbers are printed (pytest -s) and recorded in
docs/bench.md. `server_lag` is the time from the simulated server stamping a step's chunks to the client having
parsed each of them (same CLOCK_MONOTONIC in both processes): server write + loopback + client queueing + parsing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from bench.conftest import Sim
from sm120check.bench.apis import Api, RequestSpec
from sm120check.bench.http import Endpoint
from sm120check.bench.runner import LevelPlan, run_level, summarize

C = 250
OUTPUT_LEN = 32


def test_one_process_sustains_250_streams_with_small_added_latency(sim_factory: Callable[..., Sim]) -> None:
    sim = sim_factory("plain", "--a-ms", "0", "--b-ms", "0", "--c-ms", "0", "--d-ms", "0")
    plan = LevelPlan(C, requests=2 * C, warmup=1, request_timeout=120, level_timeout=300)
    spec = RequestSpec("hello world", OUTPUT_LEN)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    records, t0, t1, timed_out = asyncio.run(run_level(Endpoint.parse(sim.url), Api.SGLANG, plan, lambda i: spec))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    summary = summarize(C, records, t0, t1, timed_out)

    chunks = sum(len(r.chunks) for r in records)
    assert not timed_out and summary.errors == 0
    assert len(records) == 3 * C and all(r.tokens == OUTPUT_LEN for r in records)
    assert summary.server_lag_s is not None and summary.client_wait_s is not None
    print(
        f"\nC={C}: {len(records)} requests, {chunks} chunks in {wall:.2f} s wall, {cpu:.2f} s client CPU -> "
        f"{chunks / wall:.0f} chunks/s wall, {chunks / cpu:.0f} chunks per CPU-second; "
        f"throughput {summary.throughput_tok_s:.0f} tok/s; server->parsed lag p50 "
        f"{summary.server_lag_s.p50 * 1e3:.1f} ms p99 {summary.server_lag_s.p99 * 1e3:.1f} ms; "
        f"client wait before send p50 {summary.client_wait_s.p50 * 1e3:.2f} ms "
        f"p99 {summary.client_wait_s.p99 * 1e3:.2f} ms"
    )
    assert chunks / cpu > 2000  # chunks the client parses per CPU-second
    assert summary.client_wait_s.p50 < 0.05
    assert summary.server_lag_s.p50 < 0.5

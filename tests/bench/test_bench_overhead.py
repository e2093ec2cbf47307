"""What the client must do at C=250 against a server whose steps take no time: keep 250 streams in flight at once,
count every chunk, and record its own overhead per request.

No clock is asserted here (the machines are noisy): how fast the client is (chunks per CPU-second, client wait
before send, server->parsed lag) is measured and printed by `make bench` (benchmarks/client_overhead.py, JSON in
benchmarks/results/client_overhead.json). This test keeps what is logical: the simulated server starts its first
step only once 250 requests are in flight (--start-batch), so a client that sent them one after another would
time out instead of passing, and the server's own counts say how many were in flight together.
"""

from __future__ import annotations

import asyncio
import json
import math
import urllib.request
from collections.abc import Callable

import pytest

from bench.conftest import Sim
from sm120check.bench.apis import Api, RequestSpec
from sm120check.bench.closedloop import LevelPlan, run_level, summarize
from sm120check.bench.http import Endpoint

C = 250
OUTPUT_LEN = 32


def sim_stats(sim: Sim) -> dict[str, int]:
    with urllib.request.urlopen(f"{sim.url}/get_server_info", timeout=30) as resp:
        stats: dict[str, int] = json.load(resp)["sim_stats"]
    return stats


@pytest.mark.timeout(600)  # a guard: a client that does not overlap its requests times out at the barrier instead
def test_one_process_keeps_250_streams_in_flight_and_records_its_own_wait(sim_factory: Callable[..., Sim]) -> None:
    sim = sim_factory("plain", "--a-ms", "0", "--b-ms", "0", "--c-ms", "0", "--d-ms", "0", "--start-batch", str(C))
    plan = LevelPlan(C, requests=2 * C, warmup=1, request_timeout=120, level_timeout=300)
    spec = RequestSpec("hello world", OUTPUT_LEN)
    records, t0, t1, timed_out = asyncio.run(run_level(Endpoint.parse(sim.url), Api.SGLANG, plan, lambda i: spec))
    summary = summarize(C, records, t0, t1, timed_out)

    assert not timed_out and summary.errors == 0
    assert len(records) == 3 * C and all(r.tokens == OUTPUT_LEN for r in records)
    # every chunk counted: the plain server sends one token per step, one chunk per token
    assert all(len(r.chunks) == OUTPUT_LEN for r in records)
    stats = sim_stats(sim)
    # the server saw exactly the requests the client made, C of them at once (the barrier needs all C), never more
    assert stats["requests"] == 3 * C and stats["in_flight"] == 0
    assert stats["max_in_flight"] == C and stats["max_step_batch"] == C
    # the client's own wait before send is recorded for every steady request, and is a duration (not negative)
    wait = summary.client_wait_s
    assert wait is not None and summary.server_lag_s is not None
    assert all(r.sent >= r.scheduled for r in records)
    assert all(math.isfinite(v) and v >= 0 for v in (wait.mean, wait.p50, wait.p99)) and wait.p50 <= wait.p99
    record = json.loads(json.dumps(summary.to_json()))
    assert (
        record["client_wait_s"]["p50"] == round(wait.p50, 6) and record["server_lag_s"]["n"] == summary.server_lag_s.n
    )

"""The bench holds its steady-window throughput against the server's own generation counter over the same window
(bench/server_rate.py): the pure comparison, and a live sweep against the simulated SGLang server (our stand-in:
it releases each request's tokens into `sglang:generation_tokens_total` as SGLang 0.5.16 does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.conftest import Sim, run_subcommand
from sm120check.bench.server_rate import CounterTrace, judge


def trace(points: list[tuple[float, float]]) -> CounterTrace:
    t = CounterTrace("sglang:generation_tokens_total")
    for when, value in points:
        t.add(when, value)
    return t


def test_the_counter_is_read_between_samples_and_kept_monotonic() -> None:
    t = trace([(0.0, 0.0), (1.0, 100.0), (0.5, 999.0), (2.0, 50.0), (3.0, 400.0)])  # two bad samples dropped
    assert t.times == [0.0, 1.0, 3.0] and t.at(2.0) == pytest.approx(250.0)
    assert t.rate(0.5, 3.0) == pytest.approx((400.0 - 50.0) / 2.5)
    assert t.rate(-1.0, 2.0) is None and t.rate(2.0, 1.0) is None


def test_a_bench_far_from_the_counter_over_a_long_window_is_named() -> None:
    t = trace([(0.0, 0.0), (10.0, 10000.0)])
    assert judge(t, 1.0, 9.0, 1020.0, lifetimes=20.0).warning == ""  # 2 %: agrees
    off = judge(t, 1.0, 9.0, 700.0, lifetimes=20.0)
    assert off.server_tok_s == pytest.approx(1000.0) and "(-30.0%)" in off.warning and "client" in off.warning
    assert judge(t, 1.0, 9.0, 700.0, lifetimes=3.0).warning == ""  # too few lifetimes to judge a completion counter
    assert judge(t, 1.0, 9.0, 700.0, lifetimes=12.0).warning == ""  # 6-9 % off at 11 lifetimes on a real server
    assert judge(t, None, 9.0, 700.0, lifetimes=20.0).server_tok_s is None


def test_a_sweep_records_the_servers_counter_over_its_window(plain_sim: Sim, tmp_path: Path) -> None:
    out = tmp_path / "base.jsonl"
    argv = ["bench", "--url", plain_sim.url, "--quiet", "--output-len", "16", "--input-len", "8", "--pause", "0"]
    assert run_subcommand(*argv, "--concurrency", "4", "--requests-per-level", "64", "--out", str(out)) == 0
    record = json.loads(out.read_text().splitlines()[-1])
    assert record["server_counter"] == "sglang:generation_tokens_total"
    assert record["window_lifetimes"] >= 8
    server, bench = record["server_window_tok_s"], record["throughput_tok_s"]
    assert server is not None and abs(bench - server) <= 0.1 * server, (bench, server)
    assert not any("server's own" in w for w in record["warnings"])

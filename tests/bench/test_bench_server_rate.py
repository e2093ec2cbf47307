"""The bench holds its steady-window throughput against the server's own generation counter over the same window
(bench/server_rate.py): the pure comparison, and a live sweep against the simulated SGLang server (our stand-in:
it releases each request's tokens into `sglang:generation_tokens_total` as SGLang 0.5.16 does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.conftest import Sim, run_subcommand
from sm120check.bench.server_rate import CounterTrace, judge, outside

SPEC7 = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "h200-sglang-0.5.16-run2-spec-7.jsonl"


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


def dense(rate: float, until: float, every: float = 0.25) -> CounterTrace:
    """A counter read every `every` seconds (the sampler's SAMPLE_S), growing `rate` per second."""
    return trace([(i * every, rate * i * every) for i in range(int(until / every) + 1)])


def test_a_bench_far_from_the_counter_over_a_long_window_is_named() -> None:
    t = dense(1000.0, 10.0)
    assert judge(t, 1.1, 9.1, 1020.0, lifetimes=20.0).warning == ""  # 2 %: agrees
    off = judge(t, 1.1, 9.1, 700.0, lifetimes=20.0)
    assert off.server_tok_s == pytest.approx(1000.0) and "(-30.0%)" in off.warning and "client" in off.warning
    assert off.server_range == pytest.approx((968.75, 1031.25))  # samples 1.25-9.0, 1.0-9.25
    assert "968.8-1031.2 between its samples" in off.warning
    assert judge(t, 1.1, 9.1, 700.0, lifetimes=3.0).warning == ""  # too few lifetimes to judge a completion counter
    assert judge(t, 1.1, 9.1, 700.0, lifetimes=12.0).warning == ""  # 6-9 % off at 11 lifetimes on a real server
    assert judge(t, None, 9.1, 700.0, lifetimes=20.0).server_tok_s is None


def test_the_counter_is_known_only_between_its_samples() -> None:
    """A completion counter jumps: 0 until 1.0 s, 4000 from 1.0 to 9.0 s, 8000 after. Over the window 0.9-8.9 s
    the interpolated rate says 544 tok/s, but the samples around the edges allow 0 to 1000: a bench figure in
    there is not called a disagreement, one above 1000 x 1.05 is."""
    t = trace([(0.0, 0.0), (1.0, 4000.0), (9.0, 8000.0)])
    assert t.bracket(0.9, 8.9) == pytest.approx((0.0, 1000.0))
    assert t.bracket(1.0, 9.0) == pytest.approx((500.0, 500.0))  # edges on samples: exact
    assert t.bracket(-1.0, 8.9) is None
    assert judge(t, 0.9, 8.9, 900.0, lifetimes=30.0).warning == ""
    assert "(+102.3%)" in judge(t, 0.9, 8.9, 1100.0, lifetimes=30.0).warning


def test_a_level_like_the_h200_one_the_interpolated_figure_called_off_is_within_the_samples() -> None:
    """Base server, C=10 (docs/validation/2026-12-02-h200-policy-2): the bench 3263.6 tok/s over 7.95 s, the
    interpolated counter 3469.2 (6.3 % above, 21 lifetimes). Read every 0.25 s, the counter at each edge is known
    only to a sample's growth (~870 tokens), which is about 3 % of the window's tokens at each end."""
    t = dense(3469.2, 10.0)
    check = judge(t, 0.9, 8.85, 3263.6, lifetimes=21.0)
    assert check.server_tok_s == pytest.approx(3469.2) and check.warning == ""
    assert check.server_range is not None and check.server_range[0] < 3263.6 / (1 - 0.05)
    assert "6.3" not in judge(t, 0.9, 8.85, 3263.6 * 0.85, lifetimes=21.0).warning  # 20 % below is named
    assert judge(t, 0.9, 8.85, 3263.6 * 0.85, lifetimes=21.0).warning


def test_a_sweep_records_the_servers_counter_over_its_window(plain_sim: Sim, tmp_path: Path) -> None:
    out = tmp_path / "base.jsonl"
    argv = ["bench", "--url", plain_sim.url, "--quiet", "--output-len", "16", "--input-len", "8", "--pause", "0"]
    assert run_subcommand(*argv, "--concurrency", "4", "--requests-per-level", "64", "--out", str(out)) == 0
    record = json.loads(out.read_text().splitlines()[-1])
    assert record["server_counter"] == "sglang:generation_tokens_total"
    assert record["window_lifetimes"] >= 8
    server, bench = record["server_window_tok_s"], record["throughput_tok_s"]
    assert server is not None and abs(bench - server) <= 0.1 * server, (bench, server)
    least, most = record["server_window_tok_s_range"]
    assert least <= server <= most
    assert not any("server's own" in w for w in record["warnings"])


def test_the_real_servers_records_keep_the_bench_inside_the_counters_bracket() -> None:
    """The first records with the bracket, from a real SGLang 0.5.16 server (the 7-step EAGLE-3 server on the H200,
    C=1, 2, 5; docs/validation/2026-12-02-h200-deeper): the interpolated counter lies inside its bracket, the bracket
    is a few percent wide (quarter-second samples over 8 s windows), and the bench is inside it at every level."""
    rows = [json.loads(line) for line in SPEC7.read_text().splitlines() if line.strip()]
    assert [r["concurrency"] for r in rows] == [1, 2, 5]
    for r in rows:
        least, most = r["server_window_tok_s_range"]
        assert least <= r["server_window_tok_s"] <= most and (most - least) / r["server_window_tok_s"] < 0.1, r
        assert outside(r["throughput_tok_s"], (least, most)) == 0.0
    assert outside(rows[0]["throughput_tok_s"] * 0.8, tuple(rows[0]["server_window_tok_s_range"])) > 0

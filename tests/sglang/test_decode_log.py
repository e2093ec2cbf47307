"""The server's own decode lines (tests/lab/decode_log.py) read from a real SGLang 0.5.16 log (the base server on the
H200, tests/sglang/fixtures/server-0.5.16/smoke-base.log) and from lines in the format of metrics_reporter.py."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from lab import decode_log

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "server-0.5.16"
SPEC_LINE = (
    "[2026-12-01 22:25:39] Decode batch, #running-req: {n}, #token: 122, token usage: 0.00, accept len: {a}, "
    "accept rate: 0.73, cuda graph: True, gen throughput (token/s): {t}, #queue-req: {q}"
)  # a line of the EAGLE-3 server's log on the H200, its numbers varied


def test_the_real_base_log_has_one_decode_line_read_exactly() -> None:
    rows = decode_log.parse(FIXTURES.joinpath("smoke-base.log").read_text().splitlines())
    assert len(rows) == 1
    row = rows[0]
    assert (row.running, row.gen_tok_s, row.queued, row.cuda_graph, row.accept_length) == (1, 3.2, 0, True, None)


def test_speculative_lines_give_the_accept_length_and_steady_medians() -> None:
    text = [
        SPEC_LINE.format(n=1, a="3.20", t="621.44", q=0),
        SPEC_LINE.format(n=8, a="3.40", t="3000.00", q=2),  # first of its run (the ramp) and queued: left out
        SPEC_LINE.format(n=8, a="3.40", t="3100.00", q=0),
        SPEC_LINE.format(n=8, a="3.60", t="3300.00", q=0),
        SPEC_LINE.format(n=8, a="3.00", t="3500.00", q=0),
        "[2026-12-01 22:25:40] Prefill batch, #new-seq: 1, #new-token: 6, #cached-token: 0",
        SPEC_LINE.format(n=8, a="3.2", t="bad", q=0),  # malformed: skipped
    ]
    rows = decode_log.parse(text)
    assert [r.running for r in rows] == [1, 8, 8, 8, 8]
    view = decode_log.server_view(rows)
    assert set(view) == {8}  # the C=1 line has no predecessor at 1
    assert (view[8].lines, view[8].gen_tok_s, view[8].accept_length, view[8].cuda_graph) == (3, 3300.0, 3.4, True)


def test_level_rate_weighs_each_line_by_the_tokens_it_covers() -> None:
    text = [
        SPEC_LINE.format(n=8, a="1.00", t="10.00", q=0),  # spans the idle time before the level: left out
        SPEC_LINE.format(n=8, a="2.00", t="1600.00", q=0),  # 10 steps x 8 x 2 = 160 tokens in 0.1 s
        SPEC_LINE.format(n=4, a="3.00", t="400.00", q=0),  # 120 tokens in 0.3 s
    ]
    rate = decode_log.level_rate(decode_log.parse(text), after=0, interval=10)
    assert rate is not None and rate.lines == 2 and rate.tokens == pytest.approx(280.0)
    assert rate.tok_s == pytest.approx(280.0 / 0.4)
    assert decode_log.level_rate(decode_log.parse(text), after=3, interval=10) is None


def test_prefill_lines_of_a_real_log_give_the_full_chunk_median() -> None:
    # The switch server's log tail at C=250 (H100, SGLang 0.5.16, docs/validation/2026-12-06-h100-gap-soak-jit).
    rows = decode_log.parse_prefills(FIXTURES.joinpath("gap-policy-tail.log").read_text().splitlines())
    assert [(r.new_seqs, r.new_tokens, r.running) for r in rows[:2]] == [(10, 3402, 51), (25, 8192, 61)]
    assert rows[0].input_tok_s == 29281.40 and len(rows) == 9
    view = decode_log.prefill_view(rows, chunk=8192, min_running=57)
    assert (view["prefills"], view["input_tok_s_median"]) == (7, 88176.8)  # the 320854 line (back to back) is one
    assert decode_log.prefill_view(rows, chunk=8192, min_running=100)["input_tok_s_median"] == 88697.7
    assert decode_log.prefill_view(rows, chunk=16384)["prefills"] == 0


PREFILL_LINE = (
    "[2026-12-06 18:44:31] Prefill batch, #new-seq: 25, #new-token: {n}, #cached-token: 76, token usage: 0.10, "
    "#running-req: 205, #queue-req: 0, #pending-token: 7149, cuda graph: False, input throughput (token/s): 9.0, "
    "fwd occupancy: 94.93%"
)  # the switch server's line (gap-policy-tail.log), its token count varied


def test_each_profile_window_counts_the_prefills_logged_in_it() -> None:
    # The profiler's lines as SGLang 0.5.16 profiler_manager.py logs them, with num_steps and by stage.
    text = [
        PREFILL_LINE.format(n=100),  # before any window
        "[2026-12-06 19:00:00] Profiling starts. Traces will be saved to: /tmp/p (with profile id: a)",
        PREFILL_LINE.format(n=8192),
        PREFILL_LINE.format(n=4000),
        "[2026-12-06 19:00:01] Stop profiling...",
        PREFILL_LINE.format(n=50),  # between windows
        "[2026-12-06 19:00:05] Profiling starts for EXTEND. Traces will be saved to: /tmp/p (with profile id: b)",
        "[2026-12-06 19:00:06] Stop profiling-EXTEND...",
        "[2026-12-06 19:00:07] Profiling starts. Traces will be saved to: /tmp/p (with profile id: c)",
        PREFILL_LINE.format(n=300),
    ]  # the third window never stopped: not counted
    assert decode_log.profiled_prefills(text) == [
        {"prefills": 2, "new_tokens": 8192 + 4000},
        {"prefills": 0, "new_tokens": 0},
    ]


def prefill(stamp: str, seqs: int) -> str:
    return (
        f"[2026-12-07 {stamp}] Prefill batch, #new-seq: {seqs}, #new-token: 300, #cached-token: 0, token usage: 0.00, "
        "#running-req: 9, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 1.0"
    )


def test_prefill_batching_counts_only_whole_seconds_inside_the_window() -> None:
    lines = [
        prefill("10:00:00", 5),  # the second before the window's first whole second
        prefill("10:00:01", 1),
        prefill("10:00:01", 3),
        "Prefill batch, #new-seq: 4, #new-token: 9, #running-req: 0, input throughput (token/s): 1.0",  # no stamp
        "[2026-12-07 10:00:02] Decode batch, #running-req: 9, #token: 1, gen throughput (token/s): 1.0, #queue-req: 0",
        prefill("10:00:08", 2),
        prefill("10:00:09", 7),  # cut by the window's end
    ]
    start = decode_log.stamp_epoch("[2026-12-07 10:00:00]", utc=True)
    assert start is not None
    got = decode_log.prefill_batching(lines, start + 0.5, start + 9.5, utc=True)
    assert (got.batches, got.requests, got.per_batch) == (3, 6, 2.0)
    assert decode_log.prefill_batching(lines, start + 20, start + 30, utc=True).per_batch is None
    assert decode_log.stamp_epoch("no stamp") is None


RECORD = Path(__file__).resolve().parents[2] / "docs/validation/2026-12-07-h100-envelope-starts"


def test_the_records_policy_start_batched_its_prefills_as_the_record_says() -> None:
    """The first policy start's log (stamped in UTC on the device) over its C=70 and C=250 windows, as the bench
    recorded them: the counts in the record's prefill-batches-by-level.json."""
    lines = gzip.decompress((RECORD / "envelope-policy.log.gz").read_bytes()).decode().splitlines()
    recorded = json.loads((RECORD / "prefill-batches-by-level.json").read_text())["starts"]["policy"]
    for level, (start, end) in {
        "70": (1796671758.441, 1796671771.294),
        "250": (1796671789.042, 1796671824.372),
    }.items():
        got = decode_log.prefill_batching(lines, start, end, utc=True)
        assert {"batches": got.batches, "requests": got.requests, "per_batch": got.per_batch} == recorded[level]

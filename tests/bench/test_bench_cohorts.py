"""Cohorts in a closed loop: requests of one length that start together finish together. `cohort_share` measures
it per level (closedloop.cohort_share) and, from C=8, a share of 0.5 or more warns and flags the level `cohorts`."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.conftest import Sim, run_subcommand
from sm120check.bench.closedloop import COHORT_MIN_C, cohort_share
from sm120check.bench.records import COHORTS, read_jsonl


def test_a_cohort_is_every_request_finishing_together() -> None:
    ends = [10.0 + 0.001 * i for i in range(16)] + [12.0 + 0.001 * i for i in range(16)]
    assert cohort_share(ends, lifetime=2.0, concurrency=16) == 1.0


def test_spread_finishes_give_a_small_share() -> None:
    ends = [10.0 + 0.125 * i for i in range(64)]  # 16 workers, one finish every 1/16 of a 2 s lifetime
    assert cohort_share(ends, lifetime=2.0, concurrency=16) == pytest.approx(1 / 16)


def test_the_span_is_a_share_of_the_lifetime() -> None:
    ends = [0.0, 0.09, 0.2]
    assert cohort_share(ends, lifetime=2.0, concurrency=3) == pytest.approx(2 / 3)  # 0.1 s span holds two
    assert cohort_share(ends, lifetime=4.0, concurrency=3) == 1.0  # 0.2 s span holds all three


def test_no_finishes_or_no_lifetime_gives_none() -> None:
    assert cohort_share([], lifetime=1.0, concurrency=8) is None
    assert cohort_share([1.0], lifetime=0.0, concurrency=8) is None


def sweep(sim: Sim, out: Path, *extra: str) -> int:
    return run_subcommand(
        "bench", "--url", sim.url, "--quiet", "--output-len", "32", "--input-len", "8", "--pause", "0",
        "--concurrency", "16", "--requests-per-level", "96", "--out", str(out), *extra,
    )  # fmt: skip


def test_fixed_lengths_at_c16_are_flagged_as_cohorts(plain_sim: Sim, tmp_path: Path) -> None:
    out = tmp_path / "fixed.jsonl"
    assert sweep(plain_sim, out) == 0
    (record,) = read_jsonl(out)
    assert COHORT_MIN_C <= 16 and record.cohort_share is not None and record.cohort_share >= 0.5, record.cohort_share
    assert COHORTS in record.flags
    assert any("come back in cohorts" in w and "--output-len-spread" in w for w in record.warnings), record.warnings


def test_spread_lengths_at_c16_are_not(plain_sim: Sim, tmp_path: Path) -> None:
    out = tmp_path / "spread.jsonl"
    assert sweep(plain_sim, out, "--output-len-spread", "0.5") == 0
    (record,) = read_jsonl(out)
    assert record.cohort_share is not None and record.cohort_share < 0.5, record.cohort_share
    assert COHORTS not in record.flags


def test_below_c8_a_pair_finishing_together_is_not_flagged(plain_sim: Sim, tmp_path: Path) -> None:
    out = tmp_path / "two.jsonl"
    assert run_subcommand(
        "bench", "--url", plain_sim.url, "--quiet", "--output-len", "16", "--input-len", "8", "--pause", "0",
        "--concurrency", "2", "--requests-per-level", "8", "--out", str(out),
    ) == 0  # fmt: skip
    (record,) = read_jsonl(out)
    assert record.cohort_share is not None and COHORTS not in record.flags

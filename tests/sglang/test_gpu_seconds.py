"""tests/lab/gpu_seconds.py: the envelope-gap record's GPU milliseconds per output token and idle share."""

from __future__ import annotations

import pytest

from lab.gpu_seconds import per_token


def test_two_sweeps_are_summed_before_dividing_by_their_tokens() -> None:
    rows = [
        {"decode": 6.0, "extend": 1.0, "level_wall_s": 10.0, "output_tokens": 10000},
        {"decode": 3.0, "target_verify": 2.0, "level_wall_s": 10.0, "output_tokens": 5000},
    ]
    got = per_token(rows)
    assert got == {
        "decode": 0.6,  # 9 s over 15000 tokens
        "extend": 0.0667,
        "target_verify": 0.1333,
        "wall_ms": 1.3333,
        "not_computing_share": 0.4,  # 12 s of GPU in 20 s of wall
    }


def test_a_level_without_tokens_is_an_error_not_a_zero() -> None:
    with pytest.raises(ValueError, match="no output tokens in 1 sweep"):
        per_token([{"decode": 1.0, "level_wall_s": 5.0, "output_tokens": 0}])

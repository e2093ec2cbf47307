"""tests/lab/gpu_seconds.py: the envelope-gap record's GPU milliseconds per output token and idle share."""

from __future__ import annotations

import pytest

from lab.gpu_seconds import DECODE_COST, GAP_DEFAULT, decode_cost, gap_levels, per_token, where


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


def test_gap_levels_take_a_subset_of_the_default_in_order() -> None:
    assert gap_levels(",".join(map(str, GAP_DEFAULT))) == GAP_DEFAULT
    assert gap_levels(" 250,100, 100") == (100, 250)


@pytest.mark.parametrize("bad", ["", "50", "100,x", "-100", "100,,250"])
def test_gap_levels_outside_the_default_are_refused_naming_the_value(bad: str) -> None:
    with pytest.raises(ValueError) as raised:
        gap_levels(bad)
    assert f"SM120KIT_ENVELOPE_GAP_LEVELS={bad!r}" in str(raised.value) and "subset of (30, 70, 100, 250)" in str(
        raised.value
    )


def sweep(gpu: dict[str, float], wall: float, tokens: int = 10000) -> dict[str, float]:
    return {**gpu, "level_wall_s": wall, "output_tokens": tokens}


def test_where_names_host_time_when_the_gpu_work_is_the_same_and_the_gpu_waits_longer() -> None:
    policy = [sweep({"decode": 0.262, "extend": 0.242}, wall=0.504 / 0.5363)]
    base = [sweep({"decode": 0.277, "extend": 0.235}, wall=0.512 / 0.7279)]
    assert where(policy, base) == "host time: GPU 0.0504 against 0.0512 ms a token, idle 46% against 27% of the level"


def test_where_names_gpu_work_when_the_policy_computes_more_per_token() -> None:
    policy = [sweep({"target_verify": 0.4, "eagle_draft": 0.2}, wall=1.0)]
    base = [sweep({"decode": 0.4}, wall=1.0)]
    assert where(policy, base).startswith("GPU work: GPU 0.0600 against 0.0400 ms a token")


def test_where_names_neither_when_the_policy_waits_no_longer() -> None:
    got = where([sweep({"decode": 0.4}, wall=1.0)], [sweep({"decode": 0.4}, wall=2.0)])
    assert got.startswith("neither alone:")


def test_where_without_the_device_timer_says_so() -> None:
    assert where([sweep({}, wall=1.0)], [sweep({}, wall=1.0)]).startswith("unknown: no GPU seconds")


def test_decode_cost_is_the_policys_decode_gpu_time_per_token_over_the_plain_servers() -> None:
    """The H100 accept-3 envelope at C=30 (docs/validation/2026-12-07-h100-envelope-accept-3): the plain server's
    decode 5.62 s over 52374 tokens, the policy's 5.34 s over 48562 (its few speculative batches aside): 1.03 x."""
    plain = [{"decode": 5.620687, "extend": 2.78713, "level_wall_s": 9.307, "output_tokens": 52374}]
    policy = [
        {
            "decode": 5.339773,
            "extend": 3.306095,
            "target_verify": 0.132402,
            "level_wall_s": 10.325,
            "output_tokens": 48562,
        }
    ]
    cost = decode_cost(policy, plain)
    assert cost == pytest.approx((5.339773 / 48562) / (5.620687 / 52374), abs=1e-4)
    assert cost is not None and 1.02 < cost <= DECODE_COST
    # a policy that speculated the whole level has no plain decode to compare: no figure, not a zero
    assert decode_cost([{"target_verify": 4.8, "level_wall_s": 8.5, "output_tokens": 3487}], plain) is None
    assert decode_cost(policy, [{"extend": 1.0, "level_wall_s": 9.0, "output_tokens": 100}]) is None

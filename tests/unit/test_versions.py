"""versions.triple: the NCCL release as its packages print it, read by the one version reader (doctor/nccl_floor.py)."""

from __future__ import annotations

import pytest

from sm120check import versions
from sm120check.doctor import nccl_floor


@pytest.mark.parametrize(
    ("text", "release"),
    [
        ("2.30.7", (2, 30, 7)),
        ("2.30.7-1", (2, 30, 7)),
        ("2.26.2-1+cuda12.4", (2, 26, 2)),
        (" 2.30.7 ", (2, 30, 7)),
        ("2.30", None),
        ("2.30.7.1", None),
        ("2.30.7rc1", None),
        ("v2.30.7", None),
        ("", None),
    ],
)
def test_an_nccl_release_is_exactly_three_numbers_and_a_build_or_local_part(
    text: str, release: tuple[int, int, int] | None
) -> None:
    assert versions.triple(text) == release
    assert nccl_floor.parse(text) == release

"""tests/lab/server_starts.py: the envelope's sweeps grouped by server start and the spread between starts."""

from __future__ import annotations

import pytest

from lab.server_starts import by_start, label_of, start_of, start_spread


def test_labels_name_the_start_and_the_sweep_and_read_back() -> None:
    labels = [label_of("spec-7", s, r) for s in range(3) for r in range(2)]
    assert labels == ["spec-7", "spec-7-r2", "spec-7-s2", "spec-7-s2-r2", "spec-7-s3", "spec-7-s3-r2"]
    assert [start_of(label, "spec-7") for label in labels] == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("label", ["spec-3", "spec-7x", "spec-7-s", "spec-7-r2-s2", "base"])
def test_a_label_of_another_server_is_refused_naming_it(label: str) -> None:
    with pytest.raises(ValueError, match=f"bench label '{label}' is not one of server 'spec-7'"):
        start_of(label, "spec-7")


def test_sweeps_group_by_start_and_the_spread_is_between_start_means() -> None:
    rows = [
        {"label": "policy", "concurrency": 100, "throughput_tok_s": 10000.0},
        {"label": "policy", "concurrency": 250, "throughput_tok_s": 12000.0},
        {"label": "policy-r2", "concurrency": 100, "throughput_tok_s": 11000.0},
        {"label": "policy-s2", "concurrency": 100, "throughput_tok_s": 12000.0},
    ]
    starts = by_start(rows, "policy")
    assert starts == {0: {100: [10000.0, 11000.0], 250: [12000.0]}, 1: {100: [12000.0]}}
    # start means 10500 and 12000 at C=100: 1500 over their mean 11250; C=250 was swept by one start only
    assert start_spread(starts) == {100: 0.1333, 250: 0.0}

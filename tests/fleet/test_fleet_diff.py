"""`sm120check fleet diff OLD NEW` on two real runs of the same fleet: before and after node 2 was broken."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sm120check.cli import main
from sm120check.fleet.diff import compare
from sm120check.fleet.load import load
from sm120check.fleet.model import NodeState

FIXTURES = Path(__file__).parent / "fixtures"
READY_RUN = FIXTURES / "run-ready"
BROKEN_RUN = FIXTURES / "run-broken"
BROKEN = "sm120kit-fleetdev-2"
HEALTHY = "sm120kit-fleetdev-3"


def fleet_diff(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["fleet", "diff", *args])
    return code, capsys.readouterr().out


def test_diff_lists_per_node_the_checks_whose_status_changed(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = fleet_diff(capsys, str(READY_RUN), str(BROKEN_RUN))
    assert code == 1
    block = out[out.index(f"~ {BROKEN}: ready -> failed") :].split("\n~ ")[0]
    changed = {line.split()[0]: line.split()[1:4] for line in block.splitlines()[1:] if line.startswith("    ")}
    assert changed["nvrtc"] == ["pass", "->", "fail"]
    assert changed["abi_wheels"] == ["pass", "->", "fail"]
    assert changed["sm120_jit"] == ["pass", "->", "skip"]


def test_unchanged_nodes_are_not_listed(capsys: pytest.CaptureFixture[str]) -> None:
    _, out = fleet_diff(capsys, str(READY_RUN), str(BROKEN_RUN))
    assert HEALTHY not in out


def test_diff_of_a_run_with_itself_is_empty_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = fleet_diff(capsys, str(BROKEN_RUN), str(BROKEN_RUN))
    assert (code, out.splitlines()[-1]) == (0, "no changes")


def test_diff_reports_nodes_added_and_removed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    smaller = tmp_path / "smaller"
    shutil.copytree(BROKEN_RUN, smaller)
    (smaller / "nodes" / f"{HEALTHY}.json").unlink()
    _, out = fleet_diff(capsys, str(BROKEN_RUN), str(smaller))
    assert f"- {HEALTHY}: removed (was ready)" in out
    _, out = fleet_diff(capsys, str(smaller), str(BROKEN_RUN))
    assert f"+ {HEALTHY}: added, ready" in out


def test_a_node_that_became_unreachable_shows_the_state_change_not_every_check(tmp_path: Path) -> None:
    later = tmp_path / "later"
    shutil.copytree(READY_RUN, later)
    ghost = FIXTURES / "run-broken" / "nodes" / "sm120kit-fleetdev-ghost.json"
    shutil.copy(ghost, later / "nodes" / f"{HEALTHY}.json")
    change = next(c for c in compare(load(READY_RUN), load(later)).changed if c.host == HEALTHY)
    assert (change.old_state, change.new_state, change.checks) == (NodeState.READY, NodeState.UNREACHABLE, ())


def test_two_node_files_are_compared_as_one_node(capsys: pytest.CaptureFixture[str]) -> None:
    old, new = READY_RUN / "nodes" / f"{BROKEN}.json", BROKEN_RUN / "nodes" / f"{BROKEN}.json"
    code, out = fleet_diff(capsys, str(old), str(new), "--json")
    document = json.loads(out)
    assert code == 1
    assert [c["host"] for c in document["changed"]] == [BROKEN]
    assert {c["id"] for c in document["changed"][0]["checks"]} >= {"nvrtc", "abi_wheels"}


def test_diff_of_a_missing_run_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["fleet", "diff", str(tmp_path / "gone"), str(BROKEN_RUN)])
    assert code == 2
    assert f"{tmp_path / 'gone'} does not exist" in capsys.readouterr().err

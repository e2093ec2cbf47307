"""The container lab itself: nodes start and go, recaps and diffs read what really happened (a tiny playbook)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.playbook import PlaybookRun, parse_changed_tasks, parse_recap, playbook_argv, run_playbook, write_inventory
from lab.podman import Node, NodeFactory, node_diff, node_exec, podman, running_node

pytestmark = pytest.mark.container

SELFTEST = Path(__file__).resolve().parents[1] / "lab" / "selftest" / "playbook.yml"


def converge(node: Node, tmp_path: Path, json_output: bool = False, **extra_vars: object) -> PlaybookRun:
    inventory = write_inventory(tmp_path / "inventory", [node])
    return run_playbook(playbook_argv(SELFTEST, inventory, extra_vars), timeout=300, json_output=json_output)


def test_node_runs_the_lab_image_with_python(make_node: NodeFactory) -> None:
    node = make_node("harness")
    result = node_exec(node, ["python3", "-c", "import sys; print(sys.version_info[:2])"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(3, 11)"


def test_node_is_removed_when_its_block_ends(lab: str) -> None:
    with running_node("harness", lab) as node:
        name = node.name
    assert podman("container", "exists", name, check=False).returncode == 1


def test_recap_counts_a_change_then_none(make_node: NodeFactory, tmp_path: Path) -> None:
    node = make_node("harness")
    first = converge(node, tmp_path)
    second = converge(node, tmp_path)
    assert first.rc == 0, first.tail()
    assert (first.host(node.name).changed, first.host(node.name).failed) == (1, 0)
    assert first.changed_tasks == (f"Write the marker file [{node.name}]",)
    assert second.host(node.name).changed == 0, second.tail()


def test_json_callback_gives_the_same_counts(make_node: NodeFactory, tmp_path: Path) -> None:
    node = make_node("harness")
    run = converge(node, tmp_path, json_output=True)
    assert run.rc == 0, run.tail()
    assert (run.host(node.name).ok, run.host(node.name).changed) == (2, 1)
    assert run.changed_tasks == (f"Write the marker file [{node.name}]",)


def test_diff_shows_what_the_playbook_wrote(make_node: NodeFactory, tmp_path: Path) -> None:
    node = make_node("harness")
    before = node_diff(node)
    assert converge(node, tmp_path).rc == 0
    assert node_diff(node).changes_since(before) == ["A /etc/sm120kit-selftest"]


def test_rejected_input_leaves_the_node_unchanged(make_node: NodeFactory, tmp_path: Path) -> None:
    node = make_node("harness")
    before = node_diff(node)
    run = converge(node, tmp_path, selftest_colour="red")
    assert run.rc != 0
    assert "selftest_colour=red" in run.output
    assert run.host(node.name).failed == 1
    assert node_diff(node).changes_since(before) == []


def test_recap_parser_reads_a_real_recap() -> None:
    # Recorded: ansible-core 2.19.14, default callback, tests/lab/selftest against a fresh lab node.
    log = (SELFTEST.parent / "recorded-run.log").read_text()
    recap = parse_recap(log)["sm120kit-harness-27058-1"]
    assert (recap.ok, recap.changed, recap.unreachable, recap.failed) == (2, 1, 0, 0)
    assert parse_changed_tasks(log) == ("Write the marker file [sm120kit-harness-27058-1]",)

"""Converging the core profile into a fresh Debian 12 node works, and converging again changes nothing."""

from __future__ import annotations

import pytest

from lab.converge import ConvergedNode, converge

pytestmark = pytest.mark.container


def test_first_core_converge_succeeds(core_node: ConvergedNode) -> None:
    run = core_node.first
    recap = run.host(core_node.node.name)
    assert run.rc == 0, run.tail()
    assert (recap.failed, recap.unreachable) == (0, 0), run.tail()
    assert recap.changed > 0, run.tail()


def test_second_converge_changes_nothing(core_node: ConvergedNode) -> None:
    run = converge(core_node.inventory)
    assert run.rc == 0, run.tail()
    assert run.host(core_node.node.name).changed == 0, "changed on rerun:\n" + "\n".join(run.changed_tasks)


def test_check_mode_on_a_converged_node_changes_nothing(core_node: ConvergedNode) -> None:
    run = converge(core_node.inventory, check=True)
    assert run.rc == 0, run.tail()
    assert run.host(core_node.node.name).changed == 0, "changed in check mode:\n" + "\n".join(run.changed_tasks)

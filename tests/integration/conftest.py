"""Integration fixtures: the core wheelhouse (built once, mounted read-only) and one converged core node per session.

The converged node is shared by the converge, idempotence, check-mode and testinfra tests: a core converge costs
minutes through the podman connection, and none of those tests change the node.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from lab.converge import NODE_GROUPS, ConvergedNode, converge
from lab.playbook import write_inventory
from lab.podman import Mount, running_node
from lab.wheelhouse import NODE_PATH, WheelhouseError, build_wheelhouse


@pytest.fixture(scope="session")
def core_wheelhouse(lab: str) -> Mount:
    """The core wheelhouse, built by playbooks/wheelhouse.yml when its inputs changed, as a read-only node mount."""
    try:
        directory, _ = build_wheelhouse("core")
    except WheelhouseError as error:
        pytest.fail(str(error), pytrace=False)
    return Mount(directory, NODE_PATH)


@pytest.fixture(scope="session")
def core_node(lab: str, core_wheelhouse: Mount, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConvergedNode]:
    """A node converged once with the core profile; removed at the end of the session."""
    with running_node("core", lab, [core_wheelhouse]) as node:
        inventory = write_inventory(tmp_path_factory.mktemp("core-inventory"), [node], NODE_GROUPS)
        yield ConvergedNode(node, inventory, converge(inventory))


@pytest.fixture(scope="session")
def core_host(core_node: ConvergedNode) -> Any:
    """testinfra host of the converged core node; every test using it errors with the log if the converge failed."""
    import testinfra

    if core_node.first.rc != 0:
        pytest.fail(f"the core converge failed, nothing to verify:\n{core_node.first.tail()}", pytrace=False)
    return testinfra.get_host(core_node.node.testinfra_url)

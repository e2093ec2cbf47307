"""Shared pytest fixtures: the container lab and a factory of podman nodes.

Container tests skip with the reason when this machine cannot run them (no podman, not root, no image), except in
CI (CI=true), where a missing lab is a failure: CI must never pass by skipping its integration tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import ExitStack

import pytest

from lab import in_ci
from lab.podman import DEFAULT_IMAGE, Mount, Node, NodeFactory, lab_problem, running_node


@pytest.fixture(scope="session")
def lab() -> str:
    """The node image, once the lab is known to work here; skips (fails in CI) with the precise reason otherwise.

    SM120KIT_LAB_IMAGE picks another image, e.g. localhost/sm120kit-node:ubuntu2404 (scripts/lab/setup --image all).
    """
    image = os.environ.get("SM120KIT_LAB_IMAGE") or DEFAULT_IMAGE
    problem = lab_problem(image)
    if problem is None:
        return image
    if in_ci():
        pytest.fail(f"container lab unavailable in CI (CI=true never skips): {problem}", pytrace=False)
    pytest.skip(f"container lab unavailable: {problem}")


def _factory(stack: ExitStack, image: str) -> NodeFactory:
    def start(purpose: str = "node", mounts: Sequence[Mount] = ()) -> Node:
        return stack.enter_context(running_node(purpose, image, mounts))

    return start


@pytest.fixture
def make_node(lab: str) -> Iterator[NodeFactory]:
    """Start fresh nodes for one test: `make_node("purpose", mounts=[...])`; all are removed after the test."""
    with ExitStack() as stack:
        yield _factory(stack, lab)


@pytest.fixture(scope="module")
def make_module_node(lab: str) -> Iterator[NodeFactory]:
    """Like make_node, for nodes shared by the tests of one module; removed when the module is done."""
    with ExitStack() as stack:
        yield _factory(stack, lab)


# Run last: the tests on a real llama-server, whose build .ci/run starts in the background when the tests start
# (about two minutes on two cores). Run first in file order, they waited for it idle (103 s in one CI run); last,
# the build finishes beside the other tests. Order within the file is kept.
_LAST = ("tests/bench/test_real_engine.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: any(item.nodeid.startswith(path) for path in _LAST))

"""Shared pytest fixtures: the container lab and a factory of podman nodes.

Container tests skip with the reason when this machine cannot run them (no podman, not root, no image), except in
CI (CI=true), where a missing lab is a failure: CI must never pass by skipping its integration tests.
"""

from __future__ import annotations

import os
import warnings
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

# `make test` runs pytest-xdist workers with --dist loadfile: each file's tests run in one worker, so a module
# fixture is built once. Files that share a session fixture costing minutes run in one worker too, so it is built
# once: the converged core node (tests/integration/conftest.py) and every SGLang release scanned and patched
# (tests/sglang/conftest.py). A file that starts using one of those fixtures belongs here (a worker warns).
_SHARED_FIXTURES = {
    "core_node": "core-node",
    "core_host": "core-node",
    "scans": "sglang-releases",
    "cycles": "sglang-releases",
}
_SHARED_FILES = {
    "tests/integration/test_converge_core.py": "core-node",
    "tests/integration/test_core_node.py": "core-node",
    "tests/integration/test_doctor_on_node.py": "core-node",
    "tests/integration/test_remedies_run.py": "core-node",
    "tests/sglang/test_eagle3.py": "sglang-releases",
    "tests/sglang/test_releases.py": "sglang-releases",
}


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _work_unit(nodeid: str) -> str:
    """The xdist work unit of a test: its file, or the group of files that share an expensive session fixture."""
    return _SHARED_FILES.get(_file(nodeid), _file(nodeid))


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """--dist loadfile, with the files of _SHARED_FILES in one work unit per shared fixture."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    scheduler = LoadFileScheduling(config, log)
    scheduler._split_scope = _work_unit  # the unit of a test: its file, or its _SHARED_FILES group
    return scheduler


def _is_last(item: pytest.Item) -> bool:
    return any(item.nodeid.startswith(path) for path in _LAST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # one process: in file order, the real-engine tests last
        items.sort(key=_is_last)
        return
    _order_for_workers(items)


def _order_for_workers(items: list[pytest.Item]) -> None:
    """Order the work units for the workers (the scheduler hands them out in this order, with
    --no-loadscope-reorder): units with container or slow tests first, in file order, then the real-engine tests
    (the build has long finished by then, and fast tests run beside their sweeps on the other worker), then the rest.
    """
    for item in items:
        shared = next(
            (_SHARED_FIXTURES[name] for name in getattr(item, "fixturenames", ()) if name in _SHARED_FIXTURES), None
        )
        if shared is not None and _work_unit(item.nodeid) != shared:
            warnings.warn(
                f"{_file(item.nodeid)} uses the {shared} session fixture but is not in tests/conftest.py's "
                "_SHARED_FILES: each xdist worker that runs it builds the fixture again",
                pytest.PytestWarning,
                stacklevel=1,
            )
    heavy = {
        _work_unit(item.nodeid)
        for item in items
        if not _is_last(item) and (item.get_closest_marker("container") or item.get_closest_marker("slow"))
    }

    def rank(item: pytest.Item) -> int:
        return 1 if _is_last(item) else 0 if _work_unit(item.nodeid) in heavy else 2

    items.sort(key=rank)

"""A converge killed halfway (controller killed, node restarted) is finished cleanly by the next run."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.converge import NODE_GROUPS, converge, site_argv
from lab.playbook import start_playbook, write_inventory
from lab.podman import Mount, Node, node_exec, podman, running_node

pytestmark = [pytest.mark.container, pytest.mark.slow]

# Killed while pip installs the toolkit wheels (into <prefix>.partial): the longest-running change of a core converge.
KILL_TASK = "TASK [cuda_toolkit : Assemble the CUDA_HOME tree from the pinned wheels]"
PREFIX = "/opt/cuda-13.0.1"
STAGE = f"{PREFIX}.partial"
STAMP = f"{PREFIX}/sm120kit-toolkit.json"
# True while a pip process installing into the staging prefix runs in the node (minbase has no ps or pgrep).
PIP_RUNNING = f"cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -q -- '--target {PREFIX}[.]partial/wheels'"
WAIT_LIMIT = 600


def wait_for(predicate: object, what: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + WAIT_LIMIT
    while not predicate():  # type: ignore[operator]
        if process.poll() is not None:
            pytest.fail(f"the converge ended (rc={process.returncode}) before {what}:\n{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {WAIT_LIMIT} s:\n{log.read_text()[-4000:]}")
        time.sleep(0.5)


@pytest.fixture
def interrupted_node(lab: str, core_wheelhouse: Mount, tmp_path: Path) -> Iterator[tuple[Node, Path]]:
    """A node whose first converge was killed while the toolkit was being staged."""
    with running_node("interrupted", lab, [core_wheelhouse]) as node:
        inventory = write_inventory(tmp_path / "inventory", [node], NODE_GROUPS)
        log = tmp_path / "interrupted.log"
        process = start_playbook(site_argv(inventory), log)
        try:
            wait_for(lambda: KILL_TASK in log.read_text(), "toolkit task", process, log)
            wait_for(lambda: node_exec(node, ["sh", "-c", PIP_RUNNING]).returncode == 0, "toolkit pip", process, log)
            time.sleep(1)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        # Commands already running in the node outlive the controller; a restart stops them like a reboot would.
        podman("restart", "-t", "0", node.name)
        yield node, inventory


def test_rerun_after_an_interrupted_converge_converges_cleanly(interrupted_node: tuple[Node, Path]) -> None:
    node, inventory = interrupted_node
    assert node_exec(node, ["test", "-e", STAMP]).returncode == 1, "the kill came too late: the toolkit was complete"
    rerun = converge(inventory)
    assert rerun.rc == 0, rerun.tail()
    assert node_exec(node, ["test", "-e", STAGE]).returncode == 1, "the partial toolkit was left behind"
    nvcc = node_exec(node, [f"{PREFIX}/bin/nvcc", "--version"])
    assert "V13.0.88" in nvcc.stdout, nvcc.stderr
    again = converge(inventory)
    assert again.rc == 0, again.tail()
    assert again.host(node.name).changed == 0, "changed on the run after recovery:\n" + "\n".join(again.changed_tasks)

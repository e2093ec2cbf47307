"""Podman nodes for integration tests: start, exec, diff, always remove.

Nodes are rootful podman containers of the image that scripts/lab/setup builds. Tests talk to them only through
`podman exec` (the Ansible podman connection, testinfra's podman:// backend), never over the bridge network.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

DEFAULT_IMAGE = "localhost/sm120kit-node:debian12"
NODE_LABEL = "sm120kit.lab.node"
# Written by Ansible itself on every run (module payloads, async status, facts cache): never a role's change.
ANSIBLE_OWN_PATHS = ("/root/.ansible", "/tmp/ansible", "/root/.cache/ansible")
_counter = itertools.count(1)


@dataclass(frozen=True)
class Mount:
    """A host directory bind-mounted into a node (read-only unless told otherwise)."""

    source: Path
    target: str
    read_only: bool = True

    def option(self) -> str:
        return f"{self.source}:{self.target}" + (":ro" if self.read_only else "")


@dataclass(frozen=True)
class Node:
    """A running node container."""

    name: str
    image: str

    @property
    def testinfra_url(self) -> str:
        return f"podman://{self.name}"


NodeFactory = Callable[..., Node]


@dataclass(frozen=True)
class Diff:
    """What `podman diff` reports for a node against its image: kind (A added, C changed, D deleted) by path."""

    entries: frozenset[tuple[str, str]]

    def paths(self) -> frozenset[str]:
        return frozenset(path for _, path in self.entries)

    def changes_since(self, before: Diff) -> list[str]:
        """Entries new since `before`, outside Ansible's own temporary directories, as 'KIND PATH' lines."""
        return sorted(
            f"{kind} {path}"
            for kind, path in self.entries - before.entries
            if not is_ansible_own(path) and (kind, path) not in _PARENT_NOISE
        )


# Ansible's temporaries touch these directories (files under /root/.ansible; copy's scratch files in /tmp, gone after).
_PARENT_NOISE = frozenset({("C", "/root"), ("C", "/tmp")})


def is_ansible_own(path: str) -> bool:
    return any(path == own or path.startswith(own + "/") for own in ANSIBLE_OWN_PATHS)


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a podman command, raising with its stderr on failure."""
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def lab_problem(image: str = DEFAULT_IMAGE) -> str | None:
    """Why containers cannot run here (None when they can): missing podman, not root, missing image."""
    if shutil.which("podman") is None:
        return "podman is not installed; run `sudo scripts/lab/setup`"
    if os.geteuid() != 0:
        return "the container lab needs root (rootful podman); run the tests as root"
    if not Path("/etc/containers/containers.conf.d/sm120kit.conf").is_file():
        return "podman is not configured for the lab; run `scripts/lab/setup`"
    try:
        if podman("image", "exists", image, check=False, timeout=60).returncode != 0:
            return f"image {image} is missing; build it with `scripts/lab/setup`"
    except subprocess.TimeoutExpired:
        return "podman did not answer within 60 s"
    return None


def unique_name(purpose: str) -> str:
    return f"sm120kit-{purpose}-{os.getpid()}-{next(_counter)}"


def start_node(name: str, image: str = DEFAULT_IMAGE, mounts: Sequence[Mount] = ()) -> Node:
    """Start a detached node; `--init` makes removal immediate (sleep as PID 1 would ignore SIGTERM)."""
    args = ["run", "-d", "--init", "--name", name, "--hostname", name, "--label", f"{NODE_LABEL}=1"]
    for mount in mounts:
        args += ["-v", mount.option()]
    try:
        podman(*args, image)
    except BaseException:
        remove_node(name)
        raise
    return Node(name=name, image=image)


def remove_node(name: str) -> None:
    """Remove a node at once; a node that is already gone is fine."""
    podman("rm", "-f", "-t", "0", name, check=False)


@contextmanager
def running_node(purpose: str, image: str = DEFAULT_IMAGE, mounts: Sequence[Mount] = ()) -> Iterator[Node]:
    """A node for the duration of a with-block, removed afterwards whatever happened."""
    name = unique_name(purpose)
    try:
        yield start_node(name, image, mounts)
    finally:
        remove_node(name)


def node_exec(node: Node, command: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a command in a node (no shell unless the command asks for one); never raises on its exit status."""
    return podman("exec", node.name, *command, check=False, timeout=timeout)


def node_diff(node: Node) -> Diff:
    """The node's file system changes against its image."""
    raw = json.loads(podman("diff", "--format", "json", node.name).stdout or "{}")
    kinds = {"added": "A", "changed": "C", "deleted": "D"}
    return Diff(frozenset((kinds[key], path) for key, paths in raw.items() if key in kinds for path in (paths or [])))

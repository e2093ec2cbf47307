"""Converging lab nodes with the project's site.yml (core profile, from the mounted wheelhouse)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .playbook import REPO_ROOT, PlaybookRun, playbook_argv, run_playbook
from .podman import Node
from .wheelhouse import NODE_PATH

SITE = REPO_ROOT / "site.yml"
NODE_GROUPS = ("sm120_nodes",)
CORE_VARS: Mapping[str, object] = {"sm120kit_profile": "core", "sm120kit_wheelhouse": NODE_PATH}
CONVERGE_TIMEOUT = 1200


@dataclass(frozen=True)
class ConvergedNode:
    """A node, its inventory, and the run that converged it first."""

    node: Node
    inventory: Path
    first: PlaybookRun


def site_argv(inventory: Path, check: bool = False, **extra_vars: object) -> list[str]:
    """site.yml with the core profile from the mounted wheelhouse, plus any extra vars (which win).

    Spreading a dict of vars (`**vars`), pass `check` by name too: mypy cannot tell the dict holds no `check`."""
    return playbook_argv(SITE, inventory, {**CORE_VARS, **extra_vars}, check=check)


def converge(inventory: Path, check: bool = False, **extra_vars: object) -> PlaybookRun:
    return run_playbook(site_argv(inventory, check, **extra_vars), timeout=CONVERGE_TIMEOUT)

"""Read node reports from a fleet run directory (or one report file) into a Fleet.

A run directory holds `nodes/<host>.json` (playbooks/doctor.yml writes it that way); a directory of `<host>.json`
files works too. A node file is either the doctor's JSON report (`sm120check doctor --json`) or a stub the playbook
writes when there is none: {"host": ..., "state": "unreachable" | "no_checker" | "error", "error": "..."}.
The node's name is the file's name without `.json` (the inventory name, which may differ from the node's hostname).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sm120check.fleet.model import STATUSES, CheckResult, Fleet, NodeReport, NodeState, build_fleet

NODES_DIR = "nodes"
AGGREGATE_TOOL = "sm120check fleet"  # the `tool` of fleet.json, never a node report
_EXCERPT = 200


class FleetInputError(Exception):
    """A path that holds no fleet run: the message names it and says what was expected."""


def node_from_document(host: str, document: object, source: str = "") -> NodeReport:
    """A node report from a parsed node file; anything that is not a doctor report or a stub is an ERROR node."""
    if not isinstance(document, dict):
        return NodeReport(host, NodeState.ERROR, error=f"node report is not a JSON object: {_excerpt(document)}")
    stub_state = document.get("state")
    if document.get("unreachable") is True:
        stub_state = NodeState.UNREACHABLE.value
    if stub_state is not None and "results" not in document:
        try:
            state = NodeState(stub_state)
        except ValueError:
            state = NodeState.ERROR
        return NodeReport(host, state, error=str(document.get("error") or stub_state), source=source)
    results = document.get("results")
    if not isinstance(results, list):
        return NodeReport(host, NodeState.ERROR, error=f"not a doctor report (no results list): {_excerpt(document)}")
    parsed: list[CheckResult] = []
    for item in results:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or item.get("status") not in STATUSES:
            return NodeReport(host, NodeState.ERROR, error=f"doctor report has a malformed result: {_excerpt(item)}")
        parsed.append(
            CheckResult(
                id=item["id"],
                status=item["status"],
                summary=str(item.get("summary") or ""),
                details=str(item.get("details") or ""),
                remedy=str(item.get("remedy") or ""),
                level=_int(item.get("level")),
                family=str(item.get("family") or ""),
            )
        )
    failed = any(r.status == "fail" for r in parsed)
    level = document.get("level")
    return NodeReport(
        host,
        NodeState.FAILED if failed else NodeState.READY,
        tuple(parsed),
        version=str(document.get("version") or ""),
        level=level if isinstance(level, int) else None,
        started=str(document.get("started") or ""),
        seconds=float(document.get("seconds") or 0.0),
        source=source,
    )


def read_node(path: Path) -> NodeReport:
    """One node file; unreadable or non-JSON content makes an ERROR node (the node's doctor wrote it)."""
    host = path.name.removesuffix(".json")
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise FleetInputError(f"cannot read {path}: {error.strerror}") from error
    try:
        document: Any = json.loads(text)
    except json.JSONDecodeError as error:
        excerpt = text.strip()[:_EXCERPT] or "(empty)"
        problem = f"node report is not JSON ({error.msg}): {excerpt}"
        return NodeReport(host, NodeState.ERROR, error=problem, source=str(path))
    return node_from_document(host, document, str(path))


def node_files(directory: Path) -> list[Path]:
    """The node files of a run directory: nodes/*.json when there is a nodes/ directory, else *.json."""
    nodes_dir = directory / NODES_DIR
    folder = nodes_dir if nodes_dir.is_dir() else directory
    return sorted(p for p in folder.glob("*.json") if p.is_file() and not _is_aggregate(p))


def load(path: Path) -> Fleet:
    """A fleet from a run directory, a directory of node files, or a single node file."""
    if path.is_file():
        return build_fleet([read_node(path)], str(path))
    if not path.is_dir():
        raise FleetInputError(f"{path} does not exist; give a fleet run directory (build/fleet/latest) or a node file")
    files = node_files(path)
    if not files:
        raise FleetInputError(
            f"{path} holds no node reports (expected {path / NODES_DIR}/<host>.json or {path}/<host>.json); "
            "run playbooks/doctor.yml to make a fleet run"
        )
    return build_fleet([read_node(p) for p in files], str(path))


def _is_aggregate(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            head = handle.read(4096)
    except OSError:
        return False
    return f'"tool": "{AGGREGATE_TOOL}"' in head


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _excerpt(value: object) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + "..."

"""What changed between two fleet runs: nodes added and removed, node states, and per node the checks whose
status changed."""

from __future__ import annotations

import json
from dataclasses import dataclass

from sm120check.fleet.model import NO_RESULT, Fleet, NodeReport, NodeState
from sm120check.safetext import terminal_text


@dataclass(frozen=True)
class CheckChange:
    id: str
    old: str  # status, or "-" when the check did not run
    new: str
    summary: str  # the new summary (the old one when the check disappeared)


@dataclass(frozen=True)
class NodeChange:
    host: str
    old_state: NodeState
    new_state: NodeState
    checks: tuple[CheckChange, ...]
    error: str = ""  # why the new run has no report, when it has none


@dataclass(frozen=True)
class FleetDiff:
    added: tuple[NodeReport, ...]
    removed: tuple[NodeReport, ...]
    changed: tuple[NodeChange, ...]

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)


def _status(node: NodeReport, check_id: str) -> str:
    found = node.result(check_id)
    return found.status if found else NO_RESULT


def compare_nodes(old: NodeReport, new: NodeReport) -> NodeChange | None:
    """The change of one node, or None. When either run has no report (unreachable, ...), only the state counts:
    listing every check as gone would hide the one fact that matters."""
    checks: list[CheckChange] = []
    if old.results and new.results:
        ids = {r.id: r.level for r in old.results} | {r.id: r.level for r in new.results}
        for check_id in sorted(ids, key=lambda c: (ids[c], c)):
            before, after = _status(old, check_id), _status(new, check_id)
            if before != after:
                source = new.result(check_id) or old.result(check_id)
                checks.append(CheckChange(check_id, before, after, source.summary if source else ""))
    if old.state is new.state and not checks:
        return None
    return NodeChange(new.host, old.state, new.state, tuple(checks), new.error if not new.results else "")


def compare(old: Fleet, new: Fleet) -> FleetDiff:
    old_hosts = {n.host: n for n in old.nodes}
    new_hosts = {n.host: n for n in new.nodes}
    changed = [
        change
        for host in sorted(old_hosts.keys() & new_hosts.keys())
        if (change := compare_nodes(old_hosts[host], new_hosts[host])) is not None
    ]
    return FleetDiff(
        added=tuple(new_hosts[h] for h in sorted(new_hosts.keys() - old_hosts.keys())),
        removed=tuple(old_hosts[h] for h in sorted(old_hosts.keys() - new_hosts.keys())),
        changed=tuple(changed),
    )


def _tty(value: str) -> str:
    """One terminal line: nothing a node's file holds reaches the terminal as an escape sequence."""
    return terminal_text(value, one_line=True)


def text(diff: FleetDiff, old_name: str, new_name: str) -> str:
    lines = [f"sm120check fleet diff: {_tty(old_name)} -> {_tty(new_name)}"]
    for node in diff.added:
        lines.append(f"+ {_tty(node.host)}: added, {node.state.label}")
    for node in diff.removed:
        lines.append(f"- {_tty(node.host)}: removed (was {node.state.label})")
    for change in diff.changed:
        states = (
            f"{change.old_state.label} -> {change.new_state.label}"
            if change.old_state is not change.new_state
            else change.new_state.label
        )
        why = f" ({_tty(change.error.splitlines()[0])})" if change.error.strip() else ""
        lines.append(f"~ {_tty(change.host)}: {states}{why}")
        width = max([len(_tty(c.id)) for c in change.checks] + [5])
        for check in change.checks:
            line = f"    {_tty(check.id).ljust(width)}  {check.old:>4} -> {check.new:<4}  {_tty(check.summary)}"
            lines.append(line.rstrip())
    if diff.empty:
        lines.append("no changes")
    else:
        lines.append(f"{len(diff.changed)} changed, {len(diff.added)} added, {len(diff.removed)} removed")
    return "\n".join(lines) + "\n"


def to_json(diff: FleetDiff, old_name: str, new_name: str) -> str:
    document = {
        "old": old_name,
        "new": new_name,
        "added": [{"host": n.host, "state": n.state.value} for n in diff.added],
        "removed": [{"host": n.host, "state": n.state.value} for n in diff.removed],
        "changed": [
            {
                "host": c.host,
                "old_state": c.old_state.value,
                "new_state": c.new_state.value,
                "checks": [{"id": k.id, "old": k.old, "new": k.new, "summary": k.summary} for k in c.checks],
            }
            for c in diff.changed
        ],
    }
    return json.dumps(document, indent=2) + "\n"

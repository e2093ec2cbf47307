"""Fleet report formats, pure functions of a Fleet: terminal table, Markdown, JSON, JUnit XML."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from sm120check import __version__
from sm120check.fleet.model import Fleet, NodeReport, NodeState

JSON_SCHEMA = 1
FORMATS = ("table", "md", "json", "junit")
# File names of `fleet report --write DIR`, by format.
FILE_NAMES = {"table": "fleet.txt", "md": "fleet.md", "json": "fleet.json", "junit": "fleet.xml"}


def headline(fleet: Fleet) -> str:
    """'5 nodes: 2 ready, 1 failed, 1 unreachable, 1 no sm120check (level 2)'; states with no node are left out."""
    tally = fleet.state_counts()
    parts = ", ".join(f"{tally[s.value]} {s.label}" for s in NodeState if tally[s.value])
    levels = fleet.levels()
    level = f" (level {', '.join(map(str, levels))})" if levels else ""
    verdict = "READY" if fleet.ok else "NOT READY"
    return f"{verdict}: {len(fleet.nodes)} node{'s' if len(fleet.nodes) != 1 else ''}: {parts}{level}"


_WHY_WIDTH = 200


def _why(node: NodeReport) -> str:
    """The first line of why a node has no report, cut to a terminal-friendly length."""
    line = node.error.strip().splitlines()[0] if node.error.strip() else node.state.label
    return line if len(line) <= _WHY_WIDTH else line[: _WHY_WIDTH - 3] + "..."


def table(fleet: Fleet) -> str:
    """The matrix (a row per node, a column per check), then every failure and warning with its remedy, per node."""
    host_w = max([len(n.host) for n in fleet.nodes] + [4])
    state_w = max([len(n.state.label) for n in fleet.nodes] + [5])
    widths = [max(len(c), 4) for c in fleet.checks]
    lines = [f"sm120check fleet: {headline(fleet)}"]
    columns = list(zip(fleet.checks, widths, strict=True))
    header = [f"{'NODE'.ljust(host_w)}  {'STATE'.ljust(state_w)}", *(c.ljust(w) for c, w in columns)]
    lines.append("  ".join(header).rstrip())
    for node in fleet.nodes:
        cells = [node.cell(c).ljust(w) for c, w in columns]
        lines.append("  ".join([f"{node.host.ljust(host_w)}  {node.state.label.ljust(state_w)}", *cells]).rstrip())
    troubled = [n for n in fleet.nodes if n.state is not NodeState.READY or n.problems()]
    if troubled:
        lines += ["", "Failures and warnings, with their remedies:"]
    for node in troubled:
        lines.append(f"{node.host} ({node.state.label})")
        if not node.results:
            lines.append(f"  {node.state.label}: {_why(node)}")
        for result in node.problems():
            lines.append(f"  {result.status.upper()} {result.id}: {result.summary}")
            if result.remedy:
                lines.append(f"       remedy: {result.remedy}")
    return "\n".join(lines) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(fleet: Fleet) -> str:
    """The same matrix as a Markdown table, then per node every failure and warning with remedy and evidence."""
    lines = ["# sm120check fleet report", "", f"**{headline(fleet)}**", ""]
    if fleet.source:
        lines += [f"Run: `{fleet.source}`", ""]
    lines.append("| node | state | " + " | ".join(f"`{c}`" for c in fleet.checks) + " |")
    lines.append("| --- | --- |" + " --- |" * len(fleet.checks))
    for node in fleet.nodes:
        cells = " | ".join(node.cell(c) for c in fleet.checks)
        lines.append(f"| {_md_cell(node.host)} | {node.state.label} | {cells} |")
    troubled = [n for n in fleet.nodes if n.state is not NodeState.READY or n.problems()]
    if troubled:
        lines += ["", "## Failures and warnings"]
    for node in troubled:
        lines += ["", f"### {node.host} ({node.state.label})", ""]
        if not node.results:
            lines += ["```", node.error.strip() or node.state.label, "```"]
        for result in node.problems():
            lines.append(f"- **{result.status.upper()} `{result.id}`**: {_md_cell(result.summary)}")
            if result.remedy:
                lines.append(f"  - remedy: `{_md_cell(result.remedy)}`")
            if result.details.strip():
                lines += ["  ```", *(f"  {line}" for line in result.details.strip().splitlines()), "  ```"]
    return "\n".join(lines) + "\n"


def _node_dict(node: NodeReport) -> dict[str, object]:
    return {
        "host": node.host,
        "state": node.state.value,
        "error": node.error or None,
        "version": node.version or None,
        "level": node.level,
        "started": node.started or None,
        "seconds": node.seconds,
        "summary": node.counts(),
        "cells": {c.id: c.status for c in node.results},
        "problems": [
            {"id": r.id, "status": r.status, "summary": r.summary, "remedy": r.remedy, "details": r.details}
            for r in node.problems()
        ],
        "source": node.source or None,
    }


def to_json(fleet: Fleet) -> str:
    """Stable JSON: schema, tool, version, ok, summary (nodes by state), checks, nodes (sorted by host)."""
    document = {
        "schema": JSON_SCHEMA,
        "tool": "sm120check fleet",
        "version": __version__,
        "source": fleet.source or None,
        "ok": fleet.ok,
        "summary": {"nodes": len(fleet.nodes), **fleet.state_counts()},
        "checks": list(fleet.checks),
        "nodes": [_node_dict(n) for n in fleet.nodes],
    }
    return json.dumps(document, indent=2) + "\n"


def to_junit(fleet: Fleet) -> str:
    """JUnit XML for CI: a suite per node, a case per check (fail -> failure, skip -> skipped); a node without a
    report is one failing `doctor` case that says why."""
    root = ET.Element("testsuites", name="sm120check.fleet")
    total = failures = 0
    for node in fleet.nodes:
        suite = ET.SubElement(root, "testsuite", name=node.host, hostname=node.host)
        cases = failed = skipped = 0
        if not node.results:
            case = ET.SubElement(suite, "testcase", classname=f"sm120check.fleet.{node.host}", name="doctor")
            ET.SubElement(
                case, "failure", message=f"{node.state.label}: {_why(node)}", type=node.state.value
            ).text = node.error
            cases, failed = 1, 1
        for result in node.results:
            case = ET.SubElement(suite, "testcase", classname=f"sm120check.fleet.{node.host}", name=result.id)
            evidence = "\n".join(t for t in (result.details, f"remedy: {result.remedy}" if result.remedy else "") if t)
            if result.status == "fail":
                ET.SubElement(case, "failure", message=result.summary, type="fail").text = evidence
                failed += 1
            elif result.status == "skip":
                ET.SubElement(case, "skipped", message=result.summary)
                skipped += 1
            elif result.status == "warn":
                ET.SubElement(case, "system-out").text = f"WARN: {result.summary}\n{evidence}".rstrip()
            cases += 1
        suite.attrib.update(tests=str(cases), failures=str(failed), errors="0", skipped=str(skipped))
        total, failures = total + cases, failures + failed
    root.attrib.update(tests=str(total), failures=str(failures))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def render(fleet: Fleet, fmt: str) -> str:
    renderers = {"table": table, "md": markdown, "json": to_json, "junit": to_junit}
    return renderers[fmt](fleet)

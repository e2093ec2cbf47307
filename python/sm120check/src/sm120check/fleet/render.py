"""Fleet report formats, pure functions of a Fleet: terminal table, Markdown, JSON, JUnit XML."""

from __future__ import annotations

import html
import json
import re
import xml.etree.ElementTree as ET

from sm120check import __version__
from sm120check.fleet.model import Fleet, NodeReport, NodeState
from sm120check.safetext import terminal_text, xml_text

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


def _tty(text: str) -> str:
    """One terminal line: no escape sequences or control characters from a node's files reach the terminal."""
    return terminal_text(text, one_line=True)


def table(fleet: Fleet) -> str:
    """The matrix (a row per node, a column per check), then every failure and warning with its remedy, per node."""
    hosts = {n.host: _tty(n.host) for n in fleet.nodes}
    names = [_tty(c) for c in fleet.checks]
    host_w = max([len(h) for h in hosts.values()] + [4])
    state_w = max([len(n.state.label) for n in fleet.nodes] + [5])
    widths = [max(len(c), 4) for c in names]
    lines = [f"sm120check fleet: {headline(fleet)}"]
    columns = list(zip(fleet.checks, widths, strict=True))
    header = [
        f"{'NODE'.ljust(host_w)}  {'STATE'.ljust(state_w)}",
        *(c.ljust(w) for c, w in zip(names, widths, strict=True)),
    ]
    lines.append("  ".join(header).rstrip())
    for node in fleet.nodes:
        cells = [node.cell(c).ljust(w) for c, w in columns]
        row = [f"{hosts[node.host].ljust(host_w)}  {node.state.label.ljust(state_w)}", *cells]
        lines.append("  ".join(row).rstrip())
    troubled = [n for n in fleet.nodes if n.state is not NodeState.READY or n.problems()]
    if troubled:
        lines += ["", "Failures and warnings, with their remedies:"]
    for node in troubled:
        lines.append(f"{hosts[node.host]} ({node.state.label})")
        if not node.results:
            lines.append(f"  {node.state.label}: {_tty(_why(node))}")
        for result in node.problems():
            lines.append(f"  {result.status.upper()} {_tty(result.id)}: {_tty(result.summary)}")
            if result.remedy:
                lines.append(f"       remedy: {_tty(result.remedy)}")
    return "\n".join(lines) + "\n"


# Markdown: text from node files is data, never markup. Plain text is HTML-escaped (`<`, `>`, `&`) and its Markdown
# punctuation backslash-escaped; code spans and fences use a backtick run longer than any in the text, so the text
# cannot close them; every piece is one line where the syntax needs one (table cells, headings, list items).
_MD_PUNCTUATION = re.compile(r"([\\`*_\[\]|~])")
_BACKTICKS = re.compile(r"`+")


def _md_line(text: str) -> str:
    return " ".join(terminal_text(text).split("\n")).replace("\t", " ")


def _md_cell(text: str) -> str:
    """Plain inline text (table cells, headings, list items): escaped, one line."""
    return _MD_PUNCTUATION.sub(r"\\\1", html.escape(_md_line(text), quote=False))


def _fence_for(text: str) -> str:
    return "`" * max([3, *(len(run) + 1 for run in _BACKTICKS.findall(text))])


def _md_code(text: str, in_table: bool = False) -> str:
    """An inline code span that the text cannot end; in a table, `|` is escaped so it stays in its cell (GFM reads
    `\\|` as `|` there, even in code)."""
    body = _md_line(text).replace("|", "\\|") if in_table else _md_line(text)
    fence = "`" * max([1, *(len(run) + 1 for run in _BACKTICKS.findall(body))])
    pad = " " if body.startswith("`") or body.endswith("`") or not body.strip() else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def _md_block(text: str, indent: str = "") -> list[str]:
    """A fenced code block that the text cannot end early."""
    body = terminal_text(text).splitlines() or [""]
    fence = _fence_for(text)
    return [f"{indent}{fence}text", *(f"{indent}{line}" for line in body), f"{indent}{fence}"]


def markdown(fleet: Fleet) -> str:
    """The same matrix as a Markdown table, then per node every failure and warning with remedy and evidence."""
    lines = ["# sm120check fleet report", "", f"**{headline(fleet)}**", ""]
    if fleet.source:
        lines += [f"Run: {_md_code(fleet.source)}", ""]
    lines.append("| node | state | " + " | ".join(_md_code(c, in_table=True) for c in fleet.checks) + " |")
    lines.append("| --- | --- |" + " --- |" * len(fleet.checks))
    for node in fleet.nodes:
        cells = " | ".join(node.cell(c) for c in fleet.checks)
        lines.append(f"| {_md_cell(node.host)} | {node.state.label} | {cells} |")
    troubled = [n for n in fleet.nodes if n.state is not NodeState.READY or n.problems()]
    if troubled:
        lines += ["", "## Failures and warnings"]
    for node in troubled:
        lines += ["", f"### {_md_cell(node.host)} ({node.state.label})", ""]
        if not node.results:
            lines += _md_block(node.error.strip() or node.state.label)
        for result in node.problems():
            lines.append(f"- **{result.status.upper()} {_md_code(result.id)}**: {_md_cell(result.summary)}")
            if result.remedy:
                lines.append(f"  - remedy: {_md_code(result.remedy)}")
            if result.details.strip():
                lines += _md_block(result.details.strip(), indent="  ")
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
        host = xml_text(node.host)
        suite = ET.SubElement(root, "testsuite", name=host, hostname=host)
        cases = failed = skipped = 0
        if not node.results:
            case = ET.SubElement(suite, "testcase", classname=f"sm120check.fleet.{host}", name="doctor")
            ET.SubElement(
                case, "failure", message=xml_text(f"{node.state.label}: {_why(node)}"), type=node.state.value
            ).text = xml_text(node.error)
            cases, failed = 1, 1
        for result in node.results:
            case = ET.SubElement(suite, "testcase", classname=f"sm120check.fleet.{host}", name=xml_text(result.id))
            evidence = "\n".join(t for t in (result.details, f"remedy: {result.remedy}" if result.remedy else "") if t)
            evidence, summary = xml_text(evidence), xml_text(result.summary)
            if result.status == "fail":
                ET.SubElement(case, "failure", message=summary, type="fail").text = evidence
                failed += 1
            elif result.status == "skip":
                ET.SubElement(case, "skipped", message=summary)
                skipped += 1
            elif result.status == "warn":
                ET.SubElement(case, "system-out").text = f"WARN: {summary}\n{evidence}".rstrip()
            cases += 1
        suite.attrib.update(tests=str(cases), failures=str(failed), errors="0", skipped=str(skipped))
        total, failures = total + cases, failures + failed
    root.attrib.update(tests=str(total), failures=str(failures))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def render(fleet: Fleet, fmt: str) -> str:
    renderers = {"table": table, "md": markdown, "json": to_json, "junit": to_junit}
    return renderers[fmt](fleet)

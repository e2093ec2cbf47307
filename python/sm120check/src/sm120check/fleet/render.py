"""Fleet report formats, pure functions of a Fleet: terminal table, Markdown, JSON, JUnit XML."""

from __future__ import annotations

import html
import json
import re
import xml.etree.ElementTree as ET

from sm120check import __version__
from sm120check.fleet.model import Fleet, NodeReport, NodeState
from sm120check.fleet.outliers import MIN_GROUP, Group, Ignored, Outlier, describe
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
    flagged = len(fleet.review.hosts())
    outliers = f"; outliers on {flagged} node{'s' if flagged != 1 else ''}" if flagged else ""
    return f"{verdict}: {len(fleet.nodes)} node{'s' if len(fleet.nodes) != 1 else ''}: {parts}{level}{outliers}"


# Outliers: an outlier is a warning about a node against its peers, not a failed check (the node stays ready).
NEXT_STEP = (
    "an outlier is a warning, not a failed check: run the doctor on the node again to rule out a one-off (another "
    "job on the GPU), then compare it with a peer of the same model: the check's details and data in "
    "nodes/<host>.json, `nvidia-smi --query-gpu=pcie.link.gen.current,pcie.link.width.current --format=csv` under "
    "load, `nvidia-smi -q -d PERFORMANCE` (throttle reasons), `nvidia-smi topo -m` (PCIe and NUMA placement); a link "
    "below its peers is the slot, riser or BIOS link setting; `--fail-on-outlier` makes outliers fail the report"
)
# Nodes whose GPUs are behind several root complexes: the CUDA_VISIBLE_DEVICES order per tp size (pcie_acs's data)
TP_HEADING = "TP groups, on nodes whose GPUs are behind several root complexes"
_IGNORED_SHOWN = 20  # in the table and Markdown; fleet.json lists every one


def _has_figures(fleet: Fleet) -> bool:
    return bool(fleet.review.groups or fleet.review.ignored)


def _outlier_cell(fleet: Fleet, node: NodeReport) -> str:
    return str(len(fleet.review.of_node(node.host))) if node.figures else "-"


def _number(value: float, unit: str) -> str:
    text = f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
    return f"{text} {unit}" if unit else text


def _deviation(outlier: Outlier) -> str:
    return f"{outlier.deviation * 100:+.0f} %"


def _gpu(outlier: Outlier) -> str:
    return "node" if outlier.figure.gpu is None else f"GPU {outlier.figure.gpu}"


def _group_of(outlier: Outlier) -> str:
    what = "GPUs" if outlier.figure.gpu is not None else "nodes"
    return f"{outlier.figure.group} ({outlier.size} {what})"


def _too_few(groups: tuple[Group, ...]) -> list[str]:
    """'<group> (2 values): nccl_allreduce.busbw_gbps, ...', one line per group and size."""
    by: dict[tuple[str, int], list[str]] = {}
    for group in groups:
        by.setdefault((group.group, group.size), []).append(group.metric)
    return [f"{name} ({size} value{'s' if size != 1 else ''}): {', '.join(ms)}" for (name, size), ms in by.items()]


def _ignored_lines(ignored: tuple[Ignored, ...]) -> list[str]:
    lines = [f"{i.node}: {i.where}: {i.why}" for i in ignored[:_IGNORED_SHOWN]]
    if len(ignored) > _IGNORED_SHOWN:
        lines.append(f"... and {len(ignored) - _IGNORED_SHOWN} more (fleet.json lists every one)")
    return lines


def _outlier_table(fleet: Fleet) -> list[str]:
    review = fleet.review
    lines = ["", f"Outliers against the fleet median of the same GPU model ({describe(review.thresholds)}):"]
    if review.outliers:
        rows = [("NODE", "GPU", "METRIC", "VALUE", "MEDIAN", "DEVIATION", "GROUP")]
        rows += [
            (
                _tty(o.figure.node),
                _gpu(o),
                _tty(o.figure.metric),
                _number(o.figure.value, o.figure.unit),
                _number(o.median, o.figure.unit),
                _deviation(o),
                _tty(_group_of(o)),
            )
            for o in review.outliers
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
        lines.append(f"  next: {NEXT_STEP}")
    else:
        judged = [g for g in review.groups if g.judged]
        lines.append(f"  none: {sum(g.size for g in judged)} figures in {len(judged)} groups within their thresholds")
    if review.too_few:
        lines.append(f"  too few to compare (fewer than {MIN_GROUP} values, not judged):")
        lines += [f"    {_tty(line)}" for line in _too_few(review.too_few)]
    if review.ignored:
        lines.append("  ignored (the report gave them, but not as usable numbers):")
        lines += [f"    {_tty(line)}" for line in _ignored_lines(review.ignored)]
    return lines


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
    flags = ["OUTLIERS"] if _has_figures(fleet) else []  # a column only where some node measured something
    header = [
        f"{'NODE'.ljust(host_w)}  {'STATE'.ljust(state_w)}",
        *flags,
        *(c.ljust(w) for c, w in zip(names, widths, strict=True)),
    ]
    lines.append("  ".join(header).rstrip())
    for node in fleet.nodes:
        cells = [node.cell(c).ljust(w) for c, w in columns]
        flag = [_outlier_cell(fleet, node).ljust(len("OUTLIERS"))] if flags else []
        row = [f"{hosts[node.host].ljust(host_w)}  {node.state.label.ljust(state_w)}", *flag, *cells]
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
    misnamed = [n for n in fleet.nodes if n.reported_host]
    if misnamed:
        lines += ["", "Node files whose report names another host:"]
        lines += [f"  {hosts[n.host]}: {_tty(misnamed_note(n))}" for n in misnamed]
    grouped = [n for n in fleet.nodes if n.tp_groups]
    if grouped:
        lines += ["", TP_HEADING + ":"]
        for node in grouped:
            lines.append(f"{hosts[node.host]}")
            lines += [f"  {_tty(line.strip())}" for line in node.tp_groups]
    if _has_figures(fleet):
        lines += _outlier_table(fleet)
    return "\n".join(lines) + "\n"


def misnamed_note(node: NodeReport) -> str:
    """Why a node's file name and its report's host disagree, and what to do."""
    return (
        f"{node.source or node.host} holds the report of host {node.reported_host!r}; if that is not this node, "
        "the file was copied or renamed: run the fleet play again (it names each file after its host)"
    )


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
    flags = _has_figures(fleet)
    flag_head, flag_rule = (" outliers |", " --- |") if flags else ("", "")
    checks = " | ".join(_md_code(c, in_table=True) for c in fleet.checks)
    lines.append(f"| node | state |{flag_head} {checks} |")
    lines.append(f"| --- | --- |{flag_rule}" + " --- |" * len(fleet.checks))
    for node in fleet.nodes:
        cells = " | ".join(node.cell(c) for c in fleet.checks)
        flag = f" {_outlier_cell(fleet, node)} |" if flags else ""
        lines.append(f"| {_md_cell(node.host)} | {node.state.label} |{flag} {cells} |")
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
    grouped = [n for n in fleet.nodes if n.tp_groups]
    if grouped:
        lines += ["", f"## {TP_HEADING}"]
    for node in grouped:
        lines += ["", f"### {_md_cell(node.host)}", ""]
        lines += [f"- {_md_cell(line.strip())}" for line in node.tp_groups]
    if flags:
        lines += _md_outliers(fleet)
    return "\n".join(lines) + "\n"


def _md_outliers(fleet: Fleet) -> list[str]:
    review = fleet.review
    lines = [
        "",
        "## Outliers",
        "",
        f"Against the fleet median of the same GPU model: {describe(review.thresholds)}.",
        "",
    ]
    if review.outliers:
        lines += [
            "| node | GPU | metric | value | median | deviation | group |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {_md_cell(o.figure.node)} | {_gpu(o)} | {_md_code(o.figure.metric, in_table=True)} | "
            f"{_number(o.figure.value, o.figure.unit)} | {_number(o.median, o.figure.unit)} | {_deviation(o)} | "
            f"{_md_cell(_group_of(o))} |"
            for o in review.outliers
        ]
        lines += ["", f"Next: {html.escape(NEXT_STEP, quote=False)}"]  # our text: its code spans are meant
    else:
        lines.append("No outliers.")
    if review.too_few:
        lines += ["", f"Too few to compare (fewer than {MIN_GROUP} values, not judged):", ""]
        lines += [f"- {_md_cell(line)}" for line in _too_few(review.too_few)]
    if review.ignored:
        lines += ["", "Ignored (the report gave them, but not as usable numbers):", ""]
        lines += [f"- {_md_cell(line)}" for line in _ignored_lines(review.ignored)]
    return lines


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
        "reported_host": node.reported_host or None,
        "tp_groups": list(node.tp_groups),
    }


def _outlier_dict(outlier: Outlier) -> dict[str, object]:
    figure = outlier.figure
    return {
        "node": figure.node,
        "gpu": figure.gpu,
        "metric": figure.metric,
        "value": figure.value,
        "unit": figure.unit,
        "better": figure.better,
        "median": outlier.median,
        "deviation": round(outlier.deviation, 4),
        "threshold": outlier.threshold,
        "group": figure.group,
        "group_size": outlier.size,
    }


def _review_dict(fleet: Fleet) -> dict[str, object]:
    review = fleet.review
    return {
        "rule": "deviation = (value - median) / median over the same GPU model (and GPU count); an outlier is "
        "beyond its threshold in the bad direction",
        "thresholds": review.thresholds.table(),
        "min_group": MIN_GROUP,
        "fail_on_outlier": fleet.fail_on_outlier,
        "nodes": list(review.hosts()),
        "found": [_outlier_dict(o) for o in review.outliers],
        "groups": [
            {
                "group": g.group,
                "metric": g.metric,
                "unit": g.unit,
                "better": g.better,
                "size": g.size,
                "median": g.median,
                "judged": g.judged,
            }
            for g in review.groups
        ],
        "ignored": [{"node": i.node, "where": i.where, "why": i.why} for i in review.ignored],
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
        "nodes": [
            _node_dict(n) | {"outliers": [_outlier_dict(o) for o in fleet.review.of_node(n.host)]} for n in fleet.nodes
        ],
        "outliers": _review_dict(fleet),
    }
    return json.dumps(document, indent=2, allow_nan=False) + "\n"


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
        if node.figures:
            failed += _junit_outliers(suite, node, fleet)
            cases += 1
        suite.attrib.update(tests=str(cases), failures=str(failed), errors="0", skipped=str(skipped))
        total, failures = total + cases, failures + failed
    root.attrib.update(tests=str(total), failures=str(failures))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _junit_outliers(suite: ET.Element, node: NodeReport, fleet: Fleet) -> int:
    """A `fleet_outliers` case for a node with figures: system-out when it has outliers (a warning), a failure
    with --fail-on-outlier. Returns the failures it added."""
    case = ET.SubElement(suite, "testcase", classname=f"sm120check.fleet.{xml_text(node.host)}", name="fleet_outliers")
    found = fleet.review.of_node(node.host)
    if not found:
        return 0
    lines = [
        f"{_gpu(o)} {o.figure.metric} {_number(o.figure.value, o.figure.unit)}: median "
        f"{_number(o.median, o.figure.unit)} ({_deviation(o)}) over {_group_of(o)}"
        for o in found
    ]
    text = xml_text("\n".join([*lines, f"next: {NEXT_STEP}"]))
    message = xml_text(f"{len(found)} figure{'s' if len(found) != 1 else ''} off the fleet median: {lines[0]}")
    if fleet.fail_on_outlier:
        ET.SubElement(case, "failure", message=message, type="outlier").text = text
        return 1
    ET.SubElement(case, "system-out").text = f"OUTLIER: {text}"
    return 0


def render(fleet: Fleet, fmt: str) -> str:
    renderers = {"table": table, "md": markdown, "json": to_json, "junit": to_junit}
    return renderers[fmt](fleet)

"""Read node reports from a fleet run directory (or one report file) into a Fleet.

A run directory holds `nodes/<host>.json` (playbooks/doctor.yml writes it that way); a directory of `<host>.json`
files works too. A node file is either the doctor's JSON report (`sm120check doctor --json`) or a stub the playbook
writes when there is none: {"host": ..., "state": "unreachable" | "no_checker" | "error", "error": "..."}.
The node's name is the file's name without `.json` (the inventory name, which may differ from the node's hostname).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sm120check import bounded
from sm120check.doctor.document import DoctorReport, ReportResult
from sm120check.doctor.payload import PayloadError
from sm120check.doctor.pcie.tp_groups import TpPlan
from sm120check.fleet.model import STUB_STATES, CheckResult, Fleet, NodeReport, NodeState, build_fleet
from sm120check.fleet.outliers import extract

NODES_DIR = "nodes"
AGGREGATE_TOOL = "sm120check fleet"  # the `tool` of fleet.json, never a node report
DOCTOR_TOOL = "sm120check doctor"  # the `tool` of a doctor report (`sm120check doctor --json`)
STUB_TOOL = "sm120kit fleet doctor"  # the `tool` of the stubs `fleet collect` writes
SCHEMA = 1  # the node report schema this reader understands (doctor JSON_SCHEMA, stub schema)
AGGREGATE_NAME = "fleet.json"  # where `fleet report --write` and `collect` put the aggregate: beside nodes/
# Bounds on one node file: a doctor report is tens of KiB and a few levels deep. Anything past them is that node's
# error, never a traceback that takes the other nodes' matrix with it.
MAX_NODE_BYTES = 16 << 20
MAX_JSON_DEPTH = 64
_EXCERPT = 200
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


class FleetInputError(Exception):
    """A path that holds no fleet run: the message names it and says what was expected."""


class NodeDocumentError(ValueError):
    """A node's output that is not a usable JSON document (too large, too deep, not JSON): the message says why."""


def parse_document(text: str) -> Any:
    """JSON with bounded size and nesting depth; NodeDocumentError says what is wrong (never RecursionError)."""
    if len(text) > MAX_NODE_BYTES:
        raise NodeDocumentError(f"node report is larger than {MAX_NODE_BYTES >> 20} MiB ({len(text)} characters)")
    depth = deepest = 0
    for match in _BRACKETS.finditer(_STRINGS.sub('""', text)):
        depth += 1 if match.group(0) in "[{" else -1
        if depth > deepest:
            deepest = depth
            if deepest > MAX_JSON_DEPTH:
                raise NodeDocumentError(f"node report is nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        excerpt = text.strip()[:_EXCERPT] or "(empty)"
        raise NodeDocumentError(f"node report is not JSON ({error.msg}): {excerpt}") from None
    except (RecursionError, ValueError) as error:  # belt and braces: the scan above should have caught it
        raise NodeDocumentError(f"node report cannot be parsed: {type(error).__name__}") from None


def node_from_document(host: str, document: object, source: str = "") -> NodeReport:
    """A node report from a parsed node file; anything that is not a doctor report with at least one result, or
    one of the playbook's stubs, is an ERROR node that says why (never an exception)."""
    try:
        return _node_from_document(host, document, source)
    except Exception as error:  # a reader must be total: one bad node never hides the others
        return NodeReport(host, NodeState.ERROR, error=f"node report cannot be read: {error!r}"[:500], source=source)


def _node_from_document(host: str, document: object, source: str) -> NodeReport:
    def bad(why: str) -> NodeReport:
        return NodeReport(host, NodeState.ERROR, error=why, source=source)

    if not isinstance(document, dict):
        return bad(f"node report is not a JSON object: {_excerpt(document)}")
    if document.get("tool") == AGGREGATE_TOOL and "results" not in document:
        return bad("this file is a fleet aggregate (fleet.json), not a node report; the node's doctor gave none")
    schema, tool = document.get("schema"), document.get("tool")
    if "results" in document:
        if tool != DOCTOR_TOOL or schema != SCHEMA:
            return bad(
                f"not a schema {SCHEMA} {DOCTOR_TOOL} report (schema {_excerpt(schema)}, tool {_excerpt(tool)}); "
                "run the same sm120check version on the node and here"
            )
    elif ("schema" in document and schema != SCHEMA) or ("tool" in document and tool != STUB_TOOL):
        return bad(f"node file of another schema or tool (schema {_excerpt(schema)}, tool {_excerpt(tool)})")
    stub_state = document.get("state")
    if document.get("unreachable") is True:
        stub_state = NodeState.UNREACHABLE.value
    if stub_state is not None and "results" not in document:
        error = document.get("error")
        why = error if isinstance(error, str) and error.strip() else str(stub_state)
        if stub_state not in STUB_STATES:
            return bad(
                f"node file has state {_excerpt(stub_state)}, which is not a stub state "
                f"({', '.join(STUB_STATES)}) and no doctor results: {_excerpt(document)}"
            )
        return NodeReport(host, NodeState(stub_state), error=why, source=source)
    results = document.get("results")
    if not isinstance(results, list):
        return bad(f"not a doctor report (no results list): {_excerpt(document)}")
    if not results:
        return bad("doctor report has no check results (no check ran), so it shows nothing ready")
    try:
        report = DoctorReport.from_json(document)  # the doctor's own type: a bad field is named
    except PayloadError as error:
        return bad(f"{error} ({_excerpt(_at(document, error.field))})")
    seen: set[str] = set()
    for result in report.results:
        if result.id in seen:
            return bad(f"doctor report has check {_excerpt(result.id)} more than once: not one run's report")
        seen.add(result.id)
    parsed = tuple(
        CheckResult(r.id, r.status.value, r.summary, r.details, r.remedy, r.level, r.family) for r in report.results
    )
    failed = any(r.status == "fail" for r in parsed)
    measured = extract(host, report.results)
    return NodeReport(
        host,
        NodeState.FAILED if failed else NodeState.READY,
        parsed,
        version=report.version,
        level=report.level,
        started=report.started,
        seconds=report.seconds,
        source=source,
        figures=measured.figures,
        ignored=measured.ignored,
        reported_host=report.host if report.host and report.host != host else "",
        tp_groups=_tp_groups(report.results),
    )


def _tp_groups(results: tuple[ReportResult, ...]) -> tuple[str, ...]:
    """The pcie_acs check's TP-group lines, only where the node's GPUs are behind several root complexes (one root
    complex: any order will do, nothing to say); a suggestion that does not parse is said so, in one line."""
    acs = next((r for r in results if r.id == "pcie_acs"), None)
    if acs is None or "tp_groups" not in acs.data:
        return ()
    try:
        plan = TpPlan.from_json(acs.data["tp_groups"])
    except PayloadError as error:
        return (f"pcie_acs's TP-group suggestion is unreadable: {error}"[:300],)
    return plan.lines if len(plan.roots) > 1 else ()


def _at(document: object, path: str) -> object:
    """The value at a PayloadError's field path ("results[2].summary"), for the error's excerpt; None if absent."""
    value = document
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if part.startswith("[") and isinstance(value, list) and int(part[1:-1]) < len(value):
            value = value[int(part[1:-1])]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return None
    return value


def read_node(path: Path, follow: bool = True) -> NodeReport:
    """One node file; unreadable, oversized, too deep or non-JSON content makes an ERROR node naming the file.
    With follow=False (the files of a run directory) a symbolic link is that node's error, never followed."""
    host = path.name.removesuffix(".json")
    try:
        if not follow and path.is_symlink():  # refused before the open, for every kind of link
            raise bounded.Unreadable(f"{path}: is a symbolic link, not followed in a run directory")
        document = parse_document(bounded.read_text(path, MAX_NODE_BYTES, follow))
    except bounded.Unreadable as error:
        return NodeReport(host, NodeState.ERROR, error=f"cannot read {error}", source=str(path))
    except NodeDocumentError as error:
        return NodeReport(host, NodeState.ERROR, error=f"{path}: {error}", source=str(path))
    return node_from_document(host, document, str(path))


def node_files(directory: Path) -> list[Path]:
    """The node files of a run directory: every nodes/*.json when there is a nodes/ directory, else every *.json
    but the aggregate fleet.json. What a file holds never makes it disappear: a node's output that looks like an
    aggregate is that node's error, not a file to skip."""
    nodes_dir = directory / NODES_DIR
    if nodes_dir.is_dir():
        return sorted(p for p in nodes_dir.glob("*.json") if p.is_symlink() or p.is_file())
    return sorted(p for p in directory.glob("*.json") if p.is_symlink() or (p.is_file() and not _is_aggregate(p)))


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
    return build_fleet([read_node(p, follow=False) for p in files], str(path))


def _is_aggregate(path: Path) -> bool:
    """A flat directory's fleet.json that `fleet report --write` made (by name and by its shape)."""
    if path.name != AGGREGATE_NAME:
        return False
    try:
        document = parse_document(bounded.read_text(path, MAX_NODE_BYTES))
    except (bounded.Unreadable, NodeDocumentError):
        return False
    return isinstance(document, dict) and document.get("tool") == AGGREGATE_TOOL and "nodes" in document


def _excerpt(value: object) -> str:
    try:
        text = json.dumps(value, default=str)
    except (RecursionError, ValueError):
        text = repr(type(value))
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + "..."

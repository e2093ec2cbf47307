"""Output formats: pure functions of a run's results (table, JSON, JUnit XML, Prometheus textfile)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sm120check.doctor import document
from sm120check.doctor.model import Result, Status
from sm120check.safetext import terminal_text, xml_text

JSON_SCHEMA = document.JSON_SCHEMA  # bump it there: a field changes meaning or disappears (adding one keeps it)


@dataclass(frozen=True)
class RunInfo:
    host: str
    version: str  # sm120check's
    started: str  # ISO 8601, UTC
    seconds: float
    level: int
    manifest: str  # path of the manifest read, "" when none
    started_epoch: float = 0.0
    interrupted: str = ""  # "SIGINT" / "SIGTERM" when the run was stopped before every check finished


def unfinished(results: Sequence[Result]) -> list[str]:
    """Ids of the checks an interrupted run did not finish."""
    return [r.id for r in results if r.data.get("interrupted")]


def counts(results: Sequence[Result]) -> dict[str, int]:
    tally = {status.value: 0 for status in Status}
    for result in results:
        tally[result.status.value] += 1
    tally["total"] = len(results)
    return tally


def tally_line(results: Sequence[Result], seconds: float) -> str:
    tally = counts(results)
    parts = ", ".join(f"{tally[s.value]} {s.value}" for s in Status)
    return f"{tally['total']} checks: {parts} ({seconds:.2f} s)"


def table(results: Sequence[Result], info: RunInfo) -> str:
    """The human report: one row per check, evidence and remedy under every row that did not pass."""
    width = max([len(r.id) for r in results] + [5])
    # Summaries, details and the host name carry text from outside (an Xid's process name is any user's pick):
    # each line goes through terminal_text, so no escape sequence reaches the terminal and no value adds a row.
    lines = [f"sm120check {info.version} doctor on {terminal_text(info.host, one_line=True)} (level <= {info.level})"]
    lines.append(f"{'CHECK'.ljust(width)}  STATUS  SUMMARY")
    pad = " " * (width + 10)
    said: dict[str, str] = {}  # remedy text -> the check under which it was printed
    for result in results:
        summary = terminal_text(result.summary, one_line=True)
        lines.append(f"{result.id.ljust(width)}  {result.status.value.upper():<6}  {summary}")
        if result.status is Status.PASS:
            continue
        for text, label in ((result.details, "details"), (result.remedy, "remedy")):
            if label == "remedy" and text and text in said:  # printed above: a prerequisite's, or the same fix
                blocked = result.status is Status.SKIP and result.summary.startswith("needs ")
                lines.append(f"{pad}remedy: " + (f"needs {said[text]}, see above" if blocked else f"as {said[text]}"))
                continue
            if text:
                body = [terminal_text(line, one_line=True) for line in text.strip().splitlines()]
                lines.append(f"{pad}{label}: {body[0]}")
                lines.extend(f"{pad}  {more}" for more in body[1:])
        if result.remedy:
            said.setdefault(result.remedy, result.id)
    if info.interrupted:
        left = unfinished(results)
        lines.append(f"interrupted by {info.interrupted}: {len(left)} check(s) did not finish ({', '.join(left)})")
    lines.extend(footer(results, info.level))
    lines.append(tally_line(results, info.seconds))
    return "\n".join(lines) + "\n"


_FIRST = {Status.FAIL: 0, Status.WARN: 1, Status.SKIP: 2, Status.PASS: 3}


def fix_first(results: Sequence[Result]) -> tuple[Result, int] | None:
    """The result to fix first and how many other checks wait on it: among the non-passing results with a remedy of
    their own (not one inherited from a prerequisite), the one whose remedy the most others carry, a failure before a
    warning before a skip."""
    roots: list[tuple[int, int, int, Result]] = []
    seen: set[str] = set()
    for position, result in enumerate(results):
        if result.status is Status.PASS or not result.remedy or result.remedy in seen:
            continue
        seen.add(result.remedy)
        waiting = sum(1 for other in results if other is not result and other.remedy == result.remedy)
        roots.append((-waiting, _FIRST[result.status], position, result))
    if not roots:
        return None
    waiting, _, _, first = min(roots, key=lambda root: root[:3])
    return first, -waiting


def gpu_count(results: Sequence[Result]) -> int:
    """The GPUs the driver check saw (0 when it did not run or saw none)."""
    for result in results:
        count = result.data.get("gpu_count") if result.id == "driver" else None
        if isinstance(count, int):
            return count
    return 0


def footer(results: Sequence[Result], level: int) -> list[str]:
    """What to do next: the fix that unblocks the most, and level 3 on a node of several GPUs."""
    lines: list[str] = []
    first = fix_first(results)
    if first is not None and any(r.status is not Status.PASS for r in results):
        result, waiting = first
        also = f"; {waiting} other check(s) wait on it" if waiting else ""
        remedy = terminal_text(result.remedy.strip().splitlines()[0], one_line=True)
        lines.append(f"fix first: {result.id} ({result.status.value}{also}): {remedy}")
    gpus = gpu_count(results)
    if level < 3 and gpus > 1:
        lines.append(
            f"this node has {gpus} GPUs: `sm120check doctor --level 3` also runs the multi-GPU checks (NCCL on "
            f"every GPU pair, P2P), which level {level} leaves out"
        )
    return lines


def to_json(results: Sequence[Result], info: RunInfo) -> str:
    """Stable JSON, the typed DoctorReport (doctor/document.py): schema, tool, version, host, started, seconds,
    level, manifest, results, summary (and interrupted, when the run was stopped)."""
    report = document.build(
        results,
        version=info.version,
        host=info.host,
        started=info.started,
        seconds=info.seconds,
        level=info.level,
        manifest=info.manifest,
        interrupted=info.interrupted,
    )
    return json.dumps(report.to_json(), indent=2, default=str) + "\n"


def to_junit(results: Sequence[Result], info: RunInfo) -> str:
    """JUnit XML for CI: fail -> <failure>, skip -> <skipped>, warn passes with the warning in system-out."""
    tally = counts(results)
    suite = ET.Element(
        "testsuite",
        name="sm120check.doctor",
        tests=str(tally["total"]),
        failures=str(tally["fail"]),
        errors="0",
        skipped=str(tally["skip"]),
        time=f"{info.seconds:.3f}",
        timestamp=xml_text(info.started),
        hostname=xml_text(info.host),
    )
    for result in results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=xml_text(f"sm120check.{result.family or 'doctor'}"),
            name=xml_text(result.id),
            time=f"{result.seconds:.3f}",
        )
        # Probe output carries ANSI colours and control characters that XML 1.0 forbids: without this the file is
        # not well-formed and CI rejects the whole report.
        evidence = "\n".join(t for t in (result.details, f"remedy: {result.remedy}" if result.remedy else "") if t)
        evidence, summary = xml_text(evidence), xml_text(result.summary)
        if result.status is Status.FAIL:
            ET.SubElement(case, "failure", message=summary, type="fail").text = evidence
        elif result.status is Status.SKIP:
            ET.SubElement(case, "skipped", message=summary)
        elif result.status is Status.WARN:
            ET.SubElement(case, "system-out").text = f"WARN: {summary}\n{evidence}".rstrip()
    root = ET.Element("testsuites", name="sm120check", tests=str(tally["total"]), failures=str(tally["fail"]))
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _numbers(data: Mapping[str, object], prefix: str = "") -> list[tuple[str, float]]:
    """Numeric leaves of a result's data (bools as 0/1, nested mappings joined with '.')."""
    found: list[tuple[str, float]] = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool):
            found.append((name, 1.0 if value else 0.0))
        elif isinstance(value, (int, float)) and math.isfinite(value):
            found.append((name, float(value)))
        elif isinstance(value, Mapping):
            found.extend(_numbers(value, f"{name}."))
    return found


def to_prometheus(results: Sequence[Result], info: RunInfo) -> str:
    """A node_exporter textfile: one-hot status per check, durations, numeric measured data."""
    out = [
        "# HELP sm120check_check_status Doctor verdict of a check: 1 for its status, 0 for the others.",
        "# TYPE sm120check_check_status gauge",
    ]
    for result in results:
        for status in Status:
            hot = 1 if result.status is status else 0
            out.append(
                f'sm120check_check_status{{check="{_label(result.id)}",family="{_label(result.family)}",'
                f'status="{status.value}"}} {hot}'
            )
    out += [
        "# HELP sm120check_check_duration_seconds Wall time of a check.",
        "# TYPE sm120check_check_duration_seconds gauge",
    ]
    out += [f'sm120check_check_duration_seconds{{check="{_label(r.id)}"}} {r.seconds:.6f}' for r in results]
    out += [
        "# HELP sm120check_check_data Numeric evidence measured by a check (key names the measurement).",
        "# TYPE sm120check_check_data gauge",
    ]
    for result in results:
        for key, value in _numbers(result.data):
            out.append(f'sm120check_check_data{{check="{_label(result.id)}",key="{_label(key)}"}} {value:g}')
    tally = counts(results)
    out += [
        "# HELP sm120check_checks Checks of the last doctor run by status.",
        "# TYPE sm120check_checks gauge",
    ]
    out += [f'sm120check_checks{{status="{s.value}"}} {tally[s.value]}' for s in Status]
    out += [
        "# HELP sm120check_last_run_timestamp_seconds When the last doctor run started (Unix time).",
        "# TYPE sm120check_last_run_timestamp_seconds gauge",
        f"sm120check_last_run_timestamp_seconds {info.started_epoch:.3f}",
        "# HELP sm120check_run_duration_seconds Wall time of the last doctor run.",
        "# TYPE sm120check_run_duration_seconds gauge",
        f"sm120check_run_duration_seconds {info.seconds:.6f}",
        "# HELP sm120check_info The sm120check version and host of the last run.",
        "# TYPE sm120check_info gauge",
        f'sm120check_info{{version="{_label(info.version)}",host="{_label(info.host)}"}} 1',
    ]
    return "\n".join(out) + "\n"


# --- report files and stdout: the files are the record (cron, node_exporter), stdout is for whoever watches ---

REPORT_FILE_MODE = 0o644  # node_exporter reads the textfile as its own user


def output_problem(path: Path) -> str:
    """Why a report file cannot be written at `path` ("" when it can), found before any check runs: the target is
    not a directory, its directory exists, and a file can be created there (read-only file systems, permissions)."""
    if path.is_dir():
        return f"{path} is a directory; give a file name"
    parent = path.parent
    if not parent.is_dir():
        return f"{path}: the directory {parent} does not exist"
    try:
        handle, probe = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".probe")
    except OSError as exc:
        return f"{path} cannot be written: {exc.strerror or exc}"
    os.close(handle)
    with contextlib.suppress(OSError):
        Path(probe).unlink()
    return ""


def write_file(path: Path, text: str) -> None:
    """Write atomically (a new temporary file in the same directory, then rename): readers see the old file or the
    new one, never half of one, and nothing is left behind on failure. An OSError names `path`, not the temporary."""
    tmp: Path | None = None
    try:
        handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        tmp = Path(name)
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fchmod(stream.fileno(), REPORT_FILE_MODE)
        tmp.replace(path)
    except OSError as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise OSError(exc.errno, exc.strerror, str(path)) from None

"""A verify-launch report as the user sees it: the exit code, the JSON document and the text."""

from __future__ import annotations

from sm120check.exitcodes import Exit
from sm120check.safetext import terminal_text
from sm120check.sglang.launch_verdict import LaunchReport

SCHEMA = "sm120check.verify-launch/1"


def exit_code(report: LaunchReport, strict: bool = False) -> Exit:
    if report.failed or (strict and report.unknown):
        return Exit.FOUND
    return Exit.OK


def to_dict(report: LaunchReport) -> dict[str, object]:
    log = report.log
    return {
        "schema": SCHEMA,
        "sglang_version": report.version,
        "version_origin": report.version_origin,
        "url": report.url,
        "expected": [e.value for e in report.request.expected],
        "expected_origin": report.request.origin,
        "log": None
        if log is None
        else {
            "source": log.source,
            "lines": log.lines,
            "truncated": log.truncated,
            "start_line": log.start_line,
            "starts": log.starts,
            "ready": log.ready,
            "complete": report.log_complete,
        },
        "verdicts": [
            {
                "expectation": v.expectation.value,
                "verdict": v.verdict.value,
                "summary": v.summary,
                "fix": v.fix,
                "evidence": [
                    {
                        "source": x.source,
                        "sign": x.sign.value,
                        "text": x.text,
                        "pattern": x.pattern,
                        "line": x.line,
                        "count": x.count,
                        "fix": x.fix,
                    }
                    for x in v.evidence
                ],
            }
            for v in report.verdicts
        ],
        "lines": [v.line for v in report.verdicts],
        "degraded": [v.expectation.value for v in report.degraded],
        "unknown": [v.expectation.value for v in report.unknown],
        "failed_start": report.failed_start or None,
        "problems": ([report.failed_start] if report.failed_start else [])
        + [v.line for v in report.degraded]
        + ([report.switch_problem] if report.switch_problem else [])
        + ([report.http_workers_problem] if report.http_workers_problem else []),
        "data": {
            "avg_spec_accept_length": report.info.accept_length if report.info else None,
            "graph_memory_gb": report.info.graph_memory_gb if report.info else None,
            "max_running_requests": report.info.max_running_requests if report.info else None,
            "plain_decode": report.switch.to_dict() if report.switch else None,
            "http_workers": report.http_workers.to_dict() if report.http_workers else None,
            "allreduce_backend": report.allreduce.backend.value if report.allreduce else "unknown",
            "allreduce": report.allreduce.to_dict() if report.allreduce else None,
        },
        "notes": list(report.notes),
    }


def render(report: LaunchReport) -> str:
    version = f"SGLang {report.version} ({report.version_origin})" if report.version else "SGLang (version unknown)"
    where = [version]
    if report.url:
        where.append(f"at {report.url}")
    if report.log:
        start = f"this run from line {report.log.start_line}" if report.log.start_line else "no server start seen"
        where.append(f"log: {report.log.source}, {report.log.lines} lines, {start}")
    lines = [
        "; ".join(where),
        f"expected ({report.request.origin}): {', '.join(e.value for e in report.request.expected)}",
    ]
    for v in report.verdicts:
        lines.append(f"  {v.verdict.value:<9} {v.expectation.value:<12} {v.summary}")
        if v.fix:
            lines.append(f"  {'':<9} {'':<12} fix: {v.fix}")
    lines.extend(f"note: {n}" for n in report.notes)
    if report.failed_start:
        lines.append(report.failed_start)
    if report.switch_problem:
        lines.append(report.switch_problem)
    if report.http_workers_problem:
        lines.append(report.http_workers_problem)
    lines = [terminal_text(line, one_line=True) for line in lines]  # the server's version and log text among them
    if report.failed_start:
        lines.append("the server did not start: the verdicts above judge another process")
    elif report.switch_problem:
        lines.append("the speculation switch is not as launched")
    elif report.http_workers_problem:
        lines.append("the server lost HTTP processes while it served")
    elif report.degraded:
        names = ", ".join(v.expectation.value for v in report.degraded)
        lines.append(f"{len(report.degraded)} of {len(report.verdicts)} degraded: {names}")
    elif report.unknown:
        lines.append(f"nothing degraded; unknown: {', '.join(v.expectation.value for v in report.unknown)}")
    else:
        lines.append("the server runs what the launch asked for")
    return "\n".join(lines)

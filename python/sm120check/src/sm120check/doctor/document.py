"""The doctor's JSON report as one type: `sm120check doctor --json` writes a DoctorReport, the fleet loader reads one
(strictly: a bad field is an error naming it), and the Jinja node summary and the sglang_server role read its JSON.

Schema 1 (bump JSON_SCHEMA when a field changes meaning or disappears; adding fields keeps it)::

    {"schema": 1, "tool": "sm120check doctor", "version": "0.1.0", "host": "node-1",
     "started": "2026-11-30T12:00:00+00:00", "seconds": 4.2, "level": 2, "manifest": "/etc/sm120kit/manifest.json",
     "results": [{"id": "driver", "family": "driver", "level": 1, "status": "pass", "summary": "...",
                  "details": "...", "remedy": "", "data": {...}, "seconds": 0.31}, ...],
     "summary": {"pass": 9, "warn": 1, "fail": 0, "skip": 2, "total": 12},
     "interrupted": {"signal": "SIGINT", "unfinished": ["torch"]}}   <- only when the run was stopped
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sm120check.doctor.model import Result, Status
from sm120check.doctor.payload import Fields, PayloadError

JSON_SCHEMA = 1
TOOL = "sm120check doctor"
WHAT = "doctor report"  # how a PayloadError names this document


@dataclass(frozen=True)
class ReportResult:
    """One check's result as the report carries it (`data` is the check's own measured numbers, free-form JSON)."""

    id: str
    status: Status
    summary: str = ""
    details: str = ""
    remedy: str = ""
    family: str = ""
    level: int = 0
    data: Mapping[str, object] = field(default_factory=dict)
    seconds: float = 0.0

    @classmethod
    def of(cls, result: Result) -> ReportResult:
        return cls(
            result.id,
            result.status,
            result.summary,
            result.details,
            result.remedy,
            result.family,
            result.level,
            dict(result.data),
            round(result.seconds, 4),
        )

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "family": self.family,
            "level": self.level,
            "status": self.status.value,
            "summary": self.summary,
            "details": self.details,
            "remedy": self.remedy,
            "data": dict(self.data),
            "seconds": self.seconds,
        }

    @classmethod
    def from_json(cls, f: Fields) -> ReportResult:
        status = f.text("status")
        if status not in {s.value for s in Status}:
            raise PayloadError(WHAT, f.at("status"), f"expected one of {', '.join(s.value for s in Status)}")
        return cls(
            f.text("id"),
            Status(status),
            f.text("summary"),
            f.text("details"),
            f.text("remedy"),
            f.text("family"),
            f.integer("level"),
            f.object("data").data,
            _seconds(f, "seconds"),
        )


@dataclass(frozen=True)
class Interruption:
    signal: str  # "SIGINT" / "SIGTERM"
    unfinished: tuple[str, ...]  # ids of the checks that did not finish


@dataclass(frozen=True)
class DoctorReport:
    version: str  # sm120check's
    host: str
    started: str  # ISO 8601, UTC
    seconds: float
    level: int
    manifest: str | None  # path of the manifest read, None when none
    results: tuple[ReportResult, ...]
    interrupted: Interruption | None = None
    schema: int = JSON_SCHEMA
    tool: str = TOOL

    @property
    def summary(self) -> dict[str, int]:
        tally = {status.value: 0 for status in Status}
        for result in self.results:
            tally[result.status.value] += 1
        tally["total"] = len(self.results)
        return tally

    def to_json(self) -> dict[str, object]:
        document: dict[str, object] = {
            "schema": self.schema,
            "tool": self.tool,
            "version": self.version,
            "host": self.host,
            "started": self.started,
            "seconds": self.seconds,
            "level": self.level,
            "manifest": self.manifest,
            "results": [r.to_json() for r in self.results],
            "summary": self.summary,
        }
        if self.interrupted is not None:  # only then: a finished run's document is unchanged
            document["interrupted"] = {
                "signal": self.interrupted.signal,
                "unfinished": list(self.interrupted.unfinished),
            }
        return document

    @classmethod
    def from_json(cls, data: object) -> DoctorReport:
        """Strict: every field of schema 1 with its type (PayloadError names the first bad one). `summary` is not
        read: it is counted from the results."""
        f = Fields(WHAT, data)
        schema, tool = f.integer("schema"), f.text("tool")
        if schema != JSON_SCHEMA or tool != TOOL:
            raise PayloadError(WHAT, "schema", f"expected schema {JSON_SCHEMA} of {TOOL!r}, got {schema} of {tool!r}")
        interrupted = None
        if f.has("interrupted"):
            stop = f.object("interrupted")
            interrupted = Interruption(stop.text("signal"), stop.texts("unfinished"))
        return cls(
            f.text("version"),
            f.text("host"),
            f.text("started"),
            _seconds(f, "seconds"),
            f.integer("level"),
            f.maybe_text("manifest"),
            tuple(ReportResult.from_json(r) for r in f.objects("results")),
            interrupted,
        )


def _seconds(f: Fields, name: str) -> float:
    value = f.number(name)
    if not math.isfinite(value) or value < 0:
        raise PayloadError(WHAT, f.at(name), f"expected a non-negative number of seconds, got {value}")
    return value


def build(
    results: Sequence[Result],
    *,
    version: str,
    host: str,
    started: str,
    seconds: float,
    level: int,
    manifest: str,
    interrupted: str = "",
) -> DoctorReport:
    """The report of a run; `interrupted` the signal's name when the run was stopped ("" when it finished)."""
    stopped = None
    if interrupted:
        stopped = Interruption(interrupted, tuple(r.id for r in results if r.data.get("interrupted")))
    return DoctorReport(
        version,
        host,
        started,
        round(seconds, 4),
        level,
        manifest or None,
        tuple(ReportResult.of(r) for r in results),
        stopped,
    )

"""The startup log of an SGLang server scanned against the log table: the last run's matching lines."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sm120check.sglang.launch_patterns import LOG_PATTERNS, LogPattern
from sm120check.sglang.launch_terms import Sign, printable

MAX_LINE_CHARS = 64 << 10  # longer log lines are cut (the server_args line of 0.5.23 is ~25 KiB)
EVIDENCE_CHARS = 400
# uvicorn's line when the HTTP port cannot be bound ("[Errno 98] error while attempting to bind on address
# ('127.0.0.1', 30000): address already in use"). SGLang's warmup then reaches whatever holds the port, may print
# that it is ready, and exits: this run never served.
BIND_ERROR = re.compile(r"error while attempting to bind on address (?P<address>\(.{0,300}?\)): (?P<reason>.{0,300})")


@dataclass(frozen=True)
class LogMatch:
    pattern: LogPattern
    line: int  # 1-based, in what was read
    text: str
    count: int  # lines matching it since the last start
    details: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LogScan:
    source: str  # "--log FILE" or "journal of unit NAME"
    lines: int
    truncated: bool  # the read cap cut the beginning off
    start_line: int | None  # the last server-start line; matches are from there on
    starts: int
    ready: bool  # the ready line follows the last start
    matches: tuple[LogMatch, ...]
    bind_error_line: int | None = None  # this run's HTTP server could not bind its port (BIND_ERROR)
    bind_error: str = ""

    @property
    def covers_start(self) -> bool:
        return self.start_line is not None

    def complete(self, server_up: bool) -> bool:
        """The log holds every startup line of this run: its start, and its end (the ready line, or a server that
        answered /server_info before the log was read: it serves only after its startup)."""
        return self.covers_start and (self.ready or server_up)


def scan_log(lines: Iterable[str], source: str, truncated: bool = False) -> LogScan:
    """Match every table pattern against the log; only lines after the last server start count."""
    start = next(p for p in LOG_PATTERNS if p.sign is Sign.START)
    ready_line = next(p for p in LOG_PATTERNS if p.sign is Sign.READY)
    patterns = [p for p in LOG_PATTERNS if p.expectation is not None]
    first: dict[str, LogMatch] = {}
    counts: dict[str, int] = {}
    start_line: int | None = None
    starts = 0
    ready = False
    bind: tuple[int, str] | None = None
    number = 0
    for number, raw in enumerate(lines, 1):
        line = raw[:MAX_LINE_CHARS]
        if start.compiled.search(line):
            if start_line is None or first or ready:  # the offline Engine logs its arguments twice in a row
                starts += 1
            start_line, ready, bind = number, False, None
            first.clear()
            counts.clear()
            continue
        if ready_line.compiled.search(line):
            ready = True
            continue
        if bind is None and BIND_ERROR.search(line):
            bind = number, printable(line.strip())[:EVIDENCE_CHARS]
            continue
        for pattern in patterns:
            m = pattern.compiled.search(line)
            if m is None:
                continue
            counts[pattern.id] = counts.get(pattern.id, 0) + 1
            if pattern.id not in first:
                details = {k: printable(v)[:200] for k, v in m.groupdict().items() if v is not None}
                first[pattern.id] = LogMatch(pattern, number, printable(line.strip())[:EVIDENCE_CHARS], 0, details)
    matches = tuple(
        LogMatch(m.pattern, m.line, m.text, counts[m.pattern.id], m.details)
        for m in sorted(first.values(), key=lambda m: m.line)
    )
    bind_line, bind_text = bind if bind is not None else (None, "")
    return LogScan(source, number, truncated, start_line, starts, ready, matches, bind_line, bind_text)

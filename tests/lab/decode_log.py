"""Test support (the GPU tests and their recorded logs): what an SGLang server says about its own decoding, the
"Decode batch" lines its scheduler logs every `--decode-log-interval` steps (SGLang 0.5.16
`managers/scheduler_components/metrics_reporter.py`).

A line reads, for example (the server's own text; the accept fields only with speculation):

    [2026-12-01 22:10:40] Decode batch, #running-req: 8, #token: 2112, token usage: 0.00, accept len: 3.42,
    accept rate: 0.81, cuda graph: True, gen throughput (token/s): 1843.20, #queue-req: 0

`server_view` groups these by running requests: under a closed-loop bench at concurrency C the steady state is the
lines with C running requests and an empty queue, so the server's own throughput and accept length at level C are
the medians of those lines. A bench that reads the responses can be held against them (tests/gpu).

Its "Prefill batch" lines (same file) give each prefill's new sequences and tokens, the requests already running, and
the input throughput since the previous prefill line; `prefill_view` takes the median over full-chunk prefills, the
figure two servers' prefill paths are compared by.
"""

from __future__ import annotations

import calendar
import re
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

_LINE = re.compile(r"Decode batch(?: \[\d+\])?, #running-req: (?P<running>\d+), (?P<rest>.*)$")
_FIELDS = {
    "accept_length": re.compile(r"(?:^|, )accept len: (?P<v>[0-9.]+)"),
    "gen_tok_s": re.compile(r"gen throughput \(token/s\): (?P<v>[0-9.]+)"),
    "queued": re.compile(r"#queue-req: (?P<v>\d+)"),
}
_GRAPH = re.compile(r"(?:cuda graph|[a-z_ ]*graph): (?P<v>True|False)")


@dataclass(frozen=True)
class DecodeLine:
    """One "Decode batch" line: the requests running, the throughput since the last line, the accept length
    (None without speculation), the queue, and whether the step ran as a CUDA graph."""

    line: int  # 1-based, in the text read
    running: int
    gen_tok_s: float
    queued: int
    cuda_graph: bool | None
    accept_length: float | None


@dataclass(frozen=True)
class LevelView:
    """The server's own figures for one number of running requests (the steady lines: nothing queued)."""

    running: int
    lines: int
    gen_tok_s: float  # median
    accept_length: float | None  # median, None without speculation
    cuda_graph: bool | None  # every line said True (False if any said False, None if none said)


def parse(text: Iterable[str]) -> list[DecodeLine]:
    """Every well-formed "Decode batch" line; other lines (and cut ones) are skipped."""
    rows: list[DecodeLine] = []
    for number, raw in enumerate(text, 1):
        match = _LINE.search(raw)
        if match is None:
            continue
        rest = match["rest"]
        found = {name: pattern.search(rest) for name, pattern in _FIELDS.items()}
        gen, queued = found["gen_tok_s"], found["queued"]
        if gen is None or queued is None:
            continue
        accept = found["accept_length"]
        graph = _GRAPH.search(rest)
        rows.append(
            DecodeLine(
                line=number,
                running=int(match["running"]),
                gen_tok_s=float(gen["v"]),
                queued=int(queued["v"]),
                cuda_graph=None if graph is None else graph["v"] == "True",
                accept_length=None if accept is None else float(accept["v"]),
            )
        )
    return rows


def server_view(rows: Sequence[DecodeLine], *, after: int = 0) -> Mapping[int, LevelView]:
    """Per number of running requests, the medians of the steady lines (nothing queued) after line `after`.
    A line's throughput covers the steps since the previous line, so the first line of a run of equal
    `running` values (the ramp into a level) is left out."""
    groups: dict[int, list[DecodeLine]] = {}
    previous: int | None = None
    for row in rows:
        if row.line <= after:
            continue
        if row.queued == 0 and row.running == previous:
            groups.setdefault(row.running, []).append(row)
        previous = row.running
    views: dict[int, LevelView] = {}
    for running, group in sorted(groups.items()):
        accepts = [r.accept_length for r in group if r.accept_length is not None]
        graphs = [r.cuda_graph for r in group if r.cuda_graph is not None]
        views[running] = LevelView(
            running=running,
            lines=len(group),
            gen_tok_s=statistics.median(r.gen_tok_s for r in group),
            accept_length=statistics.median(accepts) if accepts else None,
            cuda_graph=all(graphs) if graphs else None,
        )
    return views


@dataclass(frozen=True)
class LevelRate:
    """The server's own throughput over a stretch of its log: tokens generated over the time they took."""

    lines: int
    tokens: float
    seconds: float

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def level_rate(rows: Sequence[DecodeLine], *, after: int, interval: int) -> LevelRate | None:
    """Throughput over every "Decode batch" line after line `after`, from the server's own numbers: a line covers
    `interval` decode steps (--decode-log-interval) of `running` requests, each step `accept_length` tokens a request
    with speculation, and its throughput gives the seconds they took (its own wall clock, prefills between steps
    included). The first line is left out: its span reaches back over the idle time before the level."""
    chosen = [r for r in rows if r.line > after][1:]
    spans = [(interval * r.running * (r.accept_length or 1.0), r.gen_tok_s) for r in chosen if r.gen_tok_s > 0]
    if not spans:
        return None
    tokens = sum(t for t, _ in spans)
    return LevelRate(len(spans), tokens, sum(t / rate for t, rate in spans))


_PREFILL = re.compile(
    r"Prefill batch(?: \[\d+\])?, #new-seq: (?P<seqs>\d+), #new-token: (?P<tokens>\d+), .*?"
    r"#running-req: (?P<running>\d+), .*?input throughput \(token/s\): (?P<tok_s>[0-9.]+)"
)


@dataclass(frozen=True)
class PrefillLine:
    """One "Prefill batch" line: new sequences and tokens, requests already running, input tokens/s since the last."""

    line: int
    new_seqs: int
    new_tokens: int
    running: int
    input_tok_s: float


def parse_prefills(text: Iterable[str]) -> list[PrefillLine]:
    """Every well-formed "Prefill batch" line; other lines are skipped."""
    rows = []
    for number, raw in enumerate(text, 1):
        m = _PREFILL.search(raw)
        if m is not None:
            rows.append(PrefillLine(number, int(m["seqs"]), int(m["tokens"]), int(m["running"]), float(m["tok_s"])))
    return rows


def prefill_view(rows: Sequence[PrefillLine], *, chunk: int, min_running: int = 0) -> dict[str, float | int | None]:
    """Full-chunk prefills (`chunk` new tokens, the server's --chunked-prefill-size) with at least `min_running`
    requests running: how many, and the median and quartiles of their input tokens/s (None when there are none)."""
    rates = sorted(r.input_tok_s for r in rows if r.new_tokens == chunk and r.running >= min_running)
    if not rates:
        return {"prefills": 0, "input_tok_s_median": None, "input_tok_s_p25": None, "input_tok_s_p75": None}
    q = statistics.quantiles(rates, n=4) if len(rates) > 1 else [rates[0]] * 3
    return {"prefills": len(rates), "input_tok_s_median": round(statistics.median(rates), 1),
            "input_tok_s_p25": round(q[0], 1), "input_tok_s_p75": round(q[2], 1)}  # fmt: skip


_STAMP = re.compile(r"^\[(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]")


def stamp_epoch(raw: str, utc: bool = False) -> int | None:
    """The whole second a log line is stamped with (SGLang's `[YYYY-MM-DD HH:MM:SS]`, the host's local time unless
    `utc`) as epoch seconds; None for a line without one."""
    m = _STAMP.match(raw)
    if m is None:
        return None
    parsed = time.strptime(m["stamp"], "%Y-%m-%d %H:%M:%S")
    return calendar.timegm(parsed) if utc else int(time.mktime(parsed))


@dataclass(frozen=True)
class PrefillBatching:
    """The prefills logged within one stretch of time: how many batches and how many requests they took in."""

    batches: int
    requests: int

    @property
    def per_batch(self) -> float | None:
        return round(self.requests / self.batches, 2) if self.batches else None


def prefill_batching(text: Iterable[str], start: float, end: float, utc: bool = False) -> PrefillBatching:
    """The "Prefill batch" lines stamped in whole seconds inside [start, end] (epoch seconds, a bench level's window):
    a second cut by either end is left out, so the ramp of a neighbouring level does not count."""
    batches = requests = 0
    for raw in text:
        m = _PREFILL.search(raw)
        if m is None or (second := stamp_epoch(raw, utc)) is None:
            continue
        if start <= second and second + 1 <= end:
            batches += 1
            requests += int(m["seqs"])
    return PrefillBatching(batches, requests)


_PROFILE_START = re.compile(r"Profiling starts\b")
_PROFILE_STOP = re.compile(r"Stop profiling\b")


def profiled_prefills(text: Iterable[str]) -> list[dict[str, int]]:
    """Each window of SGLang's profiler (from "Profiling starts" to "Stop profiling", by stage or not), in order: the
    prefills logged in it and their new tokens. A window that never stopped is not counted."""
    covered: list[dict[str, int]] = []
    window: dict[str, int] | None = None
    for raw in text:
        m = _PREFILL.search(raw)
        if m is not None:
            if window is not None:
                window["prefills"] += 1
                window["new_tokens"] += int(m["tokens"])
        elif _PROFILE_START.search(raw):
            window = {"prefills": 0, "new_tokens": 0}
        elif _PROFILE_STOP.search(raw) and window is not None:
            covered.append(window)
            window = None
    return covered

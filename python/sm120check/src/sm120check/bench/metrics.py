"""A strict, small reader of the Prometheus text format (what llama.cpp, vLLM and SGLang serve at /metrics), and the
per-level difference of the speculative-decoding counters.

The text comes from a server the bench does not control, so it is bounded (size, line count, label count) and a line
that is not a sample is skipped and named in `Scrape.problems`, never guessed at. Only what the bench reads is
parsed: `name{label="value",...} value [timestamp]`; `# HELP` / `# TYPE` and other comments are skipped.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

MAX_BYTES = 4 << 20  # a /metrics page of a busy vLLM is ~100 KiB
MAX_LINES = 50_000
MAX_LABELS = 32
_MAX_PROBLEMS = 5

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class MetricsError(ValueError):
    """A /metrics body that cannot be read at all (too large, not text)."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True)
class Scrape:
    """Every sample of one /metrics page, and the lines skipped (at most a few, each with its line number)."""

    samples: tuple[Sample, ...] = ()
    problems: tuple[str, ...] = ()
    skipped: int = 0

    def value(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """The sum of `name`'s samples whose labels include `labels`; None when there is none."""
        want = set((labels or {}).items())
        found = [s.value for s in self.samples if s.name == name and want <= set(s.labels)]
        return sum(found) if found else None

    def series(self, name: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name]

    def has_prefix(self, prefix: str) -> bool:
        return any(s.name.startswith(prefix) for s in self.samples)


def parse(text: str | bytes) -> Scrape:
    """Parse exposition text; raises MetricsError only for a body that is too large or not UTF-8."""
    if len(text) > MAX_BYTES:
        raise MetricsError(f"/metrics body is {len(text)} bytes, above the {MAX_BYTES} the bench reads")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MetricsError(f"/metrics body is not UTF-8 text ({exc})") from None
    lines = text.split("\n")
    if len(lines) > MAX_LINES:
        raise MetricsError(f"/metrics body has {len(lines)} lines, above the {MAX_LINES} the bench reads")
    samples: list[Sample] = []
    problems: list[str] = []
    skipped = 0
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            samples.append(_sample(line))
        except ValueError as exc:
            skipped += 1
            if len(problems) < _MAX_PROBLEMS:
                problems.append(f"line {number}: {exc}: {line[:80]!r}")
    return Scrape(tuple(samples), tuple(problems), skipped)


def _sample(line: str) -> Sample:
    match = _NAME.match(line)
    if not match:
        raise ValueError("no metric name")
    name, pos = match.group(0), match.end()
    labels: list[tuple[str, str]] = []
    if pos < len(line) and line[pos] == "{":
        pos += 1
        while True:
            while pos < len(line) and line[pos] in " \t":
                pos += 1
            if pos < len(line) and line[pos] == "}":
                pos += 1
                break
            label = _LABEL_NAME.match(line, pos)
            if not label or line[label.end() : label.end() + 2] != '="':
                raise ValueError("bad label")
            pos = label.end() + 2
            chars: list[str] = []
            while True:
                if pos >= len(line):
                    raise ValueError("unterminated label value")
                ch = line[pos]
                if ch == "\\":
                    if pos + 1 >= len(line) or line[pos + 1] not in _ESCAPES:
                        raise ValueError("bad escape in a label value")
                    chars.append(_ESCAPES[line[pos + 1]])
                    pos += 2
                    continue
                pos += 1
                if ch == '"':
                    break
                chars.append(ch)
            labels.append((label.group(0), "".join(chars)))
            if len(labels) > MAX_LABELS:
                raise ValueError(f"more than {MAX_LABELS} labels")
            if pos < len(line) and line[pos] == ",":
                pos += 1
            elif pos < len(line) and line[pos] == "}":
                pos += 1
                break
            else:
                raise ValueError("labels not separated by ','")
    rest = line[pos:].split()
    if not rest or len(rest) > 2 or (pos < len(line) and line[pos] not in " \t"):
        raise ValueError("want 'name value [timestamp]'")
    value = _number(rest[0])
    if len(rest) == 2:
        _number(rest[1])  # a timestamp: checked, not kept
    return Sample(name, tuple(labels), value)


def _number(text: str) -> float:
    special = {"+Inf": math.inf, "Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}
    if text in special:
        return special[text]
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", text):
        raise ValueError(f"value {text[:30]!r} is not a number")
    return float(text)


# -- speculative decoding counters, differenced per level -------------------------------------------------------


class AcceptRatio(enum.Enum):
    """How a family's two counters, each grown over the level, give tokens per verify step."""

    # llama.cpp, vLLM: the token counter counts accepted draft tokens; each verify step also gives the target's own
    ONE_PLUS_ACCEPTED_PER_STEP = "1 + accepted / verify steps"
    # SGLang: the token counter counts every token generated (meta_info's completion_tokens / spec_verify_ct)
    TOKENS_PER_STEP = "generation tokens / verify steps"

    def of(self, tokens: float, steps: float) -> float:
        return tokens / steps + (1.0 if self is AcceptRatio.ONE_PLUS_ACCEPTED_PER_STEP else 0.0)


@dataclass(frozen=True)
class SpecFamily:
    """Where one engine keeps its speculative counters: `tokens` over `steps` (verify steps), read as `ratio` says."""

    engine: str
    tokens: str
    steps: str
    in_flight: str
    ratio: AcceptRatio = AcceptRatio.ONE_PLUS_ACCEPTED_PER_STEP
    draft_tokens: str = ""
    per_pos: str = ""

    @property
    def accept_source(self) -> str:
        return f"metrics:{self.tokens}/{self.steps}"


SPEC_FAMILIES = (
    SpecFamily(
        "llama.cpp",
        tokens="llamacpp:spec_decode_num_accepted_tokens_total",
        steps="llamacpp:spec_decode_num_drafts_total",
        in_flight="llamacpp:requests_processing",
        draft_tokens="llamacpp:spec_decode_num_draft_tokens_total",
        per_pos="llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
    ),
    SpecFamily(
        "vllm",
        tokens="vllm:spec_decode_num_accepted_tokens_total",
        steps="vllm:spec_decode_num_drafts_total",
        in_flight="vllm:num_requests_running",
        draft_tokens="vllm:spec_decode_num_draft_tokens_total",
        per_pos="vllm:spec_decode_num_accepted_tokens_per_pos_total",
    ),
    # SGLang 0.5.16 (--enable-metrics), observability/metrics_collector.py: both counters move when a request is
    # released (observe_one_finished_request; the verify counter only for requests with spec_verify_ct > 0)
    SpecFamily(
        "sglang",
        tokens="sglang:generation_tokens_total",
        steps="sglang:spec_verify_calls_total",
        in_flight="sglang:num_running_reqs",
        ratio=AcceptRatio.TOKENS_PER_STEP,
    ),
)


def family_for(engine: str) -> SpecFamily | None:
    return next((f for f in SPEC_FAMILIES if f.engine == engine), None)


@dataclass(frozen=True)
class SpecDelta:
    """The speculative counters' growth over one level."""

    tokens: float
    steps: float
    draft_tokens: float | None
    ratio: AcceptRatio = AcceptRatio.ONE_PLUS_ACCEPTED_PER_STEP

    @property
    def accept_length(self) -> float | None:
        """Tokens per verify step (see AcceptRatio)."""
        if self.steps <= 0 or self.tokens < 0:
            return None
        return self.ratio.of(self.tokens, self.steps)

    def to_meta(self) -> dict[str, object]:
        """`metrics_delta` of a record: the two counters' growth under the names of what they count."""
        if self.ratio is AcceptRatio.TOKENS_PER_STEP:
            counts: dict[str, object] = {"generation_tokens": self.tokens, "verify_calls": self.steps}
        else:
            counts = {"accepted": self.tokens, "drafts": self.steps, "draft_tokens": self.draft_tokens}
        return {**counts, "ratio": self.ratio.value, "accept_length": self.accept_length}


@dataclass(frozen=True)
class LevelDelta:
    spec: SpecDelta | None = None
    problems: tuple[str, ...] = field(default_factory=tuple)


def _growth(name: str, before: Scrape, after: Scrape) -> float | None:
    """after - before; a counter with no sample before and one after started during the level (a labelled counter
    has no sample until its first increment, as prometheus_client renders SGLang's on a fresh server)."""
    if not name:
        return None
    a, b = before.value(name), after.value(name)
    if b is None:
        return None
    return b - (a if a is not None else 0.0)


def spec_delta(family: SpecFamily, before: Scrape, after: Scrape) -> LevelDelta:
    """The level's own counts (after - before); a counter that went down (a restart) is a problem, not a value.
    No verify step during the level (a base server: SGLang's verify counter has no sample) is no value."""
    tokens, steps = _growth(family.tokens, before, after), _growth(family.steps, before, after)
    if tokens is None or steps is None:
        return LevelDelta()
    if tokens < 0 or steps < 0 or not math.isfinite(tokens) or not math.isfinite(steps):
        return LevelDelta(problems=(f"{family.tokens} or {family.steps} went down during the level (restart?)",))
    if steps == 0:
        return LevelDelta()
    return LevelDelta(SpecDelta(tokens, steps, _growth(family.draft_tokens, before, after), family.ratio))


# SGLang's GPU-busy seconds per forward kind (`category`: extend, decode, target_verify, eagle_draft, ...), counted
# with CUDA events when the server runs with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 and --enable-metrics (0.5.16:
# observability/metrics_collector.py forward_execution_seconds_total, utils/device_timer.py).
FORWARD_SECONDS = "sglang:forward_execution_seconds_total"


def forward_seconds(before: Scrape, after: Scrape) -> tuple[dict[str, float] | None, str]:
    """The level's GPU-busy seconds per forward category: per category, the busiest rank's growth (a rank's series is
    its labels but the category). (None, "") when the server exports no such counter; (None, why) when one went down
    (a restart) or is not a finite number."""
    grew: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    was = {s.labels: s.value for s in before.series(FORWARD_SECONDS)}
    for sample in after.series(FORWARD_SECONDS):
        labels = dict(sample.labels)
        category = labels.pop("category", "")
        delta = sample.value - was.get(sample.labels, 0.0)
        if not category or not math.isfinite(delta) or delta < 0:
            return None, f"{FORWARD_SECONDS}{{category={category!r}}} went down or is not a number (restart?)"
        grew.setdefault(category, {})[tuple(sorted(labels.items()))] = delta
    if not grew:
        return None, ""
    return {category: max(ranks.values()) for category, ranks in sorted(grew.items())}, ""


def draft_positions(family: SpecFamily, scrape: Scrape) -> int | None:
    """Draft tokens per verify step as the number of per-position acceptance series (llama.cpp: the draft max)."""
    if not family.per_pos:
        return None
    positions = {dict(s.labels).get("position") for s in scrape.series(family.per_pos)}
    positions.discard(None)
    return len(positions) or None

"""Goodput: the requests per second (and their output tokens per second) that met every given latency SLO.

Definitions follow SGLang 0.5.23 (sglang/benchmark/goodput.py `calculate_goodput`) and vLLM's `--goodput`: a
request counts when it succeeded and met every SLO given; TTFT is to the first token, TPOT is
(end - first token) / (tokens - 1) and 0 for a single-token reply, end-to-end is to the last byte. Differences:
SLOs are in seconds here (`--slo ttft=0.5,tpot=0.05,e2e=10`; SGLang's `--goodput ttft:500` is milliseconds), and
the rate is over the level's steady window, not the whole run with its ramp-up and drain: every request that
finished inside the window counts (warm-up and tail requests too: they ran under the same load; requests cut at
the window's end did not finish and do not count), latency is from the scheduled send as in `summarize`, and a
request with token counts that cannot be true is never good. Attainment is good / finished in the window.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # records.py imports this module for its `goodput` field; closedloop.py imports records.py
    from sm120check.bench.closedloop import RequestRecord

SLO_KEYS = ("ttft", "tpot", "e2e")
_SLO_HELP = "give e.g. --slo ttft=0.5,tpot=0.05,e2e=10 (seconds; any subset of ttft, tpot, e2e)"


class GoodputError(ValueError):
    """A bad --slo value or a goodput record that cannot be used, with the fix."""


@dataclass(frozen=True)
class Slo:
    """Latency targets in seconds; None: not a target."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    def __post_init__(self) -> None:
        for key in SLO_KEYS:
            value = getattr(self, key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise GoodputError(f"SLO {key}={value!r} is not a finite number of seconds; {_SLO_HELP}")
            if value <= 0:
                raise GoodputError(f"SLO {key}={value!r} must be above 0 seconds; {_SLO_HELP}")
        if self.ttft is None and self.tpot is None and self.e2e is None:
            raise GoodputError(f"no SLO given; {_SLO_HELP}")

    @classmethod
    def parse(cls, text: str) -> Slo:
        """`ttft=0.5,tpot=0.05,e2e=10`: seconds, each key at most once."""
        values: dict[str, float] = {}
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            key, sep, raw = part.partition("=")
            key = key.strip().lower()
            if not sep:
                hint = (
                    " (SGLang's --goodput KEY:MS form is milliseconds; this takes KEY=SECONDS)" if ":" in part else ""
                )
                raise GoodputError(f"SLO {part!r} is not KEY=SECONDS{hint}; {_SLO_HELP}")
            if key == "e2el":
                key = "e2e"
            if key not in SLO_KEYS:
                raise GoodputError(f"unknown SLO {key!r} in {part!r}: the keys are {', '.join(SLO_KEYS)}")
            if key in values:
                raise GoodputError(f"SLO {key} given twice in {text!r}; give each key once")
            try:
                value = float(raw.strip().removesuffix("s"))
            except ValueError:
                raise GoodputError(f"SLO {key}={raw.strip()!r} is not a number of seconds; {_SLO_HELP}") from None
            values[key] = value
        if not values:
            raise GoodputError(f"--slo {text!r} names no SLO; {_SLO_HELP}")
        return cls(**values)

    def met(self, record: RequestRecord) -> dict[str, bool]:
        """For a finished, successful request: which targets it met (only the keys given)."""
        observed = observed_latency(record)
        return {key: observed[key] <= limit for key in SLO_KEYS if (limit := getattr(self, key)) is not None}

    def to_json(self) -> dict[str, float]:
        return {key: value for key in SLO_KEYS if (value := getattr(self, key)) is not None}

    @classmethod
    def from_json(cls, data: object, where: str) -> Slo:
        if not isinstance(data, Mapping):
            raise GoodputError(f"{where}: goodput.slo_s must be an object like {{'ttft': 0.5}}, not {data!r:.60}")
        unknown = sorted(str(k) for k in data if k not in SLO_KEYS)
        if unknown:
            raise GoodputError(f"{where}: goodput.slo_s has unknown key(s) {', '.join(unknown)[:80]}")
        values = {str(key): _number(value, f"goodput.slo_s.{key}", where) for key, value in data.items()}
        try:
            return cls(**values)
        except GoodputError as exc:
            raise GoodputError(f"{where}: {exc}") from None

    def __str__(self) -> str:
        return ",".join(f"{key}={value:g}" for key, value in self.to_json().items())


def observed_latency(record: RequestRecord) -> dict[str, float]:
    """TTFT, TPOT and end-to-end seconds of a finished request, as `summarize` and SGLang define them."""
    first = record.first if record.first is not None else record.end
    tokens = record.tokens
    tpot = (record.end - first) / (tokens - 1) if tokens > 1 else 0.0
    return {"ttft": first - record.scheduled, "tpot": tpot, "e2e": record.end - record.scheduled}


@dataclass(frozen=True)
class Goodput:
    """Goodput of one level against one set of SLOs."""

    slo: Slo
    window_s: float
    finished: int  # requests that finished inside the window (errors included)
    good: int  # of those, succeeded and met every SLO
    good_tokens: int  # output tokens of the good requests
    met: Mapping[str, int]  # per SLO key: finished requests that met that one

    @property
    def request_goodput(self) -> float:
        """Good requests per second of the window."""
        return self.good / self.window_s if self.window_s > 0 else 0.0

    @property
    def token_goodput(self) -> float:
        """Output tokens of good requests per second of the window."""
        return self.good_tokens / self.window_s if self.window_s > 0 else 0.0

    @property
    def attainment(self) -> float | None:
        return self.good / self.finished if self.finished else None

    def to_json(self) -> dict[str, object]:
        attainment = self.attainment
        return {
            "slo_s": self.slo.to_json(),
            "window_s": round(self.window_s, 6),
            "finished": self.finished,
            "good": self.good,
            "good_tokens": self.good_tokens,
            "met": dict(self.met),
            "request_goodput": round(self.request_goodput, 6),
            "token_goodput": round(self.token_goodput, 4),
            "attainment": None if attainment is None else round(attainment, 6),
        }

    @classmethod
    def from_json(cls, data: object, where: str) -> Goodput:
        """Parse `to_json`'s output; the rates are recomputed from the counts (a file's own rates are not trusted)."""
        if not isinstance(data, Mapping):
            raise GoodputError(f"{where}: field 'goodput' must be an object or null, not {data!r:.60}")
        slo = Slo.from_json(data.get("slo_s"), where)
        window = _number(data.get("window_s"), "goodput.window_s", where)
        if window < 0:
            raise GoodputError(f"{where}: goodput.window_s {window:g} is negative")
        finished = _count(data.get("finished"), "goodput.finished", where)
        good = _count(data.get("good"), "goodput.good", where)
        good_tokens = _count(data.get("good_tokens"), "goodput.good_tokens", where)
        met_raw = data.get("met", {})
        if not isinstance(met_raw, Mapping):
            raise GoodputError(f"{where}: goodput.met must be an object of counts, not {met_raw!r:.60}")
        met: dict[str, int] = {}
        for key, value in met_raw.items():
            if key not in slo.to_json():
                raise GoodputError(f"{where}: goodput.met has {str(key)[:40]!r}, which is not one of its SLOs")
            met[key] = _count(value, f"goodput.met.{key}", where)
            if met[key] > finished:
                raise GoodputError(f"{where}: goodput.met.{key} {met[key]} exceeds finished {finished}")
        if good > finished:
            raise GoodputError(f"{where}: goodput.good {good} exceeds finished {finished}: not a goodput record")
        if any(good > count for count in met.values()):
            raise GoodputError(f"{where}: goodput.good {good} exceeds a per-SLO count: not a goodput record")
        return cls(slo, window, finished, good, good_tokens, met)


def compute_goodput(slo: Slo, records: Sequence[RequestRecord], t0: float | None, t1: float | None) -> Goodput:
    """Goodput of a level's records in its window [t0, t1]; without a window, over the span of the measured
    requests (as `summarize` falls back)."""
    if t0 is None or t1 is None or not t1 > t0:
        measured = [r for r in records if not r.warmup and not r.cut]
        t0 = min((r.scheduled for r in measured), default=0.0)
        t1 = max((r.end for r in measured), default=0.0)
    done = [r for r in records if not r.cut and t0 <= r.end <= t1]
    met = dict.fromkeys(slo.to_json(), 0)
    good = good_tokens = 0
    for r in done:
        if r.error or r.anomalies or r.first is None:
            continue
        hits = slo.met(r)
        for key, ok in hits.items():
            met[key] += ok
        if all(hits.values()):
            good += 1
            good_tokens += r.tokens
    return Goodput(slo, max(t1 - t0, 0.0), len(done), good, good_tokens, met)


def _number(value: object, name: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise GoodputError(f"{where}: field {name!r} must be a finite number, not {value!r:.60}")
    return float(value)


def _count(value: object, name: str, where: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GoodputError(f"{where}: field {name!r} must be a whole number >= 0, not {value!r:.60}")
    return value

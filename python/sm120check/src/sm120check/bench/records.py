"""One JSONL line per concurrency level: what `bench` appends and what `crossover` reads back."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sm120check import bounded
from sm120check.bench.goodput import Goodput, GoodputError
from sm120check.bench.percentiles import Dist

SCHEMA = "sm120check.bench/1"
MAX_JSONL_BYTES = 256 << 20  # a level's record is at most a few MiB (one row per request)
_OPTIONAL_FLOATS = ("throughput_halves_rel_diff", "window_lifetimes", "cached_prompt_fraction", "cohort_share")
COHORTS = "cohorts"  # the flag of a closed-loop level whose requests came back together (closedloop.cohort_share)
_DISTS = ("per_request_tok_s", "ttft_s", "itl_s", "tpot_s", "e2e_s", "client_wait_s", "server_lag_s")


class RecordError(ValueError):
    """A results file that cannot be used, with the reason and the fix."""


@dataclass(frozen=True)
class RequestRow:
    """One request of a level, as the record keeps it (`per_request`): enough to check against the server's log."""

    output_tokens: int
    e2e_s: float
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    ttft_s: float | None = None
    accept_length: float | None = None  # this request's tokens per verify step, where the server said
    warmup: bool = False
    in_window: bool = False  # scheduled and finished inside the steady window (its latency is in the numbers)
    cut: bool = False  # stopped at the end of a --duration window
    error: str = ""

    def to_json(self) -> dict[str, object]:
        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 6)

        return {
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "ttft_s": r(self.ttft_s),
            "e2e_s": r(self.e2e_s),
            "accept_length": r(self.accept_length),
            "warmup": self.warmup,
            "in_window": self.in_window,
            "cut": self.cut,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, data: object, where: str) -> RequestRow:
        """Strict: a hostile file gets a RecordError naming the entry and the field."""
        if not isinstance(data, Mapping):
            raise RecordError(f"{where}: a per_request entry must be an object, not {data!r:.60}")
        return cls(
            output_tokens=_int_field(data, "output_tokens", where, 0),
            e2e_s=_opt_float(data, "e2e_s", where) or 0.0,
            prompt_tokens=_opt_int(data, "prompt_tokens", where),
            cached_prompt_tokens=_opt_int(data, "cached_prompt_tokens", where),
            ttft_s=_opt_float(data, "ttft_s", where),
            accept_length=None if data.get("accept_length") is None else _accept_field(data, where),
            warmup=_bool_field(data, "warmup", where),
            in_window=_bool_field(data, "in_window", where),
            cut=_bool_field(data, "cut", where),
            error=_str_field(data, "error", where),
        )


@dataclass(frozen=True)
class LevelSummary:
    """The measurements of one concurrency level of one run."""

    concurrency: int
    throughput_tok_s: float  # output tokens received inside the steady window / window length
    window_s: float
    output_tokens: int  # inside the window
    requests: int  # measured (not warm-up) requests that finished, errors included
    errors: int
    label: str = ""
    run_id: str = ""
    window_valid: bool = True
    per_request_tok_s: Dist | None = None
    ttft_s: Dist | None = None
    itl_s: Dist | None = None
    tpot_s: Dist | None = None
    e2e_s: Dist | None = None
    client_wait_s: Dist | None = None
    server_lag_s: Dist | None = None
    accept_length: float | None = None
    accept_source: str = ""
    token_source: str = ""
    error_samples: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()  # machine-readable doubts: untrusted_token_counts, non_finite:<field>, ...
    # optional since the first schema: absent in older files
    throughput_halves_rel_diff: float | None = None  # |slope(1st half) - slope(2nd half)| / slope: the uncertainty
    window_lifetimes: float | None = None  # window length over the mean request latency
    cached_prompt_fraction: float | None = None  # prompt tokens the server's cache served / prompt tokens
    cohort_share: float | None = None  # most requests finishing within 5 % of a lifetime of each other / concurrency
    accept_hist: tuple[tuple[float, int], ...] = ()  # (lower edge, requests): tokens per verify step, bins of 0.5
    per_request: tuple[RequestRow, ...] = ()
    mode: str = "closed"  # "closed": C workers (closedloop.py); "open": arrivals at request_rate (openloop.py)
    request_rate: float | None = None  # offered requests/s of an open-loop level; math.inf: all at once
    burstiness: float | None = None  # gamma shape of the arrival gaps; 1: Poisson
    goodput: Goodput | None = None  # against --slo; None without it
    meta: Mapping[str, object] = field(default_factory=dict)

    @property
    def avg_latency_s(self) -> float:
        return self.e2e_s.mean if self.e2e_s else math.nan

    @property
    def per_request_mean(self) -> float:
        return self.per_request_tok_s.mean if self.per_request_tok_s else math.nan

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "schema": SCHEMA,
            "label": self.label,
            "run_id": self.run_id,
            "concurrency": self.concurrency,
            "throughput_tok_s": round(self.throughput_tok_s, 4),
            "window_s": round(self.window_s, 6),
            "window_valid": self.window_valid,
            "output_tokens": self.output_tokens,
            "requests": self.requests,
            "errors": self.errors,
        }
        for name in _DISTS:
            dist: Dist | None = getattr(self, name)
            out[name] = dist.to_json() if dist else None
        out.update(
            accept_length=None if self.accept_length is None else round(self.accept_length, 4),
            accept_source=self.accept_source,
            token_source=self.token_source,
            error_samples=list(self.error_samples),
            warnings=list(self.warnings),
            flags=list(self.flags),
            throughput_halves_rel_diff=_round(self.throughput_halves_rel_diff),
            window_lifetimes=_round(self.window_lifetimes),
            cached_prompt_fraction=_round(self.cached_prompt_fraction),
            cohort_share=_round(self.cohort_share),
            accept_hist=[[edge, n] for edge, n in self.accept_hist],
            per_request=[row.to_json() for row in self.per_request],
            mode=self.mode,
            request_rate=_rate_json(self.request_rate),
            burstiness=_rate_json(self.burstiness),
            goodput=None if self.goodput is None else self.goodput.to_json(),
        )
        out.update(self.meta)
        return out

    def to_jsonl_line(self) -> str:
        """Strict JSON: a non-finite number (NaN, Infinity) becomes null and the record gets a non_finite flag."""
        bad: list[str] = []
        data = _finite(self.to_json(), "", bad)
        assert isinstance(data, dict)
        if bad:
            data["flags"] = [*self.flags, *(f"non_finite:{path}" for path in bad)]
        return json.dumps(data, sort_keys=False, allow_nan=False)

    @classmethod
    def from_json(cls, data: Mapping[str, object], where: str) -> LevelSummary:
        """Parse one record; every field is type-checked here, so bad input is a RecordError naming the field."""
        if data.get("schema") != SCHEMA:
            raise RecordError(f"{where}: not an sm120check bench record (schema {data.get('schema')!r}, want {SCHEMA})")
        if "concurrency" not in data or "throughput_tok_s" not in data:
            missing = "concurrency" if "concurrency" not in data else "throughput_tok_s"
            raise RecordError(f"{where}: record lacks a usable '{missing}' field")
        concurrency = _int_field(data, "concurrency", where, 0)
        throughput = _float_field(data, "throughput_tok_s", where, 0.0)
        if concurrency < 1 or throughput < 0:
            raise RecordError(f"{where}: concurrency {concurrency} / throughput {throughput} out of range")
        known = {"schema", "label", "run_id", "concurrency", "throughput_tok_s", "window_s", "window_valid"}
        known |= {"output_tokens", "requests", "errors", "accept_length", "accept_source", "token_source"}
        known |= {"error_samples", "warnings", "flags", *_DISTS, *_OPTIONAL_FLOATS, "accept_hist", "per_request"}
        known |= {"mode", "request_rate", "burstiness", "goodput"}
        mode = data.get("mode", "closed")
        if mode not in ("closed", "open"):
            raise RecordError(f'{where}: field \'mode\' must be "closed" or "open", not {mode!r:.60}')
        request_rate = _rate_field(data, "request_rate", where)
        if mode == "open" and request_rate is None:
            raise RecordError(f'{where}: an open-loop record (mode "open") lacks its request_rate')
        goodput: Goodput | None = None
        if data.get("goodput") is not None:
            try:
                goodput = Goodput.from_json(data["goodput"], where)
            except GoodputError as exc:
                raise RecordError(str(exc)) from None
        accept: float | None = None
        if data.get("accept_length") is not None:
            accept = _accept_field(data, where)
        window_valid = data.get("window_valid", True)
        if not isinstance(window_valid, bool):
            raise RecordError(f"{where}: field 'window_valid' must be true or false, not {window_valid!r:.60}")
        return cls(
            concurrency=concurrency,
            throughput_tok_s=throughput,
            window_s=_float_field(data, "window_s", where, 0.0),
            output_tokens=_int_field(data, "output_tokens", where, 0),
            requests=_int_field(data, "requests", where, 0),
            errors=_int_field(data, "errors", where, 0),
            label=str(data.get("label", "")),
            run_id=str(data.get("run_id", "")),
            window_valid=window_valid,
            accept_length=accept or None,
            accept_source=str(data.get("accept_source", "")),
            token_source=str(data.get("token_source", "")),
            error_samples=tuple(str(s) for s in _as_list(data.get("error_samples"))),
            warnings=tuple(str(s) for s in _as_list(data.get("warnings"))),
            flags=tuple(str(s) for s in _as_list(data.get("flags"))),
            accept_hist=_hist(data.get("accept_hist"), where),
            per_request=tuple(
                RequestRow.from_json(row, f"{where}: per_request[{i}]")
                for i, row in enumerate(_list_field(data, "per_request", where))
            ),
            throughput_halves_rel_diff=_opt_float(data, "throughput_halves_rel_diff", where),
            window_lifetimes=_opt_float(data, "window_lifetimes", where),
            cached_prompt_fraction=_opt_float(data, "cached_prompt_fraction", where),
            cohort_share=_opt_float(data, "cohort_share", where),
            mode=str(mode),
            request_rate=request_rate,
            burstiness=_rate_field(data, "burstiness", where),
            goodput=goodput,
            meta={k: v for k, v in data.items() if k not in known},
            **{name: Dist.from_json(data.get(name)) for name in _DISTS},
        )


def _int_field(data: Mapping[str, object], key: str, where: str, default: int) -> int:
    value = data.get(key, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RecordError(f"{where}: field {key!r} must be a whole number >= 0, not {value!r:.60}")
    return value


def _float_field(data: Mapping[str, object], key: str, where: str, default: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RecordError(f"{where}: field {key!r} must be a finite number, not {value!r:.60}")
    return float(value)


MAX_ACCEPT_LENGTH = 64.0  # tokens per verify step: one more than the draft tokens, and no drafter proposes 64


def _accept_field(data: Mapping[str, object], where: str) -> float:
    accept = _float_field(data, "accept_length", where, 0.0)
    if not 0 <= accept <= MAX_ACCEPT_LENGTH:
        raise RecordError(
            f"{where}: field 'accept_length' is {accept:.6g}: accepted tokens per verify step are between 0 and "
            f"{MAX_ACCEPT_LENGTH:g} (the server reported a count that cannot be true); remove or fix the record"
        )
    return accept


def _opt_int(data: Mapping[str, object], key: str, where: str) -> int | None:
    return None if data.get(key) is None else _int_field(data, key, where, 0)


def _rate_json(value: float | None) -> float | str | None:
    """inf as the string "inf": the JSONL is strict JSON."""
    if value is None:
        return None
    return "inf" if math.isinf(value) else round(value, 6)


def _rate_field(data: Mapping[str, object], key: str, where: str) -> float | None:
    """A rate or a gamma shape: a number > 0, "inf", or absent/null."""
    value = data.get(key)
    if value is None:
        return None
    if value == "inf":
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise RecordError(f'{where}: field {key!r} must be a number > 0 or "inf", not {value!r:.60}')
    return float(value)


def _opt_float(data: Mapping[str, object], key: str, where: str) -> float | None:
    return None if data.get(key) is None else _float_field(data, key, where, 0.0)


def _bool_field(data: Mapping[str, object], key: str, where: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise RecordError(f"{where}: field {key!r} must be true or false, not {value!r:.60}")
    return value


def _str_field(data: Mapping[str, object], key: str, where: str) -> str:
    value = data.get(key, "")
    if not isinstance(value, str):
        raise RecordError(f"{where}: field {key!r} must be a string, not {value!r:.60}")
    return value[:1000]


def _list_field(data: Mapping[str, object], key: str, where: str) -> list[object]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise RecordError(f"{where}: field {key!r} must be a list, not {value!r:.60}")
    return value


def _hist(value: object, where: str) -> tuple[tuple[float, int], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise RecordError(f"{where}: field 'accept_hist' must be a list of [edge, count] pairs, not {value!r:.60}")
    bins: list[tuple[float, int]] = []
    for item in value:
        if not isinstance(item, list) or len(item) != 2:
            raise RecordError(f"{where}: an accept_hist entry must be [edge, count], not {item!r:.60}")
        pair = {"edge": item[0], "count": item[1]}
        bins.append((_float_field(pair, "edge", where, 0.0), _int_field(pair, "count", where, 0)))
    return tuple(bins)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def _finite(value: object, path: str, bad: list[str]) -> object:
    """`value` with every non-finite float replaced by None; the dotted paths of those go to `bad`."""
    if isinstance(value, float) and not math.isfinite(value):
        bad.append(path or "(record)")
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v, f"{path}.{k}" if path else str(k), bad) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v, f"{path}[{i}]", bad) for i, v in enumerate(value)]
    return value


def _as_list(value: object) -> list[object]:
    return list(value) if isinstance(value, list) else []


def append_jsonl(path: Path, summaries: Iterable[LevelSummary]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        for summary in summaries:
            fh.write(summary.to_jsonl_line() + "\n")


def read_jsonl(path: Path) -> list[LevelSummary]:
    """Every bench record in a JSONL file; raises RecordError naming the file and line for bad input."""
    try:
        text = bounded.read_text(path, MAX_JSONL_BYTES)
    except bounded.TooLarge as exc:
        raise RecordError(f"{exc} (a level's record is at most a few MiB); give the JSONL file of one sweep") from None
    except bounded.NotText as exc:
        raise RecordError(str(exc)) from None
    except bounded.Unreadable as exc:
        raise RecordError(f"cannot read {exc}; give the JSONL file `sm120check bench --out` wrote") from None
    records: list[LevelSummary] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            data = json.loads(line)
        except RecursionError:
            raise RecordError(f"{where}: JSON nested too deeply to be a `sm120check bench` record") from None
        except ValueError as exc:
            raise RecordError(f"{where}: not JSON ({exc}); each line must be one `sm120check bench` record") from None
        if not isinstance(data, dict):
            raise RecordError(f"{where}: a JSON {type(data).__name__}, not a bench record object")
        records.append(LevelSummary.from_json(data, where))
    if not records:
        raise RecordError(f"{path} holds no bench records; write some with `sm120check bench ... --out {path}`")
    return records


def level_table(summaries: Iterable[LevelSummary]) -> str:
    """What `bench` prints: the seed account's columns, then TTFT and TPOT (p50 / p99, ms); an open-loop level is
    named by the rate asked for, and goodput is shown where --slo was given."""
    rows = sorted(summaries, key=lambda s: (s.request_rate or 0.0, s.concurrency))
    open_loop = any(s.mode == "open" for s in rows)
    goodput = open_loop or any(s.goodput is not None for s in rows)
    head = ["Rate (req/s)" if open_loop else "Concurrency", "Throughput (tok/s)", "Per-Req (tok/s)", "Avg Latency (s)"]
    head += ["TTFT p50/p99 (ms)", "TPOT p50/p99 (ms)"] + (["Goodput (req/s)"] if goodput else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in rows:
        rate = s.request_rate if s.request_rate is not None else math.nan
        cells = [_rate(rate) if s.mode == "open" else str(s.concurrency)]
        cells += [_fmt(s.throughput_tok_s), _fmt(s.per_request_mean), _fmt(s.avg_latency_s)]
        cells += [_ms(s.ttft_s), _ms(s.tpot_s)]
        if goodput:
            g = s.goodput
            cells.append("no --slo" if g is None else f"{g.request_goodput:.2f} ({g.good}/{g.finished} met)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _rate(value: float) -> str:
    return "all at once" if math.isinf(value) else f"{value:g}"


def _ms(dist: Dist | None) -> str:
    return "n/a" if dist is None else f"{dist.p50 * 1000:.1f} / {dist.p99 * 1000:.1f}"


def _fmt(value: float, digits: int = 1) -> str:
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"

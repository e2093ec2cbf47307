"""Where speculation stops paying: compare a baseline sweep with a speculative one, level by level.

Interpolated crossover: the first level pair where the throughput ratio spec/base falls through 1, interpolated
linearly in log(concurrency) on log(ratio). Its uncertainty comes from repeated runs (every base run against every
spec run). Cost model: with B requests running, a plain step takes a + bB and gives B tokens, a verify step takes
c + dB and gives tau*B, so B/throughput is a straight line in B for each: a + bB and (c + dB)/tau. Weighted least
squares on those lines gives a, b, c/tau, d/tau; the lines cross at the predicted crossover.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sm120check.bench.records import LevelSummary, RecordError
from sm120check.bench.stats import mean_std

Curve = dict[int, LevelSummary]  # concurrency -> one run's level record


@dataclass(frozen=True)
class Spread:
    mean: float
    std: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        m, s = mean_std([v for v in values if not math.isnan(v)])
        return cls(m, s, len(values))


@dataclass(frozen=True)
class LevelCompare:
    concurrency: int
    base: Spread  # throughput tok/s over runs
    spec: Spread
    speedup: float
    speedup_std: float
    base_per_req: Spread
    spec_per_req: Spread
    base_latency: Spread
    spec_latency: Spread
    accept_length: float | None


@dataclass(frozen=True)
class Crossover:
    """The interpolated crossover, or why there is none in the measured range."""

    status: str  # "found", "above-range" (spec wins everywhere), "below-range" (spec loses everywhere)
    value: float | None
    low: float | None = None  # spread over run pairs (min, max) when several runs exist
    high: float | None = None
    std: float | None = None
    pairs: int = 1
    pairs_without: int = 0  # run pairs that did not cross in range
    message: str = ""


@dataclass(frozen=True)
class Line:
    intercept: float
    slope: float
    r2: float


@dataclass(frozen=True)
class CostModel:
    """Step-time model fitted to both sweeps; seconds."""

    a: float
    b: float
    c_over_tau: float
    d_over_tau: float
    tau: float | None  # measured accepted length, when the server exposed it
    r2_base: float
    r2_spec: float
    predicted: float | None
    message: str

    @property
    def c(self) -> float | None:
        return None if self.tau is None else self.c_over_tau * self.tau

    @property
    def d(self) -> float | None:
        return None if self.tau is None else self.d_over_tau * self.tau


@dataclass(frozen=True)
class Analysis:
    levels: tuple[LevelCompare, ...]
    crossover: Crossover
    model: CostModel | None
    base_runs: int
    spec_runs: int
    spec_steps: int | None  # speculative_num_steps the spec server reported
    warnings: tuple[str, ...] = ()


def group_runs(records: Iterable[LevelSummary], name: str, warnings: list[str]) -> list[Curve]:
    """Split one file's records into runs (by run_id), each a curve keyed by concurrency."""
    runs: dict[str, Curve] = {}
    for r in records:
        curve = runs.setdefault(r.run_id, {})
        if r.concurrency in curve:
            warnings.append(f"{name}: run {r.run_id or '(no id)'} has C={r.concurrency} twice; the later one is used")
        curve[r.concurrency] = r
    return list(runs.values())


def analyze(base: Sequence[LevelSummary], spec: Sequence[LevelSummary], names: tuple[str, str]) -> Analysis:
    """Compare the two sweeps. Raises RecordError when they cannot be compared."""
    warnings: list[str] = []
    base_runs = group_runs(base, names[0], warnings)
    spec_runs = group_runs(spec, names[1], warnings)
    _check_labels(base, spec, names, warnings)
    base_levels = set().union(*(c.keys() for c in base_runs))
    spec_levels = set().union(*(c.keys() for c in spec_runs))
    common = sorted(base_levels & spec_levels)
    only = sorted(base_levels ^ spec_levels)
    if len(common) < 2:
        raise RecordError(
            f"the sweeps share {len(common)} concurrency level(s) ({_levels(common) or 'none'}; {names[0]} has "
            f"{_levels(base_levels)}, {names[1]} has {_levels(spec_levels)}): run both with the same --concurrency"
        )
    if only:
        warnings.append(f"levels measured in only one sweep are left out: {_levels(only)}")
    for curve, name in [(c, names[0]) for c in base_runs] + [(c, names[1]) for c in spec_runs]:
        bad = [c for c in common if c in curve and (curve[c].throughput_tok_s <= 0 or curve[c].errors)]
        if bad:
            warnings.append(f"{name}: levels {_levels(bad)} had errors or no throughput; check error_samples")

    levels = tuple(_compare(c, base_runs, spec_runs) for c in common)
    crossover = _crossover(levels, base_runs, spec_runs, common)
    accept = [r.accept_length for r in spec if r.accept_length and r.concurrency in common]
    tau = sum(accept) / len(accept) if accept else None
    model = fit_cost_model(base_runs, spec_runs, common, tau)
    steps = _spec_steps(spec)
    return Analysis(levels, crossover, model, len(base_runs), len(spec_runs), steps, tuple(warnings))


def _check_labels(
    base: Sequence[LevelSummary], spec: Sequence[LevelSummary], names: tuple[str, str], warnings: list[str]
) -> None:
    def algo(records: Sequence[LevelSummary]) -> set[str]:
        found = set()
        for r in records:
            server = r.meta.get("server")
            if isinstance(server, Mapping):
                found.add(str(server.get("speculative_algorithm")))
        return found

    if algo(base) - {"None"}:
        warnings.append(f"{names[0]} was measured on a server with speculation on ({', '.join(algo(base))})")
    if algo(spec) == {"None"}:
        warnings.append(f"{names[1]} was measured on a server without speculation (speculative_algorithm null)")


def _levels(values: Iterable[int]) -> str:
    return ",".join(str(v) for v in sorted(values))


def _values(runs: Sequence[Curve], c: int, attr: str) -> list[float]:
    out = []
    for curve in runs:
        if c in curve:
            value = getattr(curve[c], attr)
            out.append(float(value))
    return out


def _compare(c: int, base_runs: Sequence[Curve], spec_runs: Sequence[Curve]) -> LevelCompare:
    b = Spread.of(_values(base_runs, c, "throughput_tok_s"))
    s = Spread.of(_values(spec_runs, c, "throughput_tok_s"))
    speedup = s.mean / b.mean if b.mean > 0 else math.nan
    rel = math.hypot(s.std / s.mean if s.mean else 0.0, b.std / b.mean if b.mean else 0.0)
    accepts = [curve[c].accept_length for curve in spec_runs if c in curve and curve[c].accept_length]
    return LevelCompare(
        c,
        b,
        s,
        speedup,
        speedup * rel,
        Spread.of(_values(base_runs, c, "per_request_mean")),
        Spread.of(_values(spec_runs, c, "per_request_mean")),
        Spread.of(_values(base_runs, c, "avg_latency_s")),
        Spread.of(_values(spec_runs, c, "avg_latency_s")),
        sum(a for a in accepts if a) / len(accepts) if accepts else None,
    )


def interpolate(levels: Sequence[int], base: Sequence[float], spec: Sequence[float]) -> tuple[str, float | None, int]:
    """First downward crossing of spec/base through 1, in log-log; returns status, value, number of crossings."""
    g = [math.log(s / b) if s > 0 and b > 0 else math.nan for s, b in zip(spec, base, strict=True)]
    pts = [(c, v) for c, v in zip(levels, g, strict=True) if not math.isnan(v)]
    if len(pts) < 2:
        return "invalid", None, 0
    if pts[0][1] <= 0:
        return "below-range", None, 0
    found: float | None = None
    crossings = 0
    for (c0, g0), (c1, g1) in itertools.pairwise(pts):
        if g0 > 0 >= g1:
            crossings += 1
            if found is None:
                t = g0 / (g0 - g1)
                found = math.exp(math.log(c0) + t * (math.log(c1) - math.log(c0)))
    if found is None:
        return "above-range", None, 0
    return "found", found, crossings


def _crossover(
    levels: Sequence[LevelCompare], base_runs: Sequence[Curve], spec_runs: Sequence[Curve], common: Sequence[int]
) -> Crossover:
    cs = [lv.concurrency for lv in levels]
    status, value, crossings = interpolate(cs, [lv.base.mean for lv in levels], [lv.spec.mean for lv in levels])
    pair_values: list[float] = []
    pairs = 0
    for b in base_runs:
        for s in spec_runs:
            shared = [c for c in common if c in b and c in s]
            if len(shared) < 2:
                continue
            pairs += 1
            st, v, _ = interpolate(
                shared, [b[c].throughput_tok_s for c in shared], [s[c].throughput_tok_s for c in shared]
            )
            if st == "found" and v is not None:
                pair_values.append(v)
    lo, hi = cs[0], cs[-1]
    if status == "below-range":
        return Crossover(
            status,
            None,
            pairs=pairs,
            message=f"speculation is slower already at the lowest level C={lo}: no crossover "
            "in range; speculation does not pay on this server at any measured load",
        )
    if status == "above-range":
        return Crossover(
            status,
            None,
            pairs=pairs,
            message=f"speculation is faster at every level up to C={hi}: the crossover "
            f"lies above C={hi} (not measured); extend --concurrency to find it",
        )
    if status != "found" or value is None:
        return Crossover("invalid", None, pairs=pairs, message="too few levels with throughput to interpolate")
    message = f"speculation stops paying near C={value:.1f}"
    if crossings > 1:
        message += f" (the ratio crosses 1 {crossings} times: noisy or non-monotonic; the first crossing is used)"
    if len(pair_values) >= 2:
        _, std = mean_std(pair_values)
        return Crossover(
            status, value, min(pair_values), max(pair_values), std, pairs, pairs - len(pair_values), message
        )
    note = (
        " (one run per sweep: no uncertainty; append repeated runs to the same files to get one)" if pairs <= 1 else ""
    )
    return Crossover(status, value, pairs=pairs, pairs_without=pairs - len(pair_values), message=message + note)


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> Line:
    """Least squares y = intercept + slope*x with weights 1/y^2 (relative errors count equally)."""
    w = [1.0 / (y * y) if 0 < y * y < math.inf else 0.0 for y in ys]
    sw = sum(w)
    if not (sw > 0 and math.isfinite(sw)):
        raise ValueError("no point with a usable weight (times per token of 0 or beyond floating point)")
    mx = sum(wi * x for wi, x in zip(w, xs, strict=True)) / sw
    my = sum(wi * y for wi, y in zip(w, ys, strict=True)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, xs, strict=True))
    sxy = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, xs, ys, strict=True))
    slope = sxy / sxx if sxx > 0 else 0.0
    intercept = my - slope * mx
    ss_res = sum(wi * (y - intercept - slope * x) ** 2 for wi, x, y in zip(w, xs, ys, strict=True))
    ss_tot = sum(wi * (y - my) ** 2 for wi, y in zip(w, ys, strict=True))
    return Line(intercept, slope, 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0)


def fit_cost_model(
    base_runs: Sequence[Curve], spec_runs: Sequence[Curve], common: Sequence[int], tau: float | None
) -> CostModel | None:
    def points(runs: Sequence[Curve]) -> tuple[list[float], list[float]]:
        xs, ys = [], []
        for curve in runs:
            for c in common:
                if c in curve and curve[c].throughput_tok_s > 0:
                    y = c / curve[c].throughput_tok_s
                    if 0 < y * y < math.inf and 1.0 / (y * y) > 0:  # a throughput near 0 or beyond floats: left out
                        xs.append(float(c))
                        ys.append(y)
        return xs, ys

    bx, by = points(base_runs)
    sx, sy = points(spec_runs)
    if len(set(bx)) < 2 or len(set(sx)) < 2:
        return None
    try:
        base, spec = fit_line(bx, by), fit_line(sx, sy)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    if not all(math.isfinite(v) for v in (base.intercept, base.slope, spec.intercept, spec.slope)):
        return None
    num, den = base.intercept - spec.intercept, spec.slope - base.slope
    predicted: float | None = None
    if num > 0 and den > 0:
        predicted = num / den
        message = f"the fitted step times cross at C={predicted:.1f}"
    elif num <= 0:
        message = "the model says speculation never pays (its fixed cost per token is not lower)"
    else:
        message = "the model says speculation always pays (its marginal cost per request is not higher)"
    if min(base.r2, spec.r2) < 0.9:
        message += (
            f"; the linear model fits poorly (R^2 {base.r2:.2f} / {spec.r2:.2f}): the server probably saturates "
            "(max running requests, KV cache) inside the sweep - trust the interpolated crossover"
        )
    return CostModel(base.intercept, base.slope, spec.intercept, spec.slope, tau, base.r2, spec.r2, predicted, message)


def _spec_steps(records: Sequence[LevelSummary]) -> int | None:
    for r in records:
        server = r.meta.get("server")
        if isinstance(server, Mapping) and isinstance(server.get("speculative_num_steps"), int):
            return int(server["speculative_num_steps"])
    return None


def model_throughput(model: CostModel, c: float, spec: bool) -> float:
    """Throughput the fitted model predicts at concurrency c."""
    per = model.c_over_tau + model.d_over_tau * c if spec else model.a + model.b * c
    return c / per if per > 0 else math.nan

"""Where speculation stops paying: compare a baseline sweep with a speculative one, level by level.

Interpolated crossover: the first level pair where the throughput ratio spec/base falls through 1, interpolated
linearly in log(concurrency) on log(ratio). Its uncertainty comes from repeated runs (every base run against every
spec run). Cost model: with B requests running, a plain step takes a + bB and gives B tokens, a verify step takes
c + dB and gives tau*B, so B/throughput is a straight line in B for each: a + bB and (c + dB)/tau. Weighted least
squares on those lines gives a, b, c/tau, d/tau; the lines cross at the predicted crossover.

Other axes (`analyze_mode`): the same interpolation on any metric against concurrency or offered request rate:
throughput, goodput (good requests/s) or token goodput (tokens/s of good requests) of each level; open-loop levels
(`mode` "open") are on the request-rate axis, closed-loop ones on the concurrency axis. The cost model needs the
closed loop's concurrency and throughput, so it is fitted only by `analyze`.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sm120check import findings
from sm120check.bench.goodput import Goodput, GoodputError
from sm120check.bench.identity import refuse_changed_server
from sm120check.bench.percentiles import mean_std
from sm120check.bench.records import COHORTS, LevelSummary, RecordError
from sm120check.bench.speculation import FLAG as DRAFT_FLAG
from sm120check.sglang.allreduce_backend import Backend, from_server_info
from sm120check.sglang.launch_terms import RAISE_RUNNING_CAP, SPECULATIVE_RUNNING_DEFAULT

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
    spec_reported: bool | None = None  # the spec server said speculation was on / off; None: it did not say


@dataclass(frozen=True)
class ZeroStep:
    """What a measured 0-step sweep (the speculative server held at 0 draft steps) says against full speculation."""

    crossover: float | None  # where 0 steps overtake full speculation; None: not in the measured range
    source: str  # the sweep's file
    message: str  # the crossover's own words
    warnings: tuple[str, ...] = ()  # the comparison's own (a level twice, levels in one sweep only, ...)


ZERO_STEP_MAX_ACCEPT = 1.05  # tokens per verify step of a server that drafts nothing (measured: 1.008)
ZERO_STEP_HOWTO = "start the speculative server with --speculative-adaptive-config sglang-zero-step.json and bench it"


def zero_step(zero: Sequence[LevelSummary], spec: Sequence[LevelSummary], names: tuple[str, str]) -> ZeroStep:
    """Where the speculative server held at 0 draft steps (`zero`, names[0]) overtakes it at full speculation (`spec`).
    Raises RecordError for a sweep that is not of a 0-step server: one that drafted (accept length above
    ZERO_STEP_MAX_ACCEPT), or a plain server's (it said speculation was off, or nothing says either way)."""
    where = f"--zero-step {names[0]}"
    closed = [r for r in zero if level_mode(r) == "closed"]
    if not closed:
        raise RecordError(f"{where}: no closed-loop (concurrency) level in it")
    said = {speculation_reported(r)[0] for r in closed}
    if {True, False} <= said:
        plain = _levels({r.concurrency for r in closed if speculation_reported(r)[0] is False})
        spec_on = _levels({r.concurrency for r in closed if speculation_reported(r)[0]})
        raise RecordError(
            f"{where}: mixes a plain server's records (speculation off at C={plain}) with a speculative server's "
            f"(C={spec_on}); give one 0-step sweep per file ({ZERO_STEP_HOWTO})"
        )
    servers = {server_of(r) for r in closed} - {""}
    if len(servers) > 1:
        raise RecordError(
            f"{where}: mixes sweeps of different servers ({'; '.join(sorted(servers))}); give one 0-step sweep per file"
        )
    theirs = {server_of(r) for r in spec if level_mode(r) == "closed"} - {""}
    if servers and theirs and servers != theirs:
        raise RecordError(
            f"{where}: measured on {', '.join(sorted(servers))}, but {names[1]} on {', '.join(sorted(theirs))}: "
            "bench the same speculative server, held at 0 steps"
        )
    if said == {False}:
        raise RecordError(f"{where}: its server reported speculation off: a plain server's sweep; {ZERO_STEP_HOWTO}")
    drafted = next((r for r in closed if r.accept_length is not None and r.accept_length > ZERO_STEP_MAX_ACCEPT), None)
    if drafted is not None:
        raise RecordError(
            f"{where}: accept length {drafted.accept_length:.3f} at concurrency {drafted.concurrency}: the server "
            f"drafted, so this is not a 0-step sweep; {ZERO_STEP_HOWTO}"
        )
    if True not in said and all(r.accept_length is None for r in closed):
        raise RecordError(
            f"{where}: neither its server nor its responses say speculation ran, so it cannot be told from a plain "
            f"server's sweep; {ZERO_STEP_HOWTO}"
        )
    analysis = analyze(zero, spec, names)
    return ZeroStep(analysis.crossover.value, names[0], analysis.crossover.message, analysis.warnings)


def server_of(record: LevelSummary) -> str:
    """The record's model and URL as bench wrote them ("MODEL at URL"); "" when it says neither."""
    server = record.meta.get("server")
    args = record.meta.get("args")
    model = server.get("model_path") or server.get("model") if isinstance(server, Mapping) else None
    url = args.get("url") if isinstance(args, Mapping) else None
    if not model and not url:
        return ""
    return f"{model or '(model not said)'} at {url or '(URL not said)'}"


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
    refuse_changed_server(base, names[0])
    refuse_changed_server(spec, names[1])
    refuse_mixed_allreduce(base, spec, names, warnings)
    base, spec = _closed_only(base, names[0], warnings), _closed_only(spec, names[1], warnings)
    refuse_unaccepted_draft(spec, names[1])
    base_runs = group_runs(base, names[0], warnings)
    spec_runs = group_runs(spec, names[1], warnings)
    _check_labels(base, spec, names, warnings)
    _check_running_caps(base, spec, names, warnings)
    _check_connections(base, spec, names, warnings)
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
    steps = spec_steps(spec)
    if note := deeper_steps_note(levels, steps):
        warnings.append(note)
    if note := cohorts_note([*base, *spec], common):
        warnings.append(note)
    reported = {speculation_reported(r)[0] for r in spec}
    spec_reported = True if True in reported else (False if reported == {False} else None)
    return Analysis(levels, crossover, model, len(base_runs), len(spec_runs), steps, tuple(warnings), spec_reported)


# At the lowest level, an accept length this close to the steps + 1 a verify can take says more draft steps are
# likely to pay at low load: the policies cannot place steps the sweep did not measure.
DEEPER_ACCEPT = 0.8
DEEPER_FINDING = "sglang-deeper-steps-pay-at-low-load"


def deeper_measured() -> str:
    """The measurement behind the deeper-steps note, formatted from its finding."""
    finding = findings.get(DEEPER_FINDING)
    n = finding.numbers
    levels = ", ".join(str(c) for c in n["concurrencies"])
    return (
        f"an SGLang {finding.versions['sglang']} server at {n['steps']} static steps beat the "
        f"{n['baseline_steps']}-step one at C={levels}, measured on another server start: see {finding.cite()}"
    )


def cohorts_note(records: Sequence[LevelSummary], common: Sequence[int]) -> str:
    """The compared levels where a sweep's requests came back in cohorts (the bench's flag): there one output length
    makes the comparison weigh each server's turnaround between cohorts as much as its decode."""
    flagged = sorted({r.concurrency for r in records if COHORTS in r.flags and r.concurrency in common})
    if not flagged:
        return ""
    return (
        f"at C={_levels(flagged)} a sweep's requests came back in cohorts (flag `{COHORTS}`: requests of one output "
        "length finish together), so the comparison there weighs each server's turnaround between cohorts as much as "
        "its decode; sweep both with --output-len-spread 0.5 or your --dataset before placing a threshold there"
    )


def deeper_steps_note(levels: Sequence[LevelCompare], steps: int | None) -> str:
    """A note when the draft was accepted nearly in full at the lowest level ("" otherwise)."""
    low = min(levels, key=lambda lv: lv.concurrency, default=None)
    if low is None or not steps or not low.accept_length:
        return ""
    share = low.accept_length / (steps + 1)
    if share < DEEPER_ACCEPT:
        return ""
    return (
        f"at C={low.concurrency} the draft was accepted {low.accept_length:.2f} of the {steps + 1} tokens a "
        f"{steps}-step verify takes ({share:.0%}): more draft steps are likely to pay at low load, and the "
        f"policies stop at the {steps} this sweep measured; bench a speculative server with more (SGLang: "
        f"--speculative-num-steps {2 * steps + 1} --speculative-num-draft-tokens {2 * steps + 2}) and compare "
        f"the two sweeps ({deeper_measured()})"
    )


def allreduce_of(record: LevelSummary) -> tuple[str, str]:
    """The all-reduce backend the record's server used and why: `meta.server.allreduce_backend` (in bench records that
    carry it), else what the recorded server_info fields tell (tp_size 1: none; SGLang before 0.5.22: default)."""
    server = record.meta.get("server")
    if not isinstance(server, Mapping):
        return Backend.UNKNOWN.value, "no server facts in the record"
    value = server.get("allreduce_backend")
    if isinstance(value, str) and value in {b.value for b in Backend}:
        reason = server.get("allreduce_backend_reason")
        return value, str(reason) if isinstance(reason, str) else ""
    if server.get("engine") != "sglang":
        return Backend.UNKNOWN.value, "not an SGLang server"
    backend, reason = from_server_info(server)
    return backend.value, reason


def _known(found: Mapping[str, str]) -> tuple[str, str]:
    return next(((b, w) for b, w in found.items() if b != Backend.UNKNOWN.value), ("", ""))


def refuse_mixed_allreduce(
    base: Sequence[LevelSummary], spec: Sequence[LevelSummary], names: tuple[str, str], warnings: list[str]
) -> None:
    """The all-reduce backend moves the crossover (PCIe-IPC makes the base step and the verify step cheaper by
    different amounts): sweeps whose servers used different backends are not one comparison. Unknown is a warning."""
    said: list[dict[str, str]] = []
    for records, name in ((base, names[0]), (spec, names[1])):
        found: dict[str, str] = {}
        for r in records:
            backend, reason = allreduce_of(r)
            found.setdefault(backend, reason)
        known = sorted(b for b in found if b != Backend.UNKNOWN.value)
        if len(known) > 1:
            raise RecordError(
                f"{name}: its levels were measured with different all-reduce backends ({', '.join(known)}); "
                "bench each backend into a file of its own"
            )
        said.append(found)
    base_known, base_why = _known(said[0])
    spec_known, spec_why = _known(said[1])
    if base_known and spec_known and base_known != spec_known:
        raise RecordError(
            f"the sweeps used different all-reduce backends: {names[0]} {base_known} ({base_why}), {names[1]} "
            f"{spec_known} ({spec_why}); a crossover measured on one backend does not carry over to the other: "
            "bench both servers with the same backend (sglang_server_pcie_ipc_allreduce, the "
            "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE environment)"
        )
    unknown = [n for n, found in zip(names, said, strict=True) if Backend.UNKNOWN.value in found]
    if unknown and (base_known or spec_known):
        warnings.append(
            f"the all-reduce backend of {' and '.join(unknown)} is unknown (bench it with --server-log FILE): "
            "the comparison assumes both servers used the same one"
        )


def speculation_reported(record: LevelSummary) -> tuple[bool | None, str]:
    """Whether the record's server said speculation was on: True, False, or None when it did not say (an engine
    without SGLang's server info, such as llama.cpp or vLLM); and what it named. Reads the normalized
    `meta.server.speculative` and falls back to `speculative_algorithm` (present, even as null, only when the
    server reported it) for older files."""
    server = record.meta.get("server")
    if not isinstance(server, Mapping):
        return None, ""
    algo = server.get("speculative_algorithm")
    named = str(algo) if isinstance(algo, str) and algo else ""
    if "speculative" in server:
        value = server.get("speculative")
        return (value if isinstance(value, bool) else None), named
    if "speculative_algorithm" in server:
        return (algo is not None and algo != ""), named
    return None, ""


def _check_labels(
    base: Sequence[LevelSummary], spec: Sequence[LevelSummary], names: tuple[str, str], warnings: list[str]
) -> None:
    def said(records: Sequence[LevelSummary]) -> tuple[set[bool | None], set[str]]:
        values, algos = set(), set()
        for r in records:
            value, algo = speculation_reported(r)
            values.add(value)
            if algo:
                algos.add(algo)
        return values, algos

    base_said, base_algos = said(base)
    if True in base_said:
        shown = ", ".join(sorted(base_algos)) or "speculative: true"
        warnings.append(f"{names[0]} was measured on a server with speculation on ({shown})")
    spec_said, _ = said(spec)
    if spec_said == {False}:
        warnings.append(f"{names[1]} was measured on a server without speculation (the server reported it off)")
    # None (the server did not say, e.g. llama.cpp or vLLM without SGLang's server info) is unknown: no warning


def fresh_connections(record: LevelSummary) -> bool:
    """Whether the record's bench opened a connection per request (`bench --fresh-connections`; older records: no)."""
    args = record.meta.get("args")
    return isinstance(args, Mapping) and args.get("fresh_connections") is True


def _check_connections(
    base: Sequence[LevelSummary], spec: Sequence[LevelSummary], names: tuple[str, str], warnings: list[str]
) -> None:
    used = {name: {fresh_connections(r) for r in records} for name, records in zip(names, (base, spec), strict=True)}
    if used[names[0]] != used[names[1]]:
        said = {name: " and ".join(sorted("fresh" if v else "keep-alive" for v in u)) for name, u in used.items()}
        warnings.append(
            f"{names[0]} was measured with {said[names[0]]} connections and {names[1]} with {said[names[1]]}: on a "
            "server with several HTTP processes keep-alive connections can load them unevenly; bench both the same "
            "way (--fresh-connections)"
        )


def running_cap(record: LevelSummary) -> int | None:
    """The most requests the record's server runs at once, where its server info said (SGLang: max_running_requests)."""
    server = record.meta.get("server")
    cap = server.get("max_running_requests") if isinstance(server, Mapping) else None
    return cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None


def _check_running_caps(
    base: Sequence[LevelSummary], spec: Sequence[LevelSummary], names: tuple[str, str], warnings: list[str]
) -> None:
    """A level above the server's max running requests measures that batch size with a queue, not its concurrency:
    said per sweep, with SGLang's speculative default named."""
    for records, name in ((base, names[0]), (spec, names[1])):
        caps = {cap for r in records if (cap := running_cap(r)) is not None}
        if not caps:
            continue
        cap = min(caps)
        above = sorted({r.concurrency for r in records if r.concurrency > cap})
        if not above:
            continue
        text = (
            f"{name}: its server runs at most {cap} requests at once (max_running_requests), so at C={_levels(above)} "
            f"the rest queued: those levels measure a batch of {cap}, and a policy slot above {cap} is never reached"
        )
        if cap == SPECULATIVE_RUNNING_DEFAULT and speculation_reported(records[0])[0]:
            text += f"; {cap} is {RAISE_RUNNING_CAP}"
        warnings.append(text)


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


def interpolate(levels: Sequence[float], base: Sequence[float], spec: Sequence[float]) -> tuple[str, float | None, int]:
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


def pair_crossings(
    xs: Sequence[float], base_runs: Sequence[Mapping[float, float]], spec_runs: Sequence[Mapping[float, float]]
) -> tuple[list[float], int]:
    """The crossover of every (base run, spec run) pair sharing at least two levels of `xs`, for the spread; and how
    many pairs there were."""
    values: list[float] = []
    pairs = 0
    for b in base_runs:
        for s in spec_runs:
            shared = [x for x in xs if x in b and x in s]
            if len(shared) < 2:
                continue
            pairs += 1
            status, value, _ = interpolate(shared, [b[x] for x in shared], [s[x] for x in shared])
            if status == "found" and value is not None:
                values.append(value)
    return values, pairs


def _crossover(
    levels: Sequence[LevelCompare], base_runs: Sequence[Curve], spec_runs: Sequence[Curve], common: Sequence[int]
) -> Crossover:
    cs = [lv.concurrency for lv in levels]
    status, value, crossings = interpolate(cs, [lv.base.mean for lv in levels], [lv.spec.mean for lv in levels])
    pair_values, pairs = pair_crossings(
        common,
        [{c: lv.throughput_tok_s for c, lv in b.items()} for b in base_runs],
        [{c: lv.throughput_tok_s for c, lv in s.items()} for s in spec_runs],
    )
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


def spec_steps(records: Sequence[LevelSummary]) -> int | None:
    for r in records:
        server = r.meta.get("server")
        if isinstance(server, Mapping) and isinstance(server.get("speculative_num_steps"), int):
            return int(server["speculative_num_steps"])
    return None


def model_throughput(model: CostModel, c: float, spec: bool) -> float:
    """Throughput the fitted model predicts at concurrency c."""
    per = model.c_over_tau + model.d_over_tau * c if spec else model.a + model.b * c
    return c / per if per > 0 else math.nan


# --- crossover on other axes and metrics: open-loop request rate, goodput ---------------------------------------

X_AXES = ("concurrency", "rate")
METRICS = ("throughput", "goodput", "token-goodput")
_METRIC_UNITS = {"throughput": "tok/s", "goodput": "good req/s", "token-goodput": "good tok/s"}


@dataclass(frozen=True)
class Point:
    """One level of one run on a chosen axis: x is the concurrency or the offered request rate (req/s)."""

    run_id: str
    x: float
    y: float
    accept_hist: tuple[tuple[float, int], ...] = ()  # (lower edge, requests), where the record has one


@dataclass(frozen=True)
class ModeLevel:
    x: float
    base: Spread
    spec: Spread
    ratio: float  # spec / base of the means
    ratio_std: float
    accept_hist: tuple[tuple[float, int], ...] = ()  # the spec sweep's per-request accept lengths, all runs


@dataclass(frozen=True)
class ModeAnalysis:
    x_axis: str  # "concurrency" or "rate"
    metric: str  # "throughput", "goodput" or "token-goodput"
    levels: tuple[ModeLevel, ...]
    crossover: Crossover
    base_runs: int
    spec_runs: int
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        c = self.crossover
        return {
            "x_axis": self.x_axis,
            "metric": self.metric,
            "unit": _METRIC_UNITS[self.metric],
            "levels": [
                {
                    "x": lv.x,
                    "base_mean": lv.base.mean,
                    "base_std": lv.base.std,
                    "spec_mean": lv.spec.mean,
                    "spec_std": lv.spec.std,
                    "ratio": None if math.isnan(lv.ratio) else lv.ratio,
                    "ratio_std": None if math.isnan(lv.ratio_std) else lv.ratio_std,
                    "accept_hist": [[edge, n] for edge, n in lv.accept_hist],
                }
                for lv in self.levels
            ],
            "crossover": {
                "status": c.status,
                "value": c.value,
                "low": c.low,
                "high": c.high,
                "std": c.std,
                "pairs": c.pairs,
                "pairs_without": c.pairs_without,
                "message": c.message,
            },
            "base_runs": self.base_runs,
            "spec_runs": self.spec_runs,
            "warnings": list(self.warnings),
        }

    def render_text(self, names: tuple[str, str]) -> str:
        axis = "C" if self.x_axis == "concurrency" else "rate (req/s)"
        unit = _METRIC_UNITS[self.metric]
        hist = any(lv.accept_hist for lv in self.levels)  # a column only where the records have histograms
        lines = [
            f"{self.metric} ({unit}) against {self.x_axis}: {names[0]} ({self.base_runs} run(s)) vs "
            f"{names[1]} ({self.spec_runs} run(s))",
            f"| {axis} | {names[0]} | {names[1]} | spec/base |" + (" spec accept length: requests |" if hist else ""),
            "|---|---|---|---|" + ("---|" if hist else ""),
        ]
        for lv in self.levels:
            ratio = "n/a" if math.isnan(lv.ratio) else f"{lv.ratio:.3f}"
            row = f"| {lv.x:g} | {_spread(lv.base)} | {_spread(lv.spec)} | {ratio} |"
            if hist:
                row += " " + (" ".join(f"{edge:g}+:{n}" for edge, n in lv.accept_hist) or "-") + " |"
            lines.append(row)
        lines.append(self.crossover.message)
        lines.extend(f"warning: {w}" for w in self.warnings)
        return "\n".join(lines)


def _spread(s: Spread) -> str:
    if math.isnan(s.mean):
        return "n/a"
    return f"{s.mean:.3g} +- {s.std:.2g}" if s.n > 1 else f"{s.mean:.3g}"


def level_mode(record: LevelSummary) -> str:
    """ "open" for an open-loop (request-rate) level, "closed" otherwise (records from before open loop existed)."""
    return "open" if "open" in (getattr(record, "mode", None), record.meta.get("mode")) else "closed"


def level_rate(record: LevelSummary) -> float | None:
    """The offered request rate of an open-loop level (req/s; inf for all at once), None when not recorded."""
    value = getattr(record, "request_rate", None)
    if value is None:
        value = record.meta.get("request_rate")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
        return None
    return float(value)


def level_goodput(record: LevelSummary, where: str) -> Goodput | None:
    """The level's goodput: the record's typed field once it has one, else its JSON under `goodput` (older
    readers keep unknown keys in meta). Raises RecordError for a goodput entry that cannot be true."""
    value = getattr(record, "goodput", None)
    if isinstance(value, Goodput):
        return value
    raw = record.meta.get("goodput") if value is None else value
    if raw is None:
        return None
    try:
        return Goodput.from_json(raw, where)
    except GoodputError as exc:
        raise RecordError(str(exc)) from None


def refuse_unaccepted_draft(spec: Sequence[LevelSummary], name: str) -> None:
    """A speculative sweep whose draft was not accepted at concurrency 1 (bench flag draft_not_accepted) is not one."""
    bad = next((r for r in spec if DRAFT_FLAG in r.flags), None)
    if bad is not None:
        problem = next((w for w in bad.warnings if "sglang#21272" in w), "its draft was not accepted")
        raise RecordError(f"{name}: not a speculative sweep: {problem}")


def _closed_only(records: Sequence[LevelSummary], name: str, warnings: list[str]) -> list[LevelSummary]:
    closed = [r for r in records if level_mode(r) == "closed"]
    if len(closed) < len(records):
        if not closed:
            raise RecordError(
                f"{name} holds only open-loop (request-rate) levels: compare them on the rate axis "
                "(analyze_mode with x_axis='rate'; `crossover --x rate`)"
            )
        warnings.append(f"{name}: {len(records) - len(closed)} open-loop level(s) left out of the concurrency axis")
    return closed


def points(records: Sequence[LevelSummary], name: str, x_axis: str, metric: str, warnings: list[str]) -> list[Point]:
    """The records as points on the axis; levels of the other loop mode, or without the metric, are left out
    (with a warning)."""
    if x_axis not in X_AXES or metric not in METRICS:
        raise RecordError(f"axis {x_axis!r} / metric {metric!r}: give x in {X_AXES} and a metric in {METRICS}")
    want = "closed" if x_axis == "concurrency" else "open"
    out: list[Point] = []
    other = no_rate = no_goodput = 0
    for index, r in enumerate(records):
        if level_mode(r) != want:
            other += 1
            continue
        x = float(r.concurrency) if x_axis == "concurrency" else level_rate(r)
        if x is None or math.isinf(x):
            no_rate += 1
            continue
        if metric == "throughput":
            y = r.throughput_tok_s
        else:
            goodput = level_goodput(r, f"{name} record {index + 1}")
            if goodput is None:
                no_goodput += 1
                continue
            y = goodput.request_goodput if metric == "goodput" else goodput.token_goodput
        out.append(Point(r.run_id, x, y, tuple(getattr(r, "accept_hist", ()))))
    if other:
        mode = "open-loop (request-rate)" if want == "closed" else "closed-loop (concurrency)"
        warnings.append(f"{name}: {other} {mode} level(s) are not on the {x_axis} axis and are left out")
    if no_rate:
        warnings.append(f"{name}: {no_rate} open-loop level(s) without a finite request rate are left out")
    if no_goodput:
        warnings.append(f"{name}: {no_goodput} level(s) without goodput (measured without --slo) are left out")
    return out


def analyze_mode(
    base: Sequence[LevelSummary],
    spec: Sequence[LevelSummary],
    names: tuple[str, str],
    x_axis: str = "concurrency",
    metric: str = "throughput",
) -> ModeAnalysis:
    """Where spec/base of `metric` falls through 1 along `x_axis`. Raises RecordError when it cannot be found."""
    warnings: list[str] = []
    refuse_changed_server(base, names[0])
    refuse_changed_server(spec, names[1])
    refuse_mixed_allreduce(base, spec, names, warnings)
    _check_labels(base, spec, names, warnings)
    return compare_points(
        points(base, names[0], x_axis, metric, warnings),
        points(spec, names[1], x_axis, metric, warnings),
        names,
        x_axis,
        metric,
        warnings,
    )


def _key(x: float) -> float:
    return round(x, 9)  # rates typed on two command lines as 2 and 2.0 are one level


def compare_points(
    base: Sequence[Point],
    spec: Sequence[Point],
    names: tuple[str, str],
    x_axis: str,
    metric: str,
    warnings: list[str] | None = None,
) -> ModeAnalysis:
    """The crossover of two sets of points (several runs by run_id); interpolated in log(x) on log(ratio)."""
    notes = list(warnings or [])

    hists: dict[float, Counter[float]] = {}

    def runs(pts: Sequence[Point], name: str) -> list[dict[float, float]]:
        out: dict[str, dict[float, float]] = {}
        for p in pts:
            if pts is spec:
                for edge, n in p.accept_hist:
                    hists.setdefault(_key(p.x), Counter())[edge] += n
            if not (math.isfinite(p.x) and p.x > 0 and math.isfinite(p.y) and p.y >= 0):
                notes.append(f"{name}: a level at {p.x:g} with {metric} {p.y:g} is not usable and is left out")
                continue
            curve = out.setdefault(p.run_id, {})
            if _key(p.x) in curve:
                notes.append(f"{name}: run {p.run_id or '(no id)'} has {x_axis} {p.x:g} twice; the later one is used")
            curve[_key(p.x)] = p.y
        return list(out.values())

    base_runs, spec_runs = runs(base, names[0]), runs(spec, names[1])
    base_x = set().union(*(c.keys() for c in base_runs)) if base_runs else set()
    spec_x = set().union(*(c.keys() for c in spec_runs)) if spec_runs else set()
    common = sorted(base_x & spec_x)
    flag = "--request-rate" if x_axis == "rate" else "--concurrency"
    if len(common) < 2:
        raise RecordError(
            f"the sweeps share {len(common)} {x_axis} level(s) with {metric} ({names[0]} has "
            f"{_xs(base_x) or 'none'}, {names[1]} has {_xs(spec_x) or 'none'}): run both with the same {flag}"
            + (" and --slo" if metric != "throughput" else "")
        )
    if only := sorted(base_x ^ spec_x):
        notes.append(f"{x_axis} levels measured in only one sweep are left out: {_xs(only)}")
    levels: list[ModeLevel] = []
    for x in common:
        b = Spread.of([c[x] for c in base_runs if x in c])
        s = Spread.of([c[x] for c in spec_runs if x in c])
        ratio = s.mean / b.mean if b.mean > 0 else math.nan
        rel = math.hypot(s.std / s.mean if s.mean else 0.0, b.std / b.mean if b.mean else 0.0)
        levels.append(ModeLevel(x, b, s, ratio, ratio * rel, tuple(sorted(hists.get(x, Counter()).items()))))
    crossover = _crossover_xy(levels, base_runs, spec_runs, x_axis, metric)
    return ModeAnalysis(x_axis, metric, tuple(levels), crossover, len(base_runs), len(spec_runs), tuple(notes))


def _xs(values: Iterable[float]) -> str:
    return ",".join(f"{v:g}" for v in sorted(values))


def _crossover_xy(
    levels: Sequence[ModeLevel],
    base_runs: Sequence[dict[float, float]],
    spec_runs: Sequence[dict[float, float]],
    x_axis: str,
    metric: str,
) -> Crossover:
    xs = [lv.x for lv in levels]

    def at(v: float) -> str:
        return f"C={v:.1f}" if x_axis == "concurrency" else f"{v:.3g} req/s"

    status, value, crossings = interpolate(xs, [lv.base.mean for lv in levels], [lv.spec.mean for lv in levels])
    pair_values, pairs = pair_crossings(xs, base_runs, spec_runs)
    lo, hi = at(xs[0]), at(xs[-1])
    if status == "below-range":
        message = f"speculation has less {metric} already at the lowest level {lo}: no crossover in range"
        if metric != "throughput":
            message += " (or no request met the SLOs there: check the goodput counts)"
        return Crossover(status, None, pairs=pairs, message=message)
    if status == "above-range":
        flag = "--request-rate" if x_axis == "rate" else "--concurrency"
        return Crossover(
            status,
            None,
            pairs=pairs,
            message=f"speculation has more {metric} at every level up to {hi}: the crossover lies above "
            f"{hi} (not measured); extend {flag} to find it",
        )
    if status != "found" or value is None:
        return Crossover(
            "invalid",
            None,
            pairs=pairs,
            message=f"too few levels with {metric} above 0 in both sweeps to interpolate (a level where no "
            "request met the SLOs has a goodput of 0)",
        )
    message = f"speculation stops paying in {metric} near {at(value)}"
    if crossings > 1:
        message += f" (the ratio crosses 1 {crossings} times: noisy or non-monotonic; the first crossing is used)"
    if len(pair_values) >= 2:
        _, std = mean_std(pair_values)
        return Crossover(
            status, value, min(pair_values), max(pair_values), std, pairs, pairs - len(pair_values), message
        )
    return Crossover(status, value, pairs=pairs, pairs_without=pairs - len(pair_values), message=message)

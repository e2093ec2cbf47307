"""Pure judges of a soak: its samples in, doctor Results out (family "soak"), each naming when it happened.

A verdict that found something says the time (UTC, and seconds into the soak) and carries the samples around that
moment in `data["around"]` (AROUND_S either side), so the JSON report shows what the GPU and the server did then.
Thresholds that are our choice say so in their constant's comment. Remedies come from doctor/remedies.py and the Xid
catalogue (doctor/gpu/xid.py), never written here.
"""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from sm120check.doctor import remedies
from sm120check.doctor.gpu import xid as xid_catalogue
from sm120check.doctor.gpu.payloads import XidEvent
from sm120check.doctor.model import Result, Status
from sm120check.doctor.node_health.verdicts import TEMPERATURE_WARN_C, reason_names
from sm120check.soak.samples import GpuSample, Sample, SamplerNote, ServerInterval, XidSample

FAMILY = "soak"
LEVEL = 4
AROUND_S = 3.0  # samples kept either side of a finding
THERMAL = 0x20 | 0x40  # SW and HW thermal slowdown
POWER = 0x80  # HW power brake
HW_SLOWDOWN = 0x8
SEEN = 0x4 | HW_SLOWDOWN | THERMAL | POWER  # the reasons a passing throttle verdict still counts (SW power cap too)
# our choices:
NEAR_SLOWDOWN_C = 5  # warn within this many degrees of the GPU's slowdown threshold
BUSY_PERCENT = 50  # "under load": GPU utilization at least this
COLLAPSE_FRACTION = 0.5  # tokens/s under half the soak's median ...
MIN_BASELINE_INTERVALS = 10  # ... once the soak has this many intervals with tokens to take a median of


@dataclass(frozen=True)
class Bounds:
    """How long is "sustained" and how long a silence is a stall (seconds)."""

    sustain_s: float = 30.0  # our choice: throttling or a collapse this long in a row
    stall_s: float = 30.0  # our choice: no token for this long while requests are in flight


@dataclass(frozen=True)
class Soak:
    """What the verdicts read: the samples, when the soak started, and whether a server was driven."""

    samples: tuple[Sample, ...]
    start: float
    server: bool = False
    bounds: Bounds = Bounds()

    def of(self, kind: type) -> list:  # type: ignore[type-arg]
        return [s for s in self.samples if isinstance(s, kind)]


def when(t: float, start: float) -> str:
    clock = datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%H:%M:%S UTC")
    return f"{clock} ({t - start:+.0f} s into the soak)"


def around(samples: Sequence[Sample], t: float) -> list[dict[str, object]]:
    return [{"kind": s.kind, **asdict(s)} for s in samples if abs(s.t - t) <= AROUND_S]


def _result(vid: str, status: Status, summary: str, details: str = "", remedy: str = "", **data: object) -> Result:
    return Result(vid, status, summary, details, remedy, dict(data), family=FAMILY, level=LEVEL)


def _finding(
    soak: Soak, vid: str, status: Status, t: float, summary: str, details: str, remedy: str, **data: object
) -> Result:
    return _result(
        vid,
        status,
        f"{summary} at {when(t, soak.start)}",
        details,
        remedy,
        at=t,
        around=around(soak.samples, t),
        **data,
    )


def runs(samples: Sequence[GpuSample], bad: Callable[[GpuSample], bool]) -> list[tuple[float, float]]:
    """(first, last) times of each run of consecutive samples of one GPU where `bad` holds."""
    runs: list[tuple[float, float]] = []
    first: float | None = None
    last = 0.0
    for s in samples:
        if bad(s):
            first = s.t if first is None else first
            last = s.t
        elif first is not None:
            runs.append((first, last))
            first = None
    if first is not None:
        runs.append((first, last))
    return runs


def _by_gpu(soak: Soak) -> dict[int, list[GpuSample]]:
    found: dict[int, list[GpuSample]] = {}
    for s in soak.of(GpuSample):
        found.setdefault(s.gpu, []).append(s)
    return found


def _no_gpu(vid: str, soak: Soak) -> Result | None:
    if soak.of(GpuSample):
        return None
    note = next((n.text for n in soak.of(SamplerNote) if n.event in ("failed", "hung")), "")
    return _result(vid, Status.SKIP, f"no GPU sample was read{f' ({note})' if note else ''}", remedy=remedies.SOAK_NVML)


# ---- Xid, the bus, NVML ------------------------------------------------------------------------------------------


def xids(soak: Soak) -> Result:
    """Xids seen during the soak (NVML events and new kernel log lines): fail on any the catalogue marks fail."""
    vid = "soak_xid"
    events: list[XidSample] = soak.of(XidSample)
    if not events:
        return _result(vid, Status.PASS, "no Xid during the soak")
    infos = [(e, xid_catalogue.lookup(e.xid)) for e in events]
    failing = [(e, i) for e, i in infos if i.severity == "fail"]
    first, info = (failing or infos)[0]
    lines = [
        f"{when(e.t, soak.start)}: Xid {e.xid} ({i.name}, {i.severity}) on {_where(e)} from the {e.source}"
        + (f": {e.text}" if e.text else "")
        for e, i in infos[:20]
    ]
    steps = remedies.all_of(*(f"Xid {i.xid}: {i.action}" for _, i in (failing or infos)))
    status = Status.FAIL if failing else Status.WARN
    return _finding(
        soak, vid, status, first.t, f"Xid {first.xid} ({info.name}) on {_where(first)}", "\n".join(lines), steps,
        xids=sorted({e.xid for e in events}),
    )  # fmt: skip


def _where(e: XidSample) -> str:
    return f"GPU {e.gpu}" if e.gpu is not None else (e.pci or "an unnamed GPU")


def gpu_on_bus(soak: Soak) -> Result:
    """The GPU left the bus: NVML says GPU_IS_LOST / RESET_REQUIRED, or Xid 79."""
    vid = "soak_gpu_bus"
    if (skip := _no_gpu(vid, soak)) is not None and not soak.of(XidSample):
        return skip
    lost = [s for s in soak.of(GpuSample) if s.lost]
    fell = [e for e in soak.of(XidSample) if e.xid == 79]
    if not lost and not fell:
        return _result(vid, Status.PASS, "every GPU answered NVML to the end")
    t = min([s.t for s in lost] + [e.t for e in fell])
    who = f"GPU {lost[0].gpu} ({lost[0].lost})" if lost and lost[0].t == t else _where(fell[0]) + " (Xid 79)"
    return _finding(soak, vid, Status.FAIL, t, f"{who} left the bus", "", remedies.GPU_OFF_BUS)


def sampler(soak: Soak) -> Result:
    """The sampler itself: a hung NVML call (killed by the watchdog) is a wedged GPU or driver."""
    vid = "soak_nvml"
    notes: list[SamplerNote] = soak.of(SamplerNote)
    hung = [n for n in notes if n.event == "hung"]
    if hung:
        return _finding(soak, vid, Status.FAIL, hung[0].t, f"NVML stopped answering: {hung[0].text}", "",
                        remedies.SOAK_SAMPLER_HUNG)  # fmt: skip
    failed = [n for n in notes if n.event == "failed"]
    if failed and not soak.of(GpuSample):
        return _result(vid, Status.SKIP, f"the sampler did not run: {failed[0].text}", remedy=remedies.SOAK_NVML)
    gpus = len({s.gpu for s in soak.of(GpuSample)})
    note = next((n.text for n in notes if n.event == "end" and n.text), "")
    summary = f"{len(soak.of(GpuSample))} samples of {gpus} GPU(s)" + (f"; {note}" if note else "")
    load = next((n for n in notes if n.event == "load"), None)
    if load is not None and "did not" in load.text:  # --sm-load asked for: the GPUs were sampled without it
        return _result(vid, Status.WARN, f"{summary}; {load.text}", remedy=remedies.COMPUTE_LOAD)
    return _result(vid, Status.PASS, summary + (f"; {load.text}" if load is not None else ""))


# ---- the server --------------------------------------------------------------------------------------------------


def _longest_wait(intervals: list[ServerInterval]) -> float:
    """The longest run of consecutive intervals with requests in flight and no error, in seconds."""
    longest = run = 0.0
    for i in intervals:
        run = run + i.seconds if i.in_flight and not i.errors else 0.0
        longest = max(longest, run)
    return longest


def server(soak: Soak) -> Result:
    """The server died (every request failing to the end) or stalled (no token for stall_s while requests were in
    flight)."""
    vid = "soak_server"
    intervals: list[ServerInterval] = soak.of(ServerInterval)
    if not soak.server:
        return _result(vid, Status.SKIP, "no server was driven (give --url)")
    if not intervals:
        return _result(vid, Status.FAIL, "no interval of the server was recorded", remedy=remedies.SOAK_SERVER_DIED)
    last_token = max((i.t for i in intervals if i.tokens), default=None)
    tail = [i for i in intervals if last_token is None or i.t > last_token]
    failing = [i for i in tail if i.errors]
    # died: requests kept failing (retried each second: at least two intervals of failures) and no token came back;
    # intervals between failures with requests still waiting on the dead server are part of it, unless they add up
    # to a stall
    if len(failing) >= 2 and _longest_wait(tail) < soak.bounds.stall_s:
        first = failing[0]
        return _finding(
            soak, vid, Status.FAIL, first.t,
            f"the server died ({first.error or 'requests failed'}); its first failed request",
            f"{sum(i.errors for i in tail)} requests failed from then to the end", remedies.SOAK_SERVER_DIED,
        )  # fmt: skip
    run: list[ServerInterval] = []
    for interval in intervals:
        if interval.in_flight and not interval.tokens:
            run.append(interval)
            if run[-1].t + run[-1].seconds - run[0].t >= soak.bounds.stall_s:
                return _finding(
                    soak, vid, Status.FAIL, run[0].t,
                    f"the server stalled: no token for {soak.bounds.stall_s:g} s with requests in flight",
                    f"{run[0].in_flight} requests in flight", remedies.SOAK_SERVER_STALLED,
                )  # fmt: skip
        else:
            run = []
    errors = sum(i.errors for i in intervals)
    tokens = sum(i.tokens for i in intervals)
    status = Status.WARN if errors else Status.PASS
    return _result(vid, status, f"{tokens} tokens, {errors} failed requests over {len(intervals)} intervals",
                   remedy=remedies.SOAK_SERVER_DIED if errors else "", tokens=tokens, errors=errors)  # fmt: skip


def throughput(soak: Soak) -> Result:
    """A sustained throughput collapse: tokens/s under COLLAPSE_FRACTION of the soak's median for sustain_s in a row
    while requests were in flight and none failed."""
    vid = "soak_throughput"
    if not soak.server:
        return _result(vid, Status.SKIP, "no server was driven (give --url)")
    intervals = [i for i in soak.of(ServerInterval) if i.in_flight and not i.errors]
    busy = [i.tokens_per_s for i in intervals if i.tokens]
    if len(busy) < MIN_BASELINE_INTERVALS:
        return _result(vid, Status.SKIP, f"{len(busy)} intervals with tokens: too few for a median")
    median = float(statistics.median(busy))
    floor = COLLAPSE_FRACTION * median
    run: list[ServerInterval] = []
    for interval in intervals:
        if interval.tokens_per_s < floor:
            run.append(interval)
            if run[-1].t + run[-1].seconds - run[0].t >= soak.bounds.sustain_s:
                mean = sum(i.tokens for i in run) / sum(i.seconds for i in run)
                return _finding(
                    soak, vid, Status.FAIL, run[0].t,
                    f"throughput collapsed to {mean:.0f} tok/s (median {median:.0f}) for {soak.bounds.sustain_s:g} s",
                    "", remedies.SOAK_THROUGHPUT, tokens_per_s_median=median,
                )  # fmt: skip
        else:
            run = []
    return _result(vid, Status.PASS, f"median {median:.0f} tok/s, no sustained collapse", tokens_per_s_median=median)


# ---- clocks, power, temperature, counters ------------------------------------------------------------------------


def _has(mask: int) -> Callable[[GpuSample], bool]:
    return lambda s: bool((s.reasons or 0) & mask)


def throttling(soak: Soak) -> Result:
    """Sustained thermal slowdown, HW power brake or HW slowdown (SW power cap alone is the limit doing its job)."""
    vid = "soak_throttle"
    if (skip := _no_gpu(vid, soak)) is not None:
        return skip
    for gpu, samples in sorted(_by_gpu(soak).items()):
        for mask in (THERMAL, POWER | HW_SLOWDOWN):
            for first, last in runs(samples, _has(mask)):
                if last - first >= soak.bounds.sustain_s:
                    seen = 0
                    for s in samples:
                        seen |= (s.reasons or 0) if first <= s.t <= last else 0
                    names = ", ".join(reason_names(seen & mask))
                    remedy = remedies.COOLING if mask == THERMAL else remedies.CLOCKS_HW_SLOWDOWN
                    return _finding(soak, vid, Status.WARN, first, f"GPU {gpu}: {names} for {last - first:.0f} s",
                                    f"from {when(first, soak.start)} to {when(last, soak.start)}", remedy)  # fmt: skip
    return _result(vid, Status.PASS, "no sustained thermal or power throttling" + _seen(soak))


def _seen(soak: Soak) -> str:
    """What a passing throttle verdict saw: each throttling reason's share of the samples and its longest run."""
    parts = []
    by_gpu = _by_gpu(soak)
    total = sum(len(g) for g in by_gpu.values())
    for bit in (b for b in range(8) if (1 << b) & SEEN):
        hits = sum(1 for g in by_gpu.values() for s in g if (s.reasons or 0) & (1 << bit))
        if hits:
            longest = max(last - first + 1 for g in by_gpu.values() for first, last in runs(g, _has(1 << bit)))
            parts.append(f"{reason_names(1 << bit)[0]} in {hits} of {total} samples, at most {longest:.0f} s in a row")
    return f" ({'; '.join(parts)})" if parts else ""


def slow_sample(s: GpuSample) -> bool:
    """The SM clock below the base clock while the GPU is busy."""
    return (
        s.sm_mhz is not None and s.base_sm_mhz is not None and (s.utilization or 0) >= BUSY_PERCENT
        and s.sm_mhz < s.base_sm_mhz
    )  # fmt: skip


def clocks(soak: Soak) -> Result:
    """The SM clock below the base clock (the default application clock) while the GPU is busy, sustained."""
    vid = "soak_clocks"
    if (skip := _no_gpu(vid, soak)) is not None:
        return skip
    medians: dict[str, float] = {}
    models: dict[str, str] = {}
    for gpu, samples in sorted(_by_gpu(soak).items()):
        busy = [s.sm_mhz for s in samples if s.sm_mhz is not None and (s.utilization or 0) >= BUSY_PERCENT]
        models[str(gpu)] = next((s.name for s in samples if s.name), "")
        if busy:
            medians[str(gpu)] = float(statistics.median(busy))

        for first, last in runs(samples, slow_sample):
            if last - first >= soak.bounds.sustain_s:
                at = next(s for s in samples if s.t == first)
                reasons = ", ".join(reason_names(at.reasons or 0)) or "no reason given"
                return _finding(soak, vid, Status.WARN, first,
                                f"GPU {gpu}: SM clock {at.sm_mhz} MHz below its base {at.base_sm_mhz} MHz under load "
                                f"for {last - first:.0f} s", f"clock-event reasons then: {reasons}",
                                remedies.SOAK_CLOCKS_BELOW_BASE, sm_mhz_median=medians, models=models)  # fmt: skip
    below = [(s.sm_mhz or 0, s.base_sm_mhz or 0) for g in _by_gpu(soak).values() for s in g if slow_sample(s)]
    base = sorted({b for _, b in below})
    longest = max((last - first + 1 for g in _by_gpu(soak).values() for first, last in runs(g, slow_sample)), default=0)
    dips = (
        f" but for dips of {longest:.0f} s at most ({len(below)} samples, lowest {min(m for m, _ in below)} MHz, "
        f"base {'/'.join(map(str, base))} MHz)"
        if below else ""
    )  # fmt: skip
    return _result(vid, Status.PASS, f"SM clocks at or above base under load{dips}", sm_mhz_median=medians,
                   models=models)  # fmt: skip


def temperature(soak: Soak) -> Result:
    """The GPU within NEAR_SLOWDOWN_C of its slowdown threshold (else TEMPERATURE_WARN_C when NVML gives none)."""
    vid = "soak_temperature"
    if (skip := _no_gpu(vid, soak)) is not None:
        return skip
    hottest: dict[str, int] = {}
    for gpu, samples in sorted(_by_gpu(soak).items()):
        for s in samples:
            if s.temperature_c is None:
                continue
            hottest[str(gpu)] = max(hottest.get(str(gpu), s.temperature_c), s.temperature_c)
            limit = s.slowdown_c - NEAR_SLOWDOWN_C if s.slowdown_c else TEMPERATURE_WARN_C
            if s.temperature_c >= limit:
                said = f"slowdown at {s.slowdown_c} C" if s.slowdown_c else f"warn at >= {TEMPERATURE_WARN_C} C"
                fan = f", fan {s.fan_percent} %" if s.fan_percent is not None else ""
                return _finding(soak, vid, Status.WARN, s.t, f"GPU {gpu}: {s.temperature_c} C ({said}{fan})", "",
                                remedies.COOLING, temperature_c_max=hottest)  # fmt: skip
    return _result(vid, Status.PASS, "temperatures clear of the slowdown threshold", temperature_c_max=hottest)


def counters(soak: Soak) -> Result:
    """ECC error counts, pending or failed row remaps, and PCIe replays that rose during the soak."""
    vid = "soak_counters"
    if (skip := _no_gpu(vid, soak)) is not None:
        return skip
    for gpu, samples in sorted(_by_gpu(soak).items()):
        for name, remedy in (
            ("ecc_uncorrected", remedies.ECC_UNCORRECTED),
            ("remap_failure", remedies.ECC_ROW_REMAP_FAILED),
            ("remap_pending", remedies.ECC_PENDING),
            ("ecc_corrected", remedies.ECC_LIFETIME),
            ("pcie_replay", remedies.PCIE_REPLAY),
        ):
            values = [(s.t, getattr(s, name)) for s in samples if getattr(s, name) is not None]
            if not values:
                continue
            start = values[0][1]
            rose = next(((t, v) for t, v in values if v > start), None)
            if rose is not None:
                said = f"GPU {gpu}: {name} rose from {start} to {values[-1][1]}"
                return _finding(soak, vid, Status.WARN, rose[0], said, "", remedy)
    return _result(vid, Status.PASS, "no ECC, row-remap or PCIe replay counter rose")


JUDGES: tuple[Callable[[Soak], Result], ...] = (
    xids, gpu_on_bus, sampler, server, throughput, throttling, clocks, temperature, counters,
)  # fmt: skip


def judge(soak: Soak) -> list[Result]:
    return [j(soak) for j in JUDGES]


def from_kernel_log(events: Sequence[XidEvent], boot_epoch: float, since: float) -> list[XidSample]:
    """Kernel-log Xid events (doctor/gpu/kernel_log.parse) at or after `since` (Unix time) as soak samples; a
    line without an uptime stamp is kept (its time is `since`)."""
    found = []
    for e in events:
        t = boot_epoch + e.uptime_s if e.uptime_s is not None else since
        if t >= since:
            found.append(XidSample(t, e.xid, None, e.pci, e.text, "kernel log"))
    return found

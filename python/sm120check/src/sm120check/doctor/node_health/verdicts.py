"""Pure judges: a node-health payload in, a Result (pass / warn / fail / skip, summary, details, remedy) out.

Per-GPU functions take one GpuHealth; `combine` folds them into one node verdict (the worst status first).
Thresholds that are our choice say so in their constant's comment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from sm120check.doctor import remedies
from sm120check.doctor.gpu import xid as xid_catalogue
from sm120check.doctor.gpu.payloads import (
    PEER_NOT_MEASURED,
    GpuHealth,
    KernelLog,
    PeerAnswer,
    PeerLink,
    PeerPair,
    Reading,
)
from sm120check.doctor.model import Result, Status
from sm120check.doctor.node_health.sglang_configs import TunedConfigs

PASS, WARN, FAIL, SKIP = Status.PASS, Status.WARN, Status.FAIL, Status.SKIP
_RANK = {FAIL: 3, WARN: 2, PASS: 1, SKIP: 0}
GIB = 1 << 30


def combine(id: str, verdicts: Sequence[Result], empty: str = "no GPU to judge") -> Result:
    """One node verdict: the worst status; the summary lists the GPUs that are not fine."""
    if not verdicts:
        return Result(id, SKIP, empty)
    worst = max(_RANK[v.status] for v in verdicts)
    status = next(s for s, r in _RANK.items() if r == worst)
    bad = [v for v in verdicts if v.status == status]
    summary = bad[0].summary if len(bad) == 1 else f"{len(bad)} GPUs: " + "; ".join(v.summary for v in bad)
    details = "\n".join(v.details for v in verdicts if v.details)
    return Result(id, status, summary, details, remedies.all_of(*(v.remedy for v in bad)))


# ---- PCIe link ---------------------------------------------------------------------------------------------------

_GT_PER_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
_ENCODING = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}  # Gen6: FLIT mode


def link_gbps(gen: int, width: int) -> float:
    """Raw one-direction rate of a PCIe link in GB/s: GT/s x lanes x encoding / 8 (Gen5 x16 = 32 x 16 x 128/130 / 8
    = 63.0 GB/s; Gen4 x16 = 31.5 GB/s)."""
    return _GT_PER_S.get(gen, 0.0) * width * _ENCODING.get(gen, 1.0) / 8


def _link(gen: int | None, width: int | None) -> str:
    return f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"


def pcie_link(gpu: GpuHealth) -> Result:
    """Current link vs the most it can train to, read while copies ran (an idle link may sit at Gen1 to save power)."""
    vid = "pcie_link"
    if gpu.lost:
        return Result(
            vid,
            FAIL,
            f"GPU {gpu.index}: NVML cannot reach it ({gpu.lost}): it fell off the bus or needs a reset",
            remedy=remedies.GPU_OFF_BUS,
        )
    if not (gpu.pcie_gen_max.ok and gpu.pcie_width_max.ok):
        return Result(vid, SKIP, f"GPU {gpu.index}: NVML gives no maximum link ({gpu.pcie_gen_max.status})")
    max_gen, max_width = gpu.pcie_gen_max.value or 0, gpu.pcie_width_max.value or 0
    idle = _link(gpu.pcie_gen.value, gpu.pcie_width.value)
    gpu_max = gpu.pcie_gen_gpu_max.value if gpu.pcie_gen_gpu_max.ok else None
    details = f"GPU {gpu.index} ({gpu.bus_id}): max {_link(max_gen, max_width)}, idle {idle}"
    if gpu_max is not None:
        details += f", the GPU itself can do Gen{gpu_max}"
    busy = gpu.load
    if busy is None or busy.busy_gen is None or busy.busy_width is None:
        if gpu.pcie_gen.value == max_gen and gpu.pcie_width.value == max_width:
            return Result(vid, PASS, f"GPU {gpu.index}: link {idle} (at its maximum even idle)", details)
        return Result(
            vid,
            SKIP,
            f"GPU {gpu.index}: link read only at idle ({idle} of {_link(max_gen, max_width)}): links drop "
            "generation at idle, so this is no verdict; run with the load",
            details,
        )
    gen, width = busy.busy_gen, busy.busy_width
    details += f", busy {_link(gen, width)} ({len(busy.samples)} distinct samples during the copies)"
    fraction = link_gbps(gen, width) / link_gbps(max_gen, max_width) if link_gbps(max_gen, max_width) else 1.0
    if gen >= max_gen and width >= max_width:
        if gpu_max is not None and gpu_max > max_gen:
            return Result(
                vid,
                WARN,
                f"GPU {gpu.index}: link {_link(gen, width)} is the slot's limit, the GPU can do Gen{gpu_max}",
                details,
                remedies.PCIE_SLOT_GEN,
            )
        return Result(vid, PASS, f"GPU {gpu.index}: link {_link(gen, width)} under load (its maximum)", details)
    summary = (
        f"GPU {gpu.index}: link trained at {_link(gen, width)} under load, below its maximum "
        f"{_link(max_gen, max_width)} ({fraction:.0%} of the bandwidth)"
    )
    return Result(vid, FAIL if fraction < 0.5 else WARN, summary, details, remedies.PCIE_SLOT)


REPLAY_WARN = 100  # our choice: a few replays happen on healthy links; hundreds mean signal-integrity trouble


def pcie_replay(gpu: GpuHealth) -> Result:
    vid = "pcie_replay"
    if not gpu.pcie_replay.ok:
        return Result(vid, SKIP, f"GPU {gpu.index}: replay counter {gpu.pcie_replay.status}")
    count = gpu.pcie_replay.value or 0
    if count >= REPLAY_WARN:
        return Result(
            vid,
            WARN,
            f"GPU {gpu.index}: {count} PCIe replays since the driver loaded (warn at >= {REPLAY_WARN})",
            f"GPU {gpu.index} ({gpu.bus_id}) replay counter {count}",
            remedies.PCIE_REPLAY,
        )
    return Result(vid, PASS, f"GPU {gpu.index}: {count} PCIe replays")


# ---- Xid ---------------------------------------------------------------------------------------------------------


def xid(log: KernelLog, since_s: float | None = None) -> Result:
    """Xids of this boot (or after `since_s` seconds of uptime), each with NVIDIA's meaning and the next step."""
    vid = "gpu_xid"
    if log.error:
        return Result(vid, SKIP, log.error, remedy=remedies.KERNEL_LOG_ROOT)
    events = [e for e in log.events if since_s is None or e.uptime_s is None or e.uptime_s >= since_s]
    window = "since boot" if since_s is None else f"since {since_s:.0f} s after boot"
    cut = f"; {log.cut}" if log.cut else ""  # a cut log was read from its newest line back: older Xids unseen
    if not events:
        return Result(vid, PASS, f"no Xid in the kernel log {window} ({log.source}, {log.lines} lines{cut})")
    seen: dict[tuple[int, str], int] = {}
    for event in events:
        seen[(event.xid, event.pci)] = seen.get((event.xid, event.pci), 0) + 1
    lines, steps = [], []
    worst = WARN
    for (number, pci), times in seen.items():
        info = xid_catalogue.lookup(number)
        if info.severity == FAIL:
            worst = FAIL
        lines.append(f"Xid {number} ({info.name}) on {pci}, {times}x")
        step = f"Xid {number}: {info.action}"
        if step not in steps:
            steps.append(step)
    fallen = [pci for (number, pci) in seen if number == 79]
    if fallen:
        summary = f"GPU {', '.join(fallen)} fell off the bus (Xid 79) {window}"
    else:
        summary = f"{len(events)} Xid events {window}: " + ", ".join(lines)
    example = "\n".join(f"  {e.pci}: Xid {e.xid}, {e.text}" for e in events[:5])
    details = "\n".join(lines) + "\nfirst lines:\n" + example + (f"\n{log.cut}" if log.cut else "")
    return Result(vid, worst, summary, details, remedies.all_of(*steps))


# ---- memory health -----------------------------------------------------------------------------------------------


def ecc(gpu: GpuHealth) -> Result:
    """Uncorrectable ECC counts, retired pages and remapped rows (pending / failure)."""
    vid = "gpu_ecc"
    g = f"GPU {gpu.index}"
    parts = [
        f"ECC mode {_onoff(gpu.ecc_mode)}",
        f"uncorrected volatile {gpu.ecc_uncorrected_volatile.shown()}",
        f"aggregate {gpu.ecc_uncorrected_aggregate.shown()}",
        f"retired pages {gpu.retired_pages.shown()} (pending {gpu.retired_pending.shown()})",
        f"remapped rows correctable {gpu.remap_correctable.shown()} uncorrectable {gpu.remap_uncorrectable.shown()}"
        f" pending {gpu.remap_pending.shown()} failure {gpu.remap_failure.shown()}",
    ]
    details = f"{g} ({gpu.bus_id}): " + ", ".join(parts)
    if gpu.remap_failure.ok and gpu.remap_failure.value:
        return Result(
            vid,
            FAIL,
            f"{g}: row remapping failed (no spare rows left for a bad memory row)",
            details,
            remedies.ECC_ROW_REMAP_FAILED,
        )
    if gpu.ecc_uncorrected_volatile.ok and gpu.ecc_uncorrected_volatile.value:
        return Result(
            vid,
            FAIL,
            f"{g}: {gpu.ecc_uncorrected_volatile.value} uncorrectable ECC errors since the driver loaded",
            details,
            remedies.ECC_UNCORRECTED,
        )
    pending = [w for w, r in (("row remap", gpu.remap_pending), ("page retirement", gpu.retired_pending)) if r.value]
    if pending:
        return Result(
            vid,
            WARN,
            f"{g}: {' and '.join(pending)} pending: it takes effect only after a GPU reset",
            details,
            remedies.ECC_PENDING,
        )
    if gpu.ecc_uncorrected_aggregate.ok and gpu.ecc_uncorrected_aggregate.value:
        return Result(
            vid,
            WARN,
            f"{g}: {gpu.ecc_uncorrected_aggregate.value} uncorrectable ECC errors in its lifetime (none this boot)",
            details,
            remedies.ECC_LIFETIME,
        )
    if not gpu.ecc_mode.ok:
        return Result(vid, PASS, f"{g}: ECC {gpu.ecc_mode.status}; remapped rows {gpu.remap_failure.status}", details)
    return Result(vid, PASS, f"{g}: no uncorrectable memory errors, no pending or failed remaps", details)


def _onoff(reading: Reading) -> str:
    return ("on" if reading.value else "off") if reading.ok else f"({reading.status})"


# ---- clocks, power, temperature ----------------------------------------------------------------------------------

# nvml.h nvmlClocksEventReasons bits
REASONS = {
    0x1: "GPU idle",
    0x2: "applications clocks setting",
    0x4: "SW power cap",
    0x8: "HW slowdown",
    0x10: "sync boost",
    0x20: "SW thermal slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake slowdown",
    0x100: "display clock setting",
}
_FAIL_REASONS = 0x8 | 0x40 | 0x80  # what azurehpc's check_gpu_clock_throttling flags: HW slowdown, thermal, brake
_WARN_REASONS = 0x20
_POWER_CAP = 0x4
TEMPERATURE_WARN_C = 85  # our choice: near the slowdown temperature of these parts


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in REASONS.items() if mask & bit]


def clocks(gpu: GpuHealth) -> Result:
    """Clock-event reasons seen while the FMA kernel kept every SM busy (else during the copies, else at rest), power
    limit below the default, temperature. SW power cap under the SM load is normal (the kernel draws up to the
    limit): only HW slowdown, HW thermal and HW power brake fail, as in azurehpc's throttling check."""
    vid = "gpu_clocks"
    g = f"GPU {gpu.index}"
    compute = gpu.compute
    under_sm = compute is not None and not compute.error and compute.reasons is not None
    load_mask = gpu.load.busy_reasons if gpu.load is not None else None
    if under_sm and compute is not None:
        mask, when = compute.reasons, "under the SM load"
    elif load_mask is not None:
        mask, when = load_mask, "during the copies"
    else:
        mask, when = gpu.clock_reasons.value, "at rest"
    details = (
        f"{g}: reasons {when}: {', '.join(reason_names(mask or 0)) or 'none'}; power limit "
        f"{_watts(gpu.power_limit_mw)} (default {_watts(gpu.power_default_mw)}, enforced "
        f"{_watts(gpu.power_enforced_mw)}); temperature {gpu.temperature_c.shown(' C')} at rest"
    )
    if compute is not None and under_sm:
        details += (
            f"\n{g}: SM load {compute.seconds} s ({compute.blocks} blocks x {compute.threads} threads, "
            f"{compute.iterations} FMA iterations, {compute.arch}): {len(compute.samples)} samples, SM clock min "
            f"{_opt(compute.sm_mhz_min, ' MHz')}, power max {_opt_watts(compute.power_mw_max)}, temperature max "
            f"{_opt(compute.temperature_c_max, ' C')}"
        )
    if mask is not None and mask & _FAIL_REASONS:
        return Result(
            vid,
            FAIL,
            f"{g}: clocks held down by {', '.join(reason_names(mask & _FAIL_REASONS))} {when}",
            details,
            remedies.CLOCKS_HW_SLOWDOWN,
        )
    limit, default = gpu.power_limit_mw, gpu.power_default_mw
    if limit.ok and default.ok and (limit.value or 0) < (default.value or 0):
        return Result(
            vid,
            WARN,
            f"{g}: power limit {_watts(limit)} is below the default {_watts(default)}",
            details,
            remedies.power_limit(gpu.index, (default.value or 0) // 1000),
        )
    if compute is not None and not under_sm:
        why = compute.error or "no clock sample was read during it"
        return Result(
            vid,
            WARN,
            f"{g}: could not load the SMs ({why}): clock reasons read only {when}, which proves no clock under load",
            details,
            remedies.COMPUTE_LOAD,
        )
    if mask is not None and mask & _WARN_REASONS:
        return Result(vid, WARN, f"{g}: SW thermal slowdown {when}", details, remedies.COOLING)
    hottest = compute.temperature_c_max if compute is not None and under_sm else None
    temperature = hottest if hottest is not None else (gpu.temperature_c.value if gpu.temperature_c.ok else None)
    if temperature is not None and temperature >= TEMPERATURE_WARN_C:
        return Result(vid, WARN, f"{g}: {temperature} C (warn at >= {TEMPERATURE_WARN_C} C)", details, remedies.COOLING)
    cap = " (SW power cap under the SM load: normal, the kernel draws up to the power limit)"
    normal = cap if under_sm and mask is not None and mask & _POWER_CAP else ""
    return Result(vid, PASS, f"{g}: no hardware slowdown {when}, power limit at its default{normal}", details)


def _opt(value: int | None, unit: str) -> str:
    return f"{value}{unit}" if value is not None else "(not read)"


def _opt_watts(mw: int | None) -> str:
    return f"{mw / 1000:.0f} W" if mw is not None else "(not read)"


def _watts(reading: Reading) -> str:
    return f"{(reading.value or 0) / 1000:.0f} W" if reading.ok else f"({reading.status})"


# ---- MIG, BAR1, processes ----------------------------------------------------------------------------------------


def mig(gpu: GpuHealth) -> Result:
    vid = "gpu_mig"
    g = f"GPU {gpu.index}"
    if not gpu.mig_mode.ok:
        return Result(vid, PASS, f"{g}: MIG {gpu.mig_mode.status}")
    if gpu.mig_mode.value:
        return Result(
            vid,
            FAIL,
            f"{g}: MIG mode is on: the GPU is split and cannot serve as one TP rank",
            remedy=remedies.mig_off(gpu.index),
        )
    if gpu.mig_mode_pending.ok and gpu.mig_mode_pending.value:
        return Result(vid, WARN, f"{g}: MIG mode turns on at the next GPU reset", remedy=remedies.mig_off(gpu.index))
    return Result(vid, PASS, f"{g}: MIG off")


def _rtx_class(name: str) -> bool:
    return "RTX" in name or "GeForce" in name or "TITAN" in name


def bar1(gpu: GpuHealth) -> Result:
    """Rule: on RTX-class parts, PCIe P2P maps the peer's memory through BAR1, so a BAR1 smaller than the GPU's
    memory (resizable BAR off: typically 256 MiB) means P2P and large host mappings cannot see it all: warn."""
    vid = "gpu_bar1"
    g = f"GPU {gpu.index}"
    if not (gpu.bar1_total.ok and gpu.memory_total.ok):
        return Result(vid, SKIP, f"{g}: BAR1 {gpu.bar1_total.status}, memory {gpu.memory_total.status}")
    bar, mem = gpu.bar1_total.value or 0, gpu.memory_total.value or 0
    details = f"{g} ({gpu.name}): BAR1 {bar / GIB:.2f} GiB, memory {mem / GIB:.1f} GiB"
    if bar < mem and _rtx_class(gpu.name):
        return Result(
            vid,
            WARN,
            f"{g}: BAR1 is {bar / GIB:.2f} GiB, smaller than its {mem / GIB:.0f} GiB memory (resizable BAR off?)",
            details,
            remedies.RESIZABLE_BAR,
        )
    return Result(vid, PASS, f"{g}: BAR1 {bar / GIB:.0f} GiB", details)


PROCESS_WARN_BYTES = 1 * GIB  # our choice: a CUDA context alone takes ~0.5 GiB; more means real work is there


def gpu_processes(gpu: GpuHealth) -> Result:
    """Compute processes already on the GPU (read before the probe's own load) and the memory they hold."""
    vid = "gpu_processes"
    g = f"GPU {gpu.index}"
    if gpu.processes_status != "ok":
        return Result(vid, SKIP, f"{g}: process list {gpu.processes_status}")
    if not gpu.processes:
        return Result(vid, PASS, f"{g}: no compute processes")
    listed = ", ".join(
        f"pid {p.pid}{f' ({p.name})' if p.name else ''} "
        + (f"{p.used_bytes / GIB:.1f} GiB" if p.used_bytes is not None else "memory unknown")
        for p in gpu.processes
    )
    heavy = [p for p in gpu.processes if p.used_bytes is None or p.used_bytes >= PROCESS_WARN_BYTES]
    if not heavy:
        return Result(vid, PASS, f"{g}: only small compute processes ({listed})", f"{g}: {listed}")
    top = max(heavy, key=lambda p: p.used_bytes or 0)
    held = f"{top.used_bytes / GIB:.1f} GiB" if top.used_bytes is not None else "an unknown amount of memory"
    return Result(
        vid,
        WARN,
        f"{g}: pid {top.pid}{f' ({top.name})' if top.name else ''} already holds {held}",
        f"{g}: {listed}",
        remedies.gpu_process(gpu.index, top.pid),
    )


# ---- bandwidth ---------------------------------------------------------------------------------------------------

# Our floors, as fractions of the raw link rate (link_gbps of the maximum link): pinned copy-engine copies on a
# healthy link reach roughly 80-90 % of it (TLP/DLLP overheads; nvbandwidth host_to_device_memcpy_ce and DCGM's
# pcie plugin report in that range on Gen4/Gen5 x16 hosts). Below 70 %: warn; below 40 %: fail (a link or IOMMU
# problem, not noise).
BANDWIDTH_WARN_FRACTION = 0.70
BANDWIDTH_FAIL_FRACTION = 0.40


def h2d_bandwidth(gpu: GpuHealth) -> Result:
    vid = "gpu_copy_bandwidth"
    g = f"GPU {gpu.index}"
    load = gpu.load
    if load is None:
        return Result(vid, SKIP, f"{g}: no copy load ran")
    if load.error and load.h2d_gbps is None:
        return Result(vid, FAIL, f"{g}: the copy load failed: {load.error}")
    if not (gpu.pcie_gen_max.ok and gpu.pcie_width_max.ok):
        return Result(vid, SKIP, f"{g}: no maximum link to derive a floor from ({gpu.pcie_gen_max.status})")
    max_gen, max_width = gpu.pcie_gen_max.value or 0, gpu.pcie_width_max.value or 0
    raw = link_gbps(max_gen, max_width)
    warn_floor, fail_floor = raw * BANDWIDTH_WARN_FRACTION, raw * BANDWIDTH_FAIL_FRACTION
    rates = {"H2D": load.h2d_gbps, "D2H": load.d2h_gbps}
    details = (
        f"{g}: pinned H2D {load.h2d_gbps} GB/s, D2H {load.d2h_gbps} GB/s (median of {load.repeats} x "
        f"{load.size_bytes >> 20} MiB); {_link(max_gen, max_width)} raw {raw:.1f} GB/s = GT/s x lanes x encoding / 8; "
        f"warn below {BANDWIDTH_WARN_FRACTION:.0%} ({warn_floor:.1f} GB/s), fail below "
        f"{BANDWIDTH_FAIL_FRACTION:.0%} ({fail_floor:.1f} GB/s)"
    )
    low = {d: r for d, r in rates.items() if r is not None and r < warn_floor}
    if not low:
        return Result(
            vid, PASS, f"{g}: H2D {load.h2d_gbps} / D2H {load.d2h_gbps} GB/s on {_link(max_gen, max_width)}", details
        )
    status = FAIL if any(r < fail_floor for r in low.values()) else WARN
    shown = ", ".join(f"{d} {r:.1f} GB/s" for d, r in low.items())
    return Result(
        vid,
        status,
        f"{g}: {shown} is below {warn_floor:.1f} GB/s ({BANDWIDTH_WARN_FRACTION:.0%} of {_link(max_gen, max_width)})",
        details,
        remedies.COPY_BANDWIDTH,
    )


# ---- product name and SGLang tuned configs -----------------------------------------------------------------------


def gpu_product(gpus: Sequence[GpuHealth], configs: TunedConfigs | None) -> Result:
    """The exact product name(s) and whether the installed SGLang ships tuned configs filed under that name."""
    vid = "gpu_product"
    names = sorted({g.name for g in gpus})
    if not names:
        return Result(vid, SKIP, "no GPU to name")
    if len(names) > 1:
        return Result(
            vid,
            WARN,
            f"mixed GPU products on one node: {', '.join(names)}",
            "SGLang picks tuned configs by device name: each edition needs its own files, and a TP group of mixed "
            "editions runs at the slowest one's clocks and power limit",
            remedies.MIXED_PRODUCTS,
        )
    name = names[0]
    if configs is None:
        return Result(vid, PASS, f"{name} (no SGLang tree to look for tuned configs)")
    details = f"device_name={configs.device_name}; searched {', '.join(configs.searched) or 'no config folder'}"
    if configs.files:
        listed = "\n".join(f"  {f}" for f in configs.files[:20])
        return Result(
            vid, PASS, f"{name}: SGLang ships {len(configs.files)} tuned configs for it", details + "\n" + listed
        )
    return Result(
        vid,
        WARN,
        f"{name}: the installed SGLang ships no tuned kernel configs named device_name={configs.device_name}",
        details,
        remedies.TUNED_CONFIGS,
    )


# ---- peer copies between GPUs (level 3: comm/peer.py) ----------------------------------------------------------

# Our floors for P2P copies over PCIe: the same fractions as host copies (BANDWIDTH_*_FRACTION) of the raw rate of the
# slower of the two GPUs' maximum links (a peer copy crosses both). No floor over NVLink, none without P2P (the
# driver stages those copies through host memory: a warning of its own), none for latency (reported only).
PEER_WARN_FRACTION = BANDWIDTH_WARN_FRACTION
PEER_FAIL_FRACTION = BANDWIDTH_FAIL_FRACTION

# Posted-write collapse: a pair's writes (src's copy engine pushes) against its reads (dst's copy engine pulls the same
# bytes). local-inference-lab/rtx6kpro hardware/collapse-report.md (c93c92aa) measured healthy pairs within a few
# percent of their reads (52.5 vs 53.4 GB/s, 98 %; 56 vs 56 on the 8-GPU layout) and collapsed ones at 7-26 % of
# them (52 -> 6-7 GB/s per pair on Microchip PM50100 + TR Pro, 37 -> 2.7 on Broadcom PEX890xx + EPYC Turin, reads
# unaffected at ~53). Fail below half the read rate: twice the worst collapse the report shows, half the healthy
# ratio. Warn below 75 % (ours): a gap wider than the ~15 % single-flow penalty the report measured with the IOMMU
# translating, which costs reads and writes alike.
WRITE_COLLAPSE_FRACTION = 0.50
WRITE_WARN_FRACTION = 0.75
GEFORCE_NO_P2P = "P2P not available on GeForce with the stock driver: expected, P2P features off"


def peer_pcie_raw(pair: PeerPair, links: Mapping[int, PeerLink]) -> tuple[float, str] | None:
    """The raw one-direction rate of the slower of the pair's two maximum PCIe links, and which link that is; None
    when NVML gave no maximum link for either GPU."""
    rates = []
    for index in (pair.src, pair.dst):
        link = links.get(index)
        if link is None or link.gen_max is None or link.width_max is None:
            return None
        rates.append((link_gbps(link.gen_max, link.width_max), f"GPU {index}'s {_link(link.gen_max, link.width_max)}"))
    return min(rates)


def peer_over_nvlink(pair: PeerPair, links: Mapping[int, PeerLink]) -> bool:
    """NVML says the pair talks over NVLink, or the copies beat what PCIe can carry."""
    raw = peer_pcie_raw(pair, links)
    return bool(pair.nvlink) or (raw is not None and pair.gbps is not None and pair.gbps > raw[0])


def peer_floor_gbps(pair: PeerPair, links: Mapping[int, PeerLink]) -> float | None:
    """The warn floor of a P2P pair over PCIe (PEER_WARN_FRACTION of the slower link); None where none applies."""
    raw = peer_pcie_raw(pair, links)
    if not pair.p2p or raw is None or peer_over_nvlink(pair, links):
        return None
    return round(raw[0] * PEER_WARN_FRACTION, 2)


def _opt_us(value: float | None) -> str:
    return f"{value:.1f} us" if value is not None else "(not measured)"


def root_ports_of(pair: PeerPair, roots: Mapping[int, str]) -> str:
    """ "root ports 0000:00:01.1 (GPU 0), 0000:20:01.1 (GPU 4)", saying so where one is shared or unknown."""
    ports = {i: roots.get(i, "") for i in (pair.src, pair.dst)}
    if not any(ports.values()):
        return "root ports unknown (no PCI bridge above the GPUs in sysfs)"
    if ports[pair.src] and ports[pair.src] == ports[pair.dst]:
        return f"both behind root port {ports[pair.src]}"
    return "root ports " + ", ".join(f"{port or 'unknown'} (GPU {i})" for i, port in ports.items())


def peer_write_read(pair: PeerPair, roots: Mapping[int, str]) -> Result | None:
    """Writes against reads of one P2P pair: None when both are not measured, else a collapse fail, a warn, or pass."""
    vid = "gpu_peer_bandwidth"
    if not pair.p2p or pair.gbps is None or not pair.read_gbps:
        return None
    share = pair.gbps / pair.read_gbps
    g = f"GPU {pair.src} -> {pair.dst}"
    if share >= WRITE_WARN_FRACTION:
        return None
    status = FAIL if share < WRITE_COLLAPSE_FRACTION else WARN
    what = "posted-write collapse" if status == FAIL else "writes well below reads"
    limit = WRITE_COLLAPSE_FRACTION if status == FAIL else WRITE_WARN_FRACTION
    return Result(
        vid,
        status,
        f"{g}: {what}: writes {pair.gbps:.1f} GB/s, reads {pair.read_gbps:.1f} GB/s ({share:.0%} of the reads, "
        f"{status.value} below {limit:.0%}); {root_ports_of(pair, roots)}",
        remedy=remedies.PEER_WRITE_COLLAPSE,
    )


def peer_pair(
    pair: PeerPair,
    links: Mapping[int, PeerLink],
    latency_bytes: int = 4,
    roots: Mapping[int, str] | None = None,
    geforce: frozenset[int] = frozenset(),
) -> Result:
    """One ordered pair: copies from `src` to `dst` against the floor derived from their links, and its writes
    against its reads (posted-write collapse). `roots`: each GPU's root port (NVML index -> BDF), named when the
    writes collapse; `geforce`: GPUs whose missing P2P is expected (GeForce on the stock driver)."""
    vid = "gpu_peer_bandwidth"
    g = f"GPU {pair.src} -> {pair.dst}"
    nvlink = {True: "yes", False: "no", None: "unknown"}[pair.nvlink]
    read = f"{pair.read_gbps} GB/s (median of {pair.read_repeats})" if pair.read_gbps is not None else "not measured"
    details = (
        f"{g} ({pair.src_bus} -> {pair.dst_bus}): writes {pair.gbps} GB/s (median of {pair.repeats} x "
        f"{pair.size_bytes >> 20} MiB), reads {read}, {latency_bytes}-byte copies {_opt_us(pair.latency_us)} "
        f"(median); peer access {pair.access or '(not tried)'}; NVLink per NVML {nvlink}"
    )
    if roots:
        details += f"; {root_ports_of(pair, roots)}"
    if pair.error:
        details += f"; {pair.error}"
    if pair.gbps is None:
        if pair.error.startswith(PEER_NOT_MEASURED):
            return Result(vid, WARN, f"{g}: {pair.error}", details, remedies.PEER_TIMEOUT)
        why = pair.error or "no copy was timed"
        return Result(
            vid, FAIL, f"{g}: the peer copy failed: {why}", details, remedies.peer_probe(f"{pair.src},{pair.dst}")
        )
    latency = f", latency {_opt_us(pair.latency_us)}"
    if not pair.p2p and geforce & {pair.src, pair.dst}:
        return Result(
            vid, PASS, f"{g}: {GEFORCE_NO_P2P}; copies staged through the host, {pair.gbps:.1f} GB/s", details
        )
    if not pair.p2p:
        return Result(
            vid,
            WARN,
            f"{g}: no P2P: copies staged through the host, {pair.gbps:.1f} GB/s (the `topology` check says why)",
            details,
            remedies.PEER_NO_P2P,
        )
    raw = peer_pcie_raw(pair, links)
    if peer_over_nvlink(pair, links):
        how = "NVLink per NVML" if pair.nvlink else "above the PCIe raw rate: NVLink"
        return Result(vid, PASS, f"{g}: {pair.gbps:.1f} GB/s P2P ({how}, no PCIe floor){latency}", details)
    if raw is None:
        collapse = peer_write_read(pair, roots or {})
        if collapse is not None:
            return dataclasses.replace(collapse, details=details)
        status = next((link.status for i in (pair.src, pair.dst) if (link := links.get(i)) and link.status != "ok"), "")
        return Result(
            vid,
            SKIP,
            f"{g}: {pair.gbps:.1f} GB/s P2P; no floor: NVML gives no maximum link ({status or 'not read'})",
            details,
        )
    collapse = peer_write_read(pair, roots or {})
    floor = _peer_floor(pair, raw, details, latency)
    if collapse is not None and _RANK[collapse.status] >= _RANK[floor.status]:  # the more specific cause first
        return dataclasses.replace(collapse, details=floor.details)
    return floor


def _peer_floor(pair: PeerPair, raw: tuple[float, str], details: str, latency: str) -> Result:
    """A P2P pair over PCIe against the floor of the slower of its two links."""
    vid = "gpu_peer_bandwidth"
    g = f"GPU {pair.src} -> {pair.dst}"
    assert pair.gbps is not None
    rate, which = raw
    warn_floor, fail_floor = rate * PEER_WARN_FRACTION, rate * PEER_FAIL_FRACTION
    details += (
        f"; floor from the slower link, {which}: raw {rate:.1f} GB/s, warn below {PEER_WARN_FRACTION:.0%} "
        f"({warn_floor:.1f} GB/s), fail below {PEER_FAIL_FRACTION:.0%} ({fail_floor:.1f} GB/s)"
    )
    share = f"{pair.gbps / rate:.0%} of {which} raw {rate:.1f} GB/s"
    if pair.gbps >= warn_floor:
        reads = f", reads {pair.read_gbps:.1f} GB/s" if pair.read_gbps is not None else ""
        return Result(vid, PASS, f"{g}: {pair.gbps:.1f} GB/s P2P over PCIe ({share}){reads}{latency}", details)
    return Result(
        vid,
        FAIL if pair.gbps < fail_floor else WARN,
        f"{g}: {pair.gbps:.1f} GB/s P2P is below {warn_floor:.1f} GB/s ({PEER_WARN_FRACTION:.0%} of {which}: {share})",
        details,
        remedies.PEER_BANDWIDTH,
    )


def peer_bandwidth(
    answer: PeerAnswer, roots: Mapping[int, str] | None = None, geforce: frozenset[int] = frozenset()
) -> Result:
    """Every ordered pair judged, folded into one verdict: the worst status, its pairs in the summary."""
    vid = "gpu_peer_bandwidth"
    links = {link.index: link for link in answer.links}
    verdicts = [peer_pair(p, links, answer.latency_bytes, roots, geforce) for p in answer.pairs]
    if answer.error:  # libcuda or NVML did not load: no pair was measured
        details = "\n".join(v.details for v in verdicts)
        return Result(vid, FAIL, f"the peer-copy probe could not measure: {answer.error}", details)
    if not verdicts:
        return Result(vid, SKIP, "no GPU pair to measure")
    worst = max(_RANK[v.status] for v in verdicts)
    status = next(s for s, r in _RANK.items() if r == worst)
    bad = [v for v in verdicts if v.status == status]
    details = "\n".join(v.details for v in verdicts)
    if status == PASS:
        rates = [p.gbps for p in answer.pairs if p.gbps is not None]
        waits = [p.latency_us for p in answer.pairs if p.latency_us is not None]
        spread = f"{min(rates):.1f}-{max(rates):.1f} GB/s" if len(set(rates)) > 1 else f"{rates[0]:.1f} GB/s"
        waited = f", latency {min(waits):.1f}-{max(waits):.1f} us" if waits else ""
        pulls = [p.read_gbps for p in answer.pairs if p.read_gbps is not None]
        read = f", reads {min(pulls):.1f}-{max(pulls):.1f} GB/s" if pulls else ""
        summary = f"{len(verdicts)} ordered GPU pairs, P2P {spread}{read}{waited}"
        return Result(vid, PASS, summary if len(verdicts) > 1 else bad[0].summary, details)
    listed = "; ".join(v.summary for v in bad)
    summary = bad[0].summary if len(bad) == 1 else f"{len(bad)} of {len(verdicts)} pairs: {listed}"
    return Result(vid, status, summary, details, remedies.all_of(*(v.remedy for v in bad)))

"""Node health: what GPU validators check (DCGM, azurehpc-health-checks, NVSentinel), per GPU.

One probe (gpu/node_health_probe.py) reads everything once per run, started by `facts.gather` beside the other
checks (`plan` says whether with the loads); each check here judges its part with a pure verdict of
node_health/verdicts.py. Level 1 reads at rest (no CUDA context); level 2 needs the copy and SM loads. No role owns
hardware: the family is `node_health` and the remedies are the steps a person takes (doctor/remedies.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import ClassVar

from sm120check.doctor import facts, remedies
from sm120check.doctor.gpu.payloads import GpuHealth, NodeHealth
from sm120check.doctor.gpu.xid import lookup
from sm120check.doctor.model import Check, Context, Result, Status
from sm120check.doctor.node_health import sglang_configs, verdicts

FAMILY = "node_health"


def plan(chosen: Iterable[Check], gpus: tuple[int, ...] | None = None) -> facts.HealthPlan | None:
    """The probe the run needs: none without a health check, the loads only with a level-2 one."""
    levels = [check.level for check in chosen if check.family == FAMILY]
    if not levels:
        return None
    return facts.HealthPlan(load=max(levels) >= 2, gpus=gpus, exclude_tree=os.getpid())


def health_of(ctx: Context, load: bool) -> facts.HealthFacts:
    """The probe's answer gathered for the run; without one (tests, API callers) this check asks the probe itself."""
    gathered = ctx.facts.health
    if gathered is not None and (gathered.loaded or not load):
        return gathered
    return facts.read_health(facts.HealthPlan(load=load, gpus=ctx.gpus), ctx.timeout)


def as_result(verdict: Result, data: dict[str, object]) -> Result:
    """A verdict with the measured numbers the check reports (its remedy is a value of doctor/remedies.py, set in
    verdicts.py)."""
    return Result(verdict.id, verdict.status, verdict.summary, verdict.details, remedy=verdict.remedy, data=data)


def _probe_failed(check_id: str, answer: facts.HealthFacts) -> Result:
    during = f" during {answer.step}" if answer.step else ""
    lines = [ln for ln in answer.stderr_tail.strip().splitlines() if not ln.startswith("sm120check-step:")]
    return Result(
        check_id,
        Status.FAIL,
        f"the node-health probe {answer.problem}{during}",
        details="\n".join([f"python -m {facts.HEALTH_PROBE}", *lines[-10:]]),
        remedy=remedies.GPU_OFF_BUS,
    )


def _nullable(reading_ok: bool, value: int | None) -> int | None:
    return value if reading_ok else None


class _PerGpu:
    """A verdict per GPU folded into one; `rows` gives the per-GPU data."""

    id: ClassVar[str]
    family: ClassVar[str] = FAMILY
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ("driver",)
    uses: ClassVar[tuple[str, ...]] = ()

    def verdict(self, gpu: GpuHealth) -> Result:
        raise NotImplementedError

    def row(self, gpu: GpuHealth) -> dict[str, object]:
        return {"index": gpu.index, "name": gpu.name}

    def run(self, ctx: Context) -> Result:
        answer = health_of(ctx, load=self.level >= 2)
        if answer.health is None:
            return _probe_failed(self.id, answer)
        health = answer.health
        empty = f"no GPU readings: {health.nvml_error}" if health.nvml_error else "no GPU to judge"
        verdict = verdicts.combine(self.id, [self.verdict(g) for g in health.gpus], empty)
        return as_result(verdict, {"gpus": [self.row(g) for g in health.gpus]})


class PcieLinkCheck(_PerGpu):
    """PCIe link generation and width read while pinned copies run (idle links drop generation) vs the maximum."""

    id: ClassVar[str] = "pcie_link"
    level: ClassVar[int] = 2

    def verdict(self, gpu: GpuHealth) -> Result:
        return verdicts.pcie_link(gpu)

    def row(self, gpu: GpuHealth) -> dict[str, object]:
        load = gpu.load
        busy = load is not None and load.busy_gen is not None and load.busy_width is not None
        return {
            "index": gpu.index,
            "name": gpu.name,
            "bus_id": gpu.bus_id,
            "gen": load.busy_gen if busy and load is not None else _nullable(gpu.pcie_gen.ok, gpu.pcie_gen.value),
            "width": load.busy_width
            if busy and load is not None
            else _nullable(gpu.pcie_width.ok, gpu.pcie_width.value),
            "gen_max": _nullable(gpu.pcie_gen_max.ok, gpu.pcie_gen_max.value),
            "width_max": _nullable(gpu.pcie_width_max.ok, gpu.pcie_width_max.value),
            "busy": busy,
        }


class PcieReplayCheck(_PerGpu):
    """PCIe replay counter since the driver loaded (link-level retransmissions: bit errors on the link)."""

    id: ClassVar[str] = "pcie_replay"

    def verdict(self, gpu: GpuHealth) -> Result:
        return verdicts.pcie_replay(gpu)

    def row(self, gpu: GpuHealth) -> dict[str, object]:
        return {"index": gpu.index, "name": gpu.name, "replays": _nullable(gpu.pcie_replay.ok, gpu.pcie_replay.value)}


class EccCheck(_PerGpu):
    """ECC mode, uncorrectable ECC errors (volatile, aggregate), retired pages, remapped rows pending / failed."""

    id: ClassVar[str] = "gpu_ecc"

    def verdict(self, gpu: GpuHealth) -> Result:
        return verdicts.ecc(gpu)

    def row(self, gpu: GpuHealth) -> dict[str, object]:
        keys = (
            ("ecc_mode", gpu.ecc_mode),
            ("uncorrected_volatile", gpu.ecc_uncorrected_volatile),
            ("uncorrected_aggregate", gpu.ecc_uncorrected_aggregate),
            ("retired_pages", gpu.retired_pages),
            ("retired_pending", gpu.retired_pending),
            ("remap_pending", gpu.remap_pending),
            ("remap_failure", gpu.remap_failure),
        )
        return {"index": gpu.index, "name": gpu.name, **{k: _nullable(r.ok, r.value) for k, r in keys}}


class ClocksCheck(_PerGpu):
    """Clock-event reasons while an FMA kernel loads every SM (HW slowdown, thermal, power brake), power limit vs
    its default, temperature."""

    id: ClassVar[str] = "gpu_clocks"
    level: ClassVar[int] = 2

    def verdict(self, gpu: GpuHealth) -> Result:
        return verdicts.clocks(gpu)

    def row(self, gpu: GpuHealth) -> dict[str, object]:
        compute = gpu.compute
        under = compute is not None and not compute.error and compute.reasons is not None
        reasons = compute.reasons if under and compute is not None else gpu.clock_reasons.value
        limit, default = gpu.power_limit_mw, gpu.power_default_mw
        return {
            "index": gpu.index,
            "name": gpu.name,
            "under_sm_load": under,
            "load_error": compute.error if compute is not None else "no compute load ran",
            "reasons": reasons,
            "reason_names": verdicts.reason_names(reasons or 0),
            "sm_mhz_min": compute.sm_mhz_min if compute is not None else None,
            "power_w_max": compute.power_mw_max / 1000 if compute is not None and compute.power_mw_max else None,
            "temperature_c_max": compute.temperature_c_max if compute is not None else None,
            "power_limit_w": limit.value / 1000 if limit.ok and limit.value is not None else None,
            "power_default_w": default.value / 1000 if default.ok and default.value is not None else None,
            "temperature_c": _nullable(gpu.temperature_c.ok, gpu.temperature_c.value),
        }


class MigCheck(_PerGpu):
    """MIG mode is off (a split GPU cannot serve as one tensor-parallel rank), now and after the next reset."""

    id: ClassVar[str] = "gpu_mig"

    def verdict(self, gpu: GpuHealth) -> Result:
        return verdicts.mig(gpu)

    def row(self, gpu: GpuHealth) -> dict[str, object]:
        return {
            "index": gpu.index,
            "name": gpu.name,
            "mig_mode": _nullable(gpu.mig_mode.ok, gpu.mig_mode.value),
            "mig_pending": _nullable(gpu.mig_mode_pending.ok, gpu.mig_mode_pending.value),
        }


class Bar1Check(_PerGpu):
    """BAR1 covers the GPU's memory on RTX-class parts (resizable BAR on: PCIe P2P maps the peer through it)."""

    id: ClassVar[str] = "gpu_bar1"

    def verdict(self, gpu: GpuHealth) -> Result:
        return verdicts.bar1(gpu)

    def row(self, gpu: GpuHealth) -> dict[str, object]:
        return {
            "index": gpu.index,
            "name": gpu.name,
            "bar1_bytes": _nullable(gpu.bar1_total.ok, gpu.bar1_total.value),
            "memory_bytes": _nullable(gpu.memory_total.ok, gpu.memory_total.value),
        }


class ProcessesCheck(_PerGpu):
    """Compute processes already on each GPU and the memory they hold (the doctor's own children left out)."""

    id: ClassVar[str] = "gpu_processes"

    def verdict(self, gpu: GpuHealth) -> Result:
        return verdicts.gpu_processes(gpu)

    def row(self, gpu: GpuHealth) -> dict[str, object]:
        return {
            "index": gpu.index,
            "name": gpu.name,
            "processes": [{"pid": p.pid, "name": p.name, "used_bytes": p.used_bytes} for p in gpu.processes],
        }


class CopyBandwidthCheck(_PerGpu):
    """Pinned host-to-device and device-to-host copy bandwidth per GPU vs what its maximum PCIe link allows."""

    id: ClassVar[str] = "gpu_copy_bandwidth"
    level: ClassVar[int] = 2

    def verdict(self, gpu: GpuHealth) -> Result:
        return verdicts.h2d_bandwidth(gpu)

    def row(self, gpu: GpuHealth) -> dict[str, object]:
        gen, width = gpu.pcie_gen_max, gpu.pcie_width_max
        raw = verdicts.link_gbps(gen.value or 0, width.value or 0) if gen.ok and width.ok else None
        return {
            "index": gpu.index,
            "name": gpu.name,
            "h2d_gbps": gpu.load.h2d_gbps if gpu.load is not None else None,
            "d2h_gbps": gpu.load.d2h_gbps if gpu.load is not None else None,
            "link_gbps": round(raw, 2) if raw else None,
        }


class XidCheck:
    """Xid events of this boot in the kernel log, each with NVIDIA's meaning and next step (79: off the bus)."""

    id: ClassVar[str] = "gpu_xid"
    family: ClassVar[str] = FAMILY
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ()  # the kernel log: no GPU, no driver needed
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        answer = health_of(ctx, load=False)
        if answer.health is None:
            return _probe_failed(self.id, answer)
        log = answer.health.kernel_log
        counts: dict[tuple[int, str], int] = {}
        for event in log.events:
            counts[(event.xid, event.pci)] = counts.get((event.xid, event.pci), 0) + 1
        events = [
            {"xid": n, "pci": pci, "name": lookup(n).name, "severity": lookup(n).severity, "count": c}
            for (n, pci), c in counts.items()
        ]
        data: dict[str, object] = {"source": log.source, "lines": log.lines, "events": events, "count": len(log.events)}
        return as_result(verdicts.xid(log), data)


def sglang_dir(ctx: Context) -> str:
    """The stack venv's installed sglang package directory (not imported), or ""."""
    for site in facts.site_packages(ctx.facts.venv):
        if (site / "sglang" / "__init__.py").is_file():
            return str(site / "sglang")
    return ""


def product_verdict(health: NodeHealth, where: str) -> Result:
    gpus = health.gpus
    configs = sglang_configs.find(where, gpus[0].name) if gpus and where else None
    return verdicts.gpu_product(gpus, configs)


class ProductCheck:
    """The GPUs' exact product name (one edition per node) and whether the installed SGLang ships tuned kernel
    configs filed under it."""

    id: ClassVar[str] = "gpu_product"
    family: ClassVar[str] = FAMILY
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ("driver",)
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        answer = health_of(ctx, load=False)
        if answer.health is None:
            return _probe_failed(self.id, answer)
        where = sglang_dir(ctx)
        verdict = product_verdict(answer.health, where)
        configs = sglang_configs.find(where, answer.health.gpus[0].name) if answer.health.gpus and where else None
        data: dict[str, object] = {
            "names": sorted({g.name for g in answer.health.gpus}),
            "device_name": configs.device_name if configs is not None else "",
            "tuned_configs": len(configs.files) if configs is not None else None,
            "sglang": where,
        }
        return as_result(verdict, data)


CHECKS = (
    XidCheck,
    EccCheck,
    PcieReplayCheck,
    MigCheck,
    Bar1Check,
    ProcessesCheck,
    ProductCheck,
    PcieLinkCheck,
    ClocksCheck,
    CopyBandwidthCheck,
)

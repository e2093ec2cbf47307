"""Verdicts on recorded-looking node_health payloads (H200-like healthy values, then one fault at a time)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from sm120check.doctor.gpu.kernel_log import parse
from sm120check.doctor.gpu.payloads import (
    NOT_SUPPORTED,
    GpuHealth,
    GpuProcess,
    KernelLog,
    LinkSample,
    LoadResult,
    NodeHealth,
    Reading,
    missing,
)
from sm120check.doctor.node_health import verdicts
from sm120check.doctor.node_health.sglang_configs import TunedConfigs
from sm120check.doctor.payload import PayloadError

GIB = 1 << 30


def r(value: int) -> Reading:
    return Reading(value)


def busy(gen: int, width: int, reasons: int = 0x0, h2d: float = 55.1, d2h: float = 54.0) -> LoadResult:
    return LoadResult(h2d, d2h, 256 << 20, 5, 1.2, (LinkSample(gen, width, reasons),))


def h200(**changes: Any) -> GpuHealth:
    """A healthy H200 as NVML reports it: Gen5 x16, ECC on, no errors, 700 W default limit, BAR1 larger than HBM."""
    gpu = GpuHealth(
        index=0,
        name="NVIDIA H200",
        bus_id="00000000:1B:00.0",
        memory_total=r(143771 << 20),
        memory_used=r(512 << 20),
        pcie_gen=r(5),
        pcie_width=r(16),
        pcie_gen_max=r(5),
        pcie_gen_gpu_max=r(5),
        pcie_width_max=r(16),
        pcie_replay=r(0),
        ecc_mode=r(1),
        ecc_mode_pending=r(1),
        ecc_uncorrected_volatile=r(0),
        ecc_uncorrected_aggregate=r(0),
        retired_pages=r(0),
        retired_pending=r(0),
        remap_correctable=r(0),
        remap_uncorrectable=r(0),
        remap_pending=r(0),
        remap_failure=r(0),
        clock_reasons=r(0x1),
        power_limit_mw=r(700000),
        power_default_mw=r(700000),
        power_enforced_mw=r(700000),
        temperature_c=r(31),
        mig_mode=r(0),
        mig_mode_pending=r(0),
        bar1_total=r(256 * GIB),
        bar1_used=r(1 * GIB),
        load=busy(5, 16),
    )
    return dataclasses.replace(gpu, **changes)


def rtx(**changes: Any) -> GpuHealth:
    base = h200(
        name="NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
        memory_total=r(97887 << 20),
        ecc_mode=r(0),
        power_limit_mw=r(600000),
        power_default_mw=r(600000),
        bar1_total=r(128 * GIB),
    )
    return dataclasses.replace(base, **changes)


def test_healthy_h200_passes_everything() -> None:
    gpu = h200()
    for judge in (
        verdicts.pcie_link,
        verdicts.pcie_replay,
        verdicts.ecc,
        verdicts.clocks,
        verdicts.mig,
        verdicts.bar1,
        verdicts.gpu_processes,
        verdicts.h2d_bandwidth,
    ):
        v = judge(gpu)
        assert v.status == verdicts.PASS, (judge.__name__, v)


def test_gen1_at_idle_but_gen5_busy_passes() -> None:
    v = verdicts.pcie_link(h200(pcie_gen=r(1), load=busy(5, 16)))
    assert v.status == verdicts.PASS
    assert "Gen5 x16 under load" in v.summary
    assert "idle Gen1 x16" in v.details


def test_gen1_at_idle_without_load_is_no_verdict_not_an_alarm() -> None:
    v = verdicts.pcie_link(h200(pcie_gen=r(1), load=None))
    assert v.status == verdicts.SKIP
    assert "idle" in v.summary


def test_gen4_x8_busy_fails_with_the_slot_remedy() -> None:
    v = verdicts.pcie_link(h200(load=busy(4, 8)))
    assert v.status == verdicts.FAIL
    assert "Gen4 x8" in v.summary and "Gen5 x16" in v.summary and "25%" in v.summary
    assert "CPU-attached x16 slot" in v.remedy and "BIOS" in v.remedy


def test_gen5_x8_busy_warns() -> None:
    v = verdicts.pcie_link(h200(load=busy(5, 8)))
    assert v.status == verdicts.WARN


def test_gen5_gpu_in_gen4_slot_warns() -> None:
    v = verdicts.pcie_link(h200(pcie_gen_max=r(4), load=busy(4, 16)))
    assert v.status == verdicts.WARN
    assert "slot's limit" in v.summary


def test_replays_warn() -> None:
    assert verdicts.pcie_replay(h200(pcie_replay=r(5000))).status == verdicts.WARN
    assert verdicts.pcie_replay(h200(pcie_replay=missing(NOT_SUPPORTED))).status == verdicts.SKIP


def test_link_formula() -> None:
    assert verdicts.link_gbps(5, 16) == pytest.approx(63.0, abs=0.1)
    assert verdicts.link_gbps(4, 16) == pytest.approx(31.5, abs=0.1)


def test_xid_79_line_fails_fell_off_the_bus() -> None:
    log = KernelLog(
        "/dev/kmsg",
        parse(["[ 5107.644336] NVRM: Xid (PCI:0000:03:00): 79, pid=1234, name=python3, GPU has fallen off the bus."]),
        lines=1,
    )
    v = verdicts.xid(log)
    assert v.status == verdicts.FAIL
    assert "fell off the bus" in v.summary and "0000:03:00" in v.summary
    assert "report a GPU issue" in v.remedy


def test_xid_13_warns_with_meaning_and_step() -> None:
    line = (
        "NVRM: Xid (PCI:0000:3b:00): 13, pid=2716, name=python, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): "
        "Out Of Range Address"
    )
    v = verdicts.xid(KernelLog("dmesg", parse([line]), lines=1))
    assert v.status == verdicts.WARN
    assert "Graphics Engine Exception" in v.summary
    assert "debug the user application" in v.remedy


def test_unknown_xid_points_at_the_catalogue() -> None:
    v = verdicts.xid(KernelLog("dmesg", parse(["NVRM: Xid (PCI:0000:3b:00): 250, something new"]), lines=1))
    assert "not in the catalogue" in v.summary
    assert "docs.nvidia.com/deploy/xid-errors" in v.remedy


def test_unreadable_log_is_a_skip_saying_run_as_root() -> None:
    v = verdicts.xid(KernelLog("", error="kernel log unreadable: /dev/kmsg: [Errno 1] Operation not permitted"))
    assert v.status == verdicts.SKIP
    assert "root" in v.remedy


def test_xid_window_drops_older_events() -> None:
    log = KernelLog("dmesg", parse(["[  10.000000] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."]))
    assert verdicts.xid(log, since_s=100.0).status == verdicts.PASS


def test_remapped_rows_failure_fails_with_rma() -> None:
    v = verdicts.ecc(h200(remap_failure=r(1), remap_uncorrectable=r(3)))
    assert v.status == verdicts.FAIL
    assert "RMA" in v.remedy


def test_volatile_uncorrectable_fails_and_pending_remap_warns() -> None:
    assert verdicts.ecc(h200(ecc_uncorrected_volatile=r(2))).status == verdicts.FAIL
    v = verdicts.ecc(h200(remap_pending=r(1)))
    assert v.status == verdicts.WARN and "reset" in v.summary


def test_ecc_not_supported_is_a_value_not_a_crash() -> None:
    gpu = h200(**{k: missing(NOT_SUPPORTED) for k in ("ecc_mode", "ecc_uncorrected_volatile", "remap_failure")})
    v = verdicts.ecc(gpu)
    assert v.status == verdicts.PASS and "not supported" in v.summary


def test_mig_on_fails_for_tp() -> None:
    v = verdicts.mig(h200(mig_mode=r(1)))
    assert v.status == verdicts.FAIL
    assert "TP rank" in v.summary and "-mig 0" in v.remedy


def test_small_bar1_on_rtx_warns_but_not_on_h200() -> None:
    v = verdicts.bar1(rtx(bar1_total=r(256 << 20)))
    assert v.status == verdicts.WARN
    assert "Resizable BAR" in v.remedy
    assert verdicts.bar1(h200(bar1_total=r(256 << 20))).status == verdicts.PASS


def test_process_holding_20_gib_warns_naming_the_pid() -> None:
    v = verdicts.gpu_processes(h200(processes=(GpuProcess(4242, 20 * GIB, "python3"),)))
    assert v.status == verdicts.WARN
    assert "pid 4242" in v.summary and "20.0 GiB" in v.summary


def test_small_process_passes() -> None:
    assert verdicts.gpu_processes(h200(processes=(GpuProcess(7, 300 << 20),))).status == verdicts.PASS


def test_bandwidth_below_floor_warns_then_fails() -> None:
    warn = verdicts.h2d_bandwidth(h200(load=busy(5, 16, h2d=38.0)))
    assert warn.status == verdicts.WARN and "H2D 38.0" in warn.summary
    assert "GT/s x lanes x encoding" in warn.details
    assert verdicts.h2d_bandwidth(h200(load=busy(5, 16, d2h=12.0))).status == verdicts.FAIL


def test_clock_reasons_during_load() -> None:
    v = verdicts.clocks(h200(load=busy(5, 16, reasons=0x80)))
    assert v.status == verdicts.FAIL and "power brake" in v.summary
    low = verdicts.clocks(rtx(power_limit_mw=r(300000)))
    assert low.status == verdicts.WARN and "-pl 600" in low.remedy


def test_product_names_and_configs() -> None:
    name = "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"
    none = TunedConfigs(name.replace(" ", "_"), (), ("srt/layers/moe/moe_runner/triton_utils/configs",))
    assert verdicts.gpu_product([rtx(name=name)], none).status == verdicts.WARN
    some = TunedConfigs(none.device_name, ("x/E=161,N=192,device_name=" + none.device_name + ".json",), ())
    assert verdicts.gpu_product([rtx(name=name)], some).status == verdicts.PASS
    mixed = verdicts.gpu_product([rtx(name=name), rtx(index=1)], None)
    assert mixed.status == verdicts.WARN and "mixed" in mixed.summary


def test_combine_reports_the_worst() -> None:
    node = verdicts.combine(
        "pcie_link", [verdicts.pcie_link(h200()), verdicts.pcie_link(h200(index=1, load=busy(4, 8)))]
    )
    assert node.status == verdicts.FAIL and "GPU 1" in node.summary


def test_payload_round_trip_and_strictness() -> None:
    health = NodeHealth((h200(processes=(GpuProcess(1, None),)), rtx(index=1, load=None)), KernelLog("dmesg"), "580.1")
    text = json.dumps(health.to_json())
    assert NodeHealth.from_json(json.loads(text)) == health
    broken = json.loads(text)
    broken["gpus"][0]["pcie_gen"]["value"] = "5"
    with pytest.raises(PayloadError, match=r"gpus\[0\]\.pcie_gen\.value"):
        NodeHealth.from_json(broken)


def test_gpu_nvml_cannot_reach_fails_as_lost() -> None:
    gpu = GpuHealth.unreadable(3, "NVML error 15 (GPU is lost)")
    v = verdicts.pcie_link(gpu)
    assert v.status == verdicts.FAIL and "GPU 3" in v.summary and "fell off the bus" in v.summary
    assert verdicts.ecc(gpu).status in (verdicts.PASS, verdicts.SKIP)  # no crash on all-missing readings
    assert NodeHealth.from_json(NodeHealth((gpu,), KernelLog("dmesg")).to_json()).gpus[0].lost

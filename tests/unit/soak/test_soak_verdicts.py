"""The soak's verdicts on recorded-style NVML sample series and on Xid lines quoted verbatim from public threads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sm120check.doctor.gpu import kernel_log
from sm120check.doctor.model import Result, Status
from sm120check.soak import verdicts
from sm120check.soak.samples import GpuSample, Sample, SamplerNote, ServerInterval, XidSample
from sm120check.soak.verdicts import Soak

START = 1_800_000_000.0
BOOT = START - 300.0  # the kernel log's uptime 0

# A healthy RTX PRO 6000 under load, shaped as the sampler writes it (one per second).
HEALTHY = GpuSample(
    t=START, gpu=0, name="NVIDIA RTX PRO 6000 Blackwell Workstation Edition", sm_mhz=2400, mem_mhz=13801,
    base_sm_mhz=1590, reasons=0x4, power_mw=580_000, power_limit_mw=600_000, temperature_c=70,
    memory_temperature_c=None, slowdown_c=92, fan_percent=60, utilization=100, ecc_corrected=0, ecc_uncorrected=0,
    remap_pending=0, remap_failure=0, pcie_gen=5, pcie_width=16, pcie_replay=0,
)  # fmt: skip


def series(seconds: int = 120, **changes_after: Any) -> list[GpuSample]:
    """`seconds` samples; from second 60 on, the fields in `changes_after` take their new values."""
    out: list[GpuSample] = []
    for i in range(seconds):
        sample = replace(HEALTHY, t=START + i)
        if i >= 60 and changes_after:
            sample = replace(sample, **changes_after)
        out.append(sample)
    return out


def served(seconds: int = 120, tokens: int = 1000, after: Mapping[str, Any] | None = None) -> list[ServerInterval]:
    out: list[ServerInterval] = []
    for i in range(seconds):
        interval = ServerInterval(START + i, 1.0, tokens, 4, 0, 16)
        if i >= 60 and after:
            interval = replace(interval, **after)
        out.append(interval)
    return out


def soak(samples: Sequence[Sample], server: bool = False) -> Soak:
    return Soak(tuple(sorted(samples, key=lambda s: s.t)), START, server)


def by_id(s: Soak) -> dict[str, Result]:
    return {r.id: r for r in verdicts.judge(s)}


def test_healthy_soak_passes_every_verdict() -> None:
    results = by_id(soak([*series(), *served()], server=True))
    assert {r.status for r in results.values()} == {Status.PASS}, {k: r.summary for k, r in results.items()}


# --- Xid lines, verbatim from the threads cited in /work/shared/reference/sm120-pains.md ---------------------------

# NVIDIA/open-gpu-kernel-modules#1111 (RTX PRO 6000, vLLM, comment of 2026-05-14): GSP RPC timeout.
ISSUE_1111 = (
    "[ 388.565288] NVRM: Xid (PCI:0000:01:00): 119, pid=6211, name=nvidia-smi, Timeout after 45s of waiting for RPC "
    "response from GPU0 GSP! Expected function 103 (GSP_RM_ALLOC) sequence 15421 (0x0 0x78)."
)
# NVIDIA/open-gpu-kernel-modules#1200 (RTX 5080, after about an hour of sustained LLM load).
ISSUE_1200 = "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
# NVIDIA/open-gpu-kernel-modules#1159 (RTX PRO 6000, SGLang FP8, --max-running-requests 16).
ISSUE_1159 = "NVRM: Xid (PCI:0000:01:00): 8, pid=48694, name=python3, channel 0x00000008"
# NVIDIA/open-gpu-kernel-modules#1151 (RTX 5080, random Xid 79).
ISSUE_1151 = "May 18 19:02:39 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."


def xid_soak(line: str) -> Soak:
    events = verdicts.from_kernel_log(kernel_log.parse([line]), BOOT, START)
    return soak([*series(), *events])


def test_gsp_rpc_timeout_from_issue_1111_fails_with_the_catalogue_step() -> None:
    result = by_id(xid_soak(ISSUE_1111))["soak_xid"]
    assert result.status is Status.FAIL
    assert "Xid 119 (GSP RPC Timeout)" in result.summary
    assert "+89 s into the soak" in result.summary  # uptime 388.6 s, the soak began at uptime 300
    assert "reset it" in result.remedy
    assert result.data["around"]  # the GPU samples of those seconds


def test_reset_required_from_issue_1200_fails() -> None:
    result = by_id(xid_soak(ISSUE_1200))["soak_xid"]
    assert result.status is Status.FAIL
    assert "GPU Recovery Action Changed" in result.summary
    assert "GPU Reset Required" in result.details


def test_xid_8_from_issue_1159_warns_as_not_in_the_catalogue() -> None:
    result = by_id(xid_soak(ISSUE_1159))["soak_xid"]
    assert result.status is Status.WARN
    assert "not in the catalogue" in result.summary
    assert "docs.nvidia.com/deploy/xid-errors" in result.remedy


def test_xid_79_from_issue_1151_fails_the_bus_verdict_too() -> None:
    results = by_id(xid_soak(ISSUE_1151))
    assert results["soak_xid"].status is Status.FAIL
    assert results["soak_gpu_bus"].status is Status.FAIL
    assert "Xid 79" in results["soak_gpu_bus"].summary


def test_xid_event_from_nvml_names_the_gpu() -> None:
    result = by_id(soak([*series(), XidSample(START + 70, 119, 0, source="nvml")]))["soak_xid"]
    assert result.status is Status.FAIL
    assert "on GPU 0" in result.summary and "+70 s" in result.summary


def test_xid_older_than_the_soak_is_left_out() -> None:
    events = verdicts.from_kernel_log(kernel_log.parse(["[  10.000000] " + ISSUE_1200]), BOOT, START)
    assert events == []


# --- the bus, NVML -------------------------------------------------------------------------------------------------


def test_gpu_lost_mid_soak_fails_naming_the_time() -> None:
    samples: list[Sample] = [*series(90), GpuSample(START + 90, 0, lost="NVML error 15 (GPU is lost)")]
    result = by_id(soak(samples))["soak_gpu_bus"]
    assert result.status is Status.FAIL
    assert "GPU 0 (NVML error 15 (GPU is lost)) left the bus" in result.summary and "+90 s" in result.summary


def test_hung_sampler_fails_the_nvml_verdict() -> None:
    samples: list[Sample] = [
        *series(30),
        SamplerNote(START + 45, "hung", "went silent for 15 s at: NVML reads of GPU 0"),
    ]
    result = by_id(soak(samples))["soak_nvml"]
    assert result.status is Status.FAIL
    assert "NVML stopped answering" in result.summary


def test_no_nvml_skips_the_gpu_verdicts() -> None:
    results = by_id(soak([SamplerNote(START, "failed", "libnvidia-ml.so.1 does not load")]))
    assert results["soak_clocks"].status is Status.SKIP
    assert "libnvidia-ml.so.1" in results["soak_nvml"].summary


# --- the server -----------------------------------------------------------------------------------------------------


def test_server_killed_mid_soak_fails_as_died() -> None:
    dead = {"tokens": 0, "done": 0, "errors": 3, "in_flight": 0, "error": "server closed the connection"}
    result = by_id(soak([*series(), *served(after=dead)], server=True))["soak_server"]
    assert result.status is Status.FAIL
    assert "the server died (server closed the connection)" in result.summary and "+60 s" in result.summary
    assert "its first failed request at " in result.summary


def test_a_dead_server_whose_requests_wait_a_moment_between_failures_still_died() -> None:
    """A loaded client can see a killed server's in-flight requests fail an interval late: that interval has requests
    in flight and no error, and it is part of the death, not a reason to call it a passing server with errors."""
    dead = {"tokens": 0, "done": 0, "errors": 3, "in_flight": 0, "error": "server closed the connection"}
    intervals = served(after=dead)
    intervals[60] = replace(intervals[60], errors=0, in_flight=16, error="")  # the kill's interval: still waiting
    intervals[75] = replace(intervals[75], errors=0, in_flight=4, error="")
    result = by_id(soak([*series(), *intervals], server=True))["soak_server"]
    assert result.status is Status.FAIL and "the server died" in result.summary


def test_server_with_requests_in_flight_and_no_token_stalls() -> None:
    stalled = {"tokens": 0, "done": 0, "errors": 0, "in_flight": 16}
    result = by_id(soak(served(after=stalled), server=True))["soak_server"]
    assert result.status is Status.FAIL
    assert "stalled: no token for 30 s" in result.summary


def test_throughput_collapse_fails_and_a_dip_does_not() -> None:
    collapsed = by_id(soak(served(tokens=1000, after={"tokens": 200}), server=True))["soak_throughput"]
    assert collapsed.status is Status.FAIL and "collapsed to 200 tok/s" in collapsed.summary
    dip = served(tokens=1000)
    dip[70] = replace(dip[70], tokens=100)
    assert by_id(soak(dip, server=True))["soak_throughput"].status is Status.PASS


def test_without_a_server_the_server_verdicts_skip() -> None:
    results = by_id(soak(series()))
    assert results["soak_server"].status is Status.SKIP and results["soak_throughput"].status is Status.SKIP


# --- clocks, throttling, temperature, counters ---------------------------------------------------------------------


def test_sustained_hw_thermal_slowdown_warns_and_a_short_one_does_not() -> None:
    result = by_id(soak(series(reasons=0x40 | 0x4)))["soak_throttle"]
    assert result.status is Status.WARN and "HW thermal slowdown" in result.summary
    short = series()
    short[70] = replace(short[70], reasons=0x40)
    assert by_id(soak(short))["soak_throttle"].status is Status.PASS


def test_sustained_power_brake_warns() -> None:
    result = by_id(soak(series(reasons=0x80)))["soak_throttle"]
    assert result.status is Status.WARN and "HW power brake slowdown" in result.summary


def test_sw_power_cap_alone_is_not_throttling() -> None:
    assert by_id(soak(series(reasons=0x4)))["soak_throttle"].status is Status.PASS


def test_passing_verdicts_say_how_often_the_power_cap_and_clock_dips_came() -> None:
    # The shape of a real server soak (an H100 at C=64, docs/validation): the SW power cap on every other second and
    # the SM clock dipping below its base with it, never 30 s in a row.
    samples = [replace(HEALTHY, t=START + i, reasons=0x4 if i % 2 else 0, sm_mhz=1500 if i % 2 else 2400)
               for i in range(120)]  # fmt: skip
    results = by_id(soak(samples))
    assert results["soak_throttle"].status is Status.PASS and results["soak_clocks"].status is Status.PASS
    assert "SW power cap in 60 of 120 samples, at most 1 s in a row" in results["soak_throttle"].summary
    assert "but for dips of 1 s at most (60 samples, lowest 1500 MHz, base 1590 MHz)" in results["soak_clocks"].summary
    steady = by_id(soak([replace(HEALTHY, t=START + i, reasons=0) for i in range(120)]))
    assert steady["soak_throttle"].summary == "no sustained thermal or power throttling"
    assert steady["soak_clocks"].summary == "SM clocks at or above base under load"


def test_clock_below_base_under_load_warns() -> None:
    result = by_id(soak(series(sm_mhz=1200, reasons=0x4)))["soak_clocks"]
    assert result.status is Status.WARN
    assert "SM clock 1200 MHz below its base 1590 MHz" in result.summary and "SW power cap" in result.details


def test_clock_below_base_at_idle_passes() -> None:
    assert by_id(soak(series(sm_mhz=180, utilization=0)))["soak_clocks"].status is Status.PASS


def test_temperature_near_slowdown_warns_with_the_fan() -> None:
    result = by_id(soak(series(temperature_c=88, fan_percent=50)))["soak_temperature"]
    assert result.status is Status.WARN and "88 C (slowdown at 92 C, fan 50 %)" in result.summary


def test_rising_replay_and_ecc_counters_warn() -> None:
    assert "pcie_replay rose from 0 to 7" in by_id(soak(series(pcie_replay=7)))["soak_counters"].summary
    result = by_id(soak(series(ecc_uncorrected=1)))["soak_counters"]
    assert result.status is Status.WARN and "ecc_uncorrected" in result.summary


def test_one_failed_request_in_the_last_second_is_no_death() -> None:
    intervals = served()
    intervals[-1] = replace(intervals[-1], tokens=0, errors=1, error="HTTP 500")
    result = by_id(soak([*series(), *intervals], server=True))["soak_server"]
    assert result.status is Status.WARN and "1 failed requests" in result.summary

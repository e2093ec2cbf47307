"""gpu_peer_bandwidth (level 3): the peer probe's payload read strictly, the per-pair verdicts and their link-derived
floors, the copy loop's bookkeeping with a stand-in for libcuda (this machine has no GPU, let alone two), the check
skipping with one GPU, and the real probe and doctor on this GPU-less machine."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from typing import Any

import pytest

from lab.gpu_less import NO_DRIVER, NVML_ABSENT
from sm120check.doctor import facts, remedies
from sm120check.doctor.catalogue import all_checks
from sm120check.doctor.comm import peer as peer_check
from sm120check.doctor.comm import peer_copies as peer
from sm120check.doctor.gpu import load
from sm120check.doctor.gpu.payloads import PeerAnswer, PeerLink, PeerPair
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.node_health import verdicts
from sm120check.doctor.nvml_api import Gpu, NvmlInfo
from sm120check.doctor.payload import PayloadError
from sm120check.doctor.pcie_p2p import fabric as pcie_checks

GUARD_S = 120  # hang guard for the real doctor run: it takes a few seconds here
BUS = ("00000000:01:00.0", "00000000:02:00.0")


def link(index: int, gen: int | None = 5, width: int | None = 16, status: str = "ok") -> PeerLink:
    return PeerLink(index, BUS[index], gen, width, status)


def pair(gbps: float | None, *, p2p: bool = True, nvlink: bool | None = False, error: str = "") -> PeerPair:
    return PeerPair(0, 1, BUS[0], BUS[1], p2p, gbps, 9.5, "enabled", nvlink, 12, 64 << 20, error)


def gen5_pair() -> dict[int, PeerLink]:
    return {0: link(0), 1: link(1)}


# ---- payload -----------------------------------------------------------------------------------------------------


def test_the_answer_round_trips_through_json() -> None:
    answer = PeerAnswer(
        (pair(50.0), dataclasses.replace(pair(None, p2p=False, nvlink=None, error="x"), src=1, dst=0)),
        (link(0), link(1, None, None, "not supported")),
        4,
    )
    assert PeerAnswer.from_json(json.loads(json.dumps(answer.to_json()))) == answer


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda d: d["pairs"][0].update(p2p="yes"), "peer_bandwidth: pairs[0].p2p: expected true or false"),
        (lambda d: d["pairs"][0].update(gbps="50"), "peer_bandwidth: pairs[0].gbps: expected a number"),
        (lambda d: d["pairs"][0].pop("src"), "peer_bandwidth: pairs[0].src: missing"),
        (lambda d: d["links"][0].update(gen_max=5.5), "peer_bandwidth: links[0].gen_max: expected an integer"),
        (lambda d: d.pop("links"), "peer_bandwidth: links: missing"),
        (lambda d: d.update(pairs={}), "peer_bandwidth: pairs: expected a list"),
    ],
)
def test_a_malformed_answer_names_the_field(change: Any, named: str) -> None:
    data: dict[str, Any] = PeerAnswer((pair(50.0),), (link(0), link(1))).to_json()
    change(data)
    with pytest.raises(PayloadError) as raised:
        PeerAnswer.from_json(data)
    assert str(raised.value).startswith(named), str(raised.value)


# ---- verdicts ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("gbps", "status"), [(50.0, "pass"), (30.0, "warn"), (15.0, "fail")])
def test_a_gen5_x16_pair_is_judged_against_its_link(gbps: float, status: str) -> None:
    verdict = verdicts.peer_pair(pair(gbps), gen5_pair())
    assert verdict.status == status, verdict.summary
    assert verdict.summary.startswith("GPU 0 -> 1: ")
    assert "raw 63.0 GB/s" in verdict.details
    assert verdicts.peer_floor_gbps(pair(gbps), gen5_pair()) == pytest.approx(63.02 * 0.70, abs=0.01)
    below = status != "pass"  # a pass has no remedy and names no floor; a warn or fail names both
    assert verdict.remedy == (remedies.PEER_BANDWIDTH if below else "")
    assert ("below 44.1 GB/s" in verdict.summary) is below


def test_a_gen4_and_a_gen5_gpu_floor_at_the_gen4_rate() -> None:
    links = {0: link(0, 4, 16), 1: link(1, 5, 16)}
    verdict = verdicts.peer_pair(pair(25.0), links)  # below 40 % of Gen5 x16, above 70 % of Gen4 x16
    assert verdict.status == "pass", verdict.summary
    assert "GPU 0's Gen4 x16" in verdict.summary
    assert verdicts.peer_floor_gbps(pair(25.0), links) == pytest.approx(31.51 * 0.70, abs=0.01)
    assert verdicts.peer_pair(pair(20.0), links).status == "warn"


def test_without_p2p_the_copies_are_staged_through_the_host_and_warned() -> None:
    staged = pair(9.8, p2p=False)
    verdict = verdicts.peer_pair(staged, gen5_pair())
    assert verdict.status == "warn"
    assert verdict.summary == (
        "GPU 0 -> 1: no P2P: copies staged through the host, 9.8 GB/s (the `topology` check says why)"
    )
    assert verdict.remedy == remedies.PEER_NO_P2P
    assert verdicts.peer_floor_gbps(staged, gen5_pair()) is None


def test_nvlink_pairs_get_no_pcie_floor() -> None:
    by_nvml = pair(20.0, nvlink=True)  # below the PCIe warn floor, but the pair is NVLink: report only
    assert verdicts.peer_pair(by_nvml, gen5_pair()).status == "pass"
    assert verdicts.peer_floor_gbps(by_nvml, gen5_pair()) is None
    faster = pair(150.0, nvlink=None)  # NVML could not say, but no PCIe link carries 150 GB/s
    verdict = verdicts.peer_pair(faster, gen5_pair())
    assert verdict.status == "pass" and "above the PCIe raw rate: NVLink" in verdict.summary
    assert verdicts.peer_floor_gbps(faster, gen5_pair()) is None


def test_a_failed_pair_fails_naming_the_pair() -> None:
    failed = pair(None, error="cuMemAlloc_v2 returned CUDA_ERROR_OUT_OF_MEMORY")
    verdict = verdicts.peer_pair(failed, gen5_pair())
    assert verdict.status == "fail"
    assert verdict.summary == "GPU 0 -> 1: the peer copy failed: cuMemAlloc_v2 returned CUDA_ERROR_OUT_OF_MEMORY"
    assert verdict.remedy == remedies.peer_probe("0,1")


def test_a_pair_the_time_limit_left_out_warns_to_raise_the_timeout() -> None:
    left_out = pair(None, error="not measured: the probe's time limit would pass first (up to 4 s a pair)")
    verdict = verdicts.peer_pair(left_out, gen5_pair())
    assert verdict.status == "warn" and verdict.remedy == remedies.PEER_TIMEOUT


def test_without_a_maximum_link_there_is_no_floor() -> None:
    links = {0: link(0, None, None, "not supported"), 1: link(1)}
    verdict = verdicts.peer_pair(pair(20.0), links)
    assert verdict.status == "skip" and "not supported" in verdict.summary


def test_the_node_verdict_is_the_worst_pair_and_lists_the_bad_ones() -> None:
    back = dataclasses.replace(pair(15.0), src=1, dst=0, src_bus=BUS[1], dst_bus=BUS[0])
    answer = PeerAnswer((pair(50.0), back), (link(0), link(1)))
    verdict = verdicts.peer_bandwidth(answer)
    assert verdict.status == "fail" and verdict.summary.startswith("GPU 1 -> 0: 15.0 GB/s P2P is below")
    assert "GPU 0 -> 1" in verdict.details and "GPU 1 -> 0" in verdict.details
    fine = verdicts.peer_bandwidth(PeerAnswer((pair(50.0), dataclasses.replace(back, gbps=52.0)), answer.links))
    assert fine.status == "pass" and fine.summary == "2 ordered GPU pairs, P2P 50.0-52.0 GB/s, latency 9.5-9.5 us"
    unmeasured = verdicts.peer_bandwidth(PeerAnswer((), (), error="libcuda.so.1 does not load"))
    assert unmeasured.status == "fail" and "libcuda.so.1 does not load" in unmeasured.summary


def test_the_result_data_per_pair() -> None:
    answer = PeerAnswer((pair(50.0), dataclasses.replace(pair(9.8, p2p=False), src=1, dst=0)), (link(0), link(1)))
    result = peer_check.judge_peer(answer)
    assert result.status is Status.WARN and result.family == "comm" and result.level == 3
    common = {"read_gbps": None, "latency_us": 9.5, "root_ports": ["", ""]}
    assert result.data == {
        "pairs": [
            {"src": 0, "dst": 1, "p2p": True, "gbps": 50.0, "floor_gbps": 44.11, **common},
            {"src": 1, "dst": 0, "p2p": False, "gbps": 9.8, "floor_gbps": None, **common},
        ]
    }
    json.dumps(result.data)


# ---- the copy loop, with a stand-in for libcuda -------------------------------------------------------------------


class StandInCuda(load.Cuda):
    """Stand-in for libcuda (this machine has no GPU): a 64 MiB copy 'takes' 5 ms, a small one 10 us; peer access
    as `can_access` and `already` say; `fail_at` names a call that returns an error."""

    def __init__(self, can_access: bool = True, already: bool = False, fail_at: str = "") -> None:
        super().__init__(lib=None)  # type: ignore[arg-type]
        self.can_access, self.already, self.fail_at = can_access, already, fail_at
        self.calls: list[str] = []
        self.copied = 0
        self.handles = 0x1000

    def call(self, func: str, *args: Any) -> None:
        self.calls.append(func)
        if func == self.fail_at:
            raise load.CudaCallFailed(f"{func} returned CUDA_ERROR_OUT_OF_MEMORY")
        if func == "cuCtxEnablePeerAccess" and self.already:
            raise load.CudaCallFailed(f"{func} returned {peer.ALREADY_ENABLED}")
        if func in ("cuDevicePrimaryCtxRetain", "cuMemAlloc_v2", "cuStreamCreate", "cuEventCreate"):
            self.handles += 0x100
            args[0]._obj.value = self.handles
        if func == "cuDeviceCanAccessPeer":
            args[0]._obj.value = int(self.can_access)
        if func == "cuMemcpyPeerAsync":
            self.copied = args[4].value
        if func == "cuEventElapsedTime":
            args[0]._obj.value = 5.0 if self.copied > 4096 else 0.01


FAST = peer.Settings(busy_s=0.0, limit_s=5.0, latency_copies=20, latency_limit_s=5.0)
GPUS = (peer.PeerGpu(0, BUS[0], 0), peer.PeerGpu(1, BUS[1], 1))


def test_a_p2p_pair_is_timed_and_everything_it_made_is_released() -> None:
    cuda = StandInCuda()
    got = peer.measure_pair(cuda, *GPUS, nvlink=False, settings=FAST)
    assert got.error == "" and got.p2p and got.access == "enabled"
    assert got.gbps == pytest.approx((64 << 20) / 0.005 / 1e9, abs=0.01) and got.repeats == 3
    assert got.latency_us == pytest.approx(10.0)
    assert cuda.calls.count("cuCtxEnablePeerAccess") == 2 and cuda.calls.count("cuCtxDisablePeerAccess") == 2
    for freed, times in (("cuMemFree_v2", 2), ("cuEventDestroy_v2", 4), ("cuStreamDestroy_v2", 2)):
        assert cuda.calls.count(freed) == times, freed
    assert cuda.calls.count("cuDevicePrimaryCtxRelease_v2") == cuda.calls.count("cuDevicePrimaryCtxRetain") == 2


def test_without_peer_access_the_copies_still_run_and_say_no_p2p() -> None:
    cuda = StandInCuda(can_access=False)
    got = peer.measure_pair(cuda, *GPUS, settings=FAST)
    assert not got.p2p and got.gbps is not None and got.error == ""
    assert got.access == "cuDeviceCanAccessPeer: GPU 0 -> 1 no, 1 -> 0 no"
    assert "cuCtxEnablePeerAccess" not in cuda.calls and "cuMemcpyPeerAsync" in cuda.calls


def test_peer_access_already_enabled_is_fine_and_left_enabled() -> None:
    cuda = StandInCuda(already=True)
    got = peer.measure_pair(cuda, *GPUS, settings=FAST)
    assert got.p2p and got.access == "already enabled" and got.error == ""
    assert "cuCtxDisablePeerAccess" not in cuda.calls  # someone else's: not ours to undo


def test_a_failing_cuda_call_is_the_pairs_error_and_still_frees() -> None:
    cuda = StandInCuda(fail_at="cuStreamCreate")
    got = peer.measure_pair(cuda, *GPUS, settings=FAST)
    assert got.gbps is None and got.error == "cuStreamCreate returned CUDA_ERROR_OUT_OF_MEMORY"
    assert cuda.calls.count("cuMemFree_v2") == 2 and cuda.calls.count("cuCtxDisablePeerAccess") == 2
    assert cuda.calls.count("cuDevicePrimaryCtxRelease_v2") == 2
    assert "cuMemcpyPeerAsync" not in cuda.calls


def test_every_ordered_pair_runs_and_a_spent_deadline_starts_none() -> None:
    cuda = StandInCuda()
    gpus = (*GPUS, peer.PeerGpu(2, "00000000:03:00.0", None))
    pairs = peer.measure_pairs(cuda, gpus, deadline=time.monotonic() + 60, settings=FAST)
    assert [(p.src, p.dst) for p in pairs] == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
    hidden = [p for p in pairs if 2 in (p.src, p.dst)]
    assert all("GPU 2 (00000000:03:00.0) is hidden from CUDA" in p.error for p in hidden)
    late = StandInCuda()
    left = peer.measure_pairs(late, GPUS, deadline=time.monotonic(), settings=FAST)
    assert all(p.error.startswith("not measured") for p in left) and late.calls == []


class StandInNode(StandInCuda):
    """The stand-in libcuda of a node whose CUDA devices 0 and 1 sit on BUS[0] and BUS[1]."""

    def device_by_bus(self) -> dict[tuple[int, int, int], int]:
        return {key: dev for dev, bus in enumerate(BUS) if (key := load.pci_key(bus)) is not None}


def test_the_node_maps_gpus_by_bus_and_names_the_ones_it_cannot_use() -> None:
    cuda = StandInNode()
    lost = PeerLink(2, "", None, None, "NVML error 15 (GPU is lost)")
    links = (link(0), link(1), lost, PeerLink(3, "00000000:09:00.0", 5, 16))  # GPU 3: CUDA does not list it
    pairs = {(p.src, p.dst): p for p in peer.measure_node(cuda, links, deadline=time.monotonic() + 60, settings=FAST)}
    assert len(pairs) == 12
    assert pairs[(0, 1)].gbps is not None and pairs[(1, 0)].gbps is not None and pairs[(0, 1)].error == ""
    assert pairs[(0, 2)].error == pairs[(2, 1)].error == "NVML cannot open GPU 2: NVML error 15 (GPU is lost)"
    assert pairs[(3, 0)].error == "GPU 3 (00000000:09:00.0) is hidden from CUDA (CUDA_VISIBLE_DEVICES?)"
    assert cuda.calls.count("cuDevicePrimaryCtxRetain") == cuda.calls.count("cuDevicePrimaryCtxRelease_v2")


def test_a_context_that_does_not_start_is_the_error_of_that_gpus_pairs() -> None:
    cuda = StandInNode(fail_at="cuDevicePrimaryCtxRetain")
    pairs = peer.measure_node(cuda, (link(0), link(1)), deadline=time.monotonic() + 60, settings=FAST)
    why = "no CUDA context: cuDevicePrimaryCtxRetain returned CUDA_ERROR_OUT_OF_MEMORY"
    assert [p.error for p in pairs] == [f"GPU 0: {why}", f"GPU 1: {why}"]
    assert "cuMemcpyPeerAsync" not in cuda.calls


# ---- the check and the probe on this machine ----------------------------------------------------------------------


def _ctx(*indices: int) -> Context:
    gpus = tuple(Gpu(i, "NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0), True, BUS[i]) for i in indices)
    node = dataclasses.replace(facts.local(), nvml_read=facts.NvmlFacts(NvmlInfo("580.95.05", 13000, gpus, "ctypes")))
    return Context(facts=node, results={"driver": Result("driver", Status.PASS, "driver 580.95.05")}, timeout=60)


def test_the_check_is_level_3_in_the_comm_family_before_the_other_comm_checks() -> None:
    checks = [c for c in all_checks() if c.family == "comm"]
    assert checks[0].id == "gpu_peer_bandwidth" and checks[0].level == 3 and checks[0].requires == ("driver",)


def test_with_one_gpu_the_check_skips_as_the_comm_checks_do() -> None:
    result = peer_check.PeerBandwidth().run(_ctx(0))
    assert result.status is Status.SKIP
    assert result.summary == "needs at least 2 GPUs, 1 selected" and result.remedy == remedies.COMM_TWO_GPUS


@NO_DRIVER
def test_the_real_probe_answers_on_this_machine_and_the_check_reads_it() -> None:
    """Two GPUs in the facts, none in the machine: the real probe runs and says why it measured nothing."""
    result = peer_check.PeerBandwidth().run(_ctx(0, 1))
    answer = subprocess.run(
        [sys.executable, "-m", "sm120check.doctor.comm.peer_bandwidth_probe", "--gpus", "0,1", "--timeout", "10"],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        check=True,
    )
    parsed = PeerAnswer.from_json(json.loads(answer.stdout.strip().splitlines()[-1]))
    assert parsed.error == NVML_ABSENT and parsed.pairs == () and parsed.links == ()
    assert "sm120check-step: dlopen libnvidia-ml.so.1" in answer.stderr.splitlines(), answer.stderr
    # no driver here: a fail naming it, never a crash or a pass
    assert result.status is Status.FAIL and result.level == 3 and result.family == "comm"
    assert result.summary == f"the peer-copy probe could not measure: {NVML_ABSENT}"


@NO_DRIVER
def test_doctor_level_3_does_not_fail_because_of_it_here() -> None:
    """The whole level-3 run: other checks may fail on this machine (no manifest, a CPU torch); this one skips on the
    driver check it requires (no driver here), with the driver's remedy."""
    run = subprocess.run(
        [sys.executable, "-m", "sm120check", "doctor", "--level", "3", "--json"],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        check=False,
    )
    results = {r["id"]: r for r in json.loads(run.stdout)["results"]}
    assert results["driver"]["status"] == "skip" and results["driver"]["summary"] == "no NVIDIA driver"
    peer_result = results["gpu_peer_bandwidth"]
    assert peer_result["status"] == "skip", peer_result
    assert peer_result["summary"] == "needs driver, which was skipped: no NVIDIA driver"
    assert peer_result["remedy"] == remedies.DRIVER and peer_result["data"] == {}
    assert peer_result["family"] == "comm" and peer_result["level"] == 3


def test_a_hung_peer_probe_fails_naming_the_probe_the_timeout_and_its_last_step() -> None:
    """The outcome a killed child gives (its stderr with the step marks the probe printed): one FAIL, level 3."""
    from sm120check.doctor import child
    from sm120check.doctor.probecheck import child_failure

    hung = child.ChildOutcome(
        ok=False,
        timed_out=True,
        seconds=115.0,
        stderr_tail=f"{child.STEP_MARK} dlopen libcuda.so.1 and cuInit\n{child.STEP_MARK} peer copies GPU 0 -> 1\n",
    )
    result = child_failure("gpu_peer_bandwidth", "the peer-copy probe", hung, remedies.peer_probe("0,1"))
    assert result.status is Status.FAIL and result.level == 3 and result.family == "comm"
    assert (
        result.summary
        == "the peer-copy probe timed out after 115 s (killed with its process group) during peer copies GPU 0 -> 1"
    )
    assert result.remedy == remedies.peer_probe("0,1")


# ---- writes against reads: the posted-write collapse (local-inference-lab/rtx6kpro hardware/collapse-report.md) ----

# An 8-GPU box with two root complexes, as the collapse report's topology section shows them: GPUs 0-3 behind root
# port 00:01.1, GPUs 4-7 behind 20:01.1.
TWO_ROOTS = {i: ("0000:00:01.1" if i < 4 else "0000:20:01.1") for i in range(8)}


def measured(src: int, dst: int, write: float, read: float | None) -> PeerPair:
    bus = (f"00000000:{3 + src:02X}:00.0", f"00000000:{3 + dst:02X}:00.0")
    return PeerPair(src, dst, *bus, True, write, 4.1, "enabled", False, 12, 64 << 20, read_gbps=read, read_repeats=12)


def gen5_links(*indices: int) -> dict[int, PeerLink]:
    return {i: PeerLink(i, f"00000000:{3 + i:02X}:00.0", 5, 16) for i in indices}


def test_the_collapse_reports_52_to_7_gb_s_fails_naming_the_pair_and_both_root_ports() -> None:
    """The report's WRX90 + Microchip PM50100 rig: writes GPU 0 -> 4 at ~7 GB/s while reads of the same bytes run at
    ~52 (reads are unaffected: non-posted completions have their own flow control)."""
    verdict = verdicts.peer_pair(measured(0, 4, 7.0, 52.0), gen5_links(0, 4), roots=TWO_ROOTS)
    assert verdict.status == "fail"
    assert verdict.summary == (
        "GPU 0 -> 4: posted-write collapse: writes 7.0 GB/s, reads 52.0 GB/s (13% of the reads, fail below 50%); "
        "root ports 0000:00:01.1 (GPU 0), 0000:20:01.1 (GPU 4)"
    )
    assert verdict.remedy == remedies.PEER_WRITE_COLLAPSE and "no kernel or driver setting" in verdict.remedy
    assert "reads 52.0 GB/s (median of 12)" in verdict.details


def test_a_healthy_pair_whose_reads_are_a_touch_faster_passes_with_both_rates() -> None:
    """The report's BASELINE row: 52.5 GB/s written, 53.4 read."""
    verdict = verdicts.peer_pair(measured(0, 4, 52.5, 53.4), gen5_links(0, 4), roots=TWO_ROOTS)
    assert verdict.status == "pass", verdict.summary
    assert verdict.summary.startswith("GPU 0 -> 4: 52.5 GB/s P2P over PCIe (83% of")
    assert ", reads 53.4 GB/s, latency 4.1 us" in verdict.summary


def test_writes_at_two_thirds_of_the_reads_warn_and_a_collapse_outranks_the_link_floor() -> None:
    warned = verdicts.peer_pair(measured(1, 5, 36.0, 53.0), gen5_links(1, 5), roots=TWO_ROOTS)
    assert warned.status == "warn" and warned.summary.startswith("GPU 1 -> 5: writes well below reads: writes 36.0")
    assert "(68% of the reads, warn below 75%)" in warned.summary and warned.remedy == remedies.PEER_WRITE_COLLAPSE
    # 2.7 GB/s is also far under the link floor: the collapse is the cause the user reads first
    broadcom = verdicts.peer_pair(measured(0, 6, 2.7, 37.0), gen5_links(0, 6), roots={0: "0000:00:01.1"})
    assert broadcom.status == "fail" and "posted-write collapse" in broadcom.summary
    assert broadcom.summary.endswith("root ports 0000:00:01.1 (GPU 0), unknown (GPU 6)")


def test_gpus_behind_one_root_port_say_so_and_unknown_roots_say_why() -> None:
    same = verdicts.peer_pair(measured(0, 1, 7.0, 52.0), gen5_links(0, 1), roots=TWO_ROOTS)
    assert same.summary.endswith("both behind root port 0000:00:01.1")
    flat = verdicts.peer_pair(measured(0, 1, 7.0, 52.0), gen5_links(0, 1))
    assert flat.summary.endswith("root ports unknown (no PCI bridge above the GPUs in sysfs)")


def test_the_node_verdict_over_an_8_gpu_two_root_box_names_only_the_collapsed_cross_root_pairs() -> None:
    pairs = tuple(
        measured(a, b, 7.0 if (a < 4) != (b < 4) and a < 4 else 52.0, 53.0)
        for a in range(8)
        for b in range(8)
        if a != b
    )
    verdict = verdicts.peer_bandwidth(PeerAnswer(pairs, tuple(gen5_links(*range(8)).values())), TWO_ROOTS)
    assert verdict.status == "fail"
    assert verdict.summary.startswith("16 of 56 pairs: GPU 0 -> 4: posted-write collapse: writes 7.0 GB/s")
    assert "GPU 4 -> 0" not in verdict.summary  # writes from the second root are healthy on this box
    assert verdict.remedy == remedies.PEER_WRITE_COLLAPSE


def test_a_geforce_pair_without_p2p_passes_as_expected_with_the_level_1_note() -> None:
    staged = pair(9.8, p2p=False)
    verdict = verdicts.peer_pair(staged, gen5_pair(), geforce=frozenset({0, 1}))
    assert verdict.status == "pass" and verdict.remedy == ""
    assert verdict.summary == (
        "GPU 0 -> 1: P2P not available on GeForce with the stock driver: expected, P2P features off; copies staged "
        "through the host, 9.8 GB/s"
    )
    assert verdicts.GEFORCE_NO_P2P == pcie_checks.GEFORCE_NOTE  # the words of the iommu/pcie_acs checks


def test_an_answer_from_before_reads_were_timed_still_reads_and_a_bad_read_rate_is_named() -> None:
    data: dict[str, Any] = PeerAnswer((pair(50.0),), (link(0), link(1))).to_json()
    for key in ("read_gbps", "read_repeats"):
        data["pairs"][0].pop(key)
    assert PeerAnswer.from_json(data).pairs[0].read_gbps is None
    data["pairs"][0]["read_gbps"] = "52"
    with pytest.raises(PayloadError, match=r"^peer_bandwidth: pairs\[0\]\.read_gbps: expected a number"):
        PeerAnswer.from_json(data)


class CollapsingCuda(StandInCuda):
    """Stand-in libcuda whose copies on the source's stream (the first stream made) take 10x longer than on the
    destination's (writes collapse, reads do not); records the context current at each stream's creation."""

    def __init__(self) -> None:
        super().__init__()
        self.stream_contexts: list[int] = []
        self.current = 0
        self.write_stream = 0
        self.last_stream = 0

    def call(self, func: str, *args: Any) -> None:
        if func == "cuCtxSetCurrent":
            self.current = args[0].value or 0
        if func == "cuEventRecord":
            self.last_stream = args[1].value
        super().call(func, *args)
        if func == "cuStreamCreate":
            self.stream_contexts.append(self.current)
            self.write_stream = self.write_stream or args[0]._obj.value
        if func == "cuEventElapsedTime" and self.copied > 4096:
            args[0]._obj.value = 50.0 if self.last_stream == self.write_stream else 5.0


def test_the_read_is_the_same_copy_issued_on_a_stream_of_the_destinations_context() -> None:
    cuda = CollapsingCuda()
    got = peer.measure_pair(cuda, *GPUS, settings=FAST)
    assert cuda.calls.count("cuDevicePrimaryCtxRetain") == 2 and len(cuda.stream_contexts) == 2
    src_ctx, dst_ctx = 0x1100, 0x1200  # the stand-in's handles, in the order the two contexts were retained
    assert cuda.stream_contexts == [src_ctx, dst_ctx]
    assert got.gbps is not None and got.read_gbps is not None and got.read_repeats == 3
    assert got.read_gbps == pytest.approx(10 * got.gbps, rel=0.01)
    verdict = verdicts.peer_pair(got, gen5_pair())
    assert verdict.status == "fail" and verdict.summary.startswith("GPU 0 -> 1: posted-write collapse: writes 1.3")


def test_the_root_ports_come_from_the_runs_pcie_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check declares `needs_pcie`: the facts step reads the fabric once and the judge reads no sysfs itself."""
    from sm120check.doctor.pcie import fact_file, kernel_log, node, sysfs

    def no_read(*args: Any, **kwargs: Any) -> sysfs.SysfsView:
        raise AssertionError("the root ports come from the run's PCIe facts")

    monkeypatch.setattr(sysfs, "read", no_read)  # the module probecheck falls back to
    rows = tuple(
        sysfs.SysGpu(f"0000:0{i + 1}:00.0", "0x2bb5", "0x030200", (f"0000:{i * 32:02x}:01.1",), f"pci0000:{i * 32:02x}")
        for i in (0, 1)
    )
    fabric = node.PcieFacts(
        sysfs.SysfsView(rows), None, kernel_log.IommuLog(), fact_file.FactRead("/none", missing=True)
    )
    ctx = _ctx(0, 1)
    ctx.facts = dataclasses.replace(ctx.facts, pcie_read=fabric)
    check = peer_check.PeerBandwidth()
    assert facts.pcie_reader([check]) is node.read
    gpus = list(ctx.facts.gpus or ())
    result = check.judge(PeerAnswer((pair(50.0),), (link(0), link(1))), ctx, gpus)
    assert result.data["pairs"][0]["root_ports"] == ["0000:00:01.1", "0000:20:01.1"]  # type: ignore[index]

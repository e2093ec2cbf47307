"""The level-3 pair checks of issue #25 on a machine without a GPU: `gpu_peer_stress` (many-to-one staggered writes)
judged on numbers shaped like the rtx6kpro collapse report's (local-inference-lab/rtx6kpro hardware/collapse-report.md
at c93c92aa) on an 8-GPU two-root box, its copy loop with a stand-in for libcuda; `nccl_pairs` (a two-rank NCCL
all-reduce per pair, with P2P and with NCCL_P2P_DISABLE=1) judged, and its watchdog run against real child processes
that really hang or exit non-zero (tests/unit/comm/comm_pair_stand_ins.py); both probes' answers read strictly."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from sm120check.doctor import remedies
from sm120check.doctor.catalogue import all_checks
from sm120check.doctor.child import ChildOutcome
from sm120check.doctor.comm import pairs
from sm120check.doctor.comm import stress_copies as stress
from sm120check.doctor.comm.peer_copies import PeerGpu
from sm120check.doctor.comm.peer_stress_payload import StressAnswer, StressSource, StressTarget
from sm120check.doctor.gpu import load
from sm120check.doctor.gpu.payloads import PeerLink
from sm120check.doctor.model import Status
from sm120check.doctor.payload import PayloadError
from sm120check.doctor.pcie_p2p import nccl_pair_probe as nccl_pair
from sm120check.doctor.pcie_p2p import nccl_pairs
from sm120check.doctor.pcie_p2p.nccl_pair_payload import PairRun

HERE = Path(__file__).parent
# An 8-GPU box with two root complexes (the collapse report's topology: GPUs 0-3 behind 00:01.1, 4-7 behind 20:01.1).
TWO_ROOTS = {i: ("0000:00:01.1" if i < 4 else "0000:20:01.1") for i in range(8)}
BUS = {i: f"00000000:{3 + i:02X}:00.0" for i in range(8)}


def source(src: int, solo: float | None, loaded: float | None, p2p: bool = True) -> StressSource:
    return StressSource(src, BUS[src], p2p, solo, loaded, "enabled" if p2p else "cuDeviceCanAccessPeer says no")


def round_into(
    target: int, loaded: dict[int, float], solo: float = 52.5, aggregate: float | None = None
) -> StressTarget:
    sources = tuple(source(s, solo, rate) for s, rate in loaded.items())
    total = aggregate if aggregate is not None else round(sum(loaded.values()), 2)
    return StressTarget(target, BUS[target], sources, total, 1.2)


def answer(*targets: StressTarget) -> StressAnswer:
    return StressAnswer(targets, 64 << 20, 16, 0.001)


def fair_round(target: int) -> StressTarget:
    """7 sources into one Gen5 x16 target, its link saturated (the report's CONTROL row: 52.1 together vs 52.5 alone),
    shared as a switch that arbitrates per port does: the target's 3 switch-mates get a port each, the 4 GPUs behind
    the other root share the upstream port (13.0 each vs 3.25 each)."""
    mates = [s for s in range(8) if s != target and (s < 4) == (target < 4)]
    remote = [s for s in range(8) if (s < 4) != (target < 4)]
    return round_into(target, {**dict.fromkeys(mates, 13.0), **dict.fromkeys(remote, 3.25)}, aggregate=52.1)


# ---- gpu_peer_stress: the judge ---------------------------------------------------------------------------------


def test_a_healthy_two_root_box_passes_even_where_port_arbitration_gives_remote_sources_less() -> None:
    result = pairs.judge_stress(answer(*(fair_round(t) for t in range(8))), TWO_ROOTS)
    assert result.status is Status.PASS, result.summary
    assert result.summary.startswith("8 targets, each written by every other GPU at once (starts 1 ms apart): ")
    assert "GPU 0: 52.1 GB/s from 7 GPUs at once (3.2-13.0 GB/s each)" in result.summary
    assert result.remedy == ""


def test_an_aggregate_collapse_fails_naming_the_target_and_its_root_port() -> None:
    """The report's collapse rows: 13.5 GB/s together where one GPU alone writes 52.5."""
    collapsed = round_into(4, dict.fromkeys((0, 1, 2, 3, 5, 6, 7), 1.93), aggregate=13.5)
    result = pairs.judge_stress(answer(fair_round(0), collapsed), TWO_ROOTS)
    assert result.status is Status.FAIL
    assert result.summary == (
        "GPU 4: 7 GPUs writing at once carry 13.5 GB/s, 26% of the best solo write into it (52.5 GB/s; fail below "
        "50%): the fabric collapses under many-to-one load; root port 0000:20:01.1"
    )
    assert result.remedy == remedies.PEER_STRESS and "no kernel or driver setting" in result.remedy
    assert "GPU 3 (00000000:06:00.0, root port 0000:00:01.1): solo 52.5 GB/s, under load 1.93 GB/s" in result.details


def test_a_source_shut_out_of_the_target_fails_naming_it_with_its_solo_rate() -> None:
    shut_out = dataclasses.replace(
        fair_round(0),
        sources=tuple(dataclasses.replace(s, loaded_gbps=0.4) if s.src == 5 else s for s in fair_round(0).sources),
    )
    result = pairs.judge_stress(answer(shut_out), TWO_ROOTS)
    assert result.status is Status.FAIL
    assert result.summary == (
        "GPU 0: under many-to-one load (aggregate 52.1 GB/s from 7 GPUs) a source is nearly shut out: GPU 5 0.4 GB/s "
        "(5% of an equal share 7.4; solo 52.5 GB/s; root port 0000:20:01.1)"
    )


def test_a_source_at_a_fifth_of_its_share_warns() -> None:
    rates = dict.fromkeys((1, 2, 3, 4, 5, 6), 8.4) | {7: 1.5}
    result = pairs.judge_stress(answer(round_into(0, rates)), TWO_ROOTS)
    assert result.status is Status.WARN and "GPU 7 1.5 GB/s (20% of an equal share 7.4;" in result.summary


def test_geforce_rounds_without_p2p_pass_as_expected_and_other_rounds_without_p2p_skip() -> None:
    staged = StressTarget(0, BUS[0], (source(1, 9.0, 8.0, p2p=False),), 8.0, 0.5)
    geforce = pairs.judge_stress(answer(staged), geforce=frozenset({0, 1}))
    assert geforce.status is Status.PASS
    assert geforce.summary.endswith(
        "GPU 0: P2P not available on GeForce with the stock driver: expected, P2P features off"
    )
    other = pairs.judge_stress(answer(staged))
    assert other.status is Status.SKIP and "no source has P2P to it" in other.summary


def test_a_failed_round_a_left_out_gpu_and_a_round_out_of_time_are_named() -> None:
    failed = StressTarget(
        2, BUS[2], (source(0, 52.0, None),), None, 0.3, "cuMemAlloc_v2 returned CUDA_ERROR_OUT_OF_MEMORY"
    )
    late = StressTarget(
        3, BUS[3], (), None, 0.0, "not measured: the probe's time limit would pass first (up to 9 s a round)"
    )
    result = pairs.judge_stress(
        dataclasses.replace(answer(failed, late), left_out=("GPU 1 (00000000:04:00.0) is hidden from CUDA",)),
        selected="0,1,2,3",
    )
    assert result.status is Status.FAIL
    assert "GPU 2: the many-to-one writes failed: cuMemAlloc_v2 returned CUDA_ERROR_OUT_OF_MEMORY" in result.summary
    assert "GPUs left out of every round: GPU 1 (00000000:04:00.0) is hidden from CUDA" in result.summary
    assert remedies.peer_stress_probe("0,1,2,3") in result.remedy
    alone = pairs.judge_stress(answer(late))
    assert alone.status is Status.WARN and alone.remedy == remedies.PEER_STRESS_TIMEOUT


# ---- gpu_peer_stress: its answer --------------------------------------------------------------------------------


def test_the_stress_answer_round_trips_and_a_malformed_one_names_the_field() -> None:
    whole = dataclasses.replace(answer(fair_round(0)), left_out=("GPU 9: no CUDA context",))
    data: dict[str, Any] = json.loads(json.dumps(whole.to_json()))
    assert StressAnswer.from_json(data) == whole
    data["targets"][0]["sources"][2]["loaded_gbps"] = "3.25"
    with pytest.raises(PayloadError, match=r"^peer_stress: targets\[0\]\.sources\[2\]\.loaded_gbps: expected a number"):
        StressAnswer.from_json(data)
    with pytest.raises(PayloadError, match=r"^peer_stress: \(answer\): expected an object"):
        StressAnswer.from_json(["not", "an", "object"])
    with pytest.raises(PayloadError, match=r"^peer_stress: left_out: missing"):
        StressAnswer.from_json({k: v for k, v in whole.to_json().items() if k != "left_out"})


# ---- gpu_peer_stress: the copy loop with a stand-in for libcuda --------------------------------------------------


class StandInCuda(load.Cuda):
    """Stand-in for libcuda (no GPU here): each 64 MiB copy 'takes' 5 ms; handles count up; records every call."""

    def __init__(self, fail_at: str = "") -> None:
        super().__init__(lib=None)  # type: ignore[arg-type]
        self.calls: list[str] = []
        self.handles = 0x1000
        self.fail_at = fail_at

    def call(self, func: str, *args: Any) -> None:
        self.calls.append(func)
        if func == self.fail_at:
            raise load.CudaCallFailed(f"{func} returned CUDA_ERROR_OUT_OF_MEMORY")
        if func in ("cuDevicePrimaryCtxRetain", "cuMemAlloc_v2", "cuStreamCreate", "cuEventCreate"):
            self.handles += 0x100
            args[0]._obj.value = self.handles
        if func == "cuDeviceCanAccessPeer":
            args[0]._obj.value = 1
        if func == "cuEventElapsedTime":
            args[0]._obj.value = 5.0

    def device_by_bus(self) -> dict[tuple[int, int, int], int]:
        return {key: i for i, bus in BUS.items() if i < 3 and (key := load.pci_key(bus)) is not None}


FAST = stress.StressSettings(copies=2, stagger_s=0.0, solo_busy_s=0.0, solo_limit_s=5.0)


def test_every_gpu_is_a_target_once_and_everything_made_is_released() -> None:
    cuda = StandInCuda()
    links = tuple(PeerLink(i, BUS[i], 5, 16) for i in range(3))
    found, left_out = stress.measure_node(cuda, links, deadline=time.monotonic() + 60, settings=FAST)
    assert [t.target for t in found] == [0, 1, 2] and left_out == ()
    assert [[s.src for s in t.sources] for t in found] == [[1, 2], [0, 2], [0, 1]]
    assert all(s.p2p and s.loaded_gbps is not None and s.solo_gbps is not None for t in found for s in t.sources)
    assert found[0].aggregate_gbps is not None and found[0].error == ""
    assert cuda.calls.count("cuCtxEnablePeerAccess") == cuda.calls.count("cuCtxDisablePeerAccess") == 12
    assert cuda.calls.count("cuMemAlloc_v2") == cuda.calls.count("cuMemFree_v2") == 12
    assert cuda.calls.count("cuStreamCreate") == cuda.calls.count("cuStreamDestroy_v2") == 6
    assert cuda.calls.count("cuDevicePrimaryCtxRetain") == cuda.calls.count("cuDevicePrimaryCtxRelease_v2") == 3


def test_a_failing_call_is_the_rounds_error_a_hidden_gpu_is_left_out_and_a_spent_deadline_starts_nothing() -> None:
    cuda = StandInCuda(fail_at="cuStreamCreate")
    links = (*(PeerLink(i, BUS[i], 5, 16) for i in range(3)), PeerLink(5, BUS[5], 5, 16))
    found, left_out = stress.measure_node(cuda, links, deadline=time.monotonic() + 60, settings=FAST)
    assert all(t.error == "cuStreamCreate returned CUDA_ERROR_OUT_OF_MEMORY" for t in found)
    assert cuda.calls.count("cuMemAlloc_v2") == cuda.calls.count("cuMemFree_v2")
    assert left_out == ("GPU 5 (00000000:08:00.0) is hidden from CUDA",)
    late = StandInCuda()
    rounds, _ = stress.measure_node(late, links[:2], deadline=time.monotonic(), settings=FAST)
    assert all(t.error.startswith("not measured") for t in rounds) and "cuMemcpyPeerAsync" not in late.calls


def test_one_gpu_at_both_ends_is_said_to_be_the_same_gpu_not_a_host_staged_peer() -> None:
    """scripts/device/pair_machinery.py's round on a one-GPU machine: CUDA says no peer access for a device to itself,
    which is no host staging (the H200 run said so, 2026-12-02-h200-policy)."""
    cuda = StandInCuda()
    gpu = PeerGpu(0, BUS[0], 0)
    with stress.primary_contexts(cuda, [gpu]) as (contexts, problems):
        found = stress.measure_target(cuda, gpu, [gpu], contexts, FAST)
    assert problems == [] and found.error == ""
    (source,) = found.sources
    assert source.access == "the same GPU: device-to-device copies, no peer path" and not source.p2p
    assert "cuCtxEnablePeerAccess" not in cuda.calls and "cuDeviceCanAccessPeer" not in cuda.calls


# ---- nccl_pairs: the judge --------------------------------------------------------------------------------------


def run(
    p2p: bool, *, finished: bool = True, hung: bool = False, problem: str = "", busbw: float | None = 8.4
) -> PairRun:
    return PairRun((0, 4), p2p, finished, hung, 55.2 if hung else 9.1, problem, "2.28.9", busbw if finished else None)


HUNG = "ranks hung for 55 s (in first allreduce) and were killed"


def test_both_runs_finishing_pass_with_each_busbw() -> None:
    result = nccl_pairs.judge_pairs([nccl_pairs.PairOutcome((0, 4), run(True, busbw=21.7), run(False, busbw=8.4))])
    assert result.status is Status.PASS
    assert result.summary == "GPU 0-4: all-reduce busbw 21.7 GB/s with P2P, 8.4 GB/s with NCCL_P2P_DISABLE=1"


def test_a_hang_with_p2p_that_finishes_without_it_fails_naming_iommu_acs_and_the_pcie_p2p_role() -> None:
    outcome = nccl_pairs.PairOutcome((0, 4), run(True, finished=False, hung=True, problem=HUNG), run(False))
    result = nccl_pairs.judge_pairs([outcome])
    assert result.status is Status.FAIL
    assert result.summary == (
        f"GPU 0-4: NCCL all-reduce hung with P2P: the watchdog killed it after 55 s ({HUNG}), and finished with "
        "NCCL_P2P_DISABLE=1 (busbw 8.4 GB/s): PCIe P2P between them is blocked (IOMMU translation or ACS redirect)"
    )
    assert result.remedy == remedies.NCCL_PAIR_P2P_BLOCKED
    assert "--tags pcie_p2p" in result.remedy and "iommu=pt" in result.remedy and "ACS redirect" in result.remedy


def test_a_hang_both_ways_fails_naming_the_pair_and_how_long_each_was_waited_for() -> None:
    both = nccl_pairs.PairOutcome(
        (0, 4), run(True, finished=False, hung=True, problem=HUNG), run(False, finished=False, hung=True, problem=HUNG)
    )
    result = nccl_pairs.judge_pairs([both])
    assert result.status is Status.FAIL and result.remedy == remedies.NCCL_PAIR_BROKEN
    assert result.summary.startswith("GPU 0-4: NCCL all-reduce hung with P2P: the watchdog killed it after 55 s")
    assert "and hung with NCCL_P2P_DISABLE=1: the watchdog killed it after 55 s" in result.summary


def test_p2p_working_while_the_shared_memory_fallback_fails_warns() -> None:
    fallback = nccl_pairs.PairOutcome(
        (0, 4), run(True), run(False, finished=False, problem="rank 1: exited 1: NCCL error")
    )
    result = nccl_pairs.judge_pairs([fallback])
    assert result.status is Status.WARN and result.remedy == remedies.NCCL_PAIR_NO_FALLBACK
    assert result.summary.endswith("but failed with NCCL_P2P_DISABLE=1: rank 1: exited 1: NCCL error")


def test_a_geforce_pair_runs_without_p2p_only_and_passes_as_expected() -> None:
    result = nccl_pairs.judge_pairs(
        [nccl_pairs.PairOutcome((0, 1), None, dataclasses.replace(run(False), gpus=(0, 1)))]
    )
    assert result.status is Status.PASS
    assert result.summary == (
        "GPU 0-1: P2P not available on GeForce with the stock driver: expected, P2P features off; NCCL all-reduce "
        "finished with NCCL_P2P_DISABLE=1 (busbw 8.4 GB/s)"
    )


def test_pairs_the_budget_left_out_warn_and_the_worst_pair_leads() -> None:
    good = nccl_pairs.PairOutcome(
        (0, 1), dataclasses.replace(run(True), gpus=(0, 1)), dataclasses.replace(run(False), gpus=(0, 1))
    )
    bad = nccl_pairs.PairOutcome((0, 4), run(True, finished=False, hung=True, problem=HUNG), run(False))
    result = nccl_pairs.judge_pairs([good, bad], not_run=[(6, 7)])
    assert result.status is Status.FAIL and result.summary.startswith("GPU 0-4: NCCL all-reduce hung with P2P")
    assert "not run: GPU 6-7" in result.details
    assert result.data["not_run"] == [[6, 7]]
    warned = nccl_pairs.judge_pairs([good], not_run=[(6, 7)])
    assert warned.status is Status.WARN and warned.remedy == remedies.NCCL_PAIRS_BUDGET
    assert warned.summary == "1 pair(s) not run, the check's 900 s would pass first: GPU 6-7"


def test_a_pair_run_answer_is_read_strictly() -> None:
    good = run(True).to_json()
    assert PairRun.from_json(json.loads(json.dumps(good))) == run(True)
    cases: list[tuple[dict[str, object], str]] = [
        ({"gpus": [0, 0]}, "nccl_pair: gpus: expected two different GPU indices, got [0, 0]"),
        ({"gpus": [0, 1, 2]}, "nccl_pair: gpus: expected two different GPU indices"),
        ({"seconds": -1}, "nccl_pair: seconds: expected seconds >= 0"),
        ({"finished": True, "hung": True}, "nccl_pair: hung: a run cannot both finish and hang"),
        ({"busbw_gbps": "21"}, "nccl_pair: busbw_gbps: expected a number"),
        ({"hung": None}, "nccl_pair: hung: expected true or false"),
    ]
    for change, named in cases:
        with pytest.raises(PayloadError) as raised:
            PairRun.from_json(good | change)
        assert str(raised.value).startswith(named), str(raised.value)
    with pytest.raises(PayloadError, match=r"answered for \[0, 4\] p2p=True, asked \[0, 1\]"):
        nccl_pairs.run_outcome((0, 1), True, ChildOutcome(ok=True, data=good))


# ---- nccl_pairs: the watchdog, with real child processes ----------------------------------------------------------

LIMIT_S = 12.0  # the doctor's watchdog per run in these tests; the probe's own fires 5 s before it


@pytest.fixture
def stand_ins_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))


@pytest.mark.usefixtures("stand_ins_importable")
def test_ranks_that_hang_with_p2p_only_end_in_a_fail_naming_the_pair_iommu_acs_and_how_long() -> None:
    """The whole path: the real nccl_pair probe in a child, its launcher, two stand-in ranks that hang unless
    NCCL_P2P_DISABLE=1 reaches them; every process gone when each run returns."""
    target = "comm_pair_stand_ins:hangs_with_p2p"
    on = nccl_pairs.run_pair_child((0, 1), True, limit=LIMIT_S, target=target)
    off = nccl_pairs.run_pair_child((0, 1), False, limit=LIMIT_S, target=target)
    assert on.hung and not on.finished and "in first allreduce" in on.problem
    assert off.finished and off.busbw_gbps == 8.4 and off.nccl == "2.28.9"  # the slower rank's busbw
    result = nccl_pairs.judge_pairs([nccl_pairs.PairOutcome((0, 1), on, off)])
    assert result.status is Status.FAIL and result.remedy == remedies.NCCL_PAIR_P2P_BLOCKED
    assert result.summary.startswith("GPU 0-1: NCCL all-reduce hung with P2P: the watchdog killed it after ")
    assert result.summary.endswith("PCIe P2P between them is blocked (IOMMU translation or ACS redirect)")
    assert "--- rank 0 (first allreduce)" in result.details  # each hung rank's phase and log tail


@pytest.mark.usefixtures("stand_ins_importable")
def test_ranks_that_exit_non_zero_are_a_failed_run_not_a_hang() -> None:
    failed = nccl_pair.run_pair((0, 1), True, timeout=30, target="comm_pair_stand_ins:exits_non_zero")
    assert not failed.finished and not failed.hung
    assert failed.problem.startswith("rank 0: exited 3 in phase 'init_process_group'")
    both = nccl_pairs.judge_pairs([nccl_pairs.PairOutcome((0, 1), failed, dataclasses.replace(failed, p2p=False))])
    assert both.status is Status.FAIL and both.remedy == remedies.NCCL_PAIR_BROKEN
    assert both.summary.startswith("GPU 0-1: NCCL all-reduce failed with P2P: rank 0: exited 3")


@pytest.mark.usefixtures("stand_ins_importable")
def test_a_probe_that_hangs_before_printing_is_killed_by_the_doctors_watchdog_and_named() -> None:
    hung = nccl_pairs.run_pair_child((2, 3), True, limit=3.0, module="comm_pair_stand_ins")
    assert hung.hung and not hung.finished and hung.gpus == (2, 3)
    assert hung.problem.startswith("the probe timed out after ") and "killed with its process group" in hung.problem
    verdict = nccl_pairs.judge_pair(nccl_pairs.PairOutcome((2, 3), hung, dataclasses.replace(hung, p2p=False)))
    assert verdict.status is Status.FAIL and verdict.summary.startswith("GPU 2-3: NCCL all-reduce hung with P2P")


@pytest.mark.usefixtures("stand_ins_importable")
def test_every_process_of_a_run_keeps_multicast_off() -> None:
    """The stand-in rank refuses to answer unless NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
    NVSHMEM_DISABLE_NVLS=1 reached it, with P2P and without."""
    for p2p in (True, False):
        done = nccl_pairs.run_pair_child((0, 1), p2p, limit=30.0, target="comm_pair_stand_ins:finishes")
        assert done.finished, done.problem
    assert nccl_pair.pair_env(False)["NCCL_P2P_DISABLE"] == "1" and "NCCL_P2P_DISABLE" not in nccl_pair.pair_env(True)


# ---- the catalogue -------------------------------------------------------------------------------------------------


def test_the_pair_checks_are_level_3_in_the_catalogue_after_the_peer_copies() -> None:
    checks = {c.id: c for c in all_checks()}
    assert checks["gpu_peer_stress"].family == "comm" and checks["gpu_peer_stress"].level == 3
    assert checks["nccl_pairs"].family == "pcie_p2p" and checks["nccl_pairs"].level == 3
    assert checks["nccl_pairs"].requires == ("driver", "torch")
    ids = [c.id for c in all_checks()]
    assert ids.index("gpu_peer_bandwidth") < ids.index("gpu_peer_stress") < ids.index("nccl_allreduce")

"""The level-3 checks' verdicts: prerequisites, the FlashInfer gate before any launch, hangs, JIT timeouts, NCCL
correctness at 512 KiB and more and the PCIe bus-bandwidth floor. Judges read whole typed answers (comm_answers)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from comm_answers import (
    ACS_REDIRECT,
    KIB,
    MIB,
    fabric,
    fusion_answer,
    fusion_failed,
    launched,
    nccl_answer,
    nccl_hang,
    nccl_rank,
    nvml_pair,
    pcie,
    symm_answer,
    symm_rank,
    topology_evidence,
)

from sm120check.doctor import facts, probecheck, remedies
from sm120check.doctor.child import ChildOutcome
from sm120check.doctor.comm import collectives as comm
from sm120check.doctor.comm.nccl_payload import NcclRank
from sm120check.doctor.comm.topology_payload import CommandText
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.nvml_api import Gpu, NvmlInfo
from sm120check.doctor.pcie import node
from sm120check.doctor.pcie.lspci import AcsState
from sm120check.jitcache.flashinfer_release import fusion_support


def gpu(index: int, name: str = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", cc: str = "12.0") -> Gpu:
    major, minor = (int(part) for part in cc.split("."))
    return Gpu(index, name, (major, minor), None, f"00000000:{index + 1:02x}:00.0")


def context(rows: Sequence[Gpu], torch: Status = Status.PASS, **kw: Any) -> Context:
    """The node's facts with these GPUs as NVML listed them (read now: after the test's monkeypatches)."""
    nvml = facts.NvmlFacts(NvmlInfo("580.95.05", 13000, tuple(rows), "ctypes"))
    results = {"driver": Result("driver", Status.PASS, "driver ok"), "torch": Result("torch", torch, "torch ok")}
    return Context(facts=replace(facts.local(), nvml_read=nvml), results=results, **kw)


def no_probe(*args: Any, **kwargs: Any) -> ChildOutcome:
    raise AssertionError("no child process may start for this verdict")


def test_checks_skip_when_the_driver_check_did_not_run() -> None:
    result = comm.NcclAllreduce().run(Context())
    assert result.status is Status.SKIP and "`driver` did not run" in result.summary


def test_checks_skip_when_torch_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(comm, "run_probe", no_probe)
    monkeypatch.setattr(probecheck, "run_probe", no_probe)
    result = comm.SymmMem().run(context([gpu(0), gpu(1)], torch=Status.FAIL))
    assert result.status is Status.SKIP and "torch" in result.summary


def test_one_gpu_is_a_skip_not_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(comm, "run_probe", no_probe)
    monkeypatch.setattr(probecheck, "run_probe", no_probe)
    result = comm.NcclAllreduce().run(context([gpu(0)]))
    assert result.status is Status.SKIP and "at least 2 GPUs" in result.summary


def test_gpus_option_naming_a_missing_gpu_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(comm, "run_probe", no_probe)
    monkeypatch.setattr(probecheck, "run_probe", no_probe)
    result = comm.NcclAllreduce().run(context([gpu(0), gpu(1)], gpus=(0, 5)))
    assert result.status is Status.SKIP and "[5]" in result.summary


def test_sm120_node_with_flashinfer_0_6_12_fails_before_launching(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(comm, "run_probe", no_probe)
    monkeypatch.setattr(probecheck, "run_probe", no_probe)
    monkeypatch.setattr(metadata, "version", lambda name: "0.6.12")
    result = comm.AllreduceFusion().run(context([gpu(0), gpu(1)]))
    assert result.status is Status.FAIL
    assert "no SM120 allreduce-fusion kernels" in result.summary
    assert result.remedy == "pip install 'flashinfer-python>=0.6.17'"


def test_fusion_without_flashinfer_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    result = comm.AllreduceFusion().run(context([gpu(0), gpu(1)]))
    assert result.status is Status.SKIP and "python_stack" in result.remedy


def test_a_cold_jit_cache_gets_the_long_timeout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, float] = {}

    def probe(module: str, args: Sequence[str], *, timeout: float, env: Any = None, python: Any = None) -> ChildOutcome:
        seen["timeout"] = timeout
        return ChildOutcome(ok=True, data=fusion_failed("stop here").to_json())

    monkeypatch.setattr(comm, "run_probe", probe)
    monkeypatch.setattr(probecheck, "run_probe", probe)
    monkeypatch.setattr(metadata, "version", lambda name: "0.7.2")
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path))
    monkeypatch.setenv(comm.JIT_TIMEOUT_ENV, "700")
    comm.AllreduceFusion().run(context([gpu(0, "NVIDIA H200", "9.0"), gpu(1, "NVIDIA H200", "9.0")], timeout=120))
    assert seen["timeout"] == 700
    # A library file alone is not warm (ninja decides: tests/jitcache/test_jitcache_fusion_prediction.py).
    library = tmp_path / ".cache/flashinfer/0.7.2/90a/cached_ops/trtllm_comm/trtllm_comm.so"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")
    comm.AllreduceFusion().run(context([gpu(0, "NVIDIA H200", "9.0"), gpu(1, "NVIDIA H200", "9.0")], timeout=120))
    assert seen["timeout"] == 700
    monkeypatch.setattr(comm, "predicted_cached", lambda *args, **kw: True)
    comm.AllreduceFusion().run(context([gpu(0, "NVIDIA H200", "9.0"), gpu(1, "NVIDIA H200", "9.0")], timeout=120))
    assert seen["timeout"] == 120


def test_nccl_hang_that_passes_without_p2p_blames_p2p(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    def probe(module: str, args: Sequence[str], *, timeout: float, env: Any = None, python: Any = None) -> ChildOutcome:
        calls.append({"args": list(args), "env": env})
        if "NCCL_P2P_DISABLE" not in env:
            return ChildOutcome(ok=True, data=nccl_hang("ranks hung for 115 s").to_json())
        return ChildOutcome(ok=True, data=nccl_answer().to_json())

    monkeypatch.setattr(comm, "run_probe", probe)
    monkeypatch.setattr(probecheck, "run_probe", probe)
    result = comm.NcclAllreduce().run(context([gpu(0), gpu(1)]))
    assert result.status is Status.FAIL
    assert "completes with NCCL_P2P_DISABLE=1" in result.summary
    assert "iommu=pt" in result.remedy
    assert calls[1]["env"]["NCCL_P2P_DISABLE"] == "1" and "--correctness-only" in calls[1]["args"]


def test_nccl_pass_reports_latency_and_busbw() -> None:
    answer = nccl_answer(
        nccl_rank(0, busbw=310.4, latency=(51.0, 52.5, 55.0)), nccl_rank(1, busbw=312.0, latency=(50.0, 52.0, 54.0))
    )
    result = comm.judge_nccl(answer, 2)
    assert result.status is Status.PASS
    assert "1/3/8 x 7168 bf16: 51/52/55 us" in result.summary and "310 GB/s" in result.summary
    assert {k: result.data[k] for k in ("nccl", "busbw_gbps", "world_size")} == {
        "nccl": "2.28.9",
        "busbw_gbps": 310.4,
        "world_size": 2,
    }
    assert result.data["latency_us"] == {"1": 51.0, "3": 52.5, "8": 55.0}
    json.dumps(result.data)  # the JSON report carries it as it is


def test_nccl_reports_exact_results_per_size_from_512_kib_to_the_bandwidth_buffer() -> None:
    result = comm.judge_nccl(nccl_answer(), 2)
    assert result.status is Status.PASS
    assert result.data["sizes"] == [
        {"bytes": n, "correct": True, "mismatches": 0} for n in (112 * KIB, 512 * KIB, MIB, 4 * MIB, 64 * MIB)
    ]
    assert "exact at 112 KiB, 512 KiB, 1 MiB, 4 MiB, 64 MiB" in result.details


def test_nccl_wrong_at_512_kib_fails_naming_the_size_the_version_and_the_floor() -> None:
    answer = nccl_answer(nccl_rank(0, "2.26.2", wrong={512 * KIB: 7}), nccl_rank(1, "2.26.2", wrong={512 * KIB: 5}))
    result = comm.judge_nccl(answer, 2)
    assert result.status is Status.FAIL
    assert result.summary == "NCCL 2.26.2 allreduce returned 12 wrong element(s) at 512 KiB"
    assert ">= 2.27.3" in result.remedy and "--tags nccl" in result.remedy
    assert "known-bad" in result.details  # sm120kit's NCCL table says why
    assert {"bytes": 512 * KIB, "correct": False, "mismatches": 12} in result.data["sizes"]  # type: ignore[operator]


def test_nccl_fault_at_a_size_fails_naming_the_size_and_the_version() -> None:
    """An illegal memory access raises in the rank: it reports the sizes that passed and where it failed."""
    partial = NcclRank(nccl_rank(0).head, "2.26.2", sizes=nccl_rank(0).sizes[:1], failed_bytes=512 * KIB)
    error = "allreduce of 512 KiB: RuntimeError: CUDA error: an illegal memory access was encountered"
    problem = f"rank 0: {error}"
    answer = nccl_answer(
        replace(partial, head=replace(partial.head, error=error)), NcclRank(), launch=launched(False, problem=problem)
    )
    result = comm.judge_nccl(answer, 2)
    assert result.status is Status.FAIL
    assert result.summary.startswith("NCCL 2.26.2 allreduce failed at 512 KiB: rank 0: allreduce of 512 KiB")
    assert ">= 2.27.3" in result.remedy


def test_nccl_over_pcie_below_the_busbw_floor_warns_with_the_figure() -> None:
    answer = nccl_answer(nccl_rank(0, busbw=11.2), nccl_rank(1, busbw=11.9), links=pcie())
    result = comm.judge_nccl(answer, 2)
    assert result.status is Status.WARN
    assert "busbw 11.2 GB/s at 64 MiB over PCIe is below the 15 GB/s floor" in result.summary
    assert result.remedy == remedies.COMM_PCIE_BUSBW
    assert result.data["busbw_gbps"] == 11.2 and result.data["busbw_floor_gbps"] == 15.0


def test_nccl_over_pcie_above_the_floor_and_over_nvlink_below_it_pass() -> None:
    assert comm.judge_nccl(nccl_answer(nccl_rank(0, busbw=24.0), nccl_rank(1), links=pcie()), 2).status is Status.PASS
    assert comm.judge_nccl(nccl_answer(nccl_rank(0, busbw=11.2), nccl_rank(1)), 2).status is Status.PASS


def test_nccl_with_the_link_unknown_applies_no_floor_and_says_so() -> None:
    answer = replace(nccl_answer(nccl_rank(0, busbw=11.2), nccl_rank(1)), links=(), links_error="nvidia-smi: exit 9")
    result = comm.judge_nccl(answer, 2)
    assert result.status is Status.PASS and "no bus-bandwidth floor applied" in result.details


def test_symm_mem_without_p2p_names_the_cause() -> None:
    problem = "rank 0: RuntimeError: CUDA error: invalid device ordinal"
    result = comm.judge_symm_mem(symm_answer(launch=launched(False, problem=problem)))
    assert result.status is Status.FAIL and "no P2P" in result.summary


def test_symm_mem_reports_that_multicast_was_not_allowed() -> None:
    result = comm.judge_symm_mem(symm_answer(symm_rank(0, tokens=("1",)), symm_rank(1, tokens=("1",))))
    assert result.status is Status.PASS
    assert "one_shot 17 us, two_shot 12 us, nccl 51 us" in result.summary
    assert "TORCH_SYMM_MEM_DISABLE_MULTICAST" in result.details
    result = comm.judge_symm_mem(symm_answer())
    assert "one_shot 17/21/33 us, two_shot 12/30/25 us, nccl 51/36/60 us" in result.summary
    assert result.data == {
        "latency_us": {
            "nccl": {"1": 51.0, "3": 36.0, "8": 60.0},
            "one_shot": {"1": 17.0, "3": 21.0, "8": 33.0},
            "two_shot": {"1": 12.0, "3": 30.0, "8": 25.0},
        },
        "multicast": False,
        "multicast_ptr": [0, 0],
    }


def test_symm_mem_wrong_on_one_rank_fails_for_that_path() -> None:
    result = comm.judge_symm_mem(symm_answer(symm_rank(0), symm_rank(1, two_shot_ok=False)))
    assert result.status is Status.FAIL and result.summary == "symmetric-memory allreduce wrong for two_shot"


def test_symm_mem_with_multicast_runs_multimem() -> None:
    result = comm.judge_symm_mem(symm_answer(symm_rank(0, multimem=True), symm_rank(1, multimem=True)))
    assert result.status is Status.PASS and "multimem 9/9/9 us" in result.summary
    assert result.data["multicast"] is True


def test_fusion_compiled_cold_warns_with_the_warming_command() -> None:
    result = comm.judge_fusion(fusion_answer(cached=False), fusion_support("0.7.2", ["9.0"], multicast=False), 900)
    assert result.status is Status.WARN
    assert "trtllm_comm 290 s" in result.summary and remedies.FLASHINFER_JIT in result.remedy


def test_fusion_from_cache_passes_with_fused_beside_unfused() -> None:
    result = comm.judge_fusion(fusion_answer(cached=True), fusion_support("0.7.2", ["9.0"], multicast=False), 120)
    assert result.status is Status.PASS
    assert "fused 35/36/38 us vs unfused 167/170/178 us" in result.summary
    assert "backend trtllm" in result.summary and "JIT targets 90a" in result.details
    assert "PcieIpcAllReduceWorkspace (pcie_2gpu): correct, 40/40/40 us" in result.details
    assert sorted(result.data) == [
        "backend",
        "cold_build",
        "jit",
        "latency_us",
        "max_rel_err",
        "pcie_ipc",
        "targets",
        "workspace",
    ]
    json.dumps(result.data)


def test_fusion_result_far_from_the_reference_fails() -> None:
    gate = fusion_support("0.7.2", ["9.0"], multicast=False)
    result = comm.judge_fusion(fusion_answer(cached=True, err=0.3), gate, 120)
    assert result.status is Status.FAIL and "differs from the torch reference" in result.summary


def test_fusion_arch_gate_error_from_flashinfer_gets_the_remedy() -> None:
    answer = fusion_failed("rank 0: RuntimeError: No supported CUDA architectures found for major versions [9, 10].")
    gate = fusion_support("0.6.12", ["12.0"], multicast=False)
    result = comm.judge_fusion(answer, gate, 900)
    assert result.status is Status.FAIL and "flashinfer-python>=0.6.17" in result.remedy


def test_fusion_timeout_in_the_jit_build_points_at_warming() -> None:
    answer = fusion_failed("ranks hung for 895 s (in jit build, init_process_group) and were killed", timed_out=True)
    result = comm.judge_fusion(answer, fusion_support("0.7.2", ["12.0"], multicast=False), 900)
    assert "JIT build did not finish within 900 s" in result.summary and comm.JIT_TIMEOUT_ENV in result.remedy


def test_fusion_hang_after_the_build_keeps_rank_0s_jit_report() -> None:
    answer = fusion_failed("ranks hung for 115 s (in create workspace) and were killed", timed_out=True, jit=True)
    result = comm.judge_fusion(answer, fusion_support("0.7.2", ["9.0"], multicast=False), 120)
    assert result.summary.startswith("allreduce fusion hung") and result.remedy == comm.P2P_REMEDY
    assert result.data["cold_build"] is True and result.data["jit"]["modules"][0]["name"] == "trtllm_comm"  # type: ignore[index]


def test_geforce_pair_warns_that_p2p_is_disabled_by_the_driver() -> None:
    evidence = topology_evidence("topo_m_2x5090_phb.txt", "topo_p2p_rw_2x5090_gns.txt")
    denied = fabric(bridges={"0000:00:01.1": AcsState("0000:00:01.1", readable=False)})  # lspci without root
    gpus = [gpu(0, "NVIDIA GeForce RTX 5090"), gpu(1, "NVIDIA GeForce RTX 5090")]
    result = comm.judge_topology(evidence, gpus, denied)
    assert result.status is Status.WARN
    assert "P2P disabled by the driver on NVIDIA GeForce RTX 5090" in result.summary
    assert result.data["pairs"] == [{"pair": [0, 1], "link": "PHB", "kind": "pcie", "p2p": "GNS"}]


def test_translating_iommu_on_a_pcie_box_warns_with_iommu_pt() -> None:
    evidence = topology_evidence(
        "topo_m_5gpu_node_phb.txt",
        "topo_p2p_p_5gpu_ok.txt",
        gpus=(0, 1, 2, 3, 4),
    )
    translating = fabric((0, 1, 2, 3, 4), cmdline="BOOT_IMAGE=/vmlinuz ro amd_iommu=on")
    result = comm.judge_topology(evidence, [gpu(i) for i in range(5)], translating)
    assert result.status is Status.WARN and "IOMMU translates DMA" in result.summary
    assert "iommu=pt" in result.remedy


def test_nvlink_node_with_p2p_passes() -> None:
    evidence = topology_evidence(
        "topo_m_8xh100_nv18.txt",
        pairs=(nvml_pair(0, 1, ancestor="NV"),),
    )
    no_lspci = fabric(cmdline="BOOT_IMAGE=/vmlinuz ro intel_iommu=on", lspci_error="lspci not found (install pciutils)")
    result = comm.judge_topology(
        evidence, [gpu(0, "NVIDIA H100 80GB HBM3", "9.0"), gpu(1, "NVIDIA H100 80GB HBM3", "9.0")], no_lspci
    )
    assert result.status is Status.PASS
    assert result.summary == "2 GPUs over NVLink, P2P OK on 1/1 pairs"


def test_acs_redirect_behind_a_pcie_switch_warns() -> None:
    evidence = topology_evidence("topo_m_8xh100_nv18.txt", pairs=(nvml_pair(0, 1),))
    evidence = replace(evidence, topo_m=CommandText(True, text="\tGPU0\tGPU1\nGPU0\t X \tPXB\nGPU1\tPXB\t X \n"))
    result = comm.judge_topology(evidence, [gpu(0), gpu(1)], fabric(bridges={ACS_REDIRECT.bdf: ACS_REDIRECT}))
    # The bridge as the facts step names it (its sysfs BDF), where lspci -vvv printed 00:01.1 before.
    assert result.status is Status.WARN and "ACS redirects peer traffic on 0000:00:01.1" in result.summary
    assert result.data["acs_redirect_ports"] == ["0000:00:01.1"]


def test_acs_is_judged_on_the_bridges_above_the_selected_gpus_only() -> None:
    evidence = topology_evidence("topo_m_8xh100_nv18.txt", pairs=(nvml_pair(0, 1),))
    evidence = replace(evidence, topo_m=CommandText(True, text="\tGPU0\tGPU1\nGPU0\t X \tPXB\nGPU1\tPXB\t X \n"))
    clean = [
        AcsState(bdf, "PCI bridge: root port", True, "SrcValid+", "SrcValid+ ReqRedir- CmpltRedir-")
        for bdf in ("0000:00:03.0", "0000:00:05.0")
    ]
    # GPUs 0 and 2 under the clean ports, GPU 1 (not selected) under the redirecting one.
    bridges = {clean[0].bdf: clean[0], ACS_REDIRECT.bdf: ACS_REDIRECT, clean[1].bdf: clean[1]}
    result = comm.judge_topology(evidence, [gpu(0), gpu(2)], fabric((0, 1, 2), bridges=bridges))
    assert result.data["acs_redirect_ports"] == [] and "ACS: 0 port(s) redirect peer requests" in result.details


def test_an_unreadable_fabric_is_said_not_a_crash() -> None:
    evidence = topology_evidence("topo_m_2x5090_phb.txt", pairs=(nvml_pair(0, 1),))
    failed = facts.read_pcie(lambda: (_ for _ in ()).throw(OSError(5, "Input/output error")))
    result = comm.judge_topology(evidence, [gpu(0), gpu(1)], failed)
    assert result.status is Status.PASS and result.summary == "2 GPUs over PCIe, P2P OK on 1/1 pairs"
    assert "IOMMU: unknown (kernel command line unreadable: the PCIe fabric read failed: OSError" in result.details
    assert "ACS: the PCI bus is not readable (the PCIe fabric read failed: OSError" in result.details
    assert result.data["iommu"] == "unknown" and result.data["acs_redirect_ports"] == []


def test_the_topology_check_judges_the_runs_pcie_facts_and_reads_no_fabric_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_read(*args: Any, **kwargs: Any) -> node.PcieFacts:
        raise AssertionError("the fabric is read once, by the facts step")

    monkeypatch.setattr(node, "read", no_read)
    evidence = topology_evidence("topo_m_5gpu_node_phb.txt", "topo_p2p_p_5gpu_ok.txt", gpus=(0, 1))
    monkeypatch.setattr(probecheck, "run_probe", answers_from(evidence.to_json()))
    ctx = context([gpu(0), gpu(1)])
    ctx.facts = replace(ctx.facts, pcie_read=fabric(cmdline="BOOT_IMAGE=/vmlinuz ro amd_iommu=on"))
    result = comm.Topology().run(ctx)
    assert result.status is Status.WARN and "IOMMU translates DMA" in result.summary


def answers_from(data: dict[str, object]) -> Any:
    def probe(module: str, args: Sequence[str], *, timeout: float, env: Any = None, python: Any = None) -> ChildOutcome:
        return ChildOutcome(ok=True, data=data)

    return probe


def broken(answer: dict[str, object], path: Sequence[str | int], value: object) -> dict[str, object]:
    """The answer with one field at `path` replaced (JSON copy: the original is kept)."""
    copy = json.loads(json.dumps(answer))
    node = copy
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return dict(copy)


@pytest.mark.parametrize(
    ("check", "answer", "path", "value", "field"),
    [
        (comm.Topology, topology_evidence("topo_m_8xh100_nv18.txt").to_json(), ["topo_m", "text"], 7, "topo_m.text"),
        (
            comm.NcclAllreduce,
            nccl_answer().to_json(),
            ["ranks", 1, "sizes", 2, "mismatches"],
            "0",
            "ranks[1].sizes[2].mismatches",
        ),
        (comm.NcclAllreduce, nccl_answer().to_json(), ["busbw_gbps"], "fast", "busbw_gbps"),
        (
            comm.SymmMem,
            symm_answer().to_json(),
            ["ranks", 0, "sizes", "3", "one_shot_correct"],
            None,
            "ranks[0].sizes.3.one_shot_correct",
        ),
        (comm.SymmMem, symm_answer().to_json(), ["correct"], [True], "correct"),
        (
            comm.AllreduceFusion,
            fusion_answer().to_json(),
            ["jit", "modules", 0, "seconds"],
            "290",
            "jit.modules[0].seconds",
        ),
        (comm.AllreduceFusion, fusion_answer().to_json(), ["latency_us", "fused", "8"], None, "latency_us.fused.8"),
    ],
)
def test_a_malformed_probe_answer_is_a_fail_naming_the_field(
    monkeypatch: pytest.MonkeyPatch,
    check: Any,
    answer: dict[str, object],
    path: list[str | int],
    value: object,
    field: str,
) -> None:
    monkeypatch.setattr(comm, "run_probe", answers_from(broken(answer, path, value)))
    monkeypatch.setattr(probecheck, "run_probe", answers_from(broken(answer, path, value)))
    monkeypatch.setattr(metadata, "version", lambda name: "0.7.2")
    monkeypatch.setattr(comm, "predicted_cached", lambda *args, **kw: True)
    result = check().run(context([gpu(0, "NVIDIA H200", "9.0"), gpu(1, "NVIDIA H200", "9.0")]))
    assert result.status is Status.FAIL
    assert "printed a malformed answer" in result.summary and f": {field}: " in result.summary, result.summary
    assert "sm120check.doctor.comm." in result.remedy

"""The level-3 checks' verdicts: prerequisites, the FlashInfer gate before any launch, hangs, JIT timeouts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sm120check.comm.flashinfer_release import fusion_gate
from sm120check.doctor import facts, remedies
from sm120check.doctor.checks import comm
from sm120check.doctor.child import ChildOutcome
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.nvml_api import Gpu, NvmlInfo

FIXTURES = Path(__file__).parents[2] / "fixtures" / "comm"


def gpu(index: int, name: str = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", cc: str = "12.0") -> Gpu:
    major, minor = (int(part) for part in cc.split("."))
    return Gpu(index, name, (major, minor), None, f"00000000:{index + 1:02x}:00.0")


def context(rows: Sequence[Gpu], torch: Status = Status.PASS, **kw: Any) -> Context:
    """The node's facts with these GPUs as NVML listed them (read now: after the test's monkeypatches)."""
    nvml = facts.NvmlFacts(NvmlInfo("580.95.05", 13000, tuple(rows), "ctypes"))
    ctx = Context(facts=replace(facts.local(), nvml_read=nvml), **kw)
    ctx.results["driver"] = Result("driver", Status.PASS, "driver ok")
    ctx.results["torch"] = Result("torch", torch, "torch ok")
    return ctx


def no_probe(*args: Any, **kwargs: Any) -> ChildOutcome:
    raise AssertionError("no child process may start for this verdict")


def test_checks_skip_when_the_driver_check_did_not_run() -> None:
    result = comm.NcclAllreduce().run(Context())
    assert result.status is Status.SKIP and "`driver` did not run" in result.summary


def test_checks_skip_when_torch_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(comm, "run_probe", no_probe)
    result = comm.SymmMem().run(context([gpu(0), gpu(1)], torch=Status.FAIL))
    assert result.status is Status.SKIP and "torch" in result.summary


def test_one_gpu_is_a_skip_not_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(comm, "run_probe", no_probe)
    result = comm.NcclAllreduce().run(context([gpu(0)]))
    assert result.status is Status.SKIP and "at least 2 GPUs" in result.summary


def test_gpus_option_naming_a_missing_gpu_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(comm, "run_probe", no_probe)
    result = comm.NcclAllreduce().run(context([gpu(0), gpu(1)], gpus=(0, 5)))
    assert result.status is Status.SKIP and "[5]" in result.summary


def test_sm120_node_with_flashinfer_0_6_12_fails_before_launching(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(comm, "run_probe", no_probe)
    monkeypatch.setattr(facts.metadata, "version", lambda name: "0.6.12")
    result = comm.AllreduceFusion().run(context([gpu(0), gpu(1)]))
    assert result.status is Status.FAIL
    assert "no SM120 allreduce-fusion kernels" in result.summary
    assert result.remedy == "pip install 'flashinfer-python>=0.6.17'"


def test_fusion_without_flashinfer_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise facts.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(facts.metadata, "version", missing)
    result = comm.AllreduceFusion().run(context([gpu(0), gpu(1)]))
    assert result.status is Status.SKIP and "python_stack" in result.remedy


def test_a_cold_jit_cache_gets_the_long_timeout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, float] = {}

    def probe(module: str, args: Sequence[str], *, timeout: float, env: Any = None, python: Any = None) -> ChildOutcome:
        seen["timeout"] = timeout
        return ChildOutcome(ok=True, data={"ok": False, "problem": "stop here"})

    monkeypatch.setattr(comm, "run_probe", probe)
    monkeypatch.setattr(facts.metadata, "version", lambda name: "0.7.2")
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
            return ChildOutcome(ok=True, data={"ok": False, "timed_out": True, "problem": "ranks hung for 115 s"})
        return ChildOutcome(ok=True, data={"ok": True, "correct": True})

    monkeypatch.setattr(comm, "run_probe", probe)
    result = comm.NcclAllreduce().run(context([gpu(0), gpu(1)]))
    assert result.status is Status.FAIL
    assert "completes with NCCL_P2P_DISABLE=1" in result.summary
    assert "iommu=pt" in result.remedy
    assert calls[1]["env"]["NCCL_P2P_DISABLE"] == "1" and "--correctness-only" in calls[1]["args"]


def test_nccl_pass_reports_latency_and_busbw() -> None:
    data = {
        "ok": True,
        "correct": True,
        "latency_us": {"1": 51.0, "3": 52.5, "8": 55.0},
        "busbw_gbps": 310.4,
        "ranks": [{"nccl": "2.28.9"}, {"nccl": "2.28.9"}],
    }
    result = comm.judge_nccl(data, 2)
    assert result.status is Status.PASS
    assert "1/3/8 x 7168 bf16: 51/52/55 us" in result.summary and "310 GB/s" in result.summary


def test_symm_mem_without_p2p_names_the_cause() -> None:
    result = comm.judge_symm_mem({"ok": False, "problem": "rank 0: RuntimeError: CUDA error: invalid device ordinal"})
    assert result.status is Status.FAIL and "no P2P" in result.summary


def test_symm_mem_reports_that_multicast_was_not_allowed() -> None:
    data = {
        "ok": True,
        "multicast_ptr": [0, 0],
        "multimem_allowed": False,
        "correct": {"one_shot": True, "two_shot": True, "nccl_matches_reference": True},
        "latency_us": {"one_shot": {"1": 17.0}, "two_shot": {"1": 12.0}, "nccl": {"1": 51.0}},
    }
    result = comm.judge_symm_mem(data)
    assert result.status is Status.PASS
    assert "one_shot 17 us, two_shot 12 us, nccl 51 us" in result.summary
    assert "TORCH_SYMM_MEM_DISABLE_MULTICAST" in result.details


def fusion_data(cached: bool, err: float = 3e-6) -> dict[str, Any]:
    return {
        "ok": True,
        "flashinfer": "0.7.2",
        "backend": "trtllm",
        "workspace": "TRTLLMAllReduceFusionWorkspace",
        "max_rel_err": {"1": err, "3": err, "8": err},
        "latency_us": {"fused": {"1": 35.0, "3": 36.0, "8": 38.0}, "unfused": {"1": 167.0, "3": 170.0, "8": 178.0}},
        "jit": {
            "modules": [
                {"name": "trtllm_comm", "cached_before": cached, "built": not cached, "seconds": 0 if cached else 290}
            ],
            "environment": {"targets": ["90a"], "arch_list_env": ""},
        },
    }


def test_fusion_compiled_cold_warns_with_the_warming_command() -> None:
    result = comm.judge_fusion(fusion_data(cached=False), fusion_gate("0.7.2", ["9.0"], multicast=False), 900)
    assert result.status is Status.WARN
    assert "trtllm_comm 290 s" in result.summary and remedies.FLASHINFER_JIT in result.remedy


def test_fusion_from_cache_passes_with_fused_beside_unfused() -> None:
    result = comm.judge_fusion(fusion_data(cached=True), fusion_gate("0.7.2", ["9.0"], multicast=False), 120)
    assert result.status is Status.PASS
    assert "fused 35/36/38 us vs unfused 167/170/178 us" in result.summary
    assert "backend trtllm" in result.summary and "JIT targets 90a" in result.details


def test_fusion_result_far_from_the_reference_fails() -> None:
    result = comm.judge_fusion(fusion_data(cached=True, err=0.3), fusion_gate("0.7.2", ["9.0"], multicast=False), 120)
    assert result.status is Status.FAIL and "differs from the torch reference" in result.summary


def test_fusion_arch_gate_error_from_flashinfer_gets_the_remedy() -> None:
    data = {
        "ok": False,
        "problem": "rank 0: RuntimeError: No supported CUDA architectures found for major versions [9, 10].",
    }
    gate = fusion_gate("0.6.12", ["12.0"], multicast=False)
    result = comm.judge_fusion(data, gate, 900)
    assert result.status is Status.FAIL and "flashinfer-python>=0.6.17" in result.remedy


def test_fusion_timeout_in_the_jit_build_points_at_warming() -> None:
    data = {
        "ok": False,
        "timed_out": True,
        "problem": "ranks hung for 895 s (in jit build, init_process_group) and were killed",
    }
    result = comm.judge_fusion(data, fusion_gate("0.7.2", ["12.0"], multicast=False), 900)
    assert "JIT build did not finish within 900 s" in result.summary and comm.JIT_TIMEOUT_ENV in result.remedy


def test_geforce_pair_warns_that_p2p_is_disabled_by_the_driver() -> None:
    evidence = {
        "topo_m": {"ok": True, "text": (FIXTURES / "topo_m_2x5090_phb.txt").read_text()},
        "topo_p2p_r": {"ok": True, "text": (FIXTURES / "topo_p2p_rw_2x5090_gns.txt").read_text()},
        "cmdline": "BOOT_IMAGE=/vmlinuz ro quiet",
        "acs": {"ok": True, "readable": False, "ports": []},
    }
    result = comm.judge_topology(evidence, [gpu(0, "NVIDIA GeForce RTX 5090"), gpu(1, "NVIDIA GeForce RTX 5090")])
    assert result.status is Status.WARN
    assert "P2P disabled by the driver on NVIDIA GeForce RTX 5090" in result.summary
    assert result.data["pairs"] == [{"pair": [0, 1], "link": "PHB", "kind": "pcie", "p2p": "GNS"}]


def test_translating_iommu_on_a_pcie_box_warns_with_iommu_pt() -> None:
    evidence = {
        "topo_m": {"ok": True, "text": (FIXTURES / "topo_m_5gpu_node_phb.txt").read_text()},
        "topo_p2p_r": {"ok": True, "text": (FIXTURES / "topo_p2p_p_5gpu_ok.txt").read_text()},
        "cmdline": "BOOT_IMAGE=/vmlinuz ro amd_iommu=on",
        "acs": {"ok": True, "readable": True, "ports": []},
    }
    result = comm.judge_topology(evidence, [gpu(i) for i in range(5)])
    assert result.status is Status.WARN and "IOMMU translates DMA" in result.summary
    assert "iommu=pt" in result.remedy


def test_nvlink_node_with_p2p_passes() -> None:
    evidence = {
        "topo_m": {"ok": True, "text": (FIXTURES / "topo_m_8xh100_nv18.txt").read_text()},
        "nvml": {"ok": True, "pairs": [{"pair": [0, 1], "read": "OK", "write": "OK", "nvlink": "OK"}]},
        "cmdline": "BOOT_IMAGE=/vmlinuz ro intel_iommu=on",
        "acs": {"ok": False, "error": "lspci not found on PATH"},
    }
    result = comm.judge_topology(
        evidence, [gpu(0, "NVIDIA H100 80GB HBM3", "9.0"), gpu(1, "NVIDIA H100 80GB HBM3", "9.0")]
    )
    assert result.status is Status.PASS
    assert result.summary == "2 GPUs over NVLink, P2P OK on 1/1 pairs"

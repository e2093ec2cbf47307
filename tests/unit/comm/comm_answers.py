"""Whole probe answers for the level-3 judges, built from the payload types (and merged by the probes' own
`summarize`), with figures from the H200 x2 validation run (docs/validation/2026-11-30-h200x2/l3_warm.json)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from sm120check.doctor.collective_payload import LaunchFacts, RankHead
from sm120check.doctor.comm import fusion_probe as fusion
from sm120check.doctor.comm import nccl_probe as nccl
from sm120check.doctor.comm import symm_mem_probe as symm_mem
from sm120check.doctor.comm.fusion_payload import (
    FusionAnswer,
    FusionRank,
    FusionSize,
    JitBuild,
    JitEnvironment,
    JitModule,
    PcieRank,
    PcieSize,
)
from sm120check.doctor.comm.nccl_payload import Bandwidth, NcclAnswer, NcclRank, PairLink, SizeCheck
from sm120check.doctor.comm.symm_mem_payload import SymmMemAnswer, SymmRank, SymmSize
from sm120check.doctor.comm.topology_payload import (
    CommandText,
    NvmlDevice,
    NvmlEvidence,
    NvmlPair,
    TopologyEvidence,
)
from sm120check.doctor.pcie import cmdline as kernel_cmdline
from sm120check.doctor.pcie import fact_file, kernel_log, lspci, sysfs
from sm120check.doctor.pcie.node import PcieFacts
from sm120check.doctor.stats import LatencyStats

FIXTURES = Path(__file__).parents[2] / "fixtures" / "comm"
RTX_PRO = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
KIB, MIB = 2**10, 2**20
NCCL_SIZES = (112 * KIB, 512 * KIB, MIB, 4 * MIB, 64 * MIB)  # the verify size (8 x 7168 bf16) first


def stats(median: float) -> LatencyStats:
    return LatencyStats(200, median, median - 1.0, median + 2.0, median + 0.5, median - 1.5)


def launched(
    ok: bool = True, timed_out: bool = False, problem: str = "", evidence: str = "", seconds: float = 6.25
) -> LaunchFacts:
    return LaunchFacts(ok, timed_out, problem, seconds, (), evidence)


def head(rank: int, name: str = RTX_PRO, cc: str = "12.0") -> RankHead:
    return RankHead(rank, rank, name, cc)


def text(name: str) -> CommandText:
    return CommandText(True, text=(FIXTURES / name).read_text())


def topology_evidence(
    topo_m: str,
    topo_p2p_r: str | None = None,
    *,
    gpus: tuple[int, ...] = (0, 1),
    pairs: tuple[NvmlPair, ...] = (),
) -> TopologyEvidence:
    nvml = (
        NvmlEvidence(
            True, devices=tuple(NvmlDevice(i, RTX_PRO, f"00000000:{i + 1:02x}:00.0") for i in gpus), pairs=pairs
        )
        if pairs
        else NvmlEvidence(False, "nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    )
    p2p = text(topo_p2p_r) if topo_p2p_r else CommandText(False, error="nvidia-smi topo -p2p r: exit 1")
    return TopologyEvidence(gpus, nvml, text(topo_m), p2p)


def nvml_pair(a: int, b: int, code: str = "OK", ancestor: str = "PHB") -> NvmlPair:
    return NvmlPair((a, b), code, code, "NS" if ancestor != "NV" else "OK", code, ancestor)


def amd_gpp_bridges() -> dict[str, lspci.AcsState]:
    """The recorded AMD GPP root ports (00:01.1 and 00:01.2, ACS redirecting: lspci_acs_amd_gpp.txt) as the facts
    step reads each bridge above a GPU: by its sysfs BDF."""
    states, _ = lspci.parse_all((FIXTURES / "lspci_acs_amd_gpp.txt").read_text())
    return {f"0000:{s.bdf}": replace(s, bdf=f"0000:{s.bdf}") for s in states}


ACS_REDIRECT = amd_gpp_bridges()["0000:00:01.1"]


def fabric(
    gpus: tuple[int, ...] = (0, 1),
    *,
    cmdline: str | None = "BOOT_IMAGE=/vmlinuz ro quiet",
    group_type: str = "",
    bridges: Mapping[str, lspci.AcsState] | None = None,
    lspci_error: str = "",
) -> PcieFacts:
    """The run's PCIe facts (pcie/node.py) for the GPUs at 0000:0N:00.0 (NVML's bus ids in these tests): GPU i under
    the i-th of `bridges` (round robin; none: on the root bus), its IOMMU group of `group_type` ("" none), the kernel
    command line `cmdline` (None: unreadable)."""
    ports = list(bridges or {})
    rows = tuple(
        sysfs.SysGpu(
            f"0000:{i + 1:02x}:00.0",
            "0x2bb5",
            "0x030200",
            (ports[n % len(ports)],) if ports else (),
            "pci0000:00",
            str(n) if group_type else "",
            group_type,
        )
        for n, i in enumerate(gpus)
    )
    return PcieFacts(
        sysfs.SysfsView(rows),
        kernel_cmdline.parse(cmdline) if cmdline is not None else None,
        kernel_log.IommuLog(),
        fact_file.FactRead(str(fact_file.DEFAULT_PATH), missing=True),
        acs=dict(bridges or {}),
        lspci_error=lspci_error,
        cmdline_error="" if cmdline is not None else "/proc/cmdline: Permission denied",
    )


def nccl_rank(
    rank: int,
    version: str = "2.28.9",
    wrong: dict[int, int] | None = None,
    busbw: float = 266.6,
    latency: tuple[float, float, float] = (58.26, 56.11, 38.94),
) -> NcclRank:
    wrong = wrong or {}
    sizes = tuple(SizeCheck(n, not wrong.get(n), wrong.get(n, 0)) for n in NCCL_SIZES)
    timed = {tokens: stats(us) for tokens, us in zip(("1", "3", "8"), latency, strict=True)}
    bandwidth = Bandwidth(64 * MIB, 64 * MIB / (busbw * 1e9), busbw * 0.5, busbw)
    return NcclRank(head(rank), version, sizes[0].correct, sizes[0].mismatches, sizes, None, timed, bandwidth)


def nvlink() -> tuple[PairLink, ...]:
    return (PairLink((0, 1), "NV18", "nvlink"),)


def pcie() -> tuple[PairLink, ...]:
    return (PairLink((0, 1), "NODE", "pcie"),)


def nccl_answer(
    *ranks: NcclRank, links: tuple[PairLink, ...] = (), links_error: str = "", launch: LaunchFacts | None = None
) -> NcclAnswer:
    ranks = ranks or (nccl_rank(0), nccl_rank(1))
    return nccl.summarize(launch or launched(), ranks, links or nvlink(), links_error)


def nccl_hang(problem: str = "ranks hung for 115 s (in first allreduce) and were killed") -> NcclAnswer:
    return nccl.summarize(launched(False, True, problem, seconds=115.0), (NcclRank(), NcclRank()), nvlink())


SYMM_US = {"1": (17.0, 12.0, 51.0), "3": (21.0, 30.0, 36.0), "8": (33.0, 25.0, 60.0)}  # one-shot, two-shot, NCCL


def symm_rank(
    rank: int, multimem: bool = False, two_shot_ok: bool = True, tokens: tuple[str, ...] = ("1", "3", "8")
) -> SymmRank:
    sizes = {}
    for size in tokens:
        one, two, ref = SYMM_US[size]
        timed = {"nccl": stats(ref), "one_shot": stats(one), "two_shot": stats(two)}
        if multimem:
            timed["multimem"] = stats(9.0)
        sizes[size] = SymmSize(True, True, two_shot_ok, timed, True if multimem else None)
    return SymmRank(head(rank), "2.9.1+cu130", True, "CUDA", 1 if multimem else 0, multimem, sizes)


def symm_answer(*ranks: SymmRank, launch: LaunchFacts | None = None) -> SymmMemAnswer:
    ranks = ranks or (symm_rank(0), symm_rank(1))
    env = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMMMEM": ""}
    return symm_mem.summarize(launch or launched(), ranks, env)


def jit_build(cached: bool) -> JitBuild:
    module = JitModule(
        "trtllm_comm",
        cached,
        not cached,
        0.0 if cached else 290.0,
        "/root/.cache/flashinfer/0.7.2/90a/cached_ops/trtllm_comm",
        "no work",
        "/root/.cache/flashinfer/0.7.2/90a/cached_ops/trtllm_comm/trtllm_comm.so",
    )
    return JitBuild((module,), JitEnvironment("", ("90a",), "/root/.cache/flashinfer/0.7.2/90a/cached_ops", ""))


def fusion_rank(rank: int, cached: bool = True, err: float = 3e-6, pcie_ipc: bool = True) -> FusionRank:
    fused = {"1": (35.0, 167.0), "3": (36.0, 170.0), "8": (38.0, 178.0)}
    sizes = {k: FusionSize(err, err, stats(f), stats(u)) for k, (f, u) in fused.items()}
    pcie_rank = PcieRank("pcie_2gpu", {k: PcieSize(True, True, stats(40.0)) for k in fused}) if pcie_ipc else None
    return FusionRank(
        head(rank, "NVIDIA H200", "9.0"),
        jit_build(cached) if rank == 0 else None,
        "0.7.2",
        "trtllm",
        "trtllm",
        "TRTLLMAllReduceFusionWorkspace",
        sizes,
        pcie_rank,
    )


def fusion_answer(
    cached: bool = True, err: float = 3e-6, launch: LaunchFacts | None = None, pcie_ipc: bool = True
) -> FusionAnswer:
    ranks = (fusion_rank(0, cached, err, pcie_ipc), fusion_rank(1, cached, err, pcie_ipc))
    return fusion.summarize(launch or launched(), ranks)


def fusion_failed(problem: str, timed_out: bool = False, jit: bool = False) -> FusionAnswer:
    rank0 = FusionRank(RankHead(0), jit_build(False)) if jit else FusionRank()
    return fusion.summarize(launched(False, timed_out, problem, seconds=115.0), (rank0, FusionRank()))

"""The level-3 probes run for real on this machine (CPU torch, no GPU, no nvidia-smi, no FlashInfer): every answer
they print reads as its payload type, and the judge turns it into a verdict that names the rank's error."""

from __future__ import annotations

import importlib.util
import shutil

import pytest

from sm120check.doctor import facts
from sm120check.doctor.child import run_probe
from sm120check.doctor.comm import collectives as comm
from sm120check.doctor.comm.fusion_payload import FusionAnswer
from sm120check.doctor.comm.nccl_payload import NcclAnswer
from sm120check.doctor.comm.symm_mem_payload import SymmMemAnswer
from sm120check.doctor.comm.topology_payload import TopologyEvidence
from sm120check.doctor.model import Status
from sm120check.doctor.nvml_api import Gpu
from sm120check.jitcache.flashinfer_release import fusion_support

ARGS = ["--gpus", "0,1", "--timeout", "30", "--iters", "2", "--warmup", "1"]
GUARD = 90.0  # seconds: a hang guard, ten times a normal run here
no_gpu_here = pytest.mark.skipif(
    shutil.which("nvidia-smi") is not None or importlib.util.find_spec("torch") is None,
    reason="needs a machine with torch and without GPUs: the ranks must fail where they start CUDA",
)


def gpus() -> list[Gpu]:
    return [
        Gpu(i, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", (12, 0), None, f"0000:0{i + 1}:00.0")
        for i in (0, 1)
    ]


def test_the_topology_probe_answer_is_read_and_judged() -> None:
    outcome = run_probe("sm120check.doctor.comm.topology_probe", ["--gpus", "0,1"], timeout=GUARD)
    assert outcome.ok, outcome.problem
    evidence = TopologyEvidence.from_json(outcome.data)
    assert evidence.gpus == (0, 1)
    result = comm.judge_topology(
        evidence, gpus(), facts.read_pcie()
    )  # this machine's fabric, as the facts step reads it
    assert result.status in (Status.PASS, Status.WARN), result
    if not evidence.topo_m.ok:
        assert f"nvidia-smi topo -m: {evidence.topo_m.error}" in result.details


@no_gpu_here
def test_the_nccl_probe_without_a_gpu_fails_naming_the_ranks_error() -> None:
    outcome = run_probe("sm120check.doctor.comm.nccl_probe", ARGS, timeout=GUARD)
    assert outcome.ok, outcome.problem
    answer = NcclAnswer.from_json(outcome.data)
    assert not answer.launch.ok and not answer.launch.timed_out
    assert answer.links == () and "nvidia-smi" in answer.links_error
    assert all(r.head.error for r in answer.ranks)
    result = comm.judge_nccl(answer, 2)
    assert result.status is Status.FAIL and result.summary.startswith("NCCL allreduce failed: rank 0: ")


@no_gpu_here
def test_the_symm_mem_probe_without_a_gpu_fails_naming_the_ranks_error() -> None:
    outcome = run_probe("sm120check.doctor.comm.symm_mem_probe", ARGS, timeout=GUARD)
    assert outcome.ok, outcome.problem
    answer = SymmMemAnswer.from_json(outcome.data)
    result = comm.judge_symm_mem(answer)
    assert result.status is Status.FAIL and result.summary.startswith("symmetric memory failed: rank 0: ")


@no_gpu_here
@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is not None, reason="FlashInfer would build its modules")
def test_the_fusion_probe_without_flashinfer_fails_naming_the_ranks_error() -> None:
    outcome = run_probe("sm120check.doctor.comm.fusion_probe", ARGS, timeout=GUARD)
    assert outcome.ok, outcome.problem
    answer = FusionAnswer.from_json(outcome.data)
    assert "jit build" in answer.launch.evidence  # rank 0 failed building, before any process group
    result = comm.judge_fusion(answer, fusion_support("0.7.2", ["12.0"], multicast=False), 30)
    assert result.status is Status.FAIL and "No module named 'flashinfer'" in result.summary

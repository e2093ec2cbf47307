"""Level-3 probes on real GPUs: skipped without two NVIDIA GPUs (run on the device machine).

Every process must keep NVLink multicast off where the node forbids it: NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 (set here if absent).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sm120check.doctor.child import run_probe

pytestmark = pytest.mark.gpu
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


needs_two = pytest.mark.skipif(gpu_count() < 2, reason="needs 2 NVIDIA GPUs")


@pytest.fixture(autouse=True)
def no_multicast(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in SAFE_ENV.items():
        if key not in os.environ:
            monkeypatch.setenv(key, value)


def rank_processes() -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "sm120check.doctor.ranks" in text:
            found.append(text)
    return found


@needs_two
def test_nccl_allreduce_is_exact_and_timed_on_two_gpus() -> None:
    outcome = run_probe("sm120check.doctor.comm.nccl_probe", ["--gpus", "0,1", "--timeout", "110"], timeout=120)
    data: dict[str, Any] = dict(outcome.data)  # the probe's JSON line, untyped
    assert outcome.ok and data["ok"], data.get("problem") or outcome.problem
    assert data["correct"]
    assert set(data["latency_us"]) == {"1", "3", "8"}
    assert data["busbw_gbps"] > 0
    assert not rank_processes()


@needs_two
def test_symmetric_memory_one_and_two_shot_match_nccl() -> None:
    outcome = run_probe("sm120check.doctor.comm.symm_mem_probe", ["--gpus", "0,1", "--timeout", "110"], timeout=120)
    data: dict[str, Any] = dict(outcome.data)  # the probe's JSON line, untyped
    assert outcome.ok and data["ok"], data.get("problem") or outcome.problem
    assert data["correct"]["one_shot"] and data["correct"]["two_shot"]
    assert "multimem" not in data["latency_us"]  # multicast is off here
    assert not rank_processes()


@needs_two
@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="FlashInfer not installed")
def test_allreduce_fusion_matches_the_unfused_reference() -> None:
    timeout = float(os.environ.get("SM120CHECK_JIT_TIMEOUT", "900"))
    outcome = run_probe(
        "sm120check.doctor.comm.fusion_probe", ["--gpus", "0,1", "--timeout", str(timeout - 5)], timeout=timeout
    )
    data: dict[str, Any] = dict(outcome.data)  # the probe's JSON line, untyped
    assert outcome.ok and data["ok"], data.get("problem") or outcome.problem
    assert max(data["max_rel_err"].values()) < 2e-2
    assert data["backend"] == "trtllm"
    assert not rank_processes()

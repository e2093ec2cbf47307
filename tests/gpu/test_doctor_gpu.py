"""`sm120check doctor --level 2` on a real GPU: driver, NVRTC and the SM120 JIT (launched on the local GPU) pass.

Run on the device machine: `python -m pytest -m gpu tests/gpu/test_doctor_gpu.py` (skips without a GPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "tests" / "fixtures" / "doctor" / "h200-manifest.json"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not Path("/proc/driver/nvidia/version").exists(), reason="no NVIDIA driver on this machine"),
]


@pytest.fixture(scope="module")
def report() -> dict[str, dict[str, object]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python" / "sm120check" / "src"))
    env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    run = subprocess.run(
        [sys.executable, "-m", "sm120check.doctor", "--level", "2", "--json", "--manifest", str(MANIFEST)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert run.returncode in (0, 1), run.stderr
    return {r["id"]: r for r in json.loads(run.stdout)["results"]}


def test_driver_passes_with_gpus_listed(report: dict[str, dict[str, object]]) -> None:
    driver = report["driver"]
    assert driver["status"] == "pass", driver
    assert driver["data"]["gpu_count"] >= 1  # type: ignore[index]


def test_nvrtc_passes(report: dict[str, dict[str, object]]) -> None:
    assert report["nvrtc"]["status"] == "pass", report["nvrtc"]


def test_sm120_jit_passes_with_a_launch_on_every_local_gpu(report: dict[str, dict[str, object]]) -> None:
    jit = report["sm120_jit"]
    assert jit["status"] == "pass", jit
    gpus = jit["data"]["gpus"]  # type: ignore[index]
    assert gpus and all(g["ok"] and g["mismatches"] == 0 for g in gpus)

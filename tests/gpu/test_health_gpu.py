"""The SM load's real launch: the node-health probe compiles the spin kernel with NVRTC and runs it on every SM of
each local GPU, clocks sampled (tests/unit/health/test_health_compute_load.py compiles it on CPU and runs the launch
bookkeeping against a stand-in libcuda; only this file launches it).

Run on the device machine: `python -m pytest -m gpu tests/gpu/test_health_gpu.py` (skips without a GPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sm120check.doctor.gpu import load
from sm120check.doctor.gpu.payloads import NodeHealth

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not Path("/proc/driver/nvidia/version").exists(),
        reason="no GPU here: the launch runs in tests/gpu on the device machine",
    ),
]


def test_the_spin_kernel_runs_on_every_sm_of_each_gpu_for_the_timed_span_with_clocks_sampled() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python" / "sm120check" / "src"))
    proc = subprocess.run(
        [sys.executable, "-m", "sm120check.doctor.gpu.node_health_probe", "--size-mib", "16"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    health = NodeHealth.from_json(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert health.gpus and health.load_error == "", (health.nvml_error, health.load_error)
    for gpu in health.gpus:
        compute = gpu.compute
        assert compute is not None and compute.error == "", (gpu.index, compute)
        assert compute.arch.startswith("compute_") and compute.blocks % load.BLOCKS_PER_SM == 0 and compute.blocks > 0
        assert compute.threads == load.THREADS and compute.iterations >= load.FIRST_ITERATIONS
        assert compute.seconds == pytest.approx(load.SPIN_S, rel=0.5), compute.seconds
        assert compute.samples and compute.sm_mhz_min is not None and compute.sm_mhz_min > 0

"""allreduce_fusion predicts a cold build by asking ninja, as FlashInfer's own load does (real ninja)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from jitcache_helpers import BUILD_NINJA, ninja

from sm120check.doctor.comm.collectives import predicted_cached

CAPS = ["9.0"]  # H200: FlashInfer targets 90a


def _env(root: Path) -> dict[str, str]:
    return {"FLASHINFER_WORKSPACE_BASE": str(root), "PATH": os.environ["PATH"]}


def _module(
    root: Path, sources: Path, run_in_parent: bool = False, name: str = "trtllm_comm", version: str = "0.7.2"
) -> Path:
    sources.mkdir(parents=True, exist_ok=True)
    (sources / f"{name}.cu").write_text("__global__ void k() {}\n")
    (sources / f"{name}.cuh").write_text("#pragma once\n")
    directory = root / ".cache" / "flashinfer" / version / "90a" / "cached_ops" / name
    directory.mkdir(parents=True)
    text = BUILD_NINJA.replace("demo", name)
    build = directory / "build.ninja"
    build.write_text(text.format(dir=directory, src=sources / f"{name}.cu", header=sources / f"{name}.cuh"))
    workdir = directory.parent if run_in_parent else directory
    subprocess.run([ninja(), "-C", str(workdir), "-f", str(build)], check=True, capture_output=True)
    return directory


def test_module_current_for_ninja_is_predicted_cached(tmp_path: Path) -> None:
    _module(tmp_path / "ws", tmp_path / "src")
    _module(tmp_path / "ws", tmp_path / "src", name="pcie_ipc_comm")  # the probe builds both on 0.7.2
    assert predicted_cached("0.7.2", CAPS, _env(tmp_path / "ws"))


def test_a_cold_pcie_ipc_module_beside_a_warm_trtllm_comm_is_predicted_cold(tmp_path: Path) -> None:
    # The probe compiles pcie_ipc_comm (70-140 s) too: the short timeout would cut it off.
    _module(tmp_path / "ws", tmp_path / "src")
    assert not predicted_cached("0.7.2", CAPS, _env(tmp_path / "ws"))


def test_before_0_7_only_trtllm_comm_is_needed(tmp_path: Path) -> None:
    # FlashInfer 0.6.x has no pcie_ipc_comm: a warm trtllm_comm is all the probe loads.
    _module(tmp_path / "ws", tmp_path / "src", version="0.6.17")
    assert predicted_cached("0.6.17", CAPS, _env(tmp_path / "ws"))


def test_missing_module_is_predicted_cold(tmp_path: Path) -> None:
    assert not predicted_cached("0.7.2", CAPS, _env(tmp_path / "ws"))

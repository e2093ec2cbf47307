"""allreduce_fusion predicts a cold build by asking ninja, as FlashInfer's own load does (real ninja)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from jitcache_helpers import BUILD_NINJA, ninja

from sm120check.doctor.checks.comm import predicted_cached

CAPS = ["9.0"]  # H200: FlashInfer targets 90a


def _env(root: Path) -> dict[str, str]:
    return {"FLASHINFER_WORKSPACE_BASE": str(root), "PATH": os.environ["PATH"]}


def _module(root: Path, sources: Path, run_in_parent: bool = False) -> Path:
    sources.mkdir(parents=True, exist_ok=True)
    (sources / "trtllm_comm.cu").write_text("__global__ void k() {}\n")
    (sources / "trtllm_comm.cuh").write_text("#pragma once\n")
    directory = root / ".cache" / "flashinfer" / "0.7.2" / "90a" / "cached_ops" / "trtllm_comm"
    directory.mkdir(parents=True)
    text = BUILD_NINJA.replace("demo", "trtllm_comm")
    build = directory / "build.ninja"
    build.write_text(text.format(dir=directory, src=sources / "trtllm_comm.cu", header=sources / "trtllm_comm.cuh"))
    workdir = directory.parent if run_in_parent else directory
    subprocess.run([ninja(), "-C", str(workdir), "-f", str(build)], check=True, capture_output=True)
    return directory


def test_module_current_for_ninja_is_predicted_cached(tmp_path: Path) -> None:
    _module(tmp_path / "ws", tmp_path / "src")
    assert predicted_cached("0.7.2", CAPS, _env(tmp_path / "ws"))


def test_module_built_by_the_combined_prebuild_is_predicted_cold(tmp_path: Path) -> None:
    # The library exists, but ninja's log is one directory up: FlashInfer's first load recompiles it.
    directory = _module(tmp_path / "ws", tmp_path / "src", run_in_parent=True)
    assert (directory / "trtllm_comm.so").exists()
    assert not predicted_cached("0.7.2", CAPS, _env(tmp_path / "ws"))


def test_missing_module_is_predicted_cold(tmp_path: Path) -> None:
    assert not predicted_cached("0.7.2", CAPS, _env(tmp_path / "ws"))

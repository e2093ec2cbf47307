"""The probe run here (no GPU, no NVML) exits cleanly with a payload saying why; the NCCL floor table; SGLang's
config names for each RTX PRO 6000 edition."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab.gpu_less import NO_DRIVER, NVML_ABSENT
from lab.sglang_releases import release_dir
from sm120check.doctor import nccl_floor
from sm120check.doctor.gpu import kernel_log
from sm120check.doctor.gpu.load import pci_key
from sm120check.doctor.gpu.payloads import GpuHealth, NodeHealth
from sm120check.doctor.node_health import sglang_configs, verdicts

SRC = Path(__file__).resolve().parents[3] / "python" / "sm120check" / "src"
RECORDED = Path(__file__).resolve().parents[2] / "fixtures" / "health" / "h200-2026-12-01-busy.json"


def gpu_named(name: str) -> GpuHealth:
    """The GPU recorded on the H200 under another product name (the edition is all gpu_product reads)."""
    recorded = NodeHealth.from_json(json.loads(RECORDED.read_text(encoding="utf-8"))).gpus[0]
    return dataclasses.replace(recorded, name=name)


@NO_DRIVER
def test_probe_without_nvml_prints_a_payload_saying_why() -> None:
    env = dict(os.environ, PYTHONPATH=str(SRC), LD_LIBRARY_PATH="/nonexistent")
    proc = subprocess.run(
        [sys.executable, "-m", "sm120check.doctor.gpu.node_health_probe", "--no-load"],
        capture_output=True,
        text=True,
        timeout=60,  # hang guard: it takes well under a second
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "sm120check-step: dlopen libnvidia-ml.so.1" in proc.stderr.splitlines(), proc.stderr
    health = NodeHealth.from_json(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert health.gpus == () and health.driver == ""
    assert health.nvml_error == NVML_ABSENT and health.load_error == "skipped: no NVML"
    # the kernel log is read anyway, from the source this machine allows (the same read, here in the test)
    here = kernel_log.read()
    assert (health.kernel_log.source, health.kernel_log.error) == (here.source, here.error)
    assert bool(health.kernel_log.source) != bool(health.kernel_log.error)


def test_nccl_floor() -> None:
    assert nccl_floor.floor() == "2.27.3"
    bad = nccl_floor.judge_nccl("2.26.2")
    assert bad.status == "fail" and "nccl#2418" in bad.details
    assert nccl_floor.judge_nccl("2.26.5").status == "fail"
    assert nccl_floor.judge_nccl("2.21.5").status == "fail"
    pinned = nccl_floor.judge_nccl("2.30.7-1+cuda13.0")
    assert pinned.status == "pass" and "512 KiB" in pinned.details
    assert nccl_floor.judge_nccl("2.31.2").details == ""
    assert nccl_floor.judge_nccl("v2.x").status == "fail"


def test_sglang_device_names_per_edition(tmp_path: Path) -> None:
    max_q = "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"
    assert sglang_configs.device_name(max_q) == "NVIDIA_RTX_PRO_6000_Blackwell_Max-Q_Workstation_Edition"
    folder = tmp_path / "srt/layers/moe/moe_runner/triton_utils/configs/triton_3_5_1"
    folder.mkdir(parents=True)
    for name in (
        "E=161,N=192,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Max-Q_Workstation_Edition.json",
        "E=256,N=512,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition_down.json",
        "E=256,N=512,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition,dtype=fp8_w8a8.json",
    ):
        (folder / name).write_text("{}")
    assert len(sglang_configs.find(str(tmp_path), max_q).files) == 1
    assert len(sglang_configs.find(str(tmp_path), "NVIDIA RTX PRO 6000 Blackwell Server Edition").files) == 2
    workstation = sglang_configs.find(str(tmp_path), "NVIDIA RTX PRO 6000 Blackwell Workstation Edition")
    assert workstation.files == () and workstation.searched


@pytest.mark.slow  # may download the sglang 0.5.23 wheel once (pip's configured index) into .cache/sglang
def test_sglang_0_5_23_ships_tuned_configs_for_max_q_and_server_editions_but_not_the_workstation_edition() -> None:
    """The real release tree: the editions' exact names decide what SGLang finds (Max-Q and Server have files under
    their own names; the Workstation Edition none: the verdict warns and names device_name)."""
    tree = str(release_dir("0.5.23") / "sglang")
    max_q = sglang_configs.find(tree, "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition")
    assert len(max_q.files) == 4 and any("triton_3_5_1" in f for f in max_q.files), max_q.files
    server = sglang_configs.find(tree, "NVIDIA RTX PRO 6000 Blackwell Server Edition")
    assert len(server.files) == 2, server.files
    workstation = sglang_configs.find(tree, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition")
    assert workstation.files == ()
    verdict = verdicts.gpu_product([gpu_named("NVIDIA RTX PRO 6000 Blackwell Workstation Edition")], workstation)
    assert verdict.status == verdicts.WARN
    assert "device_name=NVIDIA_RTX_PRO_6000_Blackwell_Workstation_Edition" in verdict.summary
    passed = verdicts.gpu_product([gpu_named("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition")], max_q)
    assert passed.status == verdicts.PASS and "4 tuned configs" in passed.summary


def test_pci_keys_match_across_nvml_cuda_and_xid_forms() -> None:
    assert pci_key("00000000:3B:00.0") == pci_key("0000:3b:00.0") == pci_key("PCI:0000:3b:00") == (0, 0x3B, 0)
    assert pci_key("garbage") is None

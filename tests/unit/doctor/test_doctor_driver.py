"""driver: NVML answer + /proc/driver/nvidia/version -> verdict (values from the H200 machines, stack-facts 7)."""

from __future__ import annotations

from doctor_helpers import fixture

from sm120check.doctor.model import Status
from sm120check.doctor.nvml_api import Gpu, NvmlInfo
from sm120check.doctor.preflight.driver import (
    driver_verdict,
    module_flavour,
    nodes_verdict,
    persistence_verdict,
    proc_driver_version,
)

OPEN = fixture("proc-driver-version-580.159.04-open.txt")
PROPRIETARY = fixture("proc-driver-version-580.159.04-proprietary.txt")
H200 = NvmlInfo(
    "580.159.04", 13000, (Gpu(0, "NVIDIA H200", (9, 0), True), Gpu(1, "NVIDIA H200", (9, 0), False)), "ctypes"
)
RTX_PRO = NvmlInfo(
    "580.159.04", 13000, (Gpu(0, "NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0), True),), "ctypes"
)


def test_proc_text_tells_open_from_proprietary_module() -> None:
    assert module_flavour(OPEN) == "open"
    assert module_flavour(PROPRIETARY) == "proprietary"
    assert proc_driver_version(OPEN) == proc_driver_version(PROPRIETARY) == "580.159.04"


def test_h200_driver_passes_and_lists_gpus_with_compute_capability() -> None:
    result = driver_verdict(H200, "", OPEN, "580.65.06", "manifest")
    assert result.status is Status.PASS
    assert "driver 580.159.04 (open), CUDA 13.0" in result.summary
    assert "0: NVIDIA H200 (cc 9.0)" in result.summary
    assert result.data["gpu_count"] == 2


def test_driver_older_than_manifest_minimum_fails() -> None:
    result = driver_verdict(H200, "", OPEN, "580.160.0", "manifest")
    assert result.status is Status.FAIL
    assert "older than 580.160.0" in result.summary


def test_blackwell_on_proprietary_module_warns() -> None:
    result = driver_verdict(RTX_PRO, "", PROPRIETARY, "580.65.06", "manifest")
    assert result.status is Status.WARN and "open kernel modules" in result.remedy


def test_no_driver_at_all_is_a_skip_saying_so() -> None:
    result = driver_verdict(None, "libnvidia-ml.so.1 does not load", None, "580.65.06", "default")
    assert (result.status, result.summary) == (Status.SKIP, "no NVIDIA driver")


def test_kernel_module_without_working_nvml_fails() -> None:
    result = driver_verdict(None, "nvmlInit_v2 returned 18 (Driver/library version mismatch)", OPEN, "580.65.06", "")
    assert result.status is Status.FAIL and "NVML fails" in result.summary


def test_missing_uvm_node_warns_and_missing_ctl_fails() -> None:
    assert nodes_verdict(["nvidiactl", "nvidia0", "nvidia-uvm", "nvidia-uvm-tools"]).status is Status.PASS
    assert nodes_verdict(["nvidiactl", "nvidia0"]).status is Status.WARN
    assert nodes_verdict(["nvidia0", "nvidia-uvm"]).status is Status.FAIL


def test_persistence_off_on_one_gpu_warns_naming_it() -> None:
    result = persistence_verdict(H200.gpus)
    assert result.status is Status.WARN and result.summary == "persistence mode is off on GPU 1"
    assert "nvidia-smi -pm 1" in result.remedy

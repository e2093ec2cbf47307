"""What a machine without an NVIDIA driver says, for the tests that run the real probes there (their GPU-less
outcome cannot occur where a driver is: ldconfig resolves libnvidia-ml.so.1 whatever LD_LIBRARY_PATH says, and the
probes would measure real GPUs, which tests/gpu covers)."""

from __future__ import annotations

from pathlib import Path

import pytest

NVML_ABSENT = (
    "libnvidia-ml.so.1 does not load: libnvidia-ml.so.1: cannot open shared object file: No such file or directory "
    "(no NVIDIA driver on this host?)"
)
NO_DRIVER = pytest.mark.skipif(
    Path("/proc/driver/nvidia/version").exists(), reason="an NVIDIA driver here: the GPU-less outcome cannot occur"
)

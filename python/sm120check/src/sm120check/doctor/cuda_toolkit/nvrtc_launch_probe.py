"""Probe (child process): compile the test kernel with NVRTC for each GPU's own architecture, load the
cubin through the driver API, launch it and compare with a CPU reference. Prints one JSON line.

    python -m sm120check.doctor.cuda_toolkit.nvrtc_launch_probe [--gpus 0,1]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from sm120check.doctor import cuda_api, nvrtc_api
from sm120check.doctor.child import emit
from sm120check.doctor.cuda_toolkit.nvrtc_launch_payload import JitLaunch, LaunchRow

N = 4099  # not a multiple of the block size: the bounds check is exercised too
A = 2654435761


def reference(x: list[int], y: list[int]) -> list[int]:
    return [(A * xi + yi) & 0xFFFFFFFF for xi, yi in zip(x, y, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", default="")
    args = parser.parse_args()
    nvrtc = nvrtc_api.Nvrtc.open()
    driver = cuda_api.Driver()
    wanted = [int(i) for i in args.gpus.split(",") if i.strip()] or list(range(driver.device_count()))
    x = [(i * 7919 + 13) & 0xFFFFFFFF for i in range(N)]
    y = [(i * 104729) ^ 0x5A5A5A5A for i in range(N)]
    expected = reference(x, y)
    gpus = []
    for ordinal in wanted:
        dev, name, cc = driver.device(ordinal)
        arch = nvrtc_api.arch_of(*cc)
        compiled = nvrtc.compile(arch)
        row = LaunchRow(ordinal, name, f"{cc[0]}.{cc[1]}", arch, ok=False)
        if not compiled.ok:
            gpus.append(replace(row, error=f"NVRTC {compiled.error} for {arch}", log=compiled.log[-1000:]))
            continue
        start = time.monotonic()
        try:
            out = driver.run_axpy(dev, compiled.cubin, nvrtc_api.TEST_KERNEL_NAME, A, x, y)
        except cuda_api.CudaError as exc:
            gpus.append(replace(row, error=str(exc)))
            continue
        mismatches = sum(1 for got, want in zip(out, expected, strict=True) if got != want)
        row = replace(
            row,
            ok=mismatches == 0,
            mismatches=mismatches,
            elements=N,
            cubin_bytes=len(compiled.cubin),
            compile_s=round(compiled.seconds, 4),
            launch_s=round(time.monotonic() - start, 4),
        )
        gpus.append(row)
    emit(JitLaunch(nvrtc.path, tuple(gpus)).to_json())


if __name__ == "__main__":
    main()

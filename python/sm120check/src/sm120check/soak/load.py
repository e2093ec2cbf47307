"""The soak's own SM load when no server is driven: the doctor's FMA kernel (doctor/gpu/load.spin) on every GPU at
once, launched again and again until the duration ends or the stop file appears.

    python -m sm120check.soak.load --duration 300 [--stop FILE] [--gpus 0,1]

A child process (the parent runs it under the doctor's child runner, killed at its bound or when silent); each launch
ends by itself after about SPIN_S seconds. No clock, power or fan setting is changed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sm120check.doctor import child
from sm120check.doctor.gpu import load
from sm120check.doctor.gpu.nvml_health import Nvml
from sm120check.doctor.nvml_api import NvmlUnavailable

SPIN_S = 5.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sm120check.soak.load")
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--stop", type=Path)
    parser.add_argument("--gpus", default="")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + max(0.0, args.duration)
    try:
        nvml = Nvml.open(child.step)
    except NvmlUnavailable as exc:
        child.emit({"ok": False, "error": str(exc)})
        return 1
    rounds, errors = 0, []
    try:
        child.step(f"dlopen {load.SONAME} and cuInit")
        try:
            cuda = load.Cuda.open()
            by_bus = cuda.device_by_bus()
        except (load.CudaUnavailable, load.CudaCallFailed) as exc:
            child.emit({"ok": False, "error": str(exc)})
            return 1
        nvrtc, nvrtc_error = load.open_nvrtc()
        indices = child.gpu_indices(args.gpus) or list(range(nvml.count()))
        with contextlib.ExitStack() as held:
            targets: list[tuple[int, ctypes.c_void_p]] = []
            for index in indices:
                key = load.pci_key(nvml.gpu(index).bus_id)
                dev = by_bus.get(key) if key is not None else None
                if dev is not None:
                    held.enter_context(load.held_context(cuda, dev))
                    targets.append((dev, nvml.handle(index)))
            if not targets:
                child.emit({"ok": False, "error": "CUDA sees none of the GPUs NVML lists (CUDA_VISIBLE_DEVICES?)"})
                return 1
            with ThreadPoolExecutor(max_workers=len(targets), thread_name_prefix="spin") as pool:
                while (left := deadline - time.monotonic()) > 1.0 and not (args.stop and args.stop.exists()):
                    child.step(f"FMA kernel round {rounds} on {len(targets)} GPU(s)")
                    spins = [
                        pool.submit(load.spin, cuda, dev, nvml, h, nvrtc, nvrtc_error, spin_s=min(SPIN_S, left))
                        for dev, h in targets
                    ]
                    found = [s.result().error for s in spins]
                    rounds += 1
                    if any(found):
                        errors = [e for e in found if e]
                        break
    finally:
        nvml.close()
    child.emit({"ok": not errors, "rounds": rounds, "error": "; ".join(errors)})
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())

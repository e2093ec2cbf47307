"""Probe (child process): node health per GPU (NVML), a short copy load with the link read busy, the kernel log's Xids.
Prints one JSON line (health.payloads.NodeHealth); announces each step on stderr first.

    python -m sm120check.doctor.probes.node_health [--gpus 0,1] [--no-load] [--size-mib 256]

NVML, libcuda and the log read run here, not in the doctor, so a GPU that fell off the bus (an NVML call that
blocks) or a driver that segfaults ends as a verdict (the parent's timeout, the signal), not a hung doctor.
Without NVML (no driver) it still prints a payload: `nvml_error` says why, the kernel log is read anyway.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from sm120check.doctor.child import emit, step
from sm120check.doctor.health import kernel_log, load
from sm120check.doctor.health.nvml_health import Nvml
from sm120check.doctor.health.payloads import GpuHealth, NodeHealth
from sm120check.doctor.nvml_api import NvmlUnavailable


def _indices(text: str) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(f"--gpus {text!r}: expected NVML indices such as 0,1") from None


def _with_load(nvml: Nvml, gpus: list[GpuHealth], size: int) -> tuple[list[GpuHealth], str]:
    step(f"dlopen {load.SONAME} and cuInit")
    try:
        cuda = load.Cuda.open()
        by_bus = cuda.device_by_bus()
    except (load.CudaUnavailable, load.CudaCallFailed) as exc:
        return gpus, str(exc)
    done = []
    for gpu in gpus:
        key = load.pci_key(gpu.bus_id)
        dev = by_bus.get(key) if key is not None else None
        if dev is None:
            done.append(gpu)  # hidden from CUDA (CUDA_VISIBLE_DEVICES): no load, pcie_link says "idle only"
            continue
        step(f"pinned H2D/D2H copies on GPU {gpu.index} ({gpu.bus_id}, CUDA device {dev})")
        result = load.measure(cuda, dev, nvml, nvml.handle(gpu.index), size=size)
        done.append(dataclasses.replace(gpu, load=result))
    return done, ""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="node_health")
    parser.add_argument("--gpus", default="", help="NVML indices to read (default: all)")
    parser.add_argument("--no-load", action="store_true", help="read at rest only (no CUDA context, no copies)")
    parser.add_argument("--size-mib", type=int, default=256, help="bytes per copy, in MiB")
    args = parser.parse_args(argv)
    wanted = _indices(args.gpus)

    step("read the kernel log (/dev/kmsg, journalctl -k -b, dmesg)")
    log = kernel_log.read()
    try:
        nvml = Nvml.open(step)
    except NvmlUnavailable as exc:
        emit(NodeHealth((), log, nvml_error=str(exc), load_error="skipped: no NVML").to_json())
        return
    try:
        driver = nvml.driver()
        indices = wanted if wanted is not None else list(range(nvml.count()))
        gpus = [nvml.gpu(i) for i in indices]  # before the load: the process list must not see our own context
        me = os.getpid()
        gpus = [dataclasses.replace(g, processes=tuple(p for p in g.processes if p.pid != me)) for g in gpus]
        load_error = "skipped: --no-load" if args.no_load else ""
        if not args.no_load and gpus:
            gpus, load_error = _with_load(nvml, gpus, args.size_mib << 20)
        answer = NodeHealth(tuple(gpus), log, driver, load_error=load_error)
    except NvmlUnavailable as exc:
        answer = NodeHealth((), log, nvml_error=str(exc), load_error="skipped: no NVML")
    finally:
        nvml.close()
    emit(answer.to_json())


if __name__ == "__main__":
    main()

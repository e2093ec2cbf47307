"""Probe (child process): node health per GPU (NVML), a short copy load with the link read busy, the kernel log's Xids.
Prints one JSON line (health.payloads.NodeHealth); announces each step on stderr first.

    python -m sm120check.doctor.gpu.node_health_probe [--gpus 0,1] [--no-load] [--size-mib 256] [--exclude-tree PID]

`--exclude-tree PID` leaves out of the process lists every process whose parent chain reaches PID (the doctor
passes its own pid: its other children hold CUDA contexts while this reads the lists).

NVML, libcuda and the log read run here, not in the doctor, so a GPU that fell off the bus (an NVML call that
blocks) or a driver that segfaults ends as a verdict (the parent's timeout, the signal), not a hung doctor.
Without NVML (no driver) it still prints a payload: `nvml_error` says why, the kernel log is read anyway.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor

from sm120check.doctor.child import emit, gpu_indices, step
from sm120check.doctor.gpu import ancestry, kernel_log, load
from sm120check.doctor.gpu.nvml_health import Nvml
from sm120check.doctor.gpu.payloads import ComputeLoad, GpuHealth, LoadResult, NodeHealth
from sm120check.doctor.nvml_api import NvmlUnavailable


def _with_load(nvml: Nvml, gpus: list[GpuHealth], size: int) -> tuple[list[GpuHealth], str]:
    """Copies one GPU at a time (GPUs behind one switch share its uplink: copying on both at once would halve what
    each reads), then the FMA kernel on every GPU at once (a server loads them all: power and thermal limits show
    under the whole node's load), each in its own thread (ctypes releases the GIL; the kernel ends by itself)."""
    step(f"dlopen {load.SONAME} and cuInit")
    try:
        cuda = load.Cuda.open()
        by_bus = cuda.device_by_bus()
    except (load.CudaUnavailable, load.CudaCallFailed) as exc:
        return gpus, str(exc)
    nvrtc, nvrtc_error = load.open_nvrtc()
    done = list(gpus)
    with contextlib.ExitStack() as held:
        loaded: list[tuple[int, int, ctypes.c_void_p]] = []  # (position in gpus, CUDA device, NVML handle)
        for pos, gpu in enumerate(gpus):
            key = load.pci_key(gpu.bus_id)
            dev = by_bus.get(key) if key is not None else None
            if dev is None:
                continue  # hidden from CUDA (CUDA_VISIBLE_DEVICES): no load, pcie_link says "idle only"
            step(f"pinned H2D/D2H copies on GPU {gpu.index} ({gpu.bus_id}, CUDA device {dev})")
            handle = nvml.handle(gpu.index)
            try:
                held.enter_context(load.held_context(cuda, dev))  # kept for the SM load: no second context start
            except load.CudaCallFailed as exc:  # no context on this GPU: both loads say why
                failed = LoadResult(None, None, size, 0, 0.0, error=str(exc))
                done[pos] = dataclasses.replace(
                    gpu, load=failed, compute=ComputeLoad(0.0, 0, 0, load.THREADS, "", error=str(exc))
                )
                continue
            done[pos] = dataclasses.replace(gpu, load=load.measure(cuda, dev, nvml, handle, size=size))
            loaded.append((pos, dev, handle))
        if loaded:
            step(
                f"FMA kernel on every SM of GPU {', '.join(str(gpus[p].index) for p, _, _ in loaded)} at once "
                "(NVRTC PTX, cuLaunchKernel), clocks sampled"
            )
            with ThreadPoolExecutor(max_workers=len(loaded), thread_name_prefix="spin") as pool:
                spins = [
                    pool.submit(load.spin, cuda, dev, nvml, handle, nvrtc, nvrtc_error) for _, dev, handle in loaded
                ]
                for (pos, _, _), spun in zip(loaded, spins, strict=True):
                    done[pos] = dataclasses.replace(done[pos], compute=spun.result())
    return done, ""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="node_health")
    parser.add_argument("--gpus", default="", help="NVML indices to read (default: all)")
    parser.add_argument("--no-load", action="store_true", help="read at rest only (no CUDA context, no copies)")
    parser.add_argument("--size-mib", type=int, default=256, help="bytes per copy, in MiB")
    parser.add_argument("--exclude-tree", type=int, default=0, help="leave out processes descending from this pid")
    args = parser.parse_args(argv)
    wanted = gpu_indices(args.gpus)

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

        def foreign(pid: int) -> bool:
            return pid != me and not (args.exclude_tree and ancestry.descends_from(pid, args.exclude_tree))

        gpus = [dataclasses.replace(g, processes=tuple(p for p in g.processes if foreign(p.pid))) for g in gpus]
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

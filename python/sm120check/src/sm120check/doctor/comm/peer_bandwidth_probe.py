"""Probe (child process): peer copy bandwidth and latency for every ordered pair of the selected GPUs
(comm/peer_copies.py), with each GPU's maximum PCIe link and NVML's NVLink status per pair. Prints one JSON line
(health.payloads.PeerAnswer); announces each step on stderr first.

    python -m sm120check.doctor.comm.peer_bandwidth_probe --gpus 0,1 [--timeout 60] [--size-mib 64]

`--gpus` are NVML indices (default: every GPU NVML lists); they are matched to CUDA devices by PCI bus id, as the
node-health probe does. Pairs run one at a time; a pair that could not finish within `--timeout` (the check passes
its own limit less 5 s) is not started and says so. NVML and libcuda load here, not in the doctor: a driver call that
blocks or crashes ends as the parent's timeout or the signal, not a hung doctor.
"""

from __future__ import annotations

import argparse
import time

from sm120check.doctor.child import emit, gpu_indices, step
from sm120check.doctor.comm import peer_copies as peer
from sm120check.doctor.gpu import load
from sm120check.doctor.gpu.nvml_health import Nvml
from sm120check.doctor.gpu.payloads import PeerAnswer
from sm120check.doctor.nvml_api import NvmlUnavailable


def measure(wanted: list[int] | None, deadline: float, settings: peer.Settings) -> PeerAnswer:
    try:
        nvml = Nvml.open(step)
    except NvmlUnavailable as exc:
        return PeerAnswer((), (), settings.latency_bytes, error=str(exc))
    try:
        indices = wanted if wanted is not None else list(range(nvml.count()))
        read = [peer.read_link(nvml, i) for i in indices]
        links = tuple(link for link, _ in read)
        handles = {link.index: handle for link, handle in read}
        nvlink = {
            (a, b): peer.nvlink_between(nvml, ha, hb) if ha is not None and hb is not None else None
            for a, ha in handles.items()
            for b, hb in handles.items()
            if a != b
        }
    except NvmlUnavailable as exc:
        return PeerAnswer((), (), settings.latency_bytes, error=str(exc))
    finally:
        nvml.close()
    step(f"dlopen {load.SONAME} and cuInit")
    try:
        cuda = load.Cuda.open()
    except load.CudaUnavailable as exc:
        gpus = [peer.PeerGpu(link.index, link.bus_id, None) for link in links]
        return PeerAnswer(peer.failed_pairs(gpus, str(exc), settings.size), links, settings.latency_bytes, str(exc))
    pairs = peer.measure_node(cuda, links, deadline=deadline, nvlink=nvlink, step=step, settings=settings)
    return PeerAnswer(pairs, links, settings.latency_bytes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sm120check.doctor.comm.peer_bandwidth_probe", description=__doc__)
    parser.add_argument("--gpus", default="", help="NVML indices, at least two (default: all)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for all pairs together")
    parser.add_argument("--size-mib", type=int, default=peer.SIZE >> 20, help="bytes per bandwidth copy, in MiB")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout
    emit(measure(gpu_indices(args.gpus), deadline, peer.Settings(size=args.size_mib << 20)).to_json())


if __name__ == "__main__":
    main()

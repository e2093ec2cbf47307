"""Probe (child process): many-to-one staggered writes (comm/stress_copies.py): each selected GPU in turn is the target
and every other selected GPU writes to it at once. Prints one JSON line (payloads.peer_stress.StressAnswer);
announces each step on stderr first.

    python -m sm120check.doctor.comm.peer_stress_probe --gpus 0,1,2,3 [--timeout 60] [--size-mib 64] [--copies 16]

`--gpus` are NVML indices (default: every GPU NVML lists), matched to CUDA devices by PCI bus id. A round that could
not finish within `--timeout` (the check passes its own limit less 5 s) is not started and says so. NVML and libcuda
load here, not in the doctor: a copy that never completes ends as the parent's timeout, not a hung doctor.
"""

from __future__ import annotations

import argparse
import time

from sm120check.doctor.child import emit, gpu_indices, step
from sm120check.doctor.comm import peer_copies as peer
from sm120check.doctor.comm import stress_copies as stress
from sm120check.doctor.comm.peer_stress_payload import StressAnswer
from sm120check.doctor.gpu import load
from sm120check.doctor.gpu.nvml_health import Nvml
from sm120check.doctor.nvml_api import NvmlUnavailable


def measure(wanted: list[int] | None, deadline: float, settings: stress.StressSettings) -> StressAnswer:
    def answer(error: str) -> StressAnswer:
        return StressAnswer((), settings.size, settings.copies, settings.stagger_s, error)

    try:
        nvml = Nvml.open(step)
    except NvmlUnavailable as exc:
        return answer(str(exc))
    try:
        indices = wanted if wanted is not None else list(range(nvml.count()))
        links = tuple(peer.read_link(nvml, i)[0] for i in indices)
    except NvmlUnavailable as exc:
        return answer(str(exc))
    finally:
        nvml.close()
    step(f"dlopen {load.SONAME} and cuInit")
    try:
        cuda = load.Cuda.open()
    except load.CudaUnavailable as exc:
        return answer(str(exc))
    targets, left_out = stress.measure_node(cuda, links, deadline=deadline, step=step, settings=settings)
    return StressAnswer(targets, settings.size, settings.copies, settings.stagger_s, left_out=left_out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sm120check.doctor.comm.peer_stress_probe", description=__doc__)
    parser.add_argument("--gpus", default="", help="NVML indices, at least two (default: all)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for all rounds together")
    parser.add_argument("--size-mib", type=int, default=stress.SIZE >> 20, help="bytes per copy, in MiB")
    parser.add_argument("--copies", type=int, default=stress.COPIES, help="copies per source under load")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout
    settings = stress.StressSettings(size=args.size_mib << 20, copies=max(1, args.copies))
    emit(measure(gpu_indices(args.gpus), deadline, settings).to_json())


if __name__ == "__main__":
    main()

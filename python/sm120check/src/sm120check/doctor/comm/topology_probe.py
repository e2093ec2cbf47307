"""Collect the evidence for the `topology` check that needs NVML or the GPU: NVML P2P status and common ancestor per
GPU pair, `nvidia-smi topo -m` and `topo -p2p r`. The IOMMU and ACS evidence is not read here: the check takes it
from the run's PCIe facts (doctor/pcie/node.py, read once by the facts step).

Run as `python -m sm120check.doctor.comm.topology_probe --gpus 0,1`; prints one TopologyEvidence
(doctor/comm/topology_payload.py) of raw evidence (the check parses and judges it with
sm120check.doctor.comm.topology_parse). Needs no torch; NVML through nvidia-ml-py when installed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

from sm120check.doctor.child import emit
from sm120check.doctor.comm.topology_payload import (
    CommandText,
    NvmlDevice,
    NvmlEvidence,
    NvmlPair,
    TopologyEvidence,
)

# NVML P2P status -> the code `nvidia-smi topo -p2p` prints.
NVML_P2P_CODES = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
NVML_P2P_CAPS = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3}
# nvmlGpuTopologyLevel_t -> `nvidia-smi topo -m` code.
NVML_TOPOLOGY = {0: "SELF", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def run_text(cmd: list[str], timeout: float = 20.0) -> CommandText:
    """A command's stdout, or why there is none (not on PATH, no answer in time, a non-zero exit)."""
    if shutil.which(cmd[0]) is None:
        return CommandText(False, error=f"{cmd[0]} not found on PATH")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return CommandText(False, error=f"`{' '.join(cmd)}` did not answer within {timeout:.0f} s")
    if proc.returncode != 0:
        return CommandText(False, error=(proc.stderr or proc.stdout).strip()[-500:] or f"exit {proc.returncode}")
    return CommandText(True, text=proc.stdout)


def _nvml(gpus: list[int]) -> NvmlEvidence:
    try:
        import pynvml
    except ImportError:
        return NvmlEvidence(False, "nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return NvmlEvidence(False, f"nvmlInit: {exc}")
    try:
        handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in gpus}
        devices = []
        for i, h in handles.items():
            name = pynvml.nvmlDeviceGetName(h)
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            devices.append(
                NvmlDevice(
                    i,
                    name.decode() if isinstance(name, bytes) else str(name),
                    bus.decode() if isinstance(bus, bytes) else str(bus),
                )
            )
        pairs = []
        for a in gpus:
            for b in gpus:
                if a >= b:
                    continue
                caps: dict[str, str] = {}
                for cap, index in NVML_P2P_CAPS.items():
                    try:
                        status = pynvml.nvmlDeviceGetP2PStatus(handles[a], handles[b], index)
                        caps[cap] = NVML_P2P_CODES.get(int(status), str(status))
                    except pynvml.NVMLError as exc:
                        caps[cap] = f"error: {exc}"
                try:
                    level = pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b])
                    ancestor = NVML_TOPOLOGY.get(int(level), str(level))
                except pynvml.NVMLError as exc:
                    ancestor = f"error: {exc}"
                pairs.append(NvmlPair((a, b), caps["read"], caps["write"], caps["nvlink"], caps["atomics"], ancestor))
        return NvmlEvidence(True, devices=tuple(devices), pairs=tuple(pairs))
    finally:
        pynvml.nvmlShutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sm120check.doctor.comm.topology_probe", description=__doc__)
    parser.add_argument("--gpus", default="", help="GPU indices (default: every GPU NVML sees)")
    ns = parser.parse_args(argv)
    gpus = [int(g) for g in ns.gpus.split(",") if g.strip()]
    if not gpus:
        gpus = _all_gpus()
    evidence = TopologyEvidence(
        tuple(gpus),
        _nvml(gpus),
        run_text(["nvidia-smi", "topo", "-m"]),
        run_text(["nvidia-smi", "topo", "-p2p", "r"]),
    )
    emit(evidence.to_json())
    return 0


def _all_gpus() -> list[int]:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return list(range(pynvml.nvmlDeviceGetCount()))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML: nvidia-smi's matrix still shows every GPU
        return []


if __name__ == "__main__":
    sys.exit(main())

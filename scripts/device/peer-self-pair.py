"""The peer-copy measurement's CUDA calls on one GPU: GPU 0 as both ends of a "pair" (a device-to-device copy
through cuMemcpyPeerAsync, events on a stream, the 4-byte latency loop, peer access refused for the same device).
Not a peer measurement: it proves the calls, the clean-up and the payload on a real GPU where only one exists.

    PYTHONPATH=python/sm120check/src python3 scripts/device/peer-self-pair.py
"""

from __future__ import annotations

import json

from sm120check.doctor.health import load, peer
from sm120check.doctor.health.nvml_health import Nvml

nvml = Nvml.open(lambda _: None)
try:
    bus = nvml.gpu(0).bus_id
finally:
    nvml.close()
cuda = load.Cuda.open()
dev = cuda.device_by_bus()[load.pci_key(bus) or (0, 0, 0)]
gpu = peer.PeerGpu(0, bus, dev)
with load.held_context(cuda, dev):
    pair = peer.measure_pair(cuda, gpu, gpu)
print(json.dumps(pair.to_json()))

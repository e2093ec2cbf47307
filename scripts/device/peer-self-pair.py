"""The peer-copy measurement's CUDA calls on one GPU: GPU 0 as both ends of a "pair" (a device-to-device copy
through cuMemcpyPeerAsync, events on a stream, the 4-byte latency loop, peer access refused for the same device).
Not a peer measurement: it proves the calls, the clean-up and the payload on a real GPU where only one exists.

    PYTHONPATH=python/sm120check/src python3 scripts/device/peer-self-pair.py
"""

from __future__ import annotations

import json

from pair_machinery import gpu_zero  # scripts/device, this script's own directory

from sm120check.doctor.comm import peer_copies as peer
from sm120check.doctor.gpu import load

cuda, gpu = gpu_zero()
assert gpu.dev is not None
with load.held_context(cuda, gpu.dev):
    pair = peer.measure_pair(cuda, gpu, gpu)
print(json.dumps(pair.to_json()))

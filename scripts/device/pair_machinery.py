"""The level-3 pair checks' machinery (issue #25) on a machine with one GPU, as far as one GPU goes. Not a peer
measurement: GPU 0 stands at both ends, so no PCIe path, IOMMU or ACS is exercised; it proves the CUDA calls, the
watchdog, the clean-up and the payloads on a real GPU and a real NCCL where only one GPU exists.

    PYTHONPATH=python/sm120check/src:scripts/device <stack venv python> scripts/device/pair_machinery.py OUTDIR

Writes OUTDIR/pair-machinery.json:
- `copy`: gpu_peer_bandwidth's measure_pair, GPU 0 to GPU 0 (write on the source's stream, read on the
  destination's, the 4-byte latency loop, peer access refused for the same device);
- `stress`: gpu_peer_stress's measure_target, GPU 0 as the target and its one source (solo, then the staggered round);
- `nccl_on` / `nccl_off`: nccl_pairs' two-rank all-reduce with both ranks on GPU 0, P2P on and NCCL_P2P_DISABLE=1
  (whatever NCCL says of two ranks on one device is the record);
- `hang`: the rank launcher's watchdog on a real stuck rank: rank 1 never joins, rank 0 waits in NCCL's rendezvous
  with a 600 s operation timeout; the watchdog must end both at 20 s and name the phase;
- `pids_left`: rank processes still alive afterwards (must be none).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from sm120check.doctor.comm import peer_copies as peer
from sm120check.doctor.comm import stress_copies as stress
from sm120check.doctor.gpu import load
from sm120check.doctor.gpu.nvml_health import Nvml
from sm120check.doctor.pcie_p2p import nccl_pair_probe as nccl_pair
from sm120check.doctor.ranks import RankContext, launch

HANG_S = 20.0


def never_join(ctx: RankContext) -> Mapping[str, object]:
    """Rank 1 sleeps where it would join the group; rank 0 is the real NCCL rank and waits for it."""
    if ctx.rank == 1:
        ctx.phase("asleep instead of joining")
        time.sleep(3600)
    return nccl_pair.rank_main(ctx)


def ranks_alive() -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, timeout=10).stdout
    return [line for line in ps.splitlines() if "sm120check.doctor.ranks" in line and "ps -eo" not in line]


def gpu_zero() -> tuple[load.Cuda, peer.PeerGpu]:
    """libcuda and GPU 0 as the pair checks name a GPU: its NVML index, bus id and CUDA device."""
    nvml = Nvml.open(lambda _: None)
    try:
        bus = nvml.gpu(0).bus_id
    finally:
        nvml.close()
    cuda = load.Cuda.open()
    return cuda, peer.PeerGpu(0, bus, cuda.device_by_bus()[load.pci_key(bus) or (0, 0, 0)])


def main(out: Path) -> int:
    cuda, gpu = gpu_zero()
    dev, bus = gpu.dev, gpu.bus_id
    assert dev is not None
    found: dict[str, object] = {"bus_id": bus}
    with load.held_context(cuda, dev):
        found["copy"] = peer.measure_pair(cuda, gpu, gpu).to_json()
    with stress.primary_contexts(cuda, [gpu]) as (contexts, problems):
        found["stress_problems"] = problems
        found["stress"] = stress.measure_target(cuda, gpu, [gpu], contexts).to_json()
    for key, p2p in (("nccl_on", True), ("nccl_off", False)):
        found[key] = nccl_pair.run_pair((0, 0), p2p, timeout=55.0).to_json()
    os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    began = time.monotonic()
    hung = launch(
        "pair_machinery:never_join", 2, {"gpus": [0, 0], "op_timeout": 600}, timeout=HANG_S, grace=5.0,
        env=nccl_pair.pair_env(True),
    )  # fmt: skip
    found["hang"] = nccl_pair.summarize((0, 0), True, hung).to_json() | {"wall_s": round(time.monotonic() - began, 1)}
    found["pids_left"] = ranks_alive()
    (out / "pair-machinery.json").write_text(json.dumps(found, indent=1), encoding="utf-8")
    print(json.dumps(found, indent=1)[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))

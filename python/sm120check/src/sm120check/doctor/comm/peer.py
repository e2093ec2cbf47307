"""Level 3: peer copy bandwidth and latency per ordered GPU pair, through the CUDA driver API in a child.

The probe (comm/peer_bandwidth_probe.py) times cuMemcpyPeerAsync copies between every ordered pair of the selected GPUs,
as writes (on a stream of the source's context) and as reads (the same copy on a stream of the destination's
context), and reads each GPU's maximum PCIe link from NVML; the verdict (node_health/verdicts.peer_bandwidth, pure) sets
the floor from the slower of the pair's two links, fails a pair whose writes collapse below half its reads
(posted-write collapse, naming the root ports above both GPUs from sysfs), warns where there is no P2P (passes with
a note on GeForce, where that is expected) and reports NVLink pairs and latency without a floor. Needs no torch: the
doctor's own interpreter runs the probe.

What of this has run on a GPU is in the GPU coverage table (scripts/coverage_table.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import ClassVar

from sm120check.doctor import remedies
from sm120check.doctor.child import ChildOutcome
from sm120check.doctor.gpu.payloads import PEER_PROBE, PeerAnswer
from sm120check.doctor.model import Context, Result
from sm120check.doctor.node_health import verdicts
from sm120check.doctor.nvml_api import Gpu
from sm120check.doctor.probecheck import Payload, ProbeCheck, child_failure, fabric_roots, geforce_of, gpu_arg

FAMILY = "comm"
PROBE_MARGIN_S = 5.0  # the probe stops starting pairs this long before the check's own limit kills it


def judge_peer(
    answer: PeerAnswer, roots: Mapping[int, str] | None = None, geforce: frozenset[int] = frozenset()
) -> Result:
    """The probe's answer as a Result (pure): the folded verdict, and per pair what the fleet view reads.
    `roots`: NVML index -> the root port above that GPU; `geforce`: GPUs whose missing P2P is expected."""
    roots = roots or {}
    verdict = verdicts.peer_bandwidth(answer, roots, geforce)
    links = {link.index: link for link in answer.links}
    pairs = [
        {
            "src": p.src,
            "dst": p.dst,
            "p2p": p.p2p,
            "gbps": p.gbps,
            "read_gbps": p.read_gbps,
            "latency_us": p.latency_us,
            "floor_gbps": verdicts.peer_floor_gbps(p, links),
            "root_ports": [roots.get(p.src, ""), roots.get(p.dst, "")],
        }
        for p in answer.pairs
    ]
    return dataclasses.replace(verdict, data={"pairs": pairs}, family=FAMILY, level=3)


class PeerBandwidth(ProbeCheck[PeerAnswer]):
    """Peer copy bandwidth (64 MiB cuMemcpyPeerAsync, median) as writes and as reads, and latency (4-byte copies,
    median) for every ordered pair of the selected GPUs, P2P on or staged through the host; floors from the slower
    GPU's PCIe link; writes below half the reads fail as posted-write collapse, naming the root ports."""

    id: ClassVar[str] = "gpu_peer_bandwidth"
    family: ClassVar[str] = FAMILY
    probe: ClassVar[str] = "sm120check.doctor.comm.peer_bandwidth_probe"
    payload: ClassVar[Payload[PeerAnswer]] = PeerAnswer
    answer: ClassVar[str] = PEER_PROBE
    what: ClassVar[str] = "the peer-copy probe"
    needs_pcie: ClassVar[bool] = True  # the root ports above the GPUs (fabric_roots)

    def args(self, ctx: Context, gpus: Sequence[Gpu], limit: float) -> list[str]:
        return ["--gpus", gpu_arg(gpus), "--timeout", str(max(5.0, limit - PROBE_MARGIN_S))]

    def failed(self, outcome: ChildOutcome, gpus: Sequence[Gpu]) -> Result:
        return child_failure(self.id, self.what, outcome, remedies.peer_probe(gpu_arg(gpus)), FAMILY)

    def judge(self, answer: PeerAnswer, ctx: Context, gpus: Sequence[Gpu]) -> Result:
        return judge_peer(answer, fabric_roots(ctx, gpus), geforce_of(gpus))


CHECKS = (PeerBandwidth,)

"""Level 3: peer copy bandwidth and latency per ordered GPU pair (issue #16), through the CUDA driver API in a child.

The probe (probes/peer_bandwidth.py) times cuMemcpyPeerAsync copies between every ordered pair of the selected GPUs
and reads each GPU's maximum PCIe link from NVML; the verdict (health/verdicts.peer_bandwidth, pure) sets the floor
from the slower of the pair's two links, warns where there is no P2P and reports NVLink pairs and latency without a
floor. Needs no torch: the doctor's own interpreter runs the probe.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from sm120check.doctor import remedies
from sm120check.doctor.checks import health as health_checks
from sm120check.doctor.checks.comm import FAMILY, PROBES, child_failure, gpu_arg, malformed, selected_gpus
from sm120check.doctor.child import run_probe
from sm120check.doctor.health import verdicts
from sm120check.doctor.health.payloads import PEER_PROBE, PeerAnswer
from sm120check.doctor.model import Context, Result
from sm120check.doctor.payloads import PayloadError

PROBE_MARGIN_S = 5.0  # the probe stops starting pairs this long before the check's own limit kills it


def judge_peer(answer: PeerAnswer) -> Result:
    """The probe's answer as a Result (pure): the folded verdict, and per pair what the fleet view reads."""
    verdict = verdicts.peer_bandwidth(answer)
    links = {link.index: link for link in answer.links}
    pairs = [
        {
            "src": p.src,
            "dst": p.dst,
            "p2p": p.p2p,
            "gbps": p.gbps,
            "latency_us": p.latency_us,
            "floor_gbps": verdicts.peer_floor_gbps(p, links),
        }
        for p in answer.pairs
    ]
    # the one Verdict -> Result bridge (the remedies table test vets its pass-through of verdict.remedy)
    result = health_checks.as_result(verdict, {"pairs": pairs})
    return dataclasses.replace(result, family=FAMILY, level=3)


class PeerBandwidth:
    """Peer copy bandwidth (64 MiB cuMemcpyPeerAsync, median) and latency (4-byte copies, median) for every ordered
    pair of the selected GPUs, P2P on or staged through the host; floors from the slower GPU's PCIe link."""

    id: ClassVar[str] = "gpu_peer_bandwidth"
    family: ClassVar[str] = FAMILY
    level: ClassVar[int] = 3
    requires: ClassVar[tuple[str, ...]] = ("driver",)
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        gpus = selected_gpus(ctx, self.id, need_torch=False)
        if isinstance(gpus, Result):
            return gpus
        selected = gpu_arg(gpus)
        budget = str(max(5.0, ctx.timeout - PROBE_MARGIN_S))
        outcome = run_probe(f"{PROBES}.peer_bandwidth", ["--gpus", selected, "--timeout", budget], timeout=ctx.timeout)
        if not outcome.ok:
            return child_failure(self.id, "the peer-copy probe", outcome, remedies.peer_probe(selected))
        try:
            answer = PeerAnswer.from_json(outcome.data)
        except PayloadError as exc:
            return malformed(self.id, PEER_PROBE, exc)
        return judge_peer(answer)


CHECKS = (PeerBandwidth,)

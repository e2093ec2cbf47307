"""Level 3, per GPU pair over PCIe: many-to-one staggered writes (`gpu_peer_stress`, family `comm`). The
per-pair write/read bandwidth is `gpu_peer_bandwidth`'s (comm/peer.py); the per-pair NCCL all-reduce under a watchdog
is `nccl_pairs`' (pcie_p2p/nccl_pairs.py).

The judge is a pure function of the probe's typed answer (comm/peer_stress_payload.py), read strictly: a malformed
answer is a fail naming the field. GeForce GPUs (no P2P with the stock driver) are what the level-1 `iommu` and
`pcie_acs` checks call "expected, P2P features off": their pairs pass with that note.

What of this has run on a GPU is in the GPU coverage table (scripts/coverage_table.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from sm120check.doctor import remedies
from sm120check.doctor.child import ChildOutcome
from sm120check.doctor.comm.peer_stress_payload import NOT_MEASURED, StressAnswer, StressTarget
from sm120check.doctor.comm.peer_stress_payload import PROBE as STRESS_PROBE
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.nvml_api import Gpu
from sm120check.doctor.probecheck import (
    GEFORCE_NOTE,
    RANK,
    Payload,
    ProbeCheck,
    child_failure,
    fabric_roots,
    geforce_of,
    gpu_arg,
    part,
)

FAMILY = "comm"

# ---- many-to-one staggered writes ---------------------------------------------------------------------------------

# The aggregate into a target against the best solo write into it (the target's own ingress): a healthy fabric
# saturates the target's link (the collapse report's CONTROL row: 52.1 GB/s together against 52.5 alone, 99 %);
# its collapsed rows carried 26 % (13.5 against 52.5). Fail below half, warn below 75 %: the fractions of the
# posted-write verdict (node_health/verdicts.WRITE_COLLAPSE_FRACTION), from the same report.
AGGREGATE_FAIL_FRACTION = 0.50
AGGREGATE_WARN_FRACTION = 0.75
# A source against its equal share of that aggregate (aggregate / sources), not against its solo rate: every source
# shares the target's link, so each is far below its solo rate on any healthy node. Nor is an equal share what a
# healthy switch gives: arbitration is per port, so sources that reach the target's switch through one upstream port
# share one port's turn (8 GPUs, 4 behind each of two switches: each remote source gets 7/16 = 44 % of an equal
# share). Ours: warn below 25 % and fail below 10 % of the equal share, under what port arbitration explains: a
# source shut out of the target, not outvoted.
SOURCE_WARN_FRACTION = 0.25
SOURCE_FAIL_FRACTION = 0.10
STRESS_MARGIN_S = 5.0  # the probe stops starting rounds this long before the check's own limit kills it


def _port(roots: Mapping[int, str], index: int) -> str:
    return f"root port {roots[index]}" if roots.get(index) else "root port unknown"


def judge_target(target: StressTarget, roots: Mapping[int, str], geforce: frozenset[int]) -> Result:
    """One round into one target (pure): the aggregate against the best solo write into it, each P2P source
    against its equal share of the aggregate."""
    t = f"GPU {target.target}"
    n = len(target.sources)
    lines = [
        f"into {t} ({target.target_bus}, {_port(roots, target.target)}) from {n} GPUs at once: aggregate "
        f"{target.aggregate_gbps} GB/s in {target.seconds} s" + (f"; {target.error}" if target.error else "")
    ]
    for s in target.sources:
        lines.append(
            f"  GPU {s.src} ({s.src_bus}, {_port(roots, s.src)}): solo {s.solo_gbps} GB/s, under load "
            f"{s.loaded_gbps} GB/s, peer access {s.access or '(not tried)'}" + (f"; {s.error}" if s.error else "")
        )
    details = "\n".join(lines)
    if target.error.startswith(NOT_MEASURED):
        return part(Status.WARN, f"{t}: {target.error}", details, remedies.PEER_STRESS_TIMEOUT)
    p2p = [s for s in target.sources if s.p2p]
    if not target.sources:
        return part(Status.SKIP, f"{t}: no other GPU wrote to it", details)
    if target.aggregate_gbps is None or target.error:
        why = target.error or "no copy was timed"
        everyone = ",".join(str(i) for i in (target.target, *(s.src for s in target.sources)))
        return part(
            Status.FAIL, f"{t}: the many-to-one writes failed: {why}", details, remedies.peer_stress_probe(everyone)
        )
    if not p2p:
        if geforce & ({target.target} | {s.src for s in target.sources}):
            return part(Status.PASS, f"{t}: {GEFORCE_NOTE}", details)
        return part(Status.SKIP, f"{t}: no source has P2P to it (gpu_peer_bandwidth says which pairs)", details)
    solos = [s.solo_gbps for s in p2p if s.solo_gbps]
    best = max(solos, default=0.0)
    aggregate = target.aggregate_gbps
    share = aggregate / n
    starved = [
        (s, s.loaded_gbps / share)
        for s in p2p
        if s.loaded_gbps is not None and s.loaded_gbps < SOURCE_WARN_FRACTION * share
    ]
    if best and aggregate < AGGREGATE_WARN_FRACTION * best:
        fraction = aggregate / best
        status = Status.FAIL if fraction < AGGREGATE_FAIL_FRACTION else Status.WARN
        limit = AGGREGATE_FAIL_FRACTION if status is Status.FAIL else AGGREGATE_WARN_FRACTION
        return part(
            status,
            f"{t}: {n} GPUs writing at once carry {aggregate:.1f} GB/s, {fraction:.0%} of the best solo write into it "
            f"({best:.1f} GB/s; {status.value} below {limit:.0%}): the fabric collapses under many-to-one load; "
            f"{_port(roots, target.target)}",
            details,
            remedies.PEER_STRESS,
        )
    if starved:
        worst = min(fraction for _, fraction in starved)
        status = Status.FAIL if worst < SOURCE_FAIL_FRACTION else Status.WARN
        named = ", ".join(
            f"GPU {s.src} {s.loaded_gbps:.1f} GB/s ({fraction:.0%} of an equal share {share:.1f}; solo "
            f"{s.solo_gbps} GB/s; {_port(roots, s.src)})"
            for s, fraction in starved
        )
        return part(
            status,
            f"{t}: under many-to-one load (aggregate {aggregate:.1f} GB/s from {n} GPUs) a source is nearly shut out: "
            f"{named}",
            details,
            remedies.PEER_STRESS,
        )
    loads = [s.loaded_gbps for s in p2p if s.loaded_gbps is not None]
    spread = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-"
    return part(Status.PASS, f"{t}: {aggregate:.1f} GB/s from {n} GPUs at once ({spread} GB/s each)", details)


def judge_stress(
    answer: StressAnswer,
    roots: Mapping[int, str] | None = None,
    geforce: frozenset[int] = frozenset(),
    selected: str = "",
) -> Result:
    """The probe's answer as one Result (pure): the worst round, the bad rounds named in the summary. `selected`:
    the GPUs the probe was given (its `--gpus`), for the remedy that reruns it."""
    check_id = "gpu_peer_stress"
    roots = roots or {}
    data: dict[str, object] = {
        "targets": [
            {
                "target": t.target,
                "aggregate_gbps": t.aggregate_gbps,
                "sources": [{"src": s.src, "solo_gbps": s.solo_gbps, "loaded_gbps": s.loaded_gbps} for s in t.sources],
            }
            for t in answer.targets
        ],
        "size_bytes": answer.size_bytes,
        "copies": answer.copies,
        "stagger_s": answer.stagger_s,
    }
    if answer.error:
        return Result(
            check_id, Status.FAIL, f"the many-to-one write probe could not measure: {answer.error}", data=data
        )
    verdicts = [judge_target(t, roots, geforce) for t in answer.targets]
    if answer.left_out:
        listed = "; ".join(answer.left_out)
        verdicts.append(
            part(
                Status.FAIL,
                f"GPUs left out of every round: {listed}",
                listed,
                remedies.peer_stress_probe(selected),
            )
        )
    if not verdicts:
        return Result(check_id, Status.SKIP, "no GPU to write to", data=data)
    worst = max(RANK[v.status] for v in verdicts)
    status = next(s for s, r in RANK.items() if r == worst)
    bad = [v for v in verdicts if v.status is status]
    details = "\n".join(v.details for v in verdicts)
    if status is Status.PASS:
        summary = (
            f"{len(verdicts)} targets, each written by every other GPU at once (starts {answer.stagger_s * 1000:.0f} "
            f"ms apart): " + "; ".join(v.summary for v in verdicts)
        )
    else:
        summary = (
            bad[0].summary
            if len(bad) == 1
            else f"{len(bad)} of {len(verdicts)} targets: " + "; ".join(v.summary for v in bad)
        )
    remedy = remedies.all_of(*(v.remedy for v in bad))
    return Result(check_id, status, summary, details, remedy=remedy, data=data)


class PeerStress(ProbeCheck[StressAnswer]):
    """Many-to-one staggered writes: each selected GPU in turn is written to by every other at once (64 MiB
    cuMemcpyPeerAsync copies on a stream of each source's context, starts 1 ms apart); the aggregate against the
    best solo write into it, each source against its equal share."""

    id: ClassVar[str] = "gpu_peer_stress"
    family: ClassVar[str] = FAMILY
    probe: ClassVar[str] = "sm120check.doctor.comm.peer_stress_probe"
    payload: ClassVar[Payload[StressAnswer]] = StressAnswer
    answer: ClassVar[str] = STRESS_PROBE
    what: ClassVar[str] = "the many-to-one write probe"
    needs_pcie: ClassVar[bool] = True  # the root ports above the GPUs (fabric_roots)

    def args(self, ctx: Context, gpus: Sequence[Gpu], limit: float) -> list[str]:
        return ["--gpus", gpu_arg(gpus), "--timeout", str(max(5.0, limit - STRESS_MARGIN_S))]

    def failed(self, outcome: ChildOutcome, gpus: Sequence[Gpu]) -> Result:
        return child_failure(self.id, self.what, outcome, remedies.peer_stress_probe(gpu_arg(gpus)), FAMILY)

    def judge(self, answer: StressAnswer, ctx: Context, gpus: Sequence[Gpu]) -> Result:
        return judge_stress(answer, fabric_roots(ctx, gpus), geforce_of(gpus), gpu_arg(gpus))


CHECKS = (PeerStress,)

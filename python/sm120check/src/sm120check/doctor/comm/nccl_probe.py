"""NCCL allreduce on every selected GPU: exact results at the verify size and at 512 KiB, 1 MiB, 4 MiB and the
64 MiB bandwidth buffer (NVIDIA/nccl#2418: NCCL 2.26.2 makes illegal memory accesses at 512 KiB and more on dual
RTX PRO 6000), latency at EAGLE-3 verify sizes, bus bandwidth at 64 MiB, and the link between the GPUs.

Run by the `nccl_allreduce` check as `python -m sm120check.doctor.comm.nccl_probe --gpus 0,1 --timeout S`; prints one
NcclAnswer (doctor/comm/nccl_payload.py). With `--correctness-only` it skips the timings (the P2P-off retry uses that).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sm120check.doctor import collective as co
from sm120check.doctor.child import emit
from sm120check.doctor.collective_payload import LaunchFacts
from sm120check.doctor.comm.nccl_payload import PROBE, Bandwidth, NcclAnswer, NcclRank, PairLink, SizeCheck, size_label
from sm120check.doctor.comm.topology_parse import parse_topo_matrix
from sm120check.doctor.comm.topology_probe import run_text
from sm120check.doctor.payload import Fields
from sm120check.doctor.ranks import RankContext, RankFailed, launch
from sm120check.doctor.stats import LatencyStats, algbw_gbps, allreduce_busbw_gbps

BANDWIDTH_BYTES = 64 * 2**20
# Exact results at these message sizes: NVIDIA/nccl#2418 starts at 512 KiB; the last is the bandwidth buffer.
CHECK_BYTES = (512 * 2**10, 2**20, 4 * 2**20, BANDWIDTH_BYTES)


def _exact(numel: int, ctx: RankContext, device: Any) -> int:
    """Allreduce a pattern whose exact sum is known; the number of elements that differ from it."""
    import torch
    import torch.distributed as dist

    got = co.pattern(numel, ctx.rank, device)
    dist.all_reduce(got)
    torch.cuda.synchronize()
    return int((got != co.expected_sum(numel, ctx.world_size, device)).sum().item())


def rank_main(ctx: RankContext) -> Mapping[str, object]:
    import torch
    import torch.distributed as dist

    args = ctx.args
    with co.process_group(ctx) as device:
        head, version = co.rank_head(device, ctx.rank), ".".join(map(str, torch.cuda.nccl.version()))
        verify = max(args["tokens"]) * args["hidden"] * 2  # bytes of bf16
        steps = [(verify, "first allreduce")] + [(n, f"allreduce {size_label(n)}") for n in CHECK_BYTES]
        sizes: list[SizeCheck] = []
        for nbytes, phase in steps:
            ctx.phase(phase)
            try:
                mismatches = _exact(nbytes // 2, ctx, device)
            except Exception as exc:  # an illegal memory access surfaces here: say at which size
                partial = NcclRank(head, version, sizes=tuple(sizes), failed_bytes=nbytes)
                message = f"allreduce of {size_label(nbytes)}: {type(exc).__name__}: {exc}"
                raise RankFailed(message, partial.to_json()) from exc
            sizes.append(SizeCheck(nbytes, mismatches == 0, mismatches))
        rank = NcclRank(head, version, sizes[0].correct, sizes[0].mismatches, tuple(sizes))
        if args.get("correctness_only"):
            return rank.to_json()
        ctx.phase("latency")
        latency: dict[str, LatencyStats] = {}
        for tokens in args["tokens"]:
            buf = co.pattern(tokens * args["hidden"], ctx.rank, device)
            op = functools.partial(dist.all_reduce, buf)
            latency[str(tokens)] = co.time_op(op, iters=args["iters"], warmup=args["warmup"])
        ctx.phase("bandwidth")
        big = torch.ones(BANDWIDTH_BYTES // 2, dtype=torch.bfloat16, device=device)
        for _ in range(3):
            dist.all_reduce(big)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        reps = 20
        start.record()
        for _ in range(reps):
            dist.all_reduce(big)
        end.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(end) / 1000.0 / reps
        bandwidth = Bandwidth(
            BANDWIDTH_BYTES,
            seconds,
            round(algbw_gbps(BANDWIDTH_BYTES, seconds), 2),
            round(allreduce_busbw_gbps(BANDWIDTH_BYTES, seconds, ctx.world_size), 2),
        )
        return replace(rank, latency_us=latency, bandwidth=bandwidth).to_json()


def links(gpus: Sequence[int], topo_m: str) -> tuple[tuple[PairLink, ...], str]:
    """Each pair's link from `nvidia-smi topo -m` text; no links and the reason when it cannot be read."""
    try:
        matrix = parse_topo_matrix(topo_m)
    except ValueError as exc:
        return (), f"nvidia-smi topo -m unreadable: {exc}"
    found = []
    for a in gpus:
        for b in gpus:
            if a < b:
                link = matrix.links.get((a, b))
                found.append(PairLink((a, b), link.code if link else "", link.kind if link else "unknown"))
    return tuple(found), ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sm120check.doctor.comm.nccl_probe", description=__doc__)
    co.common_args(parser)
    parser.add_argument("--correctness-only", action="store_true")
    ns = parser.parse_args(argv)
    args = co.rank_args(ns)
    args["correctness_only"] = ns.correctness_only
    result = launch("sm120check.doctor.comm.nccl_probe:rank_main", len(args["gpus"]), args, timeout=ns.timeout)
    ranks = tuple(NcclRank.from_json(Fields(PROBE, r.data, f"ranks[{i}]")) for i, r in enumerate(result.ranks))
    topo_m = run_text(["nvidia-smi", "topo", "-m"], timeout=5.0)  # within the 5 s the check leaves the probe
    found, why = links(args["gpus"], topo_m.text) if topo_m.ok else ((), f"nvidia-smi topo -m: {topo_m.error}")
    emit(summarize(co.launch_facts(result), ranks, found, why).to_json())
    return 0


def summarize(
    launch_facts: LaunchFacts, ranks: Sequence[NcclRank], found: tuple[PairLink, ...] = (), links_error: str = ""
) -> NcclAnswer:
    """The ranks' answers merged: correct only if every rank's every size is; the slowest rank's figures."""
    answer = NcclAnswer(launch_facts, tuple(ranks), found, links_error)
    if not launch_facts.ok:
        return answer
    merged: list[SizeCheck] = []
    for index, first in enumerate(ranks[0].sizes if ranks else ()):
        same = [r.sizes[index] for r in ranks if len(r.sizes) > index]
        merged.append(SizeCheck(first.bytes, all(s.correct for s in same), sum(s.mismatches for s in same)))
    correct = all(r.correct for r in ranks) and all(s.correct for s in merged)  # the verify size is sizes[0]
    bws = [r.bandwidth.busbw_gbps for r in ranks if r.bandwidth is not None]
    latency = co.merge_latency([r.latency_us for r in ranks if r.latency_us is not None])
    busbw = min(bws, default=None)
    return replace(answer, correct=correct, sizes=tuple(merged), latency_us=latency, busbw_gbps=busbw)


if __name__ == "__main__":
    sys.exit(main())

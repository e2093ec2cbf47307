"""NCCL allreduce on every selected GPU: exact result, latency at EAGLE-3 verify sizes, bus bandwidth at 64 MiB.

Run by the `nccl_allreduce` check as `python -m sm120check.doctor.probes.nccl --gpus 0,1 --timeout S`; prints one
JSON object. With `--correctness-only` it skips the timings (the P2P-off retry uses that).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Mapping
from typing import Any

from sm120check.comm.stats import algbw_gbps, allreduce_busbw_gbps
from sm120check.doctor.child import emit
from sm120check.doctor.probes import collective as co
from sm120check.doctor.probes.ranks import RankContext, launch

BANDWIDTH_BYTES = 64 * 2**20


def rank_main(ctx: RankContext) -> Mapping[str, Any]:
    import torch
    import torch.distributed as dist

    args = ctx.args
    with co.process_group(ctx) as device:
        data: dict[str, Any] = dict(
            co.device_info(device), rank=ctx.rank, nccl=".".join(map(str, torch.cuda.nccl.version()))
        )
        ctx.phase("first allreduce")
        numel = max(args["tokens"]) * args["hidden"]
        got = co.pattern(numel, ctx.rank, device)
        dist.all_reduce(got)
        torch.cuda.synchronize()
        want = co.expected_sum(numel, ctx.world_size, device)
        data["correct"] = bool(torch.equal(got, want))
        data["mismatches"] = int((got != want).sum().item())
        if args.get("correctness_only"):
            return data
        ctx.phase("latency")
        latency = {}
        for tokens in args["tokens"]:
            buf = co.pattern(tokens * args["hidden"], ctx.rank, device)
            op = functools.partial(dist.all_reduce, buf)
            latency[str(tokens)] = co.time_op(op, iters=args["iters"], warmup=args["warmup"])
        data["latency_us"] = latency
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
        data["bandwidth"] = {
            "bytes": BANDWIDTH_BYTES,
            "seconds": seconds,
            "algbw_gbps": round(algbw_gbps(BANDWIDTH_BYTES, seconds), 2),
            "busbw_gbps": round(allreduce_busbw_gbps(BANDWIDTH_BYTES, seconds, ctx.world_size), 2),
        }
        return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sm120check.doctor.probes.nccl", description=__doc__)
    co.common_args(parser)
    parser.add_argument("--correctness-only", action="store_true")
    ns = parser.parse_args(argv)
    args = co.rank_args(ns)
    args["correctness_only"] = ns.correctness_only
    result = launch("sm120check.doctor.probes.nccl:rank_main", len(args["gpus"]), args, timeout=ns.timeout)
    out = summarize(
        result.ok,
        result.timed_out,
        result.problem,
        result.seconds,
        [dict(r.data) for r in result.ranks],
        result.shm_removed,
    )
    out["evidence"] = result.evidence
    emit(out)
    return 0


def summarize(
    ok: bool, timed_out: bool, problem: str, seconds: float, ranks: list[dict[str, Any]], shm_removed: tuple[str, ...]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ok": ok,
        "timed_out": timed_out,
        "problem": problem,
        "seconds": round(seconds, 2),
        "ranks": ranks,
        "shm_removed": list(shm_removed),
    }
    if ok:
        out["correct"] = all(r.get("correct") for r in ranks)
        out["latency_us"] = co.merge_latency(ranks, "latency_us")
        bws = [r["bandwidth"]["busbw_gbps"] for r in ranks if r.get("bandwidth")]
        if bws:
            out["busbw_gbps"] = min(bws)
    return out


if __name__ == "__main__":
    sys.exit(main())

"""Rank-side helpers shared by the NCCL, symmetric-memory and allreduce-fusion probes (torch imported inside).

Every probe uses the same shapes: EAGLE-3 verify steps allreduce 1, 3 or 8 tokens of hidden 7168 in bf16.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sm120check.doctor.collective_payload import LaunchFacts, RankHead
from sm120check.doctor.ranks import Launch, RankContext
from sm120check.doctor.stats import LatencyStats, latency_stats

HIDDEN = 7168
TOKENS = (1, 3, 8)


def multicast_forbidden(env: Mapping[str, str] | None = None) -> bool:
    """Never let a probe use NVLink multicast where the node forbids it (TORCH_SYMM_MEM_DISABLE_MULTICAST set,
    NCCL_NVLS_ENABLE=0)."""
    env = os.environ if env is None else env
    disabled = env.get("TORCH_SYMM_MEM_DISABLE_MULTICAST", "") not in ("", "0")
    nvls_off = env.get("NCCL_NVLS_ENABLE", "") == "0"
    return disabled or nvls_off


def common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", default="0,1", help="GPU indices, one rank each (default 0,1)")
    parser.add_argument("--timeout", type=float, default=110.0, help="hard limit for all ranks, seconds")
    parser.add_argument("--iters", type=int, default=200, help="timed iterations per size")
    parser.add_argument("--warmup", type=int, default=20, help="untimed iterations per size")
    parser.add_argument("--hidden", type=int, default=HIDDEN)
    parser.add_argument("--tokens", default=",".join(str(t) for t in TOKENS), help="token counts, comma separated")


def rank_args(ns: argparse.Namespace) -> dict[str, Any]:
    gpus = [int(g) for g in ns.gpus.split(",") if g.strip()]
    if len(gpus) < 2:
        raise SystemExit(f"--gpus {ns.gpus!r}: a collective needs at least two GPUs")
    return {
        "gpus": gpus,
        "iters": ns.iters,
        "warmup": ns.warmup,
        "hidden": ns.hidden,
        "tokens": [int(t) for t in ns.tokens.split(",") if t.strip()],
        "op_timeout": max(10.0, ns.timeout - 5),
    }


@contextmanager
def process_group(ctx: RankContext) -> Iterator[Any]:
    """NCCL process group on this rank's GPU; destroyed on the way out, also on failure."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    device = torch.device("cuda", int(ctx.args["gpus"][ctx.rank]))
    torch.cuda.set_device(device)
    ctx.phase("init_process_group")
    dist.init_process_group(
        "nccl",
        init_method=ctx.init_method,
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=timedelta(seconds=float(ctx.args.get("op_timeout", 60))),
        device_id=device,
    )
    try:
        yield device
    finally:
        ctx.phase("destroy_process_group")
        dist.destroy_process_group()


def pattern(numel: int, rank: int, device: Any) -> Any:
    """Small integers, different on every rank, whose sums are exact in bf16 (|sum| <= 8 x world size)."""
    import torch

    index = torch.arange(numel, device=device, dtype=torch.int64)
    return (((index + 3 * rank) % 17) - 8).to(torch.bfloat16)


def expected_sum(numel: int, world_size: int, device: Any) -> Any:
    import torch

    total = torch.zeros(numel, device=device, dtype=torch.int64)
    index = torch.arange(numel, device=device, dtype=torch.int64)
    for rank in range(world_size):
        total += ((index + 3 * rank) % 17) - 8
    return total.to(torch.bfloat16)


def time_op(op: Callable[[], object], *, iters: int, warmup: int) -> LatencyStats:
    """Per-call latency with CUDA events around every call; stats in microseconds."""
    import torch

    for _ in range(warmup):
        op()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record()
        op()
        end.record()
    torch.cuda.synchronize()
    return rounded(latency_stats([start.elapsed_time(end) * 1000.0 for start, end in events]))


def rounded(stats: LatencyStats) -> LatencyStats:
    """To 0.01 us, as the payloads print them."""
    return LatencyStats(
        stats.n,
        round(stats.median_us, 2),
        round(stats.p10_us, 2),
        round(stats.p90_us, 2),
        round(stats.mean_us, 2),
        round(stats.min_us, 2),
    )


def rel_error(got: Any, want: Any) -> float:
    """max |got - want| / max |want|, in fp32."""
    diff = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item() or 1.0
    return float(diff / scale)


def device_info(device: Any) -> dict[str, object]:
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return {"device": int(device.index), "name": torch.cuda.get_device_name(device), "cc": f"{major}.{minor}"}


def rank_head(device: Any, rank: int) -> RankHead:
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return RankHead(rank, int(device.index), torch.cuda.get_device_name(device), f"{major}.{minor}")


def merge_latency(per_rank: Sequence[Mapping[str, LatencyStats]]) -> dict[str, float]:
    """Slowest rank's median per token count: a collective is as fast as its slowest rank."""
    merged: dict[str, float] = {}
    for latency in per_rank:
        for tokens, one in latency.items():
            merged[tokens] = max(merged.get(tokens, 0.0), one.median_us)
    return merged


def launch_facts(result: Launch) -> LaunchFacts:
    return LaunchFacts(
        result.ok, result.timed_out, result.problem, round(result.seconds, 2), result.shm_removed, result.evidence
    )

"""torch symmetric memory: rendezvous, multicast_ptr, one-shot and two-shot allreduce against NCCL, and latency.

Run by the `symm_mem` check as `python -m sm120check.doctor.comm.symm_mem_probe --gpus 0,1 --timeout S`; prints one
SymmMemAnswer (doctor/comm/symm_mem_payload.py). Multimem
allreduce runs only where the handle has a multicast pointer and neither TORCH_SYMM_MEM_DISABLE_MULTICAST nor
NCCL_NVLS_ENABLE=0 forbids multicast.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from sm120check.doctor import collective as co
from sm120check.doctor.child import emit
from sm120check.doctor.collective_payload import LaunchFacts
from sm120check.doctor.comm.symm_mem_payload import PROBE, SymmMemAnswer, SymmRank, SymmSize
from sm120check.doctor.payload import Fields
from sm120check.doctor.ranks import RankContext, launch

T = TypeVar("T")


def rank_main(ctx: RankContext) -> Mapping[str, object]:
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    args = ctx.args
    with co.process_group(ctx) as device:
        group = dist.group.WORLD
        group_name = group.group_name
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:  # needed before torch 2.9, harmless after
            enable(group_name)
        nvshmem = _optional(lambda: bool(symm_mem.is_nvshmem_available()))
        backend = _optional(lambda: str(symm_mem.get_backend(device)))
        ops = torch.ops.symm_mem
        allow_multimem = not co.multicast_forbidden()
        multicast_ptr = 0
        sizes: dict[str, SymmSize] = {}
        for tokens in args["tokens"]:
            numel = tokens * args["hidden"]
            ctx.phase(f"rendezvous {tokens} tokens")
            buf = symm_mem.empty(numel, dtype=torch.bfloat16, device=device)
            handle = symm_mem.rendezvous(buf, group)
            multicast_ptr = int(handle.multicast_ptr)
            want = co.expected_sum(numel, ctx.world_size, device)
            ref = co.pattern(numel, ctx.rank, device)
            dist.all_reduce(ref)
            nccl_ok = bool(torch.equal(ref, want))
            ctx.phase(f"one-shot {tokens} tokens")
            buf.copy_(co.pattern(numel, ctx.rank, device))
            one = ops.one_shot_all_reduce(buf, "sum", group_name)
            one_ok = bool(torch.equal(one, ref))
            ctx.phase(f"two-shot {tokens} tokens")
            buf.copy_(co.pattern(numel, ctx.rank, device))
            ops.two_shot_all_reduce_(buf, "sum", group_name)
            two_ok = bool(torch.equal(buf, ref))
            multimem = allow_multimem and handle.multicast_ptr != 0
            multimem_ok = None
            if multimem:
                ctx.phase(f"multimem {tokens} tokens")
                buf.copy_(co.pattern(numel, ctx.rank, device))
                ops.multimem_all_reduce_(buf, "sum", group_name)
                multimem_ok = bool(torch.equal(buf, ref))
            ctx.phase(f"latency {tokens} tokens")
            timing = {"iters": args["iters"], "warmup": args["warmup"]}
            nccl_buf = co.pattern(numel, ctx.rank, device)
            latency = {
                "nccl": co.time_op(functools.partial(dist.all_reduce, nccl_buf), **timing),
                "one_shot": co.time_op(functools.partial(ops.one_shot_all_reduce, buf, "sum", group_name), **timing),
                "two_shot": co.time_op(functools.partial(ops.two_shot_all_reduce_, buf, "sum", group_name), **timing),
            }
            if multimem:
                latency["multimem"] = co.time_op(
                    functools.partial(ops.multimem_all_reduce_, buf, "sum", group_name), **timing
                )
            sizes[str(tokens)] = SymmSize(nccl_ok, one_ok, two_ok, latency, multimem_ok)
            del handle
        torch.cuda.synchronize()
        head = co.rank_head(device, ctx.rank)
        return SymmRank(head, torch.__version__, nvshmem, backend, multicast_ptr, allow_multimem, sizes).to_json()


def _optional(read: Callable[[], T]) -> T | str:
    """A fact only some torch releases can tell (is_nvshmem_available 2.8+, get_backend 2.9+)."""
    try:
        return read()
    except Exception as exc:  # absent API or backend: report it, never fail the probe for it
        return f"unavailable: {type(exc).__name__}"


def summarize(launch_facts: LaunchFacts, ranks: Sequence[SymmRank], env: Mapping[str, str]) -> SymmMemAnswer:
    """The ranks merged: a path is correct only if it was at every size on every rank; the slowest median."""
    answer = SymmMemAnswer(launch_facts, tuple(ranks), env)
    if not launch_facts.ok:
        return answer
    correct: dict[str, bool] = {}
    latency: dict[str, dict[str, float]] = {}
    for r in ranks:
        for tokens, entry in r.sizes.items():
            for op, ok in entry.correct.items():
                correct[op] = correct.get(op, True) and ok
            for op, stats in entry.latency_us.items():
                per = latency.setdefault(op, {})
                per[tokens] = max(per.get(tokens, 0.0), stats.median_us)
    return replace(
        answer,
        multicast_ptr=tuple(r.multicast_ptr or 0 for r in ranks),
        multimem_allowed=all(r.multimem_allowed for r in ranks),
        correct=correct,
        latency_us=latency,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sm120check.doctor.comm.symm_mem_probe", description=__doc__)
    co.common_args(parser)
    ns = parser.parse_args(argv)
    args = co.rank_args(ns)
    result = launch("sm120check.doctor.comm.symm_mem_probe:rank_main", len(args["gpus"]), args, timeout=ns.timeout)
    ranks = tuple(SymmRank.from_json(Fields(PROBE, r.data, f"ranks[{i}]")) for i, r in enumerate(result.ranks))
    env = {k: os.environ.get(k, "") for k in ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "NCCL_NVLS_ENABLE", "TORCH_SYMMMEM")}
    emit(summarize(co.launch_facts(result), ranks, env).to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())

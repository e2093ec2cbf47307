"""torch symmetric memory: rendezvous, multicast_ptr, one-shot and two-shot allreduce against NCCL, and latency.

Run by the `symm_mem` check as `python -m sm120check.doctor.probes.symm_mem --gpus 0,1 --timeout S`. Multimem
allreduce runs only where the handle has a multicast pointer and neither TORCH_SYMM_MEM_DISABLE_MULTICAST nor
NCCL_NVLS_ENABLE=0 forbids multicast.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from sm120check.doctor.child import emit
from sm120check.doctor.probes import collective as co
from sm120check.doctor.probes.ranks import RankContext, launch


def rank_main(ctx: RankContext) -> Mapping[str, Any]:
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
        data: dict[str, Any] = dict(co.device_info(device), rank=ctx.rank, torch=torch.__version__)
        data["nvshmem_available"] = _optional(lambda: bool(symm_mem.is_nvshmem_available()))
        data["backend"] = _optional(lambda: str(symm_mem.get_backend(device)))
        ops = torch.ops.symm_mem
        allow_multimem = not co.multicast_forbidden()
        sizes: dict[str, Any] = {}
        for tokens in args["tokens"]:
            numel = tokens * args["hidden"]
            ctx.phase(f"rendezvous {tokens} tokens")
            buf = symm_mem.empty(numel, dtype=torch.bfloat16, device=device)
            handle = symm_mem.rendezvous(buf, group)
            data["multicast_ptr"] = int(handle.multicast_ptr)
            want = co.expected_sum(numel, ctx.world_size, device)
            ref = co.pattern(numel, ctx.rank, device)
            dist.all_reduce(ref)
            entry: dict[str, Any] = {"nccl_matches_reference": bool(torch.equal(ref, want))}
            ctx.phase(f"one-shot {tokens} tokens")
            buf.copy_(co.pattern(numel, ctx.rank, device))
            one = ops.one_shot_all_reduce(buf, "sum", group_name)
            entry["one_shot_correct"] = bool(torch.equal(one, ref))
            ctx.phase(f"two-shot {tokens} tokens")
            buf.copy_(co.pattern(numel, ctx.rank, device))
            ops.two_shot_all_reduce_(buf, "sum", group_name)
            entry["two_shot_correct"] = bool(torch.equal(buf, ref))
            multimem = allow_multimem and handle.multicast_ptr != 0
            if multimem:
                ctx.phase(f"multimem {tokens} tokens")
                buf.copy_(co.pattern(numel, ctx.rank, device))
                ops.multimem_all_reduce_(buf, "sum", group_name)
                entry["multimem_correct"] = bool(torch.equal(buf, ref))
            ctx.phase(f"latency {tokens} tokens")
            timing = {"iters": args["iters"], "warmup": args["warmup"]}
            nccl_buf = co.pattern(numel, ctx.rank, device)
            entry["latency_us"] = {
                "nccl": co.time_op(functools.partial(dist.all_reduce, nccl_buf), **timing),
                "one_shot": co.time_op(functools.partial(ops.one_shot_all_reduce, buf, "sum", group_name), **timing),
                "two_shot": co.time_op(functools.partial(ops.two_shot_all_reduce_, buf, "sum", group_name), **timing),
            }
            if multimem:
                entry["latency_us"]["multimem"] = co.time_op(
                    functools.partial(ops.multimem_all_reduce_, buf, "sum", group_name), **timing
                )
            sizes[str(tokens)] = entry
            del handle
        data["sizes"] = sizes
        data["multimem_allowed"] = allow_multimem
        torch.cuda.synchronize()
        return data


def _optional(read: Callable[[], object]) -> object:
    """A fact only some torch releases can tell (is_nvshmem_available 2.8+, get_backend 2.9+)."""
    try:
        return read()
    except Exception as exc:  # absent API or backend: report it, never fail the probe for it
        return f"unavailable: {type(exc).__name__}"


def summarize(launch_ok: bool, problem: str, seconds: float, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": launch_ok, "problem": problem, "seconds": round(seconds, 2), "ranks": ranks}
    if not launch_ok:
        return out
    out["multicast_ptr"] = [r.get("multicast_ptr", 0) for r in ranks]
    out["multimem_allowed"] = all(r.get("multimem_allowed") for r in ranks)
    correct: dict[str, bool] = {}
    latency: dict[str, dict[str, float]] = {}
    for r in ranks:
        for tokens, entry in dict(r.get("sizes") or {}).items():
            for key, value in entry.items():
                if key.endswith("_correct"):
                    op = key[: -len("_correct")]
                    correct[op] = correct.get(op, True) and bool(value)
            for op, stats in dict(entry.get("latency_us") or {}).items():
                per = latency.setdefault(op, {})
                per[tokens] = max(per.get(tokens, 0.0), float(stats["median_us"]))
    out["correct"] = correct
    out["latency_us"] = latency
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sm120check.doctor.probes.symm_mem", description=__doc__)
    co.common_args(parser)
    ns = parser.parse_args(argv)
    args = co.rank_args(ns)
    result = launch("sm120check.doctor.probes.symm_mem:rank_main", len(args["gpus"]), args, timeout=ns.timeout)
    out = summarize(result.ok, result.problem, result.seconds, [dict(r.data) for r in result.ranks])
    out.update(timed_out=result.timed_out, shm_removed=list(result.shm_removed), evidence=result.evidence)
    out["env"] = {
        k: os.environ.get(k, "") for k in ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "NCCL_NVLS_ENABLE", "TORCH_SYMMMEM")
    }
    emit(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Stand-ins for the two-rank NCCL all-reduce of the `nccl_pairs` check (this machine has no GPU, no torch CUDA, no
NCCL): rank functions for the rank launcher, and a probe that never prints. Each is as thin as the one call it
replaces (`dist.all_reduce` that never returns, a rank NCCL aborts, a probe wedged in an import); imported by the
rank and probe subprocesses through PYTHONPATH."""

from __future__ import annotations

import os
import time
from typing import Any

from sm120check.doctor.ranks import RankContext

FOREVER_S = 3600  # longer than any test waits: only the watchdog ends it
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _answer(ctx: RankContext) -> dict[str, Any]:
    unset = [k for k, v in MULTICAST_OFF.items() if os.environ.get(k) != v]
    if unset:
        raise RuntimeError(f"multicast not off in the rank's environment: {unset}")
    return {"device": ctx.args["gpus"][ctx.rank], "nccl": "2.28.9", "mismatches": 0, "busbw_gbps": 8.4 + ctx.rank}


def hangs_with_p2p(ctx: RankContext) -> dict[str, Any]:
    """A rank on a node whose IOMMU translates peer DMA: with P2P the first all-reduce never returns; with
    NCCL_P2P_DISABLE=1 it does."""
    ctx.phase("first allreduce")
    if os.environ.get("NCCL_P2P_DISABLE") != "1":
        time.sleep(FOREVER_S)  # stands in for dist.all_reduce(...) hanging
    return _answer(ctx)


def hangs_always(ctx: RankContext) -> dict[str, Any]:
    ctx.phase("first allreduce")
    time.sleep(FOREVER_S)  # stands in for dist.all_reduce(...) hanging with P2P and without
    return {}


def exits_non_zero(ctx: RankContext) -> dict[str, Any]:
    ctx.phase("init_process_group")
    os._exit(3)  # stands in for NCCL aborting the rank inside init_process_group


def finishes(ctx: RankContext) -> dict[str, Any]:
    ctx.phase("first allreduce")
    return _answer(ctx)


if __name__ == "__main__":
    time.sleep(FOREVER_S)  # stands in for a probe child wedged before it prints anything (a driver call at import)

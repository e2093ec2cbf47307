"""Probe (child process): a two-rank NCCL all-reduce on one GPU pair under the rank launcher's watchdog, with P2P on
or with NCCL_P2P_DISABLE=1 (`--p2p-off`), for the level-3 check `nccl_pairs`. Prints one PairRun
(pcie_p2p/nccl_pair_payload.py).

    python -m sm120check.doctor.pcie_p2p.nccl_pair_probe --gpus 0,1 [--timeout 55] [--p2p-off]

Each rank (`rank_main`, torch imported inside) joins an NCCL process group on its GPU, all-reduces a pattern whose
exact sum is known (1 MiB of bf16; the first all-reduce is where the IOMMU/ACS hang of vllm#33041 and
rtx6kpro#15 sits), then times `BANDWIDTH_REPEATS` all-reduces of 64 MiB for the bus bandwidth. The launcher
(ranks.py) runs the two ranks in their own sessions and kills them at `--timeout`: the run then says it
hung, for how long and in which phase. Every process keeps NVLink multicast off (`MULTICAST_OFF_ENV`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping

from sm120check.doctor import collective as co
from sm120check.doctor.child import emit
from sm120check.doctor.payload import Fields, PayloadError
from sm120check.doctor.pcie_p2p.nccl_pair_payload import PROBE, PairRank, PairRun
from sm120check.doctor.ranks import Launch, RankContext, launch
from sm120check.doctor.stats import allreduce_busbw_gbps

TARGET = "sm120check.doctor.pcie_p2p.nccl_pair_probe:rank_main"
CHECK_BYTES = 1 << 20
BANDWIDTH_BYTES = 64 << 20
BANDWIDTH_REPEATS = 5
GRACE_S = 5.0  # after one rank fails, the other (likely stuck in the collective) gets this long
# NVLink multicast stays off in every rank, as in every other probe of the doctor (NVLS, torch symmetric memory's
# multicast, NVSHMEM's NVLS).
MULTICAST_OFF_ENV: Mapping[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def pair_env(p2p: bool) -> dict[str, str]:
    """The environment every process of a run gets on top of the doctor's: multicast off, and P2P off for the
    second run."""
    return {**MULTICAST_OFF_ENV, **({} if p2p else {"NCCL_P2P_DISABLE": "1"})}


def rank_main(ctx: RankContext) -> Mapping[str, object]:
    import torch
    import torch.distributed as dist

    with co.process_group(ctx) as device:
        version = ".".join(map(str, torch.cuda.nccl.version()))
        ctx.phase("first allreduce")
        got = co.pattern(CHECK_BYTES // 2, ctx.rank, device)
        dist.all_reduce(got)
        torch.cuda.synchronize()
        mismatches = int((got != co.expected_sum(CHECK_BYTES // 2, ctx.world_size, device)).sum().item())
        ctx.phase("bandwidth")
        big = torch.ones(BANDWIDTH_BYTES // 2, dtype=torch.bfloat16, device=device)
        dist.all_reduce(big)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(BANDWIDTH_REPEATS):
            dist.all_reduce(big)
        end.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(end) / 1000.0 / BANDWIDTH_REPEATS
        busbw = round(allreduce_busbw_gbps(BANDWIDTH_BYTES, seconds, ctx.world_size), 2)
        return PairRank(int(device.index), version, mismatches, busbw).to_json()


def summarize(gpus: tuple[int, int], p2p: bool, result: Launch) -> PairRun:
    """The launch as one run: finished only when both ranks delivered an exact sum. A rank's answer is read
    strictly; one that does not fit its type makes the run a failure naming the field."""
    ranks: list[PairRank] = []
    problem = result.problem
    for i, rank in enumerate(result.ranks):
        try:
            ranks.append(PairRank.from_json(Fields(PROBE, dict(rank.data), f"ranks[{i}]")))
        except PayloadError as exc:
            problem = problem or f"rank {i} answered malformed: {exc}"
    wrong = sum(r.mismatches or 0 for r in ranks)
    delivered = result.ok and len(ranks) == 2 and all(r.mismatches is not None for r in ranks) and not problem
    if delivered and wrong:
        problem = f"the all-reduce returned {wrong} wrong element(s) of {CHECK_BYTES >> 20} MiB"
    rates = [r.busbw_gbps for r in ranks if r.busbw_gbps is not None]
    return PairRun(
        gpus,
        p2p,
        finished=delivered and not wrong,
        hung=result.timed_out,
        seconds=round(result.seconds, 2),
        problem=problem,
        nccl=next((r.nccl for r in ranks if r.nccl), ""),
        busbw_gbps=min(rates) if len(rates) == 2 else None,
        evidence=result.evidence[-3000:],
    )


def run_pair(
    gpus: tuple[int, int], p2p: bool, *, timeout: float, target: str = TARGET, python: str | None = None
) -> PairRun:
    """Both ranks of one pair under the watchdog: every rank is gone when this returns."""
    args = {"gpus": list(gpus), "op_timeout": max(10.0, timeout - 5)}
    result = launch(target, 2, args, timeout=timeout, grace=GRACE_S, env=pair_env(p2p), python=python)
    return summarize(gpus, p2p, result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sm120check.doctor.pcie_p2p.nccl_pair_probe", description=__doc__)
    parser.add_argument("--gpus", required=True, help="two NVML indices, a,b")
    parser.add_argument("--timeout", type=float, default=55.0, help="hard limit for both ranks, seconds")
    parser.add_argument("--p2p-off", action="store_true", help="run with NCCL_P2P_DISABLE=1")
    parser.add_argument("--target", default=TARGET, help="the rank function, module:function (default: the NCCL one)")
    ns = parser.parse_args(argv)
    try:
        a, b = (int(part) for part in ns.gpus.split(","))
    except ValueError:
        raise SystemExit(f"--gpus {ns.gpus!r}: expected two NVML indices such as 0,1") from None
    if a == b:
        raise SystemExit(f"--gpus {ns.gpus!r}: the two GPUs must differ")
    emit(run_pair((a, b), not ns.p2p_off, timeout=ns.timeout, target=ns.target).to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())

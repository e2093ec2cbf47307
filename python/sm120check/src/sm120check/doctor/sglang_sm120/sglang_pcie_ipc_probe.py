"""Rank side of SGLang's own PCIe-IPC all-reduce (0.5.22+, `srt/distributed/device_communicators/pcie_ipc_ar.py`),
run inside the `sglang_comm` probe's ranks: the communicator a server builds for its `tp` group when
`SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1`.

Calls only what the release defines (tests/unit/doctor/test_sglang_pcie_ipc.py reads 0.5.22's and 0.5.23's sources):
`PcieIpcCommunicator(group, device, cpu_group=)`, `prepare(hidden=, max_rows=)` (builds and autotunes the workspace
as the server's warm-up does), `max_numel`, `should_pcie_ipc_ar`, `pcie_ipc_all_reduce`, `destroy`. Per row count:
whether the communicator takes the reduction, whether its sum equals the exact one (small integers, exact in bf16),
and its latency against NCCL's all_reduce on the same tensor.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from sm120check.doctor import collective as co
from sm120check.doctor.ranks import RankContext

MODULE = "sglang.srt.distributed.device_communicators.pcie_ipc_ar"
# The widest decode reduction a server sizes the workspace for: max_bs x draft tokens rows. 64 requests x 4 draft
# tokens by default (SGLang's fallback decode width is 64 rows); the probe's --pcie-ipc-rows sets it.
DEFAULT_ROWS = 256
ITERS, WARMUP = 50, 10  # per size and backend: enough for a median, bounded under the probe's timeout


def run(ctx: RankContext, device: Any, cpu_group: Any, captured: Any) -> dict[str, Any]:
    """The communicator on this rank: built or not (SGLang's log says why), then each row count's check."""
    import torch.distributed as dist

    try:
        module = importlib.import_module(MODULE)
    except ImportError as exc:  # a release before 0.5.22, or its FlashInfer import failing at module level
        return {"present": False, "reason": _text(exc)}
    hidden = int(ctx.args["hidden"])
    rows = int(ctx.args.get("pcie_ipc_rows") or DEFAULT_ROWS)
    ctx.phase("PcieIpcCommunicator")
    comm = None
    with captured(MODULE) as log:
        try:
            comm = module.PcieIpcCommunicator(dist.group.WORLD, device, cpu_group=cpu_group)
            if not comm.disabled:
                ctx.phase("PcieIpcCommunicator.prepare")
                comm.prepare(hidden=hidden, max_rows=rows)
        except Exception as exc:  # SGLang's build or warm-up raised: this part's answer, not the whole probe's
            _release(comm)
            return {"present": True, "disabled": True, "rows": rows, "error": _text(exc), "log": log.lines}
    out: dict[str, Any] = {"present": True, "disabled": bool(comm.disabled), "rows": rows, "checks": []}
    out["max_numel"] = int(getattr(comm, "max_numel", 0) or 0)
    try:
        if comm.disabled:
            return out
        with captured(MODULE) as checks_log:
            for tokens in sorted({*(int(t) for t in ctx.args["tokens"]), rows}):
                try:
                    out["checks"].append(_check(ctx, comm, tokens, hidden, device))
                except Exception as exc:  # a reduction that faults: wrong at this size, and the rest not tried
                    out["checks"].append({"tokens": tokens, "taken": True, "exact": False, "error": _text(exc)})
                    break
        log.lines.extend(checks_log.lines)
    finally:
        out["log"] = log.lines
        _release(comm)
    return out


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def _release(comm: Any) -> None:
    """Destroy the communicator and wait for the device; after a CUDA fault both may raise again, which is already
    reported."""
    import torch

    try:
        if comm is not None and not comm.disabled:
            comm.destroy()
        torch.cuda.synchronize()
    except Exception:  # the fault that caused it is the answer
        pass


def _check(ctx: RankContext, comm: Any, tokens: int, hidden: int, device: Any) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    x = co.pattern(tokens * hidden, ctx.rank, device).view(tokens, hidden)
    if not comm.should_pcie_ipc_ar(x):
        return {"tokens": tokens, "taken": False}
    ctx.phase(f"pcie_ipc all_reduce {tokens} rows")
    want = co.expected_sum(tokens * hidden, ctx.world_size, device).view(tokens, hidden)
    got = comm.pcie_ipc_all_reduce(x.clone())
    torch.cuda.synchronize()
    exact = got is not None and bool(torch.equal(got, want))
    entry: dict[str, Any] = {"tokens": tokens, "taken": True, "exact": exact}
    if exact:
        ipc = co.time_op(functools.partial(comm.pcie_ipc_all_reduce, x), iters=ITERS, warmup=WARMUP)
        y = x.clone()
        nccl = co.time_op(functools.partial(dist.all_reduce, y), iters=ITERS, warmup=WARMUP)
        entry |= {"pcie_ipc_us": ipc.median_us, "nccl_us": nccl.median_us}
    return entry

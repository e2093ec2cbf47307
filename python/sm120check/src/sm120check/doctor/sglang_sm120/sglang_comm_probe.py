"""SGLang's own communication code on this node's GPUs: what a server started here will turn on, and why not.

Run by the `sglang_comm` check as `python -m sm120check.doctor.sglang_sm120.sglang_comm_probe --gpus 0,1 --timeout S`,
with the stack venv's interpreter (its SGLang, patched or not, is what the server imports). One rank per GPU:
1. workspace preflight (0.5.13+): `_preflight_check_workspace_memory` from `srt/layers/flashinfer_comm_fusion.py`,
   called as `FlashInferWorkspaceManager.initialize` calls it (the sizes, the `cuMemCreate` probe, the vote on a
   CPU group), with SGLang's log captured: False means the server skips allreduce fusion, and says why;
2. `TorchSymmMemCommunicator` (two GPUs or more): disabled or not, SGLang's log line when disabled, and its
   all_reduce against NCCL at verify sizes (1-8 tokens x hidden) and at 512 KiB and more;
3. `PcieIpcCommunicator` (0.5.22+, two GPUs or more; sglang_pcie_ipc_probe.py): its workspace for the decode
   width (`--pcie-ipc-rows`, max_bs x draft tokens), exact sums at decode sizes and its latency against NCCL;
4. fusion (two GPUs or more, preflight passed): SGLang's `FlashInferWorkspaceManager` creates the workspace and
   `flashinfer_allreduce_residual_rmsnorm` runs one fused allreduce + residual + RMSNorm against the unfused torch
   reference. That function reads the server's published parallel state; a bare process group has none, so the
   probe answers those three reads (`get_parallel`, `get_resources`, `get_exec`) as a `--tp-size N` server would
   publish them: a stand-in for the server's state, named `ServerState` here, and nothing else.
With one GPU only the preflight runs (tensor parallelism needs two; the preflight's decision is the same).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sm120check.doctor import collective as co
from sm120check.doctor.child import emit
from sm120check.doctor.payload import Fields
from sm120check.doctor.ranks import RankContext, launch
from sm120check.doctor.sglang_sm120 import sglang_pcie_ipc_probe as sglang_pcie_ipc
from sm120check.doctor.sglang_sm120.sglang_comm_payload import PROBE, SglangCommAnswer, SglangRank

FUSION_MODULE = "sglang.srt.layers.flashinfer_comm_fusion"
SYMM_MODULE = "sglang.srt.distributed.device_communicators.torch_symm_mem"
MAX_TOKENS = 2048  # SGLang's default max_token_num for the fusion workspace
LARGE = (262144, 1 << 20)  # bf16 elements: 512 KiB and 2 MiB messages
RMS_EPS = 1e-6
FUSION_TOLERANCE = 2e-2
SYMM_TOLERANCE = 0.0625  # two bf16 ulps at the sums of the patterns; two-shot and NCCL usually agree exactly
# SGLang 0.5.23 sizes the communicator's buffer for its Inkling custom allreduce from the server's published
# config, which a bare process group lacks; off, the buffer keeps the capability map's size (what the check is
# about). The check sets it in the ranks' environment.
SGLANG_ENV = {"SGLANG_OPT_USE_INKLING_CUSTOM_AR": "false"}


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.INFO:
            self.lines.append(f"{record.levelname}: {record.getMessage()}"[:500])


@contextmanager
def captured(module_name: str) -> Iterator[_Capture]:
    handler = _Capture()
    log = logging.getLogger(module_name)
    old = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(old)


class ServerState:
    """What `get_parallel()`, `get_resources()` and `get_exec()` answer in a `--tp-size N` server (stand-in): the
    parallel leaves, the group coordinator (`tp_group`, `attn_tp_group`), the resources' buffers and `exec.comm`."""

    nnodes = 1
    flashinfer_allreduce_fusion_backend = "auto"

    def __init__(self, world_size: int, rank: int, device_group: Any, cpu_group: Any) -> None:
        self.world_size = self.tp_size = self.attn_tp_size = world_size
        self.rank = self.rank_in_group = self.attn_tp_rank = rank
        self.device_group, self.cpu_group = device_group, cpu_group
        self.tp_group = self.attn_tp_group = self.comm = self
        self.buffers: dict[str, Any] = {}


def _preflight(mod: Any, ctx: RankContext, cpu_group: Any) -> dict[str, Any]:
    import torch

    fn = getattr(mod, "_preflight_check_workspace_memory", None)
    if fn is None:
        return {"present": False}
    out: dict[str, Any] = {"present": True}
    sizes_fn = getattr(mod, "_flashinfer_trtllm_workspace_allocation_sizes", None)
    hidden = int(ctx.args["hidden"])
    if sizes_fn is not None:
        try:
            cuda_driver = mod.get_cuda_driver_bindings()
            prop = mod._make_flashinfer_workspace_allocation_prop(cuda_driver)
            out["sizes"] = [
                int(s) for s in sizes_fn(cuda_driver, prop, ctx.world_size, MAX_TOKENS, hidden, torch.bfloat16)
            ]
        except Exception as exc:  # the very failure SGLang turns into "Skipping allreduce fusion"
            out["sizes_error"] = f"{type(exc).__name__}: {exc}"[:500]
    ctx.phase("workspace preflight")
    with captured(FUSION_MODULE) as log:
        out["ok"] = bool(
            fn(
                world_size=ctx.world_size,
                max_token_num=MAX_TOKENS,
                hidden_dim=hidden,
                dtype=torch.bfloat16,
                cpu_group=cpu_group,
            )
        )
    out["log"] = log.lines
    return out


def _symm(ctx: RankContext, device: Any) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    ctx.phase("TorchSymmMemCommunicator")
    with captured(SYMM_MODULE) as log:
        module = importlib.import_module(SYMM_MODULE)
        comm = module.TorchSymmMemCommunicator(dist.group.WORLD, device)
    out: dict[str, Any] = {"disabled": bool(comm.disabled), "log": log.lines, "checks": []}
    if comm.disabled:
        return out
    hidden = int(ctx.args["hidden"])
    sizes = [t * hidden for t in ctx.args["tokens"]] + list(LARGE)
    gen = torch.Generator(device=device).manual_seed(1234 + ctx.rank)
    for numel in sizes:
        ctx.phase(f"symm all_reduce {numel}")
        x = torch.randn(numel, device=device, dtype=torch.bfloat16, generator=gen)
        ref = x.clone()
        dist.all_reduce(ref)
        should = getattr(comm, "should_torch_symm_mem_allreduce", None)
        got = comm.all_reduce(x) if should is None or should(x) else None
        torch.cuda.synchronize()
        if got is None:
            out["checks"].append({"elements": numel, "ran": False})
            continue
        diff = float((got.float() - ref.float()).abs().max().item())
        out["checks"].append({"elements": numel, "ran": True, "max_abs_diff": diff, "ok": diff <= SYMM_TOLERANCE})
    return out


def _fusion(mod: Any, ctx: RankContext, device: Any, cpu_group: Any) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    fused = getattr(mod, "flashinfer_allreduce_residual_rmsnorm", None)
    if fused is None or not all(hasattr(mod, n) for n in ("get_parallel", "get_resources", "get_exec")):
        return {"ran": False, "reason": "this release's fusion function does not read the runtime context probed here"}
    state = ServerState(ctx.world_size, ctx.rank, dist.group.WORLD, cpu_group)
    saved = {n: getattr(mod, n) for n in ("get_parallel", "get_resources", "get_exec")}
    mod.get_parallel = lambda: state
    mod.get_resources = lambda: state
    mod.get_exec = lambda: state
    hidden = int(ctx.args["hidden"])
    out: dict[str, Any] = {"ran": True, "max_rel_err": {}}
    try:
        with captured(FUSION_MODULE) as log:
            gen = torch.Generator(device=device).manual_seed(4321)
            weight = torch.randn(hidden, device=device, dtype=torch.bfloat16, generator=gen)
            for tokens in ctx.args["tokens"]:
                ctx.phase(f"fused allreduce+rmsnorm {tokens} tokens")
                x = co.pattern(tokens * hidden, ctx.rank, device).view(tokens, hidden) / 8
                residual = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16, generator=gen)
                reduced = x.clone()
                dist.all_reduce(reduced)
                want_res = reduced.float() + residual.float()
                want = want_res * torch.rsqrt(want_res.pow(2).mean(-1, keepdim=True) + RMS_EPS) * weight.float()
                try:
                    norm, res = fused(x.clone(), residual.clone(), weight, RMS_EPS, MAX_TOKENS)
                except Exception as exc:  # e.g. _resolve_backend's "requires SM90 or SM10X" on an unpatched SM120
                    out.update(ran=False, reason=f"{type(exc).__name__}: {exc}"[:500])
                    break
                torch.cuda.synchronize()
                if norm is None:
                    out["ran"] = False
                    out["reason"] = "SGLang's function returned no result (fusion unavailable)"
                    break
                out["max_rel_err"][str(tokens)] = max(co.rel_error(norm, want), co.rel_error(res, want_res))
        out["log"] = log.lines
        out["unavailable"] = bool(getattr(mod, "_flashinfer_allreduce_unavailable", False))
    finally:
        for name, value in saved.items():
            setattr(mod, name, value)
    return out


def rank_main(ctx: RankContext) -> Mapping[str, Any]:
    import torch.distributed as dist

    with co.process_group(ctx) as device:
        import sglang

        data: dict[str, Any] = dict(co.device_info(device), rank=ctx.rank, sglang=getattr(sglang, "__version__", "?"))
        data["sglang_path"] = str(getattr(sglang, "__file__", ""))
        cpu_group = dist.new_group(backend="gloo")
        ctx.phase(f"import {FUSION_MODULE}")
        mod = importlib.import_module(FUSION_MODULE)
        data["preflight"] = _preflight(mod, ctx, cpu_group)
        if ctx.world_size >= 2:
            data["symm_mem"] = _symm(ctx, device)
            data["pcie_ipc"] = sglang_pcie_ipc.run(ctx, device, cpu_group, captured)
            faulted = any("error" in c for c in data["pcie_ipc"].get("checks", ()))
            if faulted:  # a CUDA fault poisons this process: the fused run would only fail on it
                data["fusion"] = {"ran": False, "reason": "not run: SGLang's PCIe-IPC all-reduce raised before it"}
            elif data["preflight"].get("ok", True):
                data["fusion"] = _fusion(mod, ctx, device, cpu_group)
        dist.barrier()
        return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sm120check.doctor.sglang_sm120.sglang_comm_probe", description=__doc__
    )
    co.common_args(parser)
    parser.add_argument(
        "--pcie-ipc-rows",
        type=int,
        default=sglang_pcie_ipc.DEFAULT_ROWS,
        help="rows of the widest decode reduction (max_bs x draft tokens) the PCIe-IPC workspace is sized for",
    )
    ns = parser.parse_args(argv)
    if ns.pcie_ipc_rows < 1:
        raise SystemExit(f"--pcie-ipc-rows {ns.pcie_ipc_rows}: expected a row count of 1 or more")
    gpus = [int(g) for g in ns.gpus.split(",") if g.strip()]
    args = {
        "gpus": gpus,
        "hidden": ns.hidden,
        "tokens": [int(t) for t in ns.tokens.split(",") if t.strip()],
        "pcie_ipc_rows": ns.pcie_ipc_rows,
        "op_timeout": max(10.0, ns.timeout - 5),
    }
    os.environ.update(SGLANG_ENV)  # the ranks inherit it
    result = launch("sm120check.doctor.sglang_sm120.sglang_comm_probe:rank_main", len(gpus), args, timeout=ns.timeout)
    ranks = tuple(SglangRank.from_json(Fields(PROBE, dict(r.data), f"ranks[{i}]")) for i, r in enumerate(result.ranks))
    answer = SglangCommAnswer(
        result.ok, result.problem, result.timed_out, round(result.seconds, 2), ranks, result.evidence
    )
    emit(answer.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""FlashInfer allreduce fusion (allreduce + residual add + RMSNorm) against the unfused torch reference.

Run by the `allreduce_fusion` check as `python -m sm120check.doctor.comm.fusion_probe --gpus 0,1 --timeout S`.
Rank 0 first builds (or finds cached) the JIT modules, timed, with `sm120check.jitcache.build` (the one builder,
modules side by side, prebuilt AOT modules taken as they are) before any rank touches a workspace; then every
rank creates the workspace, runs pattern kARResidualRMSNorm at each size against NCCL allreduce + add + RMSNorm
in torch, and times fused against unfused. Where FlashInfer has PcieIpcAllReduceWorkspace (0.7.0+) its
allreduce is checked and timed as well. Prints one FusionAnswer (doctor/comm/fusion_payload.py).

`--warm` builds the modules in this process only (no ranks, no GPU needed when FLASHINFER_CUDA_ARCH_LIST is
set) and reports per module whether it was cached and how long the build took. The flashinfer_jit role does not use
it: it runs `python -m sm120check.jitcache build`, the same builder, per cache key.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sm120check.doctor import collective as co
from sm120check.doctor.child import emit
from sm120check.doctor.collective_payload import LaunchFacts
from sm120check.doctor.comm.fusion_payload import (
    PROBE,
    FusionAnswer,
    FusionRank,
    FusionSize,
    FusionWarm,
    JitBuild,
    JitEnvironment,
    JitModule,
    PcieRank,
    PcieSize,
    PcieSummary,
)
from sm120check.doctor.payload import Fields
from sm120check.doctor.ranks import RankContext, launch
from sm120check.jitcache import build as builder
from sm120check.jitcache import modules as jit_modules

MAX_TOKENS = 128
RMS_EPS = 1e-6


def _build(modules: list[str]) -> JitBuild:
    def say(line: str) -> None:  # stdout carries the one JSON result
        print(line, file=sys.stderr, flush=True)

    outcomes = builder.build(modules, progress=say, use_prebuilt=True, parallel=True)
    view = builder.flashinfer_view()
    environment = JitEnvironment(view.arch_list_env, tuple(view.targets), view.jit_dir, view.workspace_base_env)
    return JitBuild(tuple(JitModule(**dataclasses.asdict(o)) for o in outcomes), environment)


def rank_main(ctx: RankContext) -> Mapping[str, object]:
    args = ctx.args
    jit = None
    if ctx.rank == 0:
        ctx.phase("jit build")
        jit = _build(list(args["modules"]) or _default_modules(bool(args["pcie"])))
    with co.process_group(ctx) as device:
        import flashinfer
        import flashinfer.comm as fc
        import torch
        import torch.distributed as dist

        backend = args["backend"]
        if backend == "auto" and co.multicast_forbidden():
            backend = "trtllm"  # "auto" picks MNNVL (NVLink multicast) where the attribute says it could
        ctx.phase("create workspace")
        ws = fc.create_allreduce_fusion_workspace(
            backend=backend,
            world_size=ctx.world_size,
            rank=ctx.rank,
            max_token_num=MAX_TOKENS,
            hidden_dim=args["hidden"],
            dtype=torch.bfloat16,
            group=dist.group.WORLD,
        )
        timing = {"iters": args["iters"], "warmup": args["warmup"]}
        hidden = args["hidden"]
        sizes: dict[str, FusionSize] = {}
        try:
            for tokens in args["tokens"]:
                ctx.phase(f"fusion {tokens} tokens")
                x, residual, gamma = _inputs(tokens, hidden, ctx.rank, device)
                reduced = x.clone()
                dist.all_reduce(reduced)
                pre = reduced.float() + residual.float()
                norm_ref = pre * torch.rsqrt(pre.pow(2).mean(-1, keepdim=True) + RMS_EPS) * gamma.float()
                residual_out = torch.empty_like(x)
                norm_out = torch.empty_like(x)
                fused = functools.partial(
                    fc.allreduce_fusion,
                    input=x.clone(),
                    workspace=ws,
                    pattern=fc.AllReduceFusionPattern.kARResidualRMSNorm,
                    launch_with_pdl=False,
                    residual_in=residual,
                    residual_out=residual_out,
                    norm_out=norm_out,
                    rms_gamma=gamma,
                    rms_eps=RMS_EPS,
                )
                fused()
                torch.cuda.synchronize()
                residual_err = co.rel_error(residual_out, pre.to(torch.bfloat16))
                norm_err = co.rel_error(norm_out, norm_ref.to(torch.bfloat16))
                scratch = x.clone()

                def unfused(scratch: Any = scratch, residual: Any = residual, gamma: Any = gamma) -> Any:
                    dist.all_reduce(scratch)
                    summed = scratch + residual
                    return torch.nn.functional.rms_norm(summed, (hidden,), gamma, RMS_EPS)

                ctx.phase(f"latency {tokens} tokens")
                fused_us, unfused_us = co.time_op(fused, **timing), co.time_op(unfused, **timing)
                sizes[str(tokens)] = FusionSize(residual_err, norm_err, fused_us, unfused_us)
        finally:
            destroy = getattr(ws, "destroy", None)
            if destroy is not None:
                destroy()
        pcie, pcie_error = None, None
        if args["pcie"] and hasattr(fc, "PcieIpcAllReduceWorkspace"):
            try:  # the workspace raises on every rank together, so no rank is left waiting
                pcie = _pcie_ipc(ctx, fc, device, timing)
            except Exception as exc:
                pcie_error = f"{type(exc).__name__}: {exc}"
        torch.cuda.synchronize()
        head = co.rank_head(device, ctx.rank)
        made = (str(getattr(ws, "backend", "")), type(ws).__name__)  # the backend and workspace FlashInfer chose
        answer = FusionRank(head, jit, flashinfer.__version__, backend, *made, sizes, pcie, pcie_error)
    return answer.to_json()


def _inputs(tokens: int, hidden: int, rank: int, device: Any) -> tuple[Any, Any, Any]:
    import torch

    mine = torch.Generator().manual_seed(1000 * tokens + rank)
    shared = torch.Generator().manual_seed(7 * tokens)
    x = torch.randn(tokens, hidden, generator=mine).to(device=device, dtype=torch.bfloat16)
    residual = torch.randn(tokens, hidden, generator=shared).to(device=device, dtype=torch.bfloat16)
    gamma = (1.0 + 0.1 * torch.randn(hidden, generator=shared)).to(device=device, dtype=torch.bfloat16)
    return x, residual, gamma


def _pcie_ipc(ctx: RankContext, fc: Any, device: Any, timing: Mapping[str, int]) -> PcieRank:
    import torch
    import torch.distributed as dist

    hidden = ctx.args["hidden"]
    ctx.phase("pcie_ipc workspace")
    ws = fc.PcieIpcAllReduceWorkspace(
        group=dist.group.WORLD, max_numel=max(ctx.args["tokens"]) * hidden, dtype=torch.bfloat16
    )
    sizes: dict[str, PcieSize] = {}
    try:
        for tokens in ctx.args["tokens"]:
            x = co.pattern(tokens * hidden, ctx.rank, device)
            if not ws.supports(x):
                sizes[str(tokens)] = PcieSize(False)
                continue
            ctx.phase(f"pcie_ipc {tokens} tokens")
            want = x.clone()
            dist.all_reduce(want)
            got = ws.all_reduce(x)
            torch.cuda.synchronize()
            correct = bool(torch.equal(got, want))
            sizes[str(tokens)] = PcieSize(True, correct, co.time_op(functools.partial(ws.all_reduce, x), **timing))
    finally:
        ws.destroy()
    return PcieRank(str(getattr(ws, "profile", "")), sizes)


def summarize(launch_facts: LaunchFacts, ranks: Sequence[FusionRank]) -> FusionAnswer:
    """The ranks merged: the worst relative error and the slowest median per token count."""
    jit = next((r.jit for r in ranks if r.jit is not None), None)
    answer = FusionAnswer(launch_facts, tuple(ranks), jit)
    if not launch_facts.ok or not ranks:
        return answer
    first = ranks[0]
    errors: dict[str, float] = {}
    fused: dict[str, float] = {}
    unfused: dict[str, float] = {}
    for r in ranks:
        for tokens, entry in r.sizes.items():
            errors[tokens] = max(errors.get(tokens, 0.0), entry.residual_rel_err, entry.norm_rel_err)
            fused[tokens] = max(fused.get(tokens, 0.0), entry.fused.median_us)
            unfused[tokens] = max(unfused.get(tokens, 0.0), entry.unfused.median_us)
    pcie_errors = [r.pcie_ipc_error for r in ranks if r.pcie_ipc_error]
    pcie = [r.pcie_ipc for r in ranks if r.pcie_ipc is not None]
    summary = PcieSummary(pcie_errors[0]) if pcie_errors else None
    if pcie:
        correct, latency = True, dict[str, float]()
        for p in pcie:
            for tokens, size in p.sizes.items():
                if size.supported and size.latency_us is not None:
                    correct = correct and bool(size.correct)
                    latency[tokens] = max(latency.get(tokens, 0.0), size.latency_us.median_us)
        summary = PcieSummary(None, pcie[0].profile, correct, latency)
    return replace(
        answer,
        flashinfer=first.flashinfer,
        backend=first.backend,
        workspace=first.workspace,
        max_rel_err=errors,
        fused_us=fused,
        unfused_us=unfused,
        pcie_ipc=summary,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sm120check.doctor.comm.fusion_probe", description=__doc__)
    co.common_args(parser)
    parser.add_argument("--backend", default="auto", choices=("auto", "trtllm", "mnnvl"))
    parser.add_argument("--no-pcie", dest="pcie", action="store_false", help="skip PcieIpcAllReduceWorkspace")
    parser.add_argument(
        "--modules", default="", help="JIT modules to build first (default: trtllm_comm, pcie_ipc_comm)"
    )
    parser.add_argument("--warm", action="store_true", help="only build the JIT modules here, then exit")
    ns = parser.parse_args(argv)
    modules = [m for m in ns.modules.split(",") if m]  # empty: rank 0 picks what this FlashInfer has
    if ns.warm:
        try:
            emit(FusionWarm(True, _build(modules or _default_modules(ns.pcie))).to_json())
        except Exception as exc:  # reported, not raised: the caller reads one JSON line
            emit(FusionWarm(False, problem=f"{type(exc).__name__}: {exc}").to_json())
        return 0
    args = co.rank_args(ns)
    args.update(backend=ns.backend, pcie=ns.pcie, modules=modules)
    result = launch("sm120check.doctor.comm.fusion_probe:rank_main", len(args["gpus"]), args, timeout=ns.timeout)
    ranks = tuple(FusionRank.from_json(Fields(PROBE, r.data, f"ranks[{i}]")) for i, r in enumerate(result.ranks))
    emit(summarize(co.launch_facts(result), ranks).to_json())
    return 0


def _default_modules(pcie: bool) -> list[str]:
    """The serving modules this FlashInfer provides (pcie_ipc_comm only with the PCIe IPC check)."""
    wanted = [m for m in jit_modules.SERVING if pcie or m != "pcie_ipc_comm"]
    return jit_modules.available(wanted)


if __name__ == "__main__":
    sys.exit(main())

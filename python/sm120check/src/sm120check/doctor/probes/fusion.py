"""FlashInfer allreduce fusion (allreduce + residual add + RMSNorm) against the unfused torch reference.

Run by the `allreduce_fusion` check as `python -m sm120check.doctor.probes.fusion --gpus 0,1 --timeout S`.
Rank 0 first builds (or finds cached) the JIT modules, timed, with `sm120check.jitcache.build` (the one builder,
modules side by side, prebuilt AOT modules taken as they are) before any rank touches a workspace; then every
rank creates the workspace, runs pattern kARResidualRMSNorm at each size against NCCL allreduce + add + RMSNorm
in torch, and times fused against unfused. Where FlashInfer has PcieIpcAllReduceWorkspace (0.7.0+) its
allreduce is checked and timed as well.

`--warm` builds the modules in this process only (no ranks, no GPU needed when FLASHINFER_CUDA_ARCH_LIST is
set) and reports per module whether it was cached and how long the build took. The flashinfer_jit role does not use
it: it runs `python -m sm120check.jitcache build`, the same builder, per cache key.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from collections.abc import Mapping
from typing import Any

from sm120check.doctor.child import emit
from sm120check.doctor.probes import collective as co
from sm120check.doctor.probes.ranks import RankContext, launch
from sm120check.jitcache import build as builder
from sm120check.jitcache import modules as jit_modules

MAX_TOKENS = 128
RMS_EPS = 1e-6


def _build(modules: list[str]) -> dict[str, Any]:
    def say(line: str) -> None:  # stdout carries the one JSON result
        print(line, file=sys.stderr, flush=True)

    outcomes = builder.build(modules, progress=say, use_prebuilt=True, parallel=True)
    return {
        "modules": [dataclasses.asdict(o) for o in outcomes],
        "environment": dataclasses.asdict(builder.flashinfer_view()),
    }


def rank_main(ctx: RankContext) -> Mapping[str, Any]:
    args = ctx.args
    data: dict[str, Any] = {"rank": ctx.rank}
    if ctx.rank == 0:
        ctx.phase("jit build")
        data["jit"] = _build(list(args["modules"]) or _default_modules(bool(args["pcie"])))
    with co.process_group(ctx) as device:
        import flashinfer
        import flashinfer.comm as fc
        import torch
        import torch.distributed as dist

        data.update(co.device_info(device), flashinfer=flashinfer.__version__)
        backend = args["backend"]
        if backend == "auto" and co.multicast_forbidden():
            backend = "trtllm"  # "auto" picks MNNVL (NVLink multicast) where the attribute says it could
        data["backend_requested"] = backend
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
        data["backend"] = str(getattr(ws, "backend", ""))
        data["workspace"] = type(ws).__name__
        timing = {"iters": args["iters"], "warmup": args["warmup"]}
        hidden = args["hidden"]
        sizes: dict[str, Any] = {}
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
                entry: dict[str, Any] = {
                    "residual_rel_err": co.rel_error(residual_out, pre.to(torch.bfloat16)),
                    "norm_rel_err": co.rel_error(norm_out, norm_ref.to(torch.bfloat16)),
                }
                scratch = x.clone()

                def unfused(scratch: Any = scratch, residual: Any = residual, gamma: Any = gamma) -> Any:
                    dist.all_reduce(scratch)
                    summed = scratch + residual
                    return torch.nn.functional.rms_norm(summed, (hidden,), gamma, RMS_EPS)

                ctx.phase(f"latency {tokens} tokens")
                entry["latency_us"] = {"fused": co.time_op(fused, **timing), "unfused": co.time_op(unfused, **timing)}
                sizes[str(tokens)] = entry
        finally:
            destroy = getattr(ws, "destroy", None)
            if destroy is not None:
                destroy()
        data["sizes"] = sizes
        if args["pcie"] and hasattr(fc, "PcieIpcAllReduceWorkspace"):
            try:  # the workspace raises on every rank together, so no rank is left waiting
                data["pcie_ipc"] = _pcie_ipc(ctx, fc, device, timing)
            except Exception as exc:
                data["pcie_ipc_error"] = f"{type(exc).__name__}: {exc}"
        torch.cuda.synchronize()
    return data


def _inputs(tokens: int, hidden: int, rank: int, device: Any) -> tuple[Any, Any, Any]:
    import torch

    mine = torch.Generator().manual_seed(1000 * tokens + rank)
    shared = torch.Generator().manual_seed(7 * tokens)
    x = torch.randn(tokens, hidden, generator=mine).to(device=device, dtype=torch.bfloat16)
    residual = torch.randn(tokens, hidden, generator=shared).to(device=device, dtype=torch.bfloat16)
    gamma = (1.0 + 0.1 * torch.randn(hidden, generator=shared)).to(device=device, dtype=torch.bfloat16)
    return x, residual, gamma


def _pcie_ipc(ctx: RankContext, fc: Any, device: Any, timing: Mapping[str, int]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    hidden = ctx.args["hidden"]
    ctx.phase("pcie_ipc workspace")
    ws = fc.PcieIpcAllReduceWorkspace(
        group=dist.group.WORLD, max_numel=max(ctx.args["tokens"]) * hidden, dtype=torch.bfloat16
    )
    out: dict[str, Any] = {"profile": str(getattr(ws, "profile", "")), "sizes": {}}
    try:
        for tokens in ctx.args["tokens"]:
            x = co.pattern(tokens * hidden, ctx.rank, device)
            if not ws.supports(x):
                out["sizes"][str(tokens)] = {"supported": False}
                continue
            ctx.phase(f"pcie_ipc {tokens} tokens")
            want = x.clone()
            dist.all_reduce(want)
            got = ws.all_reduce(x)
            torch.cuda.synchronize()
            out["sizes"][str(tokens)] = {
                "supported": True,
                "correct": bool(torch.equal(got, want)),
                "latency_us": co.time_op(functools.partial(ws.all_reduce, x), **timing),
            }
    finally:
        ws.destroy()
    return out


def summarize(launch_ok: bool, problem: str, seconds: float, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": launch_ok, "problem": problem, "seconds": round(seconds, 2), "ranks": ranks}
    jit = next((r["jit"] for r in ranks if r.get("jit")), None)
    if jit:
        out["jit"] = jit
    if not launch_ok:
        return out
    first = ranks[0]
    out.update(backend=first.get("backend"), workspace=first.get("workspace"), flashinfer=first.get("flashinfer"))
    errors: dict[str, float] = {}
    latency: dict[str, dict[str, float]] = {"fused": {}, "unfused": {}}
    for r in ranks:
        for tokens, entry in dict(r.get("sizes") or {}).items():
            errors[tokens] = max(errors.get(tokens, 0.0), entry["residual_rel_err"], entry["norm_rel_err"])
            for kind in ("fused", "unfused"):
                stats = entry["latency_us"][kind]
                latency[kind][tokens] = max(latency[kind].get(tokens, 0.0), float(stats["median_us"]))
    out["max_rel_err"] = errors
    out["latency_us"] = latency
    pcie_errors = [str(r["pcie_ipc_error"]) for r in ranks if r.get("pcie_ipc_error")]
    if pcie_errors:
        out["pcie_ipc"] = {"error": pcie_errors[0]}
    pcie = [r["pcie_ipc"] for r in ranks if r.get("pcie_ipc")]
    if pcie:
        merged: dict[str, Any] = {"profile": pcie[0].get("profile"), "correct": True, "latency_us": {}}
        for p in pcie:
            for tokens, entry in p["sizes"].items():
                if entry.get("supported"):
                    merged["correct"] = merged["correct"] and entry["correct"]
                    old = merged["latency_us"].get(tokens, 0.0)
                    merged["latency_us"][tokens] = max(old, float(entry["latency_us"]["median_us"]))
        out["pcie_ipc"] = merged
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sm120check.doctor.probes.fusion", description=__doc__)
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
            emit({"ok": True, **_build(modules or _default_modules(ns.pcie))})
        except Exception as exc:  # reported, not raised: the caller reads one JSON line
            emit({"ok": False, "problem": f"{type(exc).__name__}: {exc}"})
        return 0
    args = co.rank_args(ns)
    args.update(backend=ns.backend, pcie=ns.pcie, modules=modules)
    result = launch("sm120check.doctor.probes.fusion:rank_main", len(args["gpus"]), args, timeout=ns.timeout)
    out = summarize(result.ok, result.problem, result.seconds, [dict(r.data) for r in result.ranks])
    out.update(timed_out=result.timed_out, shm_removed=list(result.shm_removed), evidence=result.evidence)
    emit(out)
    return 0


def _default_modules(pcie: bool) -> list[str]:
    """The serving modules this FlashInfer provides (pcie_ipc_comm only with the PCIe IPC check)."""
    wanted = [m for m in jit_modules.SERVING if pcie or m != "pcie_ipc_comm"]
    return jit_modules.available(wanted)


if __name__ == "__main__":
    sys.exit(main())

"""Level 1: FlashInfer's JIT modules are cached for this node, so no server start waits minutes compiling them.

FlashInfer 0.7.x compiles a module on its first use and runs ninja over the module's directory on every later load;
a module is cached when that run has nothing to do, or when FlashInfer has it prebuilt (AOT). This check asks ninja
(`ninja -n`, compiles nothing) for each serving module this FlashInfer provides for the node's GPUs
(`jitcache.modules.for_release`), in the cache the serving process uses (`jitcache.layout`, with the manifest's
environment overridden by this process's), and prices the missing ones with `jitcache.cost`.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from sm120check.doctor import remedies, stackenv
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.probecheck import capability
from sm120check.jitcache import bundle, cost, layout
from sm120check.jitcache import modules as jit_modules
from sm120check.jitcache.ninja import NO_NINJA, NinjaVerdict, dry_run, find_ninja

FAMILY = "flashinfer_jit"


def flashinfer_version(ctx: Context) -> str:
    """flashinfer-python's version in the stack venv ("" if absent): a fact, read once before the checks."""
    return ctx.facts.flashinfer


def serving_env(ctx: Context, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a server in the stack venv sees: the manifest's values, unless the process sets its own."""
    manifest_env = dict(ctx.manifest.env) if ctx.manifest is not None else {}
    return {**manifest_env, **dict(os.environ if environ is None else environ)}


def aot_dirs(ctx: Context) -> list[Path]:
    """Where the stack's FlashInfer keeps prebuilt (AOT) modules, which it loads without ninja or a compile."""
    dirs = [site / "flashinfer" / "data" / "aot" for site in stackenv.site_packages(ctx.facts.venv)]
    if ctx.manifest is None or not ctx.manifest.venv:  # the running interpreter is the stack (PYTHONPATH counts)
        spec = importlib.util.find_spec("flashinfer")
        for location in (spec.submodule_search_locations or []) if spec else []:
            dirs.append(Path(location) / "data" / "aot")
    return dirs


def module_rows(
    root: Path, version: str, arch: str, modules: Sequence[str], ninja: str | None, aot: Sequence[Path] = ()
) -> list[dict[str, Any]]:
    rows = []
    for name in modules:
        prebuilt = next((layout.aot_library(d, name) for d in aot if layout.aot_library(d, name).is_file()), None)
        if prebuilt is not None:
            why = f"prebuilt (AOT) library {prebuilt}: FlashInfer loads it without ninja or a compile"
            rows.append({"module": name, "cached": True, "dir": str(prebuilt.parent), "why": why, "from": "aot"})
            continue
        directory = layout.module_dir(root, version, arch, name)
        library = directory / f"{name}.so"
        if not library.is_file():
            verdict = NinjaVerdict(False, 0, (f"{library} is missing",), whole=True)
        elif ninja is None:
            verdict = NinjaVerdict(False, 0, (NO_NINJA,))
        else:
            verdict = dry_run(directory, ninja)
        stamp = bundle.read_stamp(directory)
        rows.append(
            {
                "module": name,
                "cached": verdict.clean,
                "dir": str(directory),
                "why": verdict.summary() if verdict.whole or ninja else verdict.reasons[0],
                "from": stamp.get("built_on", ""),
            }
        )
    return rows


def judge(rows: Sequence[Mapping[str, Any]], where: str, arch: str, flashinfer: str | None = None) -> Result:
    missing = [r for r in rows if not r["cached"]]
    data: dict[str, Any] = {"cache": where, "modules": [dict(r) for r in rows]}
    if not missing:
        names = ", ".join(str(r["module"]) for r in rows)
        return _result(Status.PASS, f"{names} cached in {where}: a load compiles nothing", data=data)
    wait = cost.estimate((str(r["module"]) for r in missing), arch, flashinfer)
    data.update(
        blocking_seconds_min=wait.low,
        blocking_seconds_max=wait.high,
        blocking_seconds_measured=wait.measured,
        blocking_seconds_sources=cost.sources(str(r["module"]) for r in missing),
    )
    names = ", ".join(str(r["module"]) for r in missing)
    return _result(
        Status.WARN,
        f"{names} not cached for this node: the first server start blocks {wait.phrase()} compiling",
        details="\n".join(f"{r['module']}: {r['why']}" for r in rows),
        remedy=remedies.FLASHINFER_JIT,
        data=data,
    )


def _result(status: Status, summary: str, **kw: Any) -> Result:
    return Result("flashinfer_jit", status, summary, family=FAMILY, level=1, **kw)


class FlashinferJitCheck:
    """FlashInfer's JIT modules (allreduce fusion, PCIe IPC allreduce) are cached for this node's FlashInfer, CUDA
    target and paths, so the first server start does not block minutes compiling them."""

    id: ClassVar[str] = "flashinfer_jit"
    family: ClassVar[str] = FAMILY
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ()
    uses: ClassVar[tuple[str, ...]] = ()
    needs_nvml: ClassVar[bool] = True  # the JIT target is the GPUs' capability (NVML's list), even run alone

    def run(self, ctx: Context) -> Result:
        version = flashinfer_version(ctx)
        if not version:
            return _result(Status.SKIP, "FlashInfer is not installed in the stack venv: nothing to cache")
        env = serving_env(ctx)
        caps = [capability(g) for g in ctx.facts.gpus or ()]  # the GPUs NVML listed, whatever the driver's verdict
        arch_list = env.get(layout.ARCH_LIST_ENV) or None
        if not arch_list and not caps:
            return _result(
                Status.SKIP,
                "no GPU seen and FLASHINFER_CUDA_ARCH_LIST unset: the JIT target is unknown",
                remedy=remedies.CUDA_ENV,
            )
        try:
            targets = layout.jit_targets(caps, arch_list)
            majors = layout.target_majors(targets)
        except ValueError as exc:
            return _result(Status.FAIL, str(exc), remedy=remedies.CUDA_ENV)
        try:
            wanted = jit_modules.for_release(version, majors)
        except ValueError as exc:
            return _result(Status.FAIL, str(exc), remedy=remedies.PYTHON_STACK)
        if not wanted:
            shown = " ".join(targets)
            return _result(Status.SKIP, f"FlashInfer {version} has no serving JIT module for target {shown}")
        arch = layout.arch_dir(targets)
        root = layout.cache_root(env)
        ninja = find_ninja(env)
        rows = module_rows(root, version, arch, wanted, ninja, aot_dirs(ctx))
        return judge(rows, str(layout.workspace_dir(root, version, arch)), arch, version)


CHECKS = (FlashinferJitCheck,)

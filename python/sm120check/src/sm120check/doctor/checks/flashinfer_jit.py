"""Level 1: FlashInfer's JIT modules are cached for this node, so no server start waits minutes compiling them.

FlashInfer 0.7.x compiles a module on its first use and runs ninja over the module's directory on every later load;
a module is cached when that run has nothing to do. This check asks ninja (`ninja -n`, compiles nothing) for each
module the flashinfer_jit role warms, in the cache the serving process uses: $FLASHINFER_WORKSPACE_BASE (the
manifest's environment, overridden by this process's) or the home directory, then .cache/flashinfer/<version>/<arch>.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from sm120check.comm import flashinfer_jit
from sm120check.doctor import remedies, stackenv
from sm120check.doctor.checks.comm import capability, flashinfer_version
from sm120check.doctor.model import Context, Result, Status
from sm120check.jitcache import bundle
from sm120check.jitcache.ninja import NinjaVerdict, dry_run, find_ninja

FAMILY = "flashinfer_jit"
MODULES = ("trtllm_comm", "pcie_ipc_comm")  # the role's default flashinfer_jit_modules
# Cold build on first use, seconds. trtllm_comm: 260-320 s alone and 330-460 s beside pcie_ipc_comm on 2x H200
# (stack-facts section 7, docs/validation/2026-11-30-h200x2); pcie_ipc_comm's share is what the pair took beyond
# trtllm_comm alone (330-460 s against 260-320 s).
COLD_SECONDS: Mapping[str, tuple[int, int]] = {"trtllm_comm": (260, 460), "pcie_ipc_comm": (70, 140)}
REMEDY = remedies.tags("flashinfer_jit")
NO_NINJA = (
    "no `ninja` on PATH: FlashInfer runs it by name on every load and fails without it "
    "(put the stack venv's bin directory, which has the pinned ninja, on the servers' PATH)"
)


def serving_env(ctx: Context, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a server in the stack venv sees: the manifest's values, unless the process sets its own."""
    manifest_env = dict(ctx.manifest.env) if ctx.manifest is not None else {}
    return {**manifest_env, **dict(os.environ if environ is None else environ)}


def aot_dirs(ctx: Context) -> list[Path]:
    """Where the stack's FlashInfer keeps prebuilt (AOT) modules, which it loads without ninja or a compile."""
    dirs = [site / "flashinfer" / "data" / "aot" for site in stackenv.site_packages(stackenv.prefix(ctx))]
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
        prebuilt = next((d / name / f"{name}.so" for d in aot if (d / name / f"{name}.so").is_file()), None)
        if prebuilt is not None:
            why = f"prebuilt (AOT) library {prebuilt}: FlashInfer loads it without ninja or a compile"
            rows.append({"module": name, "cached": True, "dir": str(prebuilt.parent), "why": why, "from": "aot"})
            continue
        directory = bundle.module_dir(root, version, arch, name)
        library = directory / f"{name}.so"
        if not library.is_file():
            verdict = NinjaVerdict(False, 0, (f"{library} is missing",))
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
                "why": verdict.summary() if library.is_file() and ninja else verdict.reasons[0],
                "from": stamp.get("built_on", ""),
            }
        )
    return rows


def judge(rows: Sequence[Mapping[str, Any]], where: str) -> Result:
    missing = [r for r in rows if not r["cached"]]
    data: dict[str, Any] = {"cache": where, "modules": [dict(r) for r in rows]}
    if not missing:
        names = ", ".join(str(r["module"]) for r in rows)
        return _result(Status.PASS, f"{names} cached in {where}: a load compiles nothing", data=data)
    low = sum(COLD_SECONDS.get(str(r["module"]), (60, 300))[0] for r in missing)
    high = sum(COLD_SECONDS.get(str(r["module"]), (60, 300))[1] for r in missing)
    data.update(blocking_seconds_min=low, blocking_seconds_max=high)
    names = ", ".join(str(r["module"]) for r in missing)
    return _result(
        Status.WARN,
        f"{names} not cached for this node: the first server start blocks ~{low}-{high} s compiling",
        details="\n".join(f"{r['module']}: {r['why']}" for r in rows),
        remedy=f"{REMEDY} (builds once per key and copies the cache to every node with that key)",
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
    uses: ClassVar[tuple[str, ...]] = ("driver",)

    def run(self, ctx: Context) -> Result:
        version = flashinfer_version(ctx)
        if not version:
            return _result(Status.SKIP, "FlashInfer is not installed in the stack venv: nothing to cache")
        env = serving_env(ctx)
        driver = ctx.results.get("driver")
        raw = driver.data.get("gpus") if driver is not None else None
        gpus: list[Any] = raw if isinstance(raw, list) else []
        caps = [capability(g) for g in gpus if isinstance(g, Mapping)]
        arch_list = env.get("FLASHINFER_CUDA_ARCH_LIST") or None
        if not arch_list and not caps:
            return _result(
                Status.SKIP,
                "no GPU seen and FLASHINFER_CUDA_ARCH_LIST unset: the JIT target is unknown",
                remedy=remedies.CUDA_ENV,
            )
        try:
            arch = "_".join(flashinfer_jit.jit_targets(caps, arch_list))
        except ValueError as exc:
            return _result(Status.FAIL, str(exc), remedy=remedies.CUDA_ENV)
        root = flashinfer_jit.cache_root(env)
        ninja = find_ninja(env)
        rows = module_rows(root, version, arch, MODULES, ninja, aot_dirs(ctx))
        return judge(rows, f"{root}/{version}/{arch}")


CHECKS = (FlashinferJitCheck,)

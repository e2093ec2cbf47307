"""Build FlashInfer JIT modules the way a load will find them cached.

Each module is built by its own spec (`JitSpec.build`, one ninja run in the module's directory), not by FlashInfer's
combined pre-build (`build_jit_specs`): the combined run keeps ninja's log one directory up, so the first load, which
runs ninja in the module's directory, finds no record of the commands and compiles everything again.
Needs FlashInfer importable; needs no GPU when FLASHINFER_CUDA_ARCH_LIST names the targets.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120check.jitcache.ninja import NinjaVerdict, dry_run

# Module name -> (FlashInfer module, spec generator). Names are FlashInfer's own (the cache directory's name).
GENERATORS: Mapping[str, tuple[str, str]] = {
    "trtllm_comm": ("flashinfer.jit.comm", "gen_trtllm_comm_module"),  # allreduce fusion (trtllm backend)
    "pcie_ipc_comm": ("flashinfer.jit.comm", "gen_pcie_ipc_comm_module"),  # PcieIpcAllReduceWorkspace
    "api_log_stats": ("flashinfer.jit.api_log_stats", "gen_api_log_stats_module"),  # tiny: tests
}


@dataclass(frozen=True)
class ModuleOutcome:
    name: str
    cached_before: bool
    built: bool
    seconds: float
    module_dir: str
    verdict_after: str  # ninja's view after the build: must be "no work"


def spec_for(name: str) -> Any:
    """The FlashInfer JitSpec of a known module, or "pkg.module:generator" for any parameterless generator."""
    if ":" in name:
        module_name, generator = name.split(":", 1)
    elif name in GENERATORS:
        module_name, generator = GENERATORS[name]
    else:
        raise ValueError(
            f"FlashInfer JIT module {name!r} is unknown here; known: {', '.join(GENERATORS)} "
            f"(or give package.module:generator)"
        )
    module = importlib.import_module(module_name)
    if not hasattr(module, generator):
        raise ValueError(f"{module_name} has no {generator}: this FlashInfer does not provide module {name!r}")
    return getattr(module, generator)()


SYSTEM_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib", "/lib64")


def libcuda_problem(
    env: Mapping[str, str], cuda_home: Path, system_dirs: Sequence[str] = SYSTEM_LIB_DIRS
) -> str | None:
    """Why FlashInfer's link step (`-lcuda`) would fail after minutes of compiling, or None when it will not.

    The linker needs `libcuda.so` itself: the driver's development link, or the toolkit's stub. A toolkit assembled
    from NVIDIA's wheels has no stub, and a build host without a driver has no link.
    """
    dirs = [cuda_home / "lib64", cuda_home / "lib64" / "stubs", cuda_home / "lib", cuda_home / "lib" / "stubs"]
    flags = (env.get("FLASHINFER_EXTRA_LDFLAGS") or "").split()
    dirs += [Path(flag[2:]) for flag in flags if flag.startswith("-L")]
    dirs += [Path(d) for d in (env.get("LIBRARY_PATH") or "").split(os.pathsep) if d]
    dirs += [Path(d) for d in system_dirs]
    if any((d / "libcuda.so").exists() for d in dirs):
        return None
    return (
        "no libcuda.so for FlashInfer's link step (-lcuda) in "
        f"{cuda_home}/lib64[/stubs], FLASHINFER_EXTRA_LDFLAGS -L dirs, LIBRARY_PATH or the system lib dirs: on a host "
        "without the NVIDIA driver put a stub at <CUDA_HOME>/lib64/stubs/libcuda.so (the toolkit's; a toolkit "
        "assembled from wheels has none), or set FLASHINFER_EXTRA_LDFLAGS=-L<dir with one> on every node of the key"
    )


def library_dir(spec: Any) -> Path:
    return Path(spec.jit_library_path).parent


def build(names: Sequence[str], ninja: str = "ninja", progress: Callable[[str], None] = print) -> list[ModuleOutcome]:
    """Build what ninja says is not cached, one module at a time, reporting progress and time taken."""
    from flashinfer.jit.cpp_ext import get_cuda_path

    problem = libcuda_problem(os.environ, Path(get_cuda_path()))
    if problem:
        raise ValueError(problem)
    outcomes: list[ModuleOutcome] = []
    specs = [(name, spec_for(name)) for name in names]
    for index, (name, spec) in enumerate(specs, 1):
        tag = f"[{index}/{len(specs)}] {name}"
        spec.write_ninja()  # what a load writes first; unchanged bytes keep ninja's view
        directory = library_dir(spec)
        before = dry_run(directory, ninja)
        if before.clean and Path(spec.jit_library_path).exists():
            progress(f"{tag}: cached ({directory})")
            outcomes.append(ModuleOutcome(name, True, False, 0.0, str(directory), before.summary()))
            continue
        progress(f"{tag}: building, {before.commands} command(s) ({before.reasons[0] if before.reasons else 'cold'})")
        start = time.monotonic()
        spec.build(verbose=False)
        seconds = round(time.monotonic() - start, 1)
        after: NinjaVerdict = dry_run(directory, ninja)
        progress(f"{tag}: built in {seconds:.0f} s; {after.summary()}")
        outcomes.append(ModuleOutcome(name, False, True, seconds, str(directory), after.summary()))
    return outcomes

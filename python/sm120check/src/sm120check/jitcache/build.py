"""The one builder of FlashInfer JIT modules, leaving them the way a load will find them cached.

Used by `python -m sm120check.jitcache build` (the flashinfer_jit role) and by the allreduce-fusion probe (rank 0
before the workspace, and `--warm`). Each module is built by its own spec (`JitSpec.build` under FlashInfer's file
lock, one ninja run in the module's directory), not by FlashInfer's combined pre-build (`build_jit_specs`): the
combined run keeps ninja's log one directory up, so the first load, which runs ninja in the module's directory,
finds no record of the commands and compiles everything again. Whether a module is cached is ninja's answer
(`ninja -n`), before and after. Needs FlashInfer importable; needs no GPU when FLASHINFER_CUDA_ARCH_LIST names the
targets.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120check.jitcache.layout import ARCH_LIST_ENV, WORKSPACE_ENV
from sm120check.jitcache.modules import spec_for
from sm120check.jitcache.ninja import NO_NINJA, NinjaVerdict, dry_run, find_ninja

SYSTEM_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib", "/lib64")


@dataclass(frozen=True)
class ModuleOutcome:
    name: str
    cached_before: bool
    built: bool
    seconds: float
    module_dir: str
    verdict_after: str  # ninja's view after the build: must be "no work"
    library: str = ""  # the library a load uses (the prebuilt one for an AOT module)


@dataclass(frozen=True)
class FlashinferView:
    """FlashInfer's own view of its JIT targets and cache, read from the imported package."""

    arch_list_env: str
    targets: list[str]
    jit_dir: str
    workspace_base_env: str


def libcuda_problem(
    env: Mapping[str, str], cuda_home: Path, system_dirs: Sequence[str] = SYSTEM_LIB_DIRS
) -> str | None:
    """Why FlashInfer's link step (`-lcuda`, in every module's link) would fail after minutes of compiling, or None.

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


def _cuda_home() -> Path:
    """The toolkit FlashInfer compiles with (its own lookup; imports flashinfer)."""
    from flashinfer.jit.cpp_ext import get_cuda_path

    return Path(get_cuda_path())


def library_dir(spec: Any) -> Path:
    return Path(spec.jit_library_path).parent


def build(
    names: Sequence[str],
    ninja: str | None = None,
    progress: Callable[[str], None] = print,
    *,
    use_prebuilt: bool = False,
    parallel: bool = False,
) -> list[ModuleOutcome]:
    """Build what ninja says is not cached, reporting progress and the time each module took.

    `use_prebuilt` takes a module FlashInfer would load prebuilt (AOT) as it is, as a load does (the probe); the CLI
    leaves it off, since it builds the JIT cache to pack it. `parallel` builds the modules side by side in threads
    (the probe, under its time limit); otherwise one after the other, in order.
    """
    ninja = ninja or find_ninja()
    if ninja is None:
        raise ValueError(NO_NINJA)
    specs = [(name, spec_for(name)) for name in names]
    done: dict[str, ModuleOutcome] = {}
    todo: list[tuple[str, str, Any, NinjaVerdict]] = []
    for index, (name, spec) in enumerate(specs, 1):
        tag = f"[{index}/{len(specs)}] {name}"
        if use_prebuilt and getattr(spec, "is_aot", False):
            library = str(spec.get_library_path())
            progress(f"{tag}: prebuilt (AOT) {library}")
            done[name] = ModuleOutcome(name, True, False, 0.0, str(Path(library).parent), "prebuilt (AOT)", library)
            continue
        spec.write_ninja()  # what a load writes first; unchanged bytes keep ninja's view
        directory = library_dir(spec)
        before = dry_run(directory, ninja)
        if before.clean and Path(spec.jit_library_path).exists():
            progress(f"{tag}: cached ({directory})")
            done[name] = ModuleOutcome(
                name, True, False, 0.0, str(directory), before.summary(), str(spec.jit_library_path)
            )
            continue
        todo.append((tag, name, spec, before))
    if todo:  # only a build links: a node with everything cached needs no libcuda.so
        problem = libcuda_problem(os.environ, _cuda_home(), SYSTEM_LIB_DIRS)
        if problem:
            raise ValueError(problem)

    def one(job: tuple[str, str, Any, NinjaVerdict]) -> ModuleOutcome:
        tag, name, spec, before = job
        directory = library_dir(spec)
        progress(f"{tag}: building, {before.commands} command(s) ({before.reasons[0] if before.reasons else 'cold'})")
        start = time.monotonic()
        spec.build(verbose=False, need_lock=True)
        seconds = round(time.monotonic() - start, 1)
        after = dry_run(directory, ninja)
        progress(f"{tag}: built in {seconds:.0f} s; {after.summary()}")
        return ModuleOutcome(name, False, True, seconds, str(directory), after.summary(), str(spec.jit_library_path))

    if parallel and len(todo) > 1:
        with ThreadPoolExecutor(max_workers=len(todo)) as pool:
            built = list(pool.map(one, todo))
    else:
        built = [one(job) for job in todo]
    done.update((o.name, o) for o in built)
    return [done[name] for name, _ in specs]


def flashinfer_view() -> FlashinferView:
    """FlashInfer's own view of its JIT targets and cache (imports flashinfer)."""
    from flashinfer.jit import env as jit_env
    from flashinfer.jit.core import current_compilation_context

    return FlashinferView(
        arch_list_env=os.environ.get(ARCH_LIST_ENV, ""),
        targets=sorted(f"{major}{minor}" for major, minor in current_compilation_context.TARGET_CUDA_ARCHS),
        jit_dir=str(jit_env.FLASHINFER_JIT_DIR),
        workspace_base_env=os.environ.get(WORKSPACE_ENV, ""),
    )

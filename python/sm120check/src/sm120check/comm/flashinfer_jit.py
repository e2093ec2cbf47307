"""FlashInfer's JIT cache: where a comm module lives, whether it is built, and building it.

Layout (flashinfer.jit.env, 0.7.x): $FLASHINFER_WORKSPACE_BASE (default: home)/.cache/flashinfer/<version>/
<arch dir>/cached_ops/<module>/<module>.so, where <arch dir> joins the sorted JIT targets ("90a", "120f",
"90a_120f"). The targets come from FLASHINFER_CUDA_ARCH_LIST (space separated, a suffix given is kept) or
else from every visible GPU; 9.x gets "a", 12.0 gets "f" on CUDA >= 12.9, other majors >= 10 get "a".

The doctor's fusion check, the JIT-warming role and the serving process must agree on this path.
`build_modules` is the one place that builds them, used by the fusion probe and by `python -m
sm120check.doctor.probes.fusion --warm`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

# Module name -> the FlashInfer spec generator (flashinfer.jit.comm) that describes its build.
COMM_MODULES: Mapping[str, str] = {
    "trtllm_comm": "gen_trtllm_comm_module",  # allreduce fusion (trtllm backend)
    "pcie_ipc_comm": "gen_pcie_ipc_comm_module",  # PcieIpcAllReduceWorkspace, 0.7.0+
}
# Measured on 2x H200 with FlashInfer 0.7.2 (stack-facts section 7): what a cold build blocks.
COLD_BUILD_SECONDS = {"trtllm_comm": (260, 320)}


def cache_root(env: Mapping[str, str] | None = None, home: Path | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("FLASHINFER_WORKSPACE_BASE") or str(home or Path.home())
    return Path(base) / ".cache" / "flashinfer"


def _normalize(major: int, minor: int, cuda: tuple[int, int]) -> str:
    if major == 9:
        return f"{major}{minor}a"
    if major == 12:
        if minor == 0:
            return "120f" if cuda >= (12, 9) else "120a"
        return f"12{minor}a"
    if major >= 10:
        return f"{major}{minor}a"
    return f"{major}{minor}"


def jit_targets(
    capabilities: Sequence[str], arch_list: str | None = None, cuda: tuple[int, int] = (13, 0)
) -> tuple[str, ...]:
    """The JIT targets FlashInfer derives, sorted as it sorts them (by major, then minor string)."""
    pairs: set[tuple[int, str]] = set()
    entries = arch_list.split() if arch_list else list(capabilities)
    for entry in entries:
        try:
            major_text, minor_text = entry.split(".", 1)
            major = int(major_text)
        except ValueError:
            raise ValueError(
                f"JIT target {entry!r} is not of the form MAJOR.MINOR[suffix] (e.g. 12.0f); "
                f"fix FLASHINFER_CUDA_ARCH_LIST"
            ) from None
        if minor_text and minor_text[-1].isalpha():
            pairs.add((major, minor_text))
        else:
            pairs.add((major, _normalize(major, int(minor_text), cuda)[len(str(major)) :]))
    return tuple(f"{major}{minor}" for major, minor in sorted(pairs))


def module_library(root: Path, version: str, targets: Sequence[str], module: str) -> Path:
    return root / version / "_".join(targets) / "cached_ops" / module / f"{module}.so"


# A current module's ninja run takes milliseconds; anything slower compiled something.
REBUILD_SECONDS = 2.0


@dataclass(frozen=True)
class ModuleBuild:
    name: str
    cached_before: bool
    built: bool
    seconds: float
    library: str


def build_modules(names: Iterable[str]) -> list[ModuleBuild]:
    """Build (or find cached) FlashInfer JIT modules in this process, exactly as their first real load would.

    Each module is built through its own spec (`spec.build`, under FlashInfer's lock), side by side in
    threads. FlashInfer's combined pre-build (`build_jit_specs`) is not used: it keeps ninja's log one
    directory up, so the first real load finds no record, recompiles for minutes under the lock, and the
    other ranks wait for it (what looked like a hang in "create workspace" on the H200s). Prebuilt (AOT)
    modules are taken as they are. Needs no GPU when FLASHINFER_CUDA_ARCH_LIST names the targets.
    """
    from flashinfer.jit import comm as jit_comm

    specs = {}
    for name in names:
        generator = COMM_MODULES.get(name)
        if generator is None or not hasattr(jit_comm, generator):
            raise ValueError(f"FlashInfer JIT module {name!r} is unknown here; known: {', '.join(COMM_MODULES)}")
        specs[name] = getattr(jit_comm, generator)()

    def one(name: str) -> ModuleBuild:
        spec = specs[name]
        if getattr(spec, "is_aot", False):
            return ModuleBuild(name, True, False, 0.0, str(spec.get_library_path()))
        before = bool(spec.is_compiled)
        start = time.monotonic()
        spec.build(verbose=False, need_lock=True)  # ninja: a no-op in milliseconds when the module is current
        seconds = time.monotonic() - start
        built = not before or seconds > REBUILD_SECONDS
        return ModuleBuild(name, not built, built, round(seconds if built else 0.0, 2), str(spec.get_library_path()))

    with ThreadPoolExecutor(max_workers=max(1, len(specs))) as pool:
        return list(pool.map(one, specs))


def jit_environment() -> dict[str, object]:
    """FlashInfer's own view of its JIT targets and cache (imports flashinfer)."""
    from flashinfer.jit import env as jit_env
    from flashinfer.jit.core import current_compilation_context

    return {
        "arch_list_env": os.environ.get("FLASHINFER_CUDA_ARCH_LIST", ""),
        "targets": sorted(f"{major}{minor}" for major, minor in current_compilation_context.TARGET_CUDA_ARCHS),
        "jit_dir": str(jit_env.FLASHINFER_JIT_DIR),
        "workspace_base_env": os.environ.get("FLASHINFER_WORKSPACE_BASE", ""),
    }

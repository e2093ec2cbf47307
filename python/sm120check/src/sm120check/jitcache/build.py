"""Build FlashInfer JIT modules the way a load will find them cached.

Each module is built by its own spec (`JitSpec.build`, one ninja run in the module's directory), not by FlashInfer's
combined pre-build (`build_jit_specs`): the combined run keeps ninja's log one directory up, so the first load, which
runs ninja in the module's directory, finds no record of the commands and compiles everything again.
Needs FlashInfer importable; needs no GPU when FLASHINFER_CUDA_ARCH_LIST names the targets.
"""

from __future__ import annotations

import importlib
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


def library_dir(spec: Any) -> Path:
    return Path(spec.jit_library_path).parent


def build(names: Sequence[str], ninja: str = "ninja", progress: Callable[[str], None] = print) -> list[ModuleOutcome]:
    """Build what ninja says is not cached, one module at a time, reporting progress and time taken."""
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

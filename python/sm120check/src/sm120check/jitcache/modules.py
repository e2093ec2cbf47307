"""The FlashInfer JIT modules sm120check knows: what each is, where FlashInfer generates it, when a server needs it.

Names are FlashInfer's own (the module's directory under cached_ops). `SERVING` is what the flashinfer_jit role
warms by default, the doctor's flashinfer_jit check inspects and the allreduce-fusion probe builds; `for_release`
narrows it to what a FlashInfer release provides for a node's GPUs. Only `spec_for` and `available` import FlashInfer.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sm120check.jitcache import flashinfer_release


@dataclass(frozen=True)
class JitModule:
    name: str
    package: str  # the FlashInfer module holding the spec generator
    generator: str  # a parameterless function returning the module's JitSpec
    purpose: str
    serving: bool  # warmed for a server start (role default, doctor check, fusion probe)


REGISTRY: Mapping[str, JitModule] = {
    m.name: m
    for m in (
        JitModule(
            "trtllm_comm",
            "flashinfer.jit.comm",
            "gen_trtllm_comm_module",
            "allreduce fusion, trtllm backend (SGLang's allreduce + residual + RMSNorm)",
            True,
        ),
        JitModule(
            "pcie_ipc_comm",
            "flashinfer.jit.comm",
            "gen_pcie_ipc_comm_module",
            "PcieIpcAllReduceWorkspace, FlashInfer 0.7.0+ (SGLang >= 0.5.22 on PCIe boxes)",
            True,
        ),
        JitModule("api_log_stats", "flashinfer.jit.api_log_stats", "gen_api_log_stats_module", "tiny: tests", False),
    )
}
SERVING: tuple[str, ...] = tuple(name for name, m in REGISTRY.items() if m.serving)


def for_release(version: str, majors: Sequence[int], modules: Sequence[str] = SERVING) -> tuple[str, ...]:
    """Those of `modules` a server on GPUs of these compute-capability majors loads with this FlashInfer.

    trtllm_comm only where the release JIT-compiles it for one of the majors (SM120 from 0.6.17), pcie_ipc_comm only
    from 0.7.0; any other module is kept. An unknown GPU set (no majors) keeps trtllm_comm.
    """
    release = flashinfer_release.parse_version(version)
    kept = []
    for name in modules:
        if name == "trtllm_comm" and majors and not set(majors) & set(flashinfer_release.trtllm_comm_majors(release)):
            continue
        if name == "pcie_ipc_comm" and not flashinfer_release.has_pcie_ipc(release):
            continue
        kept.append(name)
    return tuple(kept)


def _generator(name: str) -> tuple[str, str]:
    if ":" in name:
        package, generator = name.split(":", 1)
        return package, generator
    module = REGISTRY.get(name)
    if module is None:
        raise ValueError(
            f"FlashInfer JIT module {name!r} is unknown here; known: {', '.join(REGISTRY)} "
            f"(or give package.module:generator)"
        )
    return module.package, module.generator


def spec_for(name: str) -> Any:
    """The FlashInfer JitSpec of a known module, or of "pkg.module:generator" for any parameterless generator."""
    package, generator = _generator(name)
    imported = importlib.import_module(package)
    if not hasattr(imported, generator):
        version = getattr(sys.modules.get("flashinfer"), "__version__", "of unknown version")
        known = REGISTRY.get(name)
        needs = f" ({known.purpose})" if known else ""
        raise ValueError(
            f"{package} has no {generator}: FlashInfer {version} does not provide module {name!r}{needs}; "
            "install the FlashInfer the server uses, or leave the module out (--modules)"
        )
    return getattr(imported, generator)()


def available(names: Sequence[str]) -> list[str]:
    """Those of `names` the imported FlashInfer can generate (imports FlashInfer)."""
    kept = []
    for name in names:
        package, generator = _generator(name)
        try:
            imported = importlib.import_module(package)
        except ImportError:
            continue
        if hasattr(imported, generator):
            kept.append(name)
    return kept

"""What each FlashInfer release can do for allreduce fusion, from its version alone.

Facts (FlashInfer git history): the trtllm comm kernels JIT for compute-capability majors [9, 10] up to
0.6.16 and [9, 10, 12] from 0.6.17 (older releases fail workspace creation with "No supported CUDA
architectures found for major versions [...]"); releases up to 0.6.9 demanded multicast, which PCIe
boxes lack; `PcieIpcAllReduceWorkspace` (a PCIe allreduce without an architecture gate) exists from 0.7.0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sm120check import versions

Version = tuple[int, int, int]

SM120_KERNELS_FROM: Version = (0, 6, 17)
PCIE_IPC_FROM: Version = (0, 7, 0)
MULTICAST_REQUIRED_UNTIL: Version = (0, 6, 9)
ARCH_GATE_ERROR = "No supported CUDA architectures found for major versions"


def parse_version(text: str) -> Version:
    """Release triple of a FlashInfer version string ("0.7.2", "0.6.17+cu130", "0.7.0rc1" -> (0, 7, 0)).

    Pre-release and local parts are ignored: the gate is about which release line the kernels landed in.
    """
    release = versions.parse_or_none(text) or ()
    if len(release) < 2:
        raise ValueError(f"FlashInfer version {text!r} is not of the form MAJOR.MINOR[.PATCH] (e.g. 0.7.2)")
    major, minor, patch = (*release, 0)[:3]
    return major, minor, patch


def format_version(version: Version) -> str:
    return ".".join(str(part) for part in version)


def trtllm_comm_majors(version: Version) -> tuple[int, ...]:
    """Compute-capability majors the trtllm comm (allreduce fusion) module JIT-compiles for."""
    return (9, 10, 12) if version >= SM120_KERNELS_FROM else (9, 10)


def has_pcie_ipc(version: Version) -> bool:
    return version >= PCIE_IPC_FROM


def requires_multicast(version: Version) -> bool:
    return version <= MULTICAST_REQUIRED_UNTIL


def capability_major(capability: str) -> int:
    """Major of a compute capability string such as "12.0" or "9.0"."""
    try:
        return int(capability.split(".", 1)[0])
    except ValueError:
        raise ValueError(f"compute capability {capability!r} is not of the form MAJOR.MINOR (e.g. 12.0)") from None


@dataclass(frozen=True)
class FusionSupport:
    """Whether this FlashInfer release can run allreduce fusion on these GPUs, and the fix if not."""

    ok: bool
    summary: str
    remedy: str = ""
    majors: tuple[int, ...] = ()


def fusion_support(
    version_text: str, capabilities: Sequence[str], *, multicast: bool, pin: str | None = None
) -> FusionSupport:
    """Judge a FlashInfer release against the node's GPUs before any kernel is built.

    `capabilities` are the GPUs' compute capabilities ("12.0"), `multicast` whether the node has (and
    allows) NVLink multicast, `pin` the manifest's flashinfer-python version if it has one.
    """
    version = parse_version(version_text)
    majors = trtllm_comm_majors(version)
    target = pin or format_version(SM120_KERNELS_FROM)
    upgrade = (
        f"pip install 'flashinfer-python=={pin}' (the manifest pin; role python_stack)"
        if pin
        else f"pip install 'flashinfer-python>={target}'"
    )
    missing = sorted({c for c in capabilities if capability_major(c) not in majors})
    if missing:
        pcie = " PcieIpcAllReduceWorkspace (no arch gate) is available." if has_pcie_ipc(version) else ""
        sm120 = any(capability_major(c) == 12 for c in missing) and version < SM120_KERNELS_FROM
        why = (
            f"FlashInfer {version_text} has no SM120 allreduce-fusion kernels (majors {list(majors)}; "
            f"SM120 from {format_version(SM120_KERNELS_FROM)})"
            if sm120
            else f"FlashInfer {version_text} builds allreduce fusion for majors {list(majors)} only, "
            f"not compute capability {', '.join(missing)}"
        )
        remedy = upgrade if sm120 else "allreduce fusion is not available for this GPU; use NCCL or symmetric memory"
        return FusionSupport(False, why + "." + pcie, remedy, majors)
    if requires_multicast(version) and not multicast:
        return FusionSupport(
            False,
            f"FlashInfer {version_text} needs NVLink multicast for allreduce fusion and this node has none "
            f"(fixed in 0.6.10+)",
            upgrade,
            majors,
        )
    summary = f"FlashInfer {version_text} has allreduce-fusion kernels for majors {list(majors)}"
    return FusionSupport(True, summary, majors=majors)

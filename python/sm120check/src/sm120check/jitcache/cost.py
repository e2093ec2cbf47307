"""What a cold FlashInfer JIT build blocks: measured seconds per module, with what was measured and where.

Every figure here was measured with one setup (`MEASURED`): FlashInfer 0.7.2 and nvcc 13.0.88, target 90a, on H200
hosts (the records named in each entry). trtllm_comm's one large source compiles on one core, so a host's core count
barely matters; a 2-core CPU VM under load took far longer (892 s for both, docs/flashinfer-jit.md "Numbers"). For
any other target (an SM120 node builds 120f) or another FlashInfer release, `estimate` returns these figures labelled
with what they are and `measured=False`: the time for that setup is unknown until someone measures it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Measurement:
    """The one setup every figure below was timed on."""

    flashinfer: str
    nvcc: str
    arch: str  # FlashInfer's target directory
    gpu: str

    def phrase(self) -> str:
        return f"FlashInfer {self.flashinfer}, nvcc {self.nvcc}, target {self.arch} on {self.gpu}"


MEASURED = Measurement(flashinfer="0.7.2", nvcc="13.0.88", arch="90a", gpu="H200")
MEASURED_ARCH = MEASURED.arch


@dataclass(frozen=True)
class ColdCost:
    low: int  # seconds
    high: int
    source: str  # the runs and the records they are in


@dataclass(frozen=True)
class BuildEstimate:
    """The seconds a first server start waits compiling, and whether they were measured for this setup."""

    low: int
    high: int
    arch: str  # the node's target directory ("120f")
    measured: bool  # False: the figures are MEASURED's, this setup's are unknown
    flashinfer: str = ""  # the node's FlashInfer release ("" when not known)

    def phrase(self) -> str:
        """`~300-460 s (measured: FlashInfer 0.7.2, ...)`, or for another setup `an unmeasured time (...)`."""
        if self.measured:
            return f"~{self.low}-{self.high} s (measured with {MEASURED.phrase()})"
        unknown = []
        if self.arch != MEASURED.arch:
            unknown.append(f"{self.arch}")
        if self.flashinfer and self.flashinfer != MEASURED.flashinfer:
            unknown.append(f"FlashInfer {self.flashinfer}")
        what = " with ".join(unknown) or "these modules"
        return f"an unmeasured time ({self.low}-{self.high} s measured with {MEASURED.phrase()}; {what} not timed yet)"


H200X2 = "2x H200, 32 cores (stack-facts section 7, docs/validation/2026-11-30-h200x2)"
H200X1 = "1x H200, 16 cores, sm120check.jitcache.build (docs/validation/2026-12-01-h200-jit-builder)"
COLD_BUILD: Mapping[str, ColdCost] = {
    "trtllm_comm": ColdCost(260, 340, f"90a alone: 260-320 s on {H200X2}; 337 s on {H200X1}"),
    "pcie_ipc_comm": ColdCost(11, 15, f"90a alone: 13 s and 15 s, 11 s beside trtllm_comm, on {H200X1}"),
}
TOGETHER: Mapping[frozenset[str], ColdCost] = {
    frozenset({"trtllm_comm", "pcie_ipc_comm"}): ColdCost(
        300, 460, f"90a: 330-460 s on {H200X2}; 307 s side by side and 350 s one after the other on {H200X1}"
    ),
}
UNMEASURED = ColdCost(60, 300, "not measured: a wide guess for a module not in the table")


def cold_cost(module: str) -> ColdCost:
    return COLD_BUILD.get(module, UNMEASURED)


def blocking_seconds(modules: Iterable[str]) -> tuple[int, int]:
    """The range a first start waits compiling these modules in the measured setup."""
    names = list(dict.fromkeys(modules))
    together = TOGETHER.get(frozenset(names))
    if together is not None:
        return together.low, together.high
    costs = [cold_cost(m) for m in names]
    return sum(c.low for c in costs), sum(c.high for c in costs)


def estimate(modules: Iterable[str], arch: str, flashinfer: str | None = None) -> BuildEstimate:
    """The wait for these modules on a node whose target directory is `arch` and FlashInfer `flashinfer` (None:
    not known): measured only for MEASURED's target and release."""
    names = list(dict.fromkeys(modules))
    low, high = blocking_seconds(names)
    same_release = flashinfer in (None, MEASURED.flashinfer)
    measured = arch == MEASURED.arch and same_release and all(n in COLD_BUILD for n in names)
    return BuildEstimate(low, high, arch, measured, flashinfer or "")


def sources(modules: Iterable[str]) -> list[str]:
    """Where each figure for these modules comes from (the runs and their records)."""
    names = list(dict.fromkeys(modules))
    together = TOGETHER.get(frozenset(names))
    if together is not None:
        return [together.source]
    return [f"{name}: {cold_cost(name).source}" for name in names]

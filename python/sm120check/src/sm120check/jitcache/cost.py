"""What a cold FlashInfer JIT build blocks: measured seconds per module, with where each number comes from.

Every figure here was measured with FlashInfer 0.7.2 and nvcc 13.0.88 for target 90a on H200 hosts: that is the
only target anyone has timed. trtllm_comm's one large source compiles on one core, so a host's core count barely
matters; a 2-core CPU VM under load took far longer (892 s for both, docs/flashinfer-jit.md "Numbers"). For any
other target (an SM120 node builds 120f) `estimate` returns the 90a figures labelled as such and `measured=False`:
the time for that target is unknown until someone measures it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MEASURED_ARCH = "90a"  # FlashInfer's target directory of every measurement below


@dataclass(frozen=True)
class ColdCost:
    low: int  # seconds
    high: int
    source: str


@dataclass(frozen=True)
class BuildEstimate:
    """The seconds a first server start waits compiling, and whether they were measured for this target."""

    low: int
    high: int
    arch: str  # the node's target directory ("120f")
    measured: bool  # False: the figures are the 90a (H200) measurement, this target's are unknown

    def phrase(self) -> str:
        """`~300-460 s`, or for an unmeasured target `an unmeasured time (300-460 s for 90a on H200; 120f unknown)`."""
        if self.measured:
            return f"~{self.low}-{self.high} s"
        return f"an unmeasured time ({self.low}-{self.high} s for {MEASURED_ARCH} on H200; {self.arch} not timed yet)"


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
    """The range a first start waits compiling these modules for target 90a (the one measured)."""
    names = list(dict.fromkeys(modules))
    together = TOGETHER.get(frozenset(names))
    if together is not None:
        return together.low, together.high
    costs = [cold_cost(m) for m in names]
    return sum(c.low for c in costs), sum(c.high for c in costs)


def estimate(modules: Iterable[str], arch: str) -> BuildEstimate:
    """The wait for these modules on a node whose FlashInfer target directory is `arch`: measured only for 90a."""
    names = list(dict.fromkeys(modules))
    low, high = blocking_seconds(names)
    measured = arch == MEASURED_ARCH and all(n in COLD_BUILD for n in names)
    return BuildEstimate(low, high, arch, measured)

"""What a cold FlashInfer JIT build blocks: measured seconds per module, with where each number comes from.

The doctor's flashinfer_jit check prices the modules a node lacks with `blocking_seconds`: a set measured together
(`TOGETHER`) takes its measurement, any other set the sum of its modules' own. All with FlashInfer 0.7.2, nvcc
13.0.88, target 90a. trtllm_comm's one large source compiles on one core, so a host's core count barely matters;
a 2-core CPU VM under load took far longer (892 s for both, docs/flashinfer-jit.md "Numbers").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ColdCost:
    low: int  # seconds
    high: int
    source: str


H200X2 = "2x H200, 32 cores (stack-facts section 7, docs/validation/2026-11-30-h200x2)"
H200X1 = "1x H200, 16 cores, sm120check.jitcache.build (docs/validation/2026-12-01-h200-jit-builder)"
COLD_BUILD: Mapping[str, ColdCost] = {
    "trtllm_comm": ColdCost(260, 340, f"alone: 260-320 s on {H200X2}; 337 s on {H200X1}"),
    "pcie_ipc_comm": ColdCost(11, 15, f"alone: 13 s and 15 s, 11 s beside trtllm_comm, on {H200X1}"),
}
TOGETHER: Mapping[frozenset[str], ColdCost] = {
    frozenset({"trtllm_comm", "pcie_ipc_comm"}): ColdCost(
        300, 460, f"330-460 s on {H200X2}; 307 s side by side and 350 s one after the other on {H200X1}"
    ),
}
UNMEASURED = ColdCost(60, 300, "not measured: a wide guess for a module not in the table")


def cold_cost(module: str) -> ColdCost:
    return COLD_BUILD.get(module, UNMEASURED)


def blocking_seconds(modules: Iterable[str]) -> tuple[int, int]:
    """The range a first server start waits compiling these modules."""
    names = list(dict.fromkeys(modules))
    together = TOGETHER.get(frozenset(names))
    if together is not None:
        return together.low, together.high
    costs = [cold_cost(m) for m in names]
    return sum(c.low for c in costs), sum(c.high for c in costs)

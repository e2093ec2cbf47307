"""What a cold FlashInfer JIT build blocks: measured seconds per module, and the finding they come from.

Every figure here comes from one setup (`measured_setup`: its FlashInfer, nvcc, target and GPU); see finding
flashinfer-jit-cold-build. For any other target (an SM120 node builds 120f) or another FlashInfer release, `estimate`
returns these figures labelled with what they are and `measured=False`: the time for that setup is unknown until
someone measures it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sm120check import findings

COLD_BUILD_FINDING = "flashinfer-jit-cold-build"


@dataclass(frozen=True)
class Measurement:
    """The one setup every figure below was timed on."""

    flashinfer: str
    nvcc: str
    arch: str  # FlashInfer's target directory
    gpu: str

    def phrase(self) -> str:
        return f"FlashInfer {self.flashinfer}, nvcc {self.nvcc}, target {self.arch} on {self.gpu}"


def measured_setup() -> Measurement:
    """The setup the cold-build figures were timed on, from their finding."""
    finding = findings.get(COLD_BUILD_FINDING)
    v = finding.versions
    return Measurement(flashinfer=v["flashinfer"], nvcc=v["nvcc"], arch=v["arch"], gpu=finding.machine)


@dataclass(frozen=True)
class ColdCost:
    low: int  # seconds
    high: int
    source: str  # the finding the figures come from


@dataclass(frozen=True)
class BuildEstimate:
    """The seconds a first server start waits compiling, and whether they were measured for this setup."""

    low: int
    high: int
    arch: str  # the node's target directory ("120f")
    measured: bool  # False: the figures are the measured setup's, this setup's are unknown
    flashinfer: str = ""  # the node's FlashInfer release ("" when not known)

    def phrase(self) -> str:
        """`~300-460 s (measured: FlashInfer 0.7.2, ...)`, or for another setup `an unmeasured time (...)`."""
        setup = measured_setup()
        if self.measured:
            return f"~{self.low}-{self.high} s (measured with {setup.phrase()})"
        unknown = []
        if self.arch != setup.arch:
            unknown.append(f"{self.arch}")
        if self.flashinfer and self.flashinfer != setup.flashinfer:
            unknown.append(f"FlashInfer {self.flashinfer}")
        what = " with ".join(unknown) or "these modules"
        return f"an unmeasured time ({self.low}-{self.high} s measured with {setup.phrase()}; {what} not timed yet)"


def _cold(key: str) -> ColdCost:
    """The measured range for `key` ("trtllm_comm", "together"), with the finding it comes from."""
    finding = findings.get(COLD_BUILD_FINDING)
    low, high = finding.numbers[f"{key}_low_s"], finding.numbers[f"{key}_high_s"]
    return ColdCost(int(low), int(high), f"see {finding.cite()}")


COLD_MODULES = ("trtllm_comm", "pcie_ipc_comm")  # the modules the finding timed, alone and together
UNMEASURED = ColdCost(60, 300, "not measured: a wide guess for a module not in the table")


def cold_cost(module: str) -> ColdCost:
    return _cold(module) if module in COLD_MODULES else UNMEASURED


def _together(names: list[str]) -> ColdCost | None:
    """The measured range for exactly the timed modules built together (None for any other set)."""
    return _cold("together") if set(names) == set(COLD_MODULES) else None


def blocking_seconds(modules: Iterable[str]) -> tuple[int, int]:
    """The range a first start waits compiling these modules in the measured setup."""
    names = list(dict.fromkeys(modules))
    together = _together(names)
    if together is not None:
        return together.low, together.high
    costs = [cold_cost(m) for m in names]
    return sum(c.low for c in costs), sum(c.high for c in costs)


def estimate(modules: Iterable[str], arch: str, flashinfer: str | None = None) -> BuildEstimate:
    """The wait for these modules on a node whose target directory is `arch` and FlashInfer `flashinfer` (None:
    not known): measured only for the measured setup's target and release."""
    names = list(dict.fromkeys(modules))
    low, high = blocking_seconds(names)
    setup = measured_setup()
    same_release = flashinfer in (None, setup.flashinfer)
    measured = arch == setup.arch and same_release and all(n in COLD_MODULES for n in names)
    return BuildEstimate(low, high, arch, measured, flashinfer or "")


def sources(modules: Iterable[str]) -> list[str]:
    """Where each figure for these modules comes from (its finding and record)."""
    names = list(dict.fromkeys(modules))
    together = _together(names)
    if together is not None:
        return [together.source]
    return [f"{name}: {cold_cost(name).source}" for name in names]

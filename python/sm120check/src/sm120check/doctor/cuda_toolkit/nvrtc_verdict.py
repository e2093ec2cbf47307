"""The verdict both NVRTC checks (`nvrtc`, `sm120_jit`) give when their probe hung or died."""

from __future__ import annotations

from collections.abc import Sequence

from sm120check.doctor import child, nvrtc_api, remedies
from sm120check.doctor.model import Result, Status


def nvrtc_probe_verdict(check_id: str, problem: str, step: str, stderr_tail: str, copies: Sequence[str]) -> Result:
    """The verdict when the NVRTC probe hung or died (timeout, signal, no JSON): a FAIL naming the step."""
    during = f" during {step}" if step else ""
    hung = "hung" if "timed out" in problem else ("crashed" if "killed by" in problem else "failed")
    lines = [line for line in stderr_tail.strip().splitlines() if not line.startswith(child.STEP_MARK)]
    evidence = [f"the NVRTC probe (python -m {nvrtc_api.PROBE}) {problem}{during}"]
    if lines:
        evidence.append("\n".join(lines[-10:]))
    if copies:
        evidence.append(f"copies on disk: {', '.join(copies)}")
    return Result(
        check_id,
        Status.FAIL,
        f"{nvrtc_api.SONAME} {hung}{during}: the probe {problem}",
        details="\n".join(evidence),
        remedy=remedies.nvrtc_hang(nvrtc_api.SONAME),
        data={"wheel_copies": list(copies)},
    )

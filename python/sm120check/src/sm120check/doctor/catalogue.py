"""The check catalogue: one folder per check family (doctor/<family>/), each check module exposing `CHECKS`, a tuple
of check classes.

A check's `family` is the role that owns (and fixes) the part it checks: `cuda_toolkit`, `cuda_env`, `python_stack`,
`preflight`, `sm120check`, `sglang_sm120`, `flashinfer_jit`, `nccl`, `pcie_p2p` (the IOMMU and ACS); `comm` for the
node's multi-GPU communication and `node_health` for its GPUs' hardware (PCIe, ECC, Xids, clocks), which no one role
owns. The runner orders checks by level, then by the order of `MODULES`, then by `CHECKS`. This module is the one
place that names the families: the runner, the model and the report know none of them.
"""

from __future__ import annotations

from types import ModuleType

from sm120check.doctor.comm import collectives, pairs, peer
from sm120check.doctor.cuda_env import env
from sm120check.doctor.cuda_toolkit import nvrtc, nvrtc_launch, toolkit
from sm120check.doctor.flashinfer_jit import flashinfer_jit
from sm120check.doctor.model import Check
from sm120check.doctor.node_health import health
from sm120check.doctor.pcie_p2p import fabric, nccl_pairs
from sm120check.doctor.preflight import driver, platform
from sm120check.doctor.python_stack import abi, stack, torch
from sm120check.doctor.sglang_sm120 import sglang, sglang_comm
from sm120check.doctor.sm120check import manifest

# Report order. The level-3 checks: `peer` (copies between GPU pairs, family `comm`), `pairs` (many-to-one writes,
# family `comm`) and `nccl_pairs` (the per-pair NCCL all-reduce, family `pcie_p2p`) report right before the other
# `comm` checks (`collectives`), then SGLang's own communication code (`sglang_comm`), then node health.
MODULES: tuple[ModuleType, ...] = (
    platform,
    manifest,
    driver,
    toolkit,
    nvrtc,
    nvrtc_launch,
    torch,
    abi,
    env,
    stack,
    fabric,
    sglang,
    flashinfer_jit,
    peer,
    pairs,
    nccl_pairs,
    collectives,
    sglang_comm,
    health,
)


def all_checks() -> list[Check]:
    return [cls() for module in MODULES for cls in module.CHECKS]

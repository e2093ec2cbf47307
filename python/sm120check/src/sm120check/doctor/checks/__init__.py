"""The check catalogue: one module per family, each exposing `CHECKS`, a tuple of check classes.

The runner orders checks by level, then by this module order, then by their order in `CHECKS`.
"""

from __future__ import annotations

import importlib

from sm120check.doctor.model import Check

# Families in report order. `sglang` (SGLang SM120 source scan), `comm` (level-3 communication) and
# `sglang_comm` (SGLang's own level-3 code) are owned by their own modules; keep their entries when editing this list.
CHECK_MODULES: tuple[str, ...] = (
    "platform",
    "driver",
    "toolkit",
    "nvrtc",
    "jit",
    "torch",
    "abi",
    "env",
    "stack",
    "sglang",
    "flashinfer_jit",
    "comm",
    "sglang_comm",
)


def all_checks() -> list[Check]:
    checks: list[Check] = []
    for name in CHECK_MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        checks.extend(cls() for cls in module.CHECKS)
    return checks

"""What a check is and what it returns. Output formats and the runner build on these alone."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    from sm120check.manifest import Manifest


class Status(str, enum.Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True)
class Result:
    id: str
    status: Status
    summary: str  # one line a user reads first
    details: str = ""  # the evidence
    remedy: str = ""  # the role tag, variable, env var or command that fixes it
    data: Mapping[str, object] = field(default_factory=dict)  # measured numbers for JSON / Prometheus
    seconds: float = 0.0
    family: str = ""
    level: int = 0


@dataclass
class Context:
    """What every check may read: the manifest (or why it is missing), options, earlier results.

    `results` holds the results of checks that already ran, so a check can use a prerequisite's
    measured data (for example the GPU list of `driver`) instead of measuring again.
    """

    manifest: Manifest | None = None
    manifest_error: str = ""
    timeout: float = 120.0  # hard limit for each GPU child process, in seconds
    jit_timeout: float | None = None  # limit for a child that must JIT-compile first (None: check's default)
    gpus: tuple[int, ...] | None = None  # restrict multi-GPU checks to these indices
    results: dict[str, Result] = field(default_factory=dict)


class Check(Protocol):
    """A check: its docstring is the user-facing description shown by `--list`."""

    id: ClassVar[str]
    family: ClassVar[str]
    level: ClassVar[int]  # 1 static, 2 single-GPU work, 3 multi-GPU communication
    requires: ClassVar[tuple[str, ...]]  # ids of checks that must not fail or skip first

    def run(self, ctx: Context) -> Result: ...

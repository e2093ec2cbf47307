"""What a check is and what it returns. Output formats and the runner build on these alone."""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

from sm120check.doctor.facts import NodeFacts, local

if TYPE_CHECKING:
    from sm120check.manifest import ErrorKind, Manifest


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


class UndeclaredResult(RuntimeError):
    """A check read the result of a check it named in neither `requires` nor `uses`: the runner would not have
    waited for it, so what it read depended on thread timing."""


class DeclaredResults(Mapping[str, "Result"]):
    """The results one check may read: those of the checks it declares (`requires`, `uses`), live.

    Reading any other id raises UndeclaredResult (not KeyError, so `.get` cannot hide it)."""

    def __init__(self, results: Mapping[str, Result], allowed: tuple[str, ...], reader: str) -> None:
        self._results, self._allowed, self._reader = results, allowed, reader

    def __getitem__(self, check_id: str) -> Result:
        if check_id not in self._allowed:
            raise UndeclaredResult(
                f"check {self._reader!r} read the result of {check_id!r} without declaring it in `requires` or `uses`"
            )
        return self._results[check_id]

    def __iter__(self) -> Iterator[str]:
        return iter([i for i in self._allowed if i in self._results])

    def __len__(self) -> int:
        return sum(1 for i in self._allowed if i in self._results)


_LOCAL_FACTS = NodeFacts()  # the default: Context() reads the local facts of its manifest (see __post_init__)


@dataclass
class Context:
    """What every check may read: the manifest (or why it is missing), the node's facts, options, earlier results.

    `facts` are the inputs several checks share (GPUs, toolkit home, stack venv, FlashInfer), gathered once by the
    CLI before the checks (`facts.gather`). A Context built without them (tests, API callers) reads the local
    facts of its manifest at construction, without NVML: the driver check then asks NVML itself.

    `results` holds the results of checks that already ran, for the orderings that remain (the ABI check reads
    the libraries torch's process mapped). A running check sees only the results it declared (`requires`,
    `uses`): the runner waits for exactly those.
    """

    manifest: Manifest | None = None
    manifest_error: str = ""
    manifest_error_kind: ErrorKind | None = None  # why the manifest is unusable (None: it was read, or never asked)
    timeout: float = 120.0  # hard limit for each GPU child process, in seconds
    jit_timeout: float | None = None  # limit for a child that must JIT-compile first (None: check's default)
    gpus: tuple[int, ...] | None = None  # restrict multi-GPU checks to these indices
    results: Mapping[str, Result] = field(default_factory=dict)
    facts: NodeFacts = _LOCAL_FACTS

    def __post_init__(self) -> None:
        if self.facts is _LOCAL_FACTS:
            self.facts = local(self.manifest)


class Check(Protocol):
    """A check: its docstring is the user-facing description shown by `--list`.

    A check may also declare `needs_pcie: ClassVar[bool] = True` (absent: False): its judge reads the run's PCIe facts
    (`ctx.facts.pcie`), which the facts step then reads once for the run (`facts.pcie_reader`). Likewise
    `needs_nvml: ClassVar[bool] = True`: it reads NVML's GPU list (`ctx.facts.gpus`), asked once for the run
    (`facts.needs_nvml`) even when the driver check is not in it."""

    id: ClassVar[str]
    family: ClassVar[str]
    level: ClassVar[int]  # 1 static, 2 single-GPU work, 3 multi-GPU communication
    requires: ClassVar[tuple[str, ...]]  # ids of checks that must not fail or skip first
    uses: ClassVar[tuple[str, ...]]  # ids of checks whose results it reads when they ran, whatever their status

    def run(self, ctx: Context) -> Result: ...

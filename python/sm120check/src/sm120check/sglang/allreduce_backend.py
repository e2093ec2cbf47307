"""Which all-reduce backend a started SGLang server used for its tensor-parallel reductions, read from its log.

SGLang 0.5.22 added FlashInfer's PCIe-IPC all-reduce (`srt/distributed/device_communicators/pcie_ipc_ar.py`), off
unless the server's environment sets `SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1`; its workspace is sized for the widest decode
reduction (`SGLANG_PCIE_IPC_MAX_NUMEL` overrides it) and larger reductions stay on SGLang's other backends. The
communicator logs whether it was built, whether its workspace was, and why it stayed off; the table below holds those
lines, copied from the format strings of 0.5.22 and 0.5.23 (tests/sglang/test_launch_verify.py renders every row
from both releases' sources). Pure: verify-launch and the bench hand it the lines.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from sm120check import versions
from sm120check.sglang.launch_terms import printable

ENV_ENABLE = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
FIRST_RELEASE = "0.5.22"  # the first release with pcie_ipc_ar.py (0.5.16 has none)
PCIE_IPC_FILE = "srt/distributed/device_communicators/pcie_ipc_ar.py"
PARALLEL_STATE_FILE = "srt/distributed/parallel_state.py"
SEEN = ("0.5.22", "0.5.23")
_EVIDENCE_CHARS = 400


class Backend(str, Enum):
    """The all-reduce backend a server's tensor-parallel reductions used (what bench records and crossover compare)."""

    PCIE_IPC = "pcie-ipc"  # FlashInfer's PCIe-IPC kernels for reductions up to the workspace, the rest on the default
    DEFAULT = "default"  # SGLang's own choice (custom all-reduce, symmetric memory or NCCL): PCIe-IPC off
    NONE = "none"  # one rank: no all-reduce at all
    UNKNOWN = "unknown"


class Role(str, Enum):
    ON = "on"  # the communicator or its workspace was built
    OFF = "off"  # it stayed off or gave up: reductions on the default backend
    NOTE = "note"  # it runs, with a limit worth knowing


@dataclass(frozen=True)
class BackendLine:
    id: str
    role: Role
    regex: str
    meaning: str
    file: str = PCIE_IPC_FILE
    seen: tuple[str, str] = SEEN
    fix: str = ""

    @property
    def compiled(self) -> re.Pattern[str]:
        return re.compile(self.regex)


_DOCTOR = "`sm120check doctor --level 3` checks P2P (iommu, pcie_acs, nccl_pairs) before the role turns it on"

BACKEND_LINES: tuple[BackendLine, ...] = (
    BackendLine(
        id="pcie-ipc-enabled",
        role=Role.ON,
        regex=r"FlashInfer PCIe-IPC all-reduce enabled \(world=(?P<world>\d+), workspace sized on first reduction\)",
        meaning="the communicator was built for the tp group; its workspace follows before graph capture",
    ),
    BackendLine(
        id="pcie-ipc-workspace-built",
        role=Role.ON,
        regex=r"FlashInfer PCIe-IPC workspace built \(world=(?P<world>\d+), max_numel=(?P<max_numel>\d+), "
        r"hidden=(?P<hidden>\d+)\)",
        meaning="the workspace exists: bf16 reductions up to max_numel elements run on the PCIe-IPC kernels",
    ),
    BackendLine(
        id="pcie-ipc-workspace-failed",
        role=Role.OFF,
        regex=r"FlashInfer PCIe-IPC workspace \(max_numel=(?P<max_numel>\d+)\) failed: (?P<error>.*); "
        r"reductions stay on NCCL",
        meaning="building the workspace raised: every reduction stays on the default backend",
        fix=f"the error is in the line (IPC handles need working P2P); {_DOCTOR}; or set "
        "sglang_server_pcie_ipc_allreduce: off",
    ),
    BackendLine(
        id="pcie-ipc-setup-failed",
        role=Role.OFF,
        regex=r"Setup FlashInfer PCIe-IPC allreduce failed with (?P<error>.*)\.",
        meaning="constructing the communicator raised: every reduction stays on the default backend",
        file=PARALLEL_STATE_FILE,
        fix=f"the error is in the line; {_DOCTOR}; or set sglang_server_pcie_ipc_allreduce: off",
    ),
    BackendLine(
        id="pcie-ipc-no-flashinfer",
        role=Role.OFF,
        regex=r"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is set but this FlashInfer build has no pcie_ipc_comm",
        meaning="the installed FlashInfer lacks flashinfer.comm.PcieIpcAllReduceWorkspace: NCCL all-reduce",
        fix="install the FlashInfer the SGLang release pins (`sm120check doctor --select python_stack` names it)",
    ),
    BackendLine(
        id="pcie-ipc-deterministic",
        role=Role.OFF,
        regex=r"Deterministic inference is on; leaving PCIe-IPC all-reduce off\.",
        meaning="deterministic inference keeps PCIe-IPC off (its tactic follows the batch shape)",
        fix="drop --enable-deterministic-inference, or leave sglang_server_pcie_ipc_allreduce: off",
    ),
    BackendLine(
        id="pcie-ipc-bf16-only",
        role=Role.NOTE,
        regex=r"FlashInfer PCIe-IPC all-reduce serves bf16 only; (?P<dtype>\S+) reductions stay on NCCL\.",
        meaning="reductions of another dtype stay on the default backend (bf16 ones use PCIe-IPC)",
    ),
    BackendLine(
        id="pcie-ipc-fallback-width",
        role=Role.NOTE,
        regex=r"FlashInfer PCIe-IPC is sizing its workspace from the fixed fallback width (?P<width>\d+), not from "
        r"this server's decode config",
        meaning="the workspace is sized from a fixed width, not from this server's decode batches",
    ),
    BackendLine(
        id="pcie-ipc-autotuned",
        role=Role.NOTE,
        regex=r"FlashInfer PCIe-IPC all-reduce autotuned (?P<shapes>\d+) shape\(s\)",
        meaning="the kernels run measured tactics",
    ),
    BackendLine(
        id="pcie-ipc-seed-policy",
        role=Role.NOTE,
        regex=r"FlashInfer PCIe-IPC (?:all-reduce: --disable-flashinfer-autotune is set; keeping|all-reduce .*"
        r"(?:keeping|running) (?:FlashInfer's|the) seed policy|autotune (?:failed|covered no shapes))",
        meaning="the kernels run FlashInfer's seed policy, not tactics measured on this host",
    ),
)


@dataclass(frozen=True)
class BackendMatch:
    line: BackendLine
    number: int  # 1-based line of the log
    text: str
    details: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BackendEvidence:
    """The all-reduce backend a server used, and the lines that say so."""

    backend: Backend
    reason: str
    matches: tuple[BackendMatch, ...] = ()
    max_numel: int | None = None

    @property
    def fix(self) -> str:
        return next((m.line.fix for m in self.matches if m.line.role is Role.OFF and m.line.fix), "")

    @property
    def note(self) -> str:
        text = f"all-reduce backend: {self.backend.value} ({self.reason})"
        return f"{text}; fix: {self.fix}" if self.fix else text

    def to_dict(self) -> dict[str, object]:
        return {
            "backend": self.backend.value,
            "reason": self.reason,
            "max_numel": self.max_numel,
            "lines": [{"id": m.line.id, "line": m.number, "text": m.text} for m in self.matches],
        }


def scan(lines: Sequence[str], start: int = 1, complete: bool = True) -> BackendEvidence:
    """The backend from the PCIe-IPC lines of one server run: `lines` is the whole log, `start` the 1-based line of the
    run's start (earlier lines belong to earlier runs), `complete` whether the log holds the run's whole startup."""
    found: dict[str, BackendMatch] = {}
    for number in range(max(start, 1), len(lines) + 1):
        raw = lines[number - 1]
        if "PCIe-IPC" not in raw and "PCIE_IPC" not in raw:
            continue
        for row in BACKEND_LINES:
            m = row.compiled.search(raw)
            if m is not None and row.id not in found:
                details = {k: printable(v)[:200] for k, v in m.groupdict().items() if v is not None}
                found[row.id] = BackendMatch(row, number, printable(raw.strip())[:_EVIDENCE_CHARS], details)
    matches = tuple(sorted(found.values(), key=lambda m: m.number))
    off = [m for m in matches if m.line.role is Role.OFF]
    notes = [m.line.meaning for m in matches if m.line.role is Role.NOTE]
    built = found.get("pcie-ipc-workspace-built")
    if off:
        error = off[0].details.get("error")
        why = f"PCIe-IPC asked for, but {off[0].line.meaning}" + (f" (error: {error})" if error else "")
        return BackendEvidence(Backend.DEFAULT, why, matches)
    if built is not None:
        numel = int(built.details["max_numel"])
        reason = (
            f"workspace built: bf16 reductions up to {numel} elements (hidden {built.details['hidden']}, "
            f"world {built.details['world']}) on FlashInfer's PCIe-IPC kernels, larger ones on the default"
        )
        return BackendEvidence(Backend.PCIE_IPC, "; ".join([reason, *notes]), matches, numel)
    if "pcie-ipc-enabled" in found:
        reason = "the communicator was built; its workspace is built on the first eligible reduction"
        return BackendEvidence(Backend.PCIE_IPC, "; ".join([reason, *notes]), matches)
    if complete:
        return BackendEvidence(
            Backend.DEFAULT,
            f"no PCIe-IPC line in a complete startup: {ENV_ENABLE} unset, one rank, or SGLang before {FIRST_RELEASE}",
            matches,
        )
    return BackendEvidence(Backend.UNKNOWN, "the log does not hold this run's whole startup", matches)


UNKNOWN_FROM_INFO = (
    f"SGLang's /server_info does not carry the server's environment ({ENV_ENABLE}): give the bench the server's log "
    "(--server-log FILE)"
)


def from_server_info(info: Mapping[str, object]) -> tuple[Backend, str]:
    """What SGLang's /server_info alone tells of the backend: one rank (none), a release without PCIe-IPC (default),
    else unknown (the switch is an environment variable, which /server_info does not show)."""
    tp = info.get("tp_size")
    if isinstance(tp, int) and not isinstance(tp, bool) and tp == 1:
        return Backend.NONE, "tp_size 1: one rank, no all-reduce"
    version = info.get("version")
    parsed = versions.parse_or_none(version if isinstance(version, str) else None)
    if parsed is not None and parsed < versions.parse(FIRST_RELEASE):
        return Backend.DEFAULT, f"SGLang {printable(str(version))[:40]} has no PCIe-IPC all-reduce ({FIRST_RELEASE}+)"
    return Backend.UNKNOWN, UNKNOWN_FROM_INFO


def combine(info: tuple[Backend, str], log: BackendEvidence | None) -> tuple[Backend, str]:
    """The backend from server_info and, where given, the server's log: a fact of server_info (one rank, an old
    release) stands; otherwise the log's lines decide."""
    if info[0] is not Backend.UNKNOWN or log is None or log.backend is Backend.UNKNOWN:
        return info
    return log.backend, f"server log: {log.reason}"

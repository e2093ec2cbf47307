"""The answer of sglang_sm120/sglang_comm_probe.py: the launch of SGLang's own communication code on the ranks, and per
rank its workspace preflight, TorchSymmMemCommunicator, PcieIpcCommunicator and fused allreduce + residual + RMSNorm, as
SGLang ran them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sm120check.doctor.payload import Fields

PROBE = "sglang_comm"


def _drop_none(values: Mapping[str, object]) -> dict[str, object]:
    return {k: v for k, v in values.items() if v is not None}


@dataclass(frozen=True)
class Preflight:
    """SGLang's `_preflight_check_workspace_memory` (absent in releases without it: present False)."""

    present: bool
    ok: bool | None = None
    sizes: tuple[int, ...] | None = None  # the workspace allocations it would make
    sizes_error: str | None = None  # why sizing failed (the failure SGLang turns into "Skipping allreduce fusion")
    log: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        if not self.present:
            return {"present": False}
        sizes = None if self.sizes is None else list(self.sizes)
        out = _drop_none({"present": True, "sizes": sizes, "sizes_error": self.sizes_error, "ok": self.ok})
        return out | {"log": list(self.log)}

    @classmethod
    def from_json(cls, f: Fields) -> Preflight:
        if not f.flag("present"):
            return cls(False)
        return cls(
            True,
            f.maybe_flag("ok"),
            f.integers("sizes") if f.has("sizes") else None,
            f.maybe_text("sizes_error"),
            f.texts("log") if f.has("log") else (),
        )


@dataclass(frozen=True)
class SymmCheck:
    elements: int
    ran: bool  # the communicator took this all_reduce (False: it left it to NCCL)
    max_abs_diff: float | None = None
    ok: bool | None = None

    def to_json(self) -> dict[str, object]:
        return _drop_none(
            {"elements": self.elements, "ran": self.ran, "max_abs_diff": self.max_abs_diff, "ok": self.ok}
        )

    @classmethod
    def from_json(cls, f: Fields) -> SymmCheck:
        return cls(f.integer("elements"), f.flag("ran"), f.maybe_number("max_abs_diff"), f.maybe_flag("ok"))


@dataclass(frozen=True)
class SymmMemRun:
    disabled: bool  # TorchSymmMemCommunicator disabled itself (its log says why)
    log: tuple[str, ...] = ()
    checks: tuple[SymmCheck, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {"disabled": self.disabled, "log": list(self.log), "checks": [c.to_json() for c in self.checks]}

    @classmethod
    def from_json(cls, f: Fields) -> SymmMemRun:
        return cls(f.flag("disabled"), f.texts("log"), tuple(SymmCheck.from_json(c) for c in f.objects("checks")))


@dataclass(frozen=True)
class PcieIpcCheck:
    """One row count through SGLang's PcieIpcCommunicator: taken (False: SGLang leaves it to NCCL), exact sum, and
    the median latency of its all-reduce and of NCCL's on the same tensor (only when exact)."""

    tokens: int
    taken: bool
    exact: bool | None = None
    pcie_ipc_us: float | None = None
    nccl_us: float | None = None
    error: str | None = None  # the exception the reduction raised (exact is then False)

    def to_json(self) -> dict[str, object]:
        values = {"tokens": self.tokens, "taken": self.taken, "exact": self.exact}
        return _drop_none(values | {"pcie_ipc_us": self.pcie_ipc_us, "nccl_us": self.nccl_us, "error": self.error})

    @classmethod
    def from_json(cls, f: Fields) -> PcieIpcCheck:
        return cls(
            f.integer("tokens"),
            f.flag("taken"),
            f.maybe_flag("exact"),
            f.maybe_number("pcie_ipc_us"),
            f.maybe_number("nccl_us"),
            f.maybe_text("error"),
        )


@dataclass(frozen=True)
class PcieIpcRun:
    """SGLang's PcieIpcCommunicator (0.5.22+; present False before, with the import's reason): disabled or not after
    `prepare` (its log says why), the workspace's max_numel for `rows` decode rows, and each row count's check."""

    present: bool
    reason: str | None = None
    disabled: bool | None = None
    rows: int | None = None
    max_numel: int | None = None
    checks: tuple[PcieIpcCheck, ...] = ()
    log: tuple[str, ...] = ()
    error: str | None = None  # the exception SGLang's build or prepare raised (disabled is then True)

    def to_json(self) -> dict[str, object]:
        if not self.present:
            return _drop_none({"present": False, "reason": self.reason})
        head: dict[str, object] = {"present": True, "disabled": self.disabled, "rows": self.rows}
        head |= {"max_numel": self.max_numel, "error": self.error}
        return _drop_none(head) | {"checks": [c.to_json() for c in self.checks], "log": list(self.log)}

    @classmethod
    def from_json(cls, f: Fields) -> PcieIpcRun:
        if not f.flag("present"):
            return cls(False, f.maybe_text("reason"))
        return cls(
            True,
            None,
            f.flag("disabled"),
            f.maybe_integer("rows"),
            f.maybe_integer("max_numel"),
            tuple(PcieIpcCheck.from_json(c) for c in f.objects("checks")) if f.has("checks") else (),
            f.texts("log") if f.has("log") else (),
            f.maybe_text("error"),
        )


@dataclass(frozen=True)
class FusionRun:
    ran: bool
    reason: str | None = None  # why it did not run
    max_rel_err: Mapping[str, float] = field(default_factory=dict)  # tokens -> against the torch reference
    log: tuple[str, ...] | None = None
    unavailable: bool | None = None  # SGLang's _flashinfer_allreduce_unavailable after the run

    def to_json(self) -> dict[str, object]:
        log = None if self.log is None else list(self.log)
        errors = dict(self.max_rel_err) if self.ran or self.max_rel_err else None  # a release it cannot run: none
        values = {"ran": self.ran, "max_rel_err": errors, "reason": self.reason, "log": log}
        return _drop_none(values | {"unavailable": self.unavailable})

    @classmethod
    def from_json(cls, f: Fields) -> FusionRun:
        errors = f.object("max_rel_err") if f.has("max_rel_err") else None
        return cls(
            f.flag("ran"),
            f.maybe_text("reason"),
            {k: errors.number(k) for k in errors.data} if errors is not None else {},
            f.texts("log") if f.has("log") else None,
            f.maybe_flag("unavailable"),
        )


@dataclass(frozen=True)
class SglangRank:
    """One rank; a rank that failed has only `error` (and `traceback`), one that was killed has nothing."""

    device: int | None = None
    name: str | None = None
    cc: str | None = None
    rank: int | None = None
    sglang: str | None = None  # SGLang's version
    sglang_path: str | None = None
    preflight: Preflight | None = None
    symm_mem: SymmMemRun | None = None  # two ranks or more
    fusion: FusionRun | None = None  # two ranks or more, when the preflight passed
    error: str | None = None
    traceback: str | None = None
    pcie_ipc: PcieIpcRun | None = None  # two ranks or more

    def to_json(self) -> dict[str, object]:
        parts: dict[str, object] = {
            "preflight": None if self.preflight is None else self.preflight.to_json(),
            "symm_mem": None if self.symm_mem is None else self.symm_mem.to_json(),
            "pcie_ipc": None if self.pcie_ipc is None else self.pcie_ipc.to_json(),
            "fusion": None if self.fusion is None else self.fusion.to_json(),
        }
        head: dict[str, object] = {
            "device": self.device,
            "name": self.name,
            "cc": self.cc,
            "rank": self.rank,
            "sglang": self.sglang,
        }
        tail: dict[str, object] = {"error": self.error, "traceback": self.traceback}
        return _drop_none(head | {"sglang_path": self.sglang_path} | parts | tail)

    @classmethod
    def from_json(cls, f: Fields) -> SglangRank:
        return cls(
            f.maybe_integer("device"),
            f.maybe_text("name"),
            f.maybe_text("cc"),
            f.maybe_integer("rank"),
            f.maybe_text("sglang"),
            f.maybe_text("sglang_path"),
            Preflight.from_json(f.object("preflight")) if f.has("preflight") else None,
            SymmMemRun.from_json(f.object("symm_mem")) if f.has("symm_mem") else None,
            FusionRun.from_json(f.object("fusion")) if f.has("fusion") else None,
            f.maybe_text("error"),
            f.maybe_text("traceback"),
            PcieIpcRun.from_json(f.object("pcie_ipc")) if f.has("pcie_ipc") else None,
        )


@dataclass(frozen=True)
class SglangCommAnswer:
    ok: bool  # every rank delivered
    problem: str  # why not, one line
    timed_out: bool
    seconds: float
    ranks: tuple[SglangRank, ...]
    evidence: str = ""  # each failing rank's phase and log tail

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "problem": self.problem,
            "timed_out": self.timed_out,
            "seconds": self.seconds,
            "ranks": [r.to_json() for r in self.ranks],
            "evidence": self.evidence,
        }

    @classmethod
    def from_json(cls, data: object) -> SglangCommAnswer:
        f = Fields(PROBE, data)
        return cls(
            f.flag("ok"),
            f.text("problem"),
            f.flag("timed_out"),
            f.number("seconds"),
            tuple(SglangRank.from_json(r) for r in f.objects("ranks")),
            f.text("evidence"),
        )

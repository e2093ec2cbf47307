"""The answer of comm/fusion_probe.py: the JIT modules rank 0 built or found cached (sm120check.jitcache.build), per
rank FlashInfer allreduce + residual + RMSNorm against the torch reference with fused and unfused latency, and
PcieIpcAllReduceWorkspace where FlashInfer has it; merged over the ranks. `--warm` prints a FusionWarm."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sm120check.doctor.collective_payload import (
    LaunchFacts,
    RankHead,
    drop_none,
    keyed,
    numbers,
    stats_from,
    stats_json,
)
from sm120check.doctor.payload import Fields
from sm120check.doctor.stats import LatencyStats

PROBE = "fusion"


@dataclass(frozen=True)
class JitModule:
    """One module as sm120check.jitcache.build left it (its ModuleOutcome)."""

    name: str
    cached_before: bool
    built: bool
    seconds: float
    module_dir: str
    verdict_after: str  # ninja's view after the build: "no work"
    library: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "cached_before": self.cached_before,
            "built": self.built,
            "seconds": self.seconds,
            "module_dir": self.module_dir,
            "verdict_after": self.verdict_after,
            "library": self.library,
        }

    @classmethod
    def from_json(cls, f: Fields) -> JitModule:
        return cls(
            f.text("name"),
            f.flag("cached_before"),
            f.flag("built"),
            f.number("seconds"),
            f.text("module_dir"),
            f.text("verdict_after"),
            f.text("library"),
        )


@dataclass(frozen=True)
class JitEnvironment:
    """FlashInfer's own view of its JIT targets and cache (jitcache.build.FlashinferView)."""

    arch_list_env: str  # FLASHINFER_CUDA_ARCH_LIST, "" when unset
    targets: tuple[str, ...]  # "120f", "90a"
    jit_dir: str
    workspace_base_env: str

    def to_json(self) -> dict[str, object]:
        return {
            "arch_list_env": self.arch_list_env,
            "targets": list(self.targets),
            "jit_dir": self.jit_dir,
            "workspace_base_env": self.workspace_base_env,
        }

    @classmethod
    def from_json(cls, f: Fields) -> JitEnvironment:
        return cls(f.text("arch_list_env"), f.texts("targets"), f.text("jit_dir"), f.text("workspace_base_env"))


@dataclass(frozen=True)
class JitBuild:
    modules: tuple[JitModule, ...]
    environment: JitEnvironment

    def to_json(self) -> dict[str, object]:
        return {"modules": [m.to_json() for m in self.modules], "environment": self.environment.to_json()}

    @classmethod
    def from_json(cls, f: Fields) -> JitBuild:
        modules = tuple(JitModule.from_json(m) for m in f.objects("modules"))
        return cls(modules, JitEnvironment.from_json(f.object("environment")))


@dataclass(frozen=True)
class FusionSize:
    """One token count on one rank: relative errors of the fused outputs, and fused/unfused latency."""

    residual_rel_err: float
    norm_rel_err: float
    fused: LatencyStats
    unfused: LatencyStats

    def to_json(self) -> dict[str, object]:
        return {
            "residual_rel_err": self.residual_rel_err,
            "norm_rel_err": self.norm_rel_err,
            "latency_us": {"fused": stats_json(self.fused), "unfused": stats_json(self.unfused)},
        }

    @classmethod
    def from_json(cls, f: Fields) -> FusionSize:
        latency = f.object("latency_us")
        return cls(
            f.number("residual_rel_err"),
            f.number("norm_rel_err"),
            stats_from(latency.object("fused")),
            stats_from(latency.object("unfused")),
        )


@dataclass(frozen=True)
class PcieSize:
    supported: bool  # the workspace takes a message of this size
    correct: bool | None = None
    latency_us: LatencyStats | None = None

    def to_json(self) -> dict[str, object]:
        latency = None if self.latency_us is None else stats_json(self.latency_us)
        return drop_none({"supported": self.supported, "correct": self.correct, "latency_us": latency})

    @classmethod
    def from_json(cls, f: Fields) -> PcieSize:
        if not f.flag("supported"):
            return cls(False)
        return cls(True, f.flag("correct"), stats_from(f.object("latency_us")))


@dataclass(frozen=True)
class PcieRank:
    """PcieIpcAllReduceWorkspace on one rank."""

    profile: str
    sizes: Mapping[str, PcieSize] = field(default_factory=dict)  # tokens ->

    def to_json(self) -> dict[str, object]:
        return {"profile": self.profile, "sizes": {k: v.to_json() for k, v in self.sizes.items()}}

    @classmethod
    def from_json(cls, f: Fields) -> PcieRank:
        return cls(f.text("profile"), keyed(f, "sizes", PcieSize.from_json))


@dataclass(frozen=True)
class FusionRank:
    head: RankHead = field(default_factory=RankHead)
    jit: JitBuild | None = None  # rank 0
    flashinfer: str | None = None
    backend_requested: str | None = None
    backend: str | None = None
    workspace: str | None = None  # the workspace class FlashInfer created
    sizes: Mapping[str, FusionSize] = field(default_factory=dict)  # tokens ->
    pcie_ipc: PcieRank | None = None
    pcie_ipc_error: str | None = None

    def to_json(self) -> dict[str, object]:
        values: dict[str, object] = {
            "jit": None if self.jit is None else self.jit.to_json(),
            "flashinfer": self.flashinfer,
            "backend_requested": self.backend_requested,
            "backend": self.backend,
            "workspace": self.workspace,
            "sizes": {k: v.to_json() for k, v in self.sizes.items()} if self.sizes else None,
            "pcie_ipc": None if self.pcie_ipc is None else self.pcie_ipc.to_json(),
            "pcie_ipc_error": self.pcie_ipc_error,
        }
        return self.head.to_json() | drop_none(values)

    @classmethod
    def from_json(cls, f: Fields) -> FusionRank:
        return cls(
            RankHead.from_json(f),
            JitBuild.from_json(f.object("jit")) if f.has("jit") else None,
            f.maybe_text("flashinfer"),
            f.maybe_text("backend_requested"),
            f.maybe_text("backend"),
            f.maybe_text("workspace"),
            keyed(f, "sizes", FusionSize.from_json) if f.has("sizes") else {},
            PcieRank.from_json(f.object("pcie_ipc")) if f.has("pcie_ipc") else None,
            f.maybe_text("pcie_ipc_error"),
        )


@dataclass(frozen=True)
class PcieSummary:
    """PcieIpcAllReduceWorkspace over the ranks: the first rank's error, or correct everywhere and the slowest
    median per token count."""

    error: str | None = None
    profile: str = ""
    correct: bool = False
    latency_us: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        if self.error is not None:
            return {"error": self.error}
        return {"profile": self.profile, "correct": self.correct, "latency_us": dict(self.latency_us)}

    @classmethod
    def from_json(cls, f: Fields) -> PcieSummary:
        if f.has("error"):
            return cls(f.text("error"))
        return cls(None, f.text("profile"), f.flag("correct"), numbers(f, "latency_us"))


@dataclass(frozen=True)
class FusionAnswer:
    launch: LaunchFacts
    ranks: tuple[FusionRank, ...]
    jit: JitBuild | None = None  # rank 0's, also when the launch failed after it
    # Merged over the ranks, present when every rank delivered:
    flashinfer: str | None = None
    backend: str | None = None
    workspace: str | None = None
    max_rel_err: Mapping[str, float] = field(default_factory=dict)  # tokens -> worst of residual and norm
    fused_us: Mapping[str, float] = field(default_factory=dict)  # tokens -> slowest median
    unfused_us: Mapping[str, float] = field(default_factory=dict)
    pcie_ipc: PcieSummary | None = None

    def to_json(self) -> dict[str, object]:
        out = self.launch.to_json() | {"ranks": [r.to_json() for r in self.ranks]}
        if self.jit is not None:
            out["jit"] = self.jit.to_json()
        if not self.launch.ok:
            return out
        merged: dict[str, object] = {
            "flashinfer": self.flashinfer,
            "backend": self.backend,
            "workspace": self.workspace,
            "max_rel_err": dict(self.max_rel_err),
            "latency_us": {"fused": dict(self.fused_us), "unfused": dict(self.unfused_us)},
            "pcie_ipc": None if self.pcie_ipc is None else self.pcie_ipc.to_json(),
        }
        return out | drop_none(merged)

    @classmethod
    def from_json(cls, data: object) -> FusionAnswer:
        f = Fields(PROBE, data)
        launch = LaunchFacts.from_json(f)
        ranks = tuple(FusionRank.from_json(r) for r in f.objects("ranks"))
        jit = JitBuild.from_json(f.object("jit")) if f.has("jit") else None
        if not launch.ok:
            return cls(launch, ranks, jit)
        latency = f.object("latency_us")
        return cls(
            launch,
            ranks,
            jit,
            f.maybe_text("flashinfer"),
            f.maybe_text("backend"),
            f.maybe_text("workspace"),
            numbers(f, "max_rel_err"),
            numbers(latency, "fused"),
            numbers(latency, "unfused"),
            PcieSummary.from_json(f.object("pcie_ipc")) if f.has("pcie_ipc") else None,
        )


@dataclass(frozen=True)
class FusionWarm:
    """`--warm`: the JIT modules built in the probe's own process, or why that failed."""

    ok: bool
    build: JitBuild | None = None
    problem: str = ""

    def to_json(self) -> dict[str, object]:
        if self.build is None:
            return {"ok": self.ok, "problem": self.problem}
        return {"ok": self.ok} | self.build.to_json()

    @classmethod
    def from_json(cls, data: object) -> FusionWarm:
        f = Fields(PROBE, data)
        if f.has("modules"):
            return cls(f.flag("ok"), JitBuild.from_json(f))
        return cls(f.flag("ok"), problem=f.text("problem"))

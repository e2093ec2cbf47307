"""The answer of comm/symm_mem_probe.py: per rank and token count, torch symmetric memory's one-shot, two-shot (and,
where multicast exists and is allowed, multimem) allreduce against NCCL, with latency; merged over the ranks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sm120check.doctor.collective_payload import (
    LaunchFacts,
    RankHead,
    drop_none,
    flags,
    keyed,
    keyed_stats,
    numbers,
    stats_map_json,
    texts,
)
from sm120check.doctor.payload import Fields
from sm120check.doctor.stats import LatencyStats

PROBE = "symm_mem"


def _fact(f: Fields, name: str) -> bool | str | None:
    """A fact only some torch releases can tell: its value, or "unavailable: <error>"."""
    if f.data.get(name) is None:
        return None
    return f.flag(name) if isinstance(f.data[name], bool) else f.text(name)


@dataclass(frozen=True)
class SymmSize:
    """One token count on one rank: each path's result against NCCL's (NCCL's against the exact sum)."""

    nccl_matches_reference: bool
    one_shot_correct: bool
    two_shot_correct: bool
    latency_us: Mapping[str, LatencyStats]  # "nccl", "one_shot", "two_shot" (and "multimem")
    multimem_correct: bool | None = None  # None: multimem not run

    @property
    def correct(self) -> dict[str, bool]:
        """Per path that ran: whether it equals NCCL's result."""
        paths = {"one_shot": self.one_shot_correct, "two_shot": self.two_shot_correct}
        return paths if self.multimem_correct is None else paths | {"multimem": self.multimem_correct}

    def to_json(self) -> dict[str, object]:
        values: dict[str, object] = {
            "nccl_matches_reference": self.nccl_matches_reference,
            "one_shot_correct": self.one_shot_correct,
            "two_shot_correct": self.two_shot_correct,
            "multimem_correct": self.multimem_correct,
            "latency_us": stats_map_json(self.latency_us),
        }
        return drop_none(values)

    @classmethod
    def from_json(cls, f: Fields) -> SymmSize:
        return cls(
            f.flag("nccl_matches_reference"),
            f.flag("one_shot_correct"),
            f.flag("two_shot_correct"),
            keyed_stats(f, "latency_us"),
            f.maybe_flag("multimem_correct"),
        )


@dataclass(frozen=True)
class SymmRank:
    head: RankHead = field(default_factory=RankHead)
    torch: str | None = None
    nvshmem_available: bool | str | None = None  # torch 2.8+; else "unavailable: <error>"
    backend: str | None = None  # torch 2.9+
    multicast_ptr: int | None = None  # of the last handle; 0: no multicast
    multimem_allowed: bool | None = None
    sizes: Mapping[str, SymmSize] = field(default_factory=dict)  # tokens ->

    def to_json(self) -> dict[str, object]:
        values: dict[str, object] = {
            "torch": self.torch,
            "nvshmem_available": self.nvshmem_available,
            "backend": self.backend,
            "multicast_ptr": self.multicast_ptr,
            "sizes": {k: v.to_json() for k, v in self.sizes.items()} if self.sizes else None,
            "multimem_allowed": self.multimem_allowed,
        }
        return self.head.to_json() | drop_none(values)

    @classmethod
    def from_json(cls, f: Fields) -> SymmRank:
        return cls(
            RankHead.from_json(f),
            f.maybe_text("torch"),
            _fact(f, "nvshmem_available"),
            f.maybe_text("backend"),
            f.maybe_integer("multicast_ptr"),
            f.maybe_flag("multimem_allowed"),
            keyed(f, "sizes", SymmSize.from_json) if f.has("sizes") else {},
        )


@dataclass(frozen=True)
class SymmMemAnswer:
    launch: LaunchFacts
    ranks: tuple[SymmRank, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # the multicast switches as the ranks saw them
    # Merged over the ranks, present when every rank delivered:
    multicast_ptr: tuple[int, ...] = ()  # per rank
    multimem_allowed: bool = False
    correct: Mapping[str, bool] = field(default_factory=dict)  # path -> right at every size on every rank
    latency_us: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # path -> tokens -> slowest median

    def to_json(self) -> dict[str, object]:
        out = self.launch.to_json() | {"ranks": [r.to_json() for r in self.ranks], "env": dict(self.env)}
        if not self.launch.ok:
            return out
        return out | {
            "multicast_ptr": list(self.multicast_ptr),
            "multimem_allowed": self.multimem_allowed,
            "correct": dict(self.correct),
            "latency_us": {op: dict(v) for op, v in self.latency_us.items()},
        }

    @classmethod
    def from_json(cls, data: object) -> SymmMemAnswer:
        f = Fields(PROBE, data)
        launch = LaunchFacts.from_json(f)
        ranks = tuple(SymmRank.from_json(r) for r in f.objects("ranks"))
        env = texts(f, "env")
        if not launch.ok:
            return cls(launch, ranks, env)
        latency = f.object("latency_us")
        return cls(
            launch,
            ranks,
            env,
            f.integers("multicast_ptr"),
            f.flag("multimem_allowed"),
            flags(f, "correct"),
            {str(op): numbers(latency, str(op)) for op in latency.data},
        )

"""The answer of comm/peer_stress_probe.py: for each target GPU in turn, every other selected GPU writes to it at once
(many-to-one), each source's solo write rate first and its rate under that load, and the aggregate into the target.
"""

from __future__ import annotations

from dataclasses import dataclass

from sm120check.doctor.payload import Fields

PROBE = "peer_stress"
NOT_MEASURED = "not measured"  # how a target's error starts when the probe's time ran out before it


@dataclass(frozen=True)
class StressSource:
    """One source GPU writing to the round's target: alone first (`solo_gbps`, the median of a few copies), then
    with every other source writing to the same target (`loaded_gbps`, its copies' bytes over its stream's time)."""

    src: int  # NVML index
    src_bus: str
    p2p: bool  # peer access both ways; False: the driver staged the copies through the host
    solo_gbps: float | None
    loaded_gbps: float | None
    access: str = ""
    error: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "src": self.src,
            "src_bus": self.src_bus,
            "p2p": self.p2p,
            "solo_gbps": self.solo_gbps,
            "loaded_gbps": self.loaded_gbps,
            "access": self.access,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, f: Fields) -> StressSource:
        return cls(
            f.integer("src"),
            f.text("src_bus"),
            f.flag("p2p"),
            f.maybe_number("solo_gbps"),
            f.maybe_number("loaded_gbps"),
            f.text("access"),
            f.text("error"),
        )


@dataclass(frozen=True)
class StressTarget:
    """One round: every source writes to `target` at once, starts staggered. `aggregate_gbps`: all sources' bytes
    over the host's time from the first start to the last copy's end. `error` set: a CUDA call failed (or the time
    ran out: it starts with NOT_MEASURED) and the figures it did not reach are None."""

    target: int
    target_bus: str
    sources: tuple[StressSource, ...]
    aggregate_gbps: float | None
    seconds: float = 0.0
    error: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "target": self.target,
            "target_bus": self.target_bus,
            "sources": [s.to_json() for s in self.sources],
            "aggregate_gbps": self.aggregate_gbps,
            "seconds": self.seconds,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, f: Fields) -> StressTarget:
        return cls(
            f.integer("target"),
            f.text("target_bus"),
            tuple(StressSource.from_json(s) for s in f.objects("sources")),
            f.maybe_number("aggregate_gbps"),
            f.number("seconds"),
            f.text("error"),
        )


@dataclass(frozen=True)
class StressAnswer:
    """The whole answer. `error` set: nothing could be measured (NVML or libcuda did not load, cuInit failed)."""

    targets: tuple[StressTarget, ...]
    size_bytes: int  # per copy
    copies: int  # per source under load
    stagger_s: float  # between one source's start and the next
    error: str = ""
    left_out: tuple[str, ...] = ()  # selected GPUs that took part in no round, each with why

    def to_json(self) -> dict[str, object]:
        return {
            "targets": [t.to_json() for t in self.targets],
            "size_bytes": self.size_bytes,
            "copies": self.copies,
            "stagger_s": self.stagger_s,
            "error": self.error,
            "left_out": list(self.left_out),
        }

    @classmethod
    def from_json(cls, data: object) -> StressAnswer:
        f = Fields(PROBE, data)
        return cls(
            tuple(StressTarget.from_json(t) for t in f.objects("targets")),
            f.integer("size_bytes"),
            f.integer("copies"),
            f.number("stagger_s"),
            f.text("error"),
            f.texts("left_out"),
        )

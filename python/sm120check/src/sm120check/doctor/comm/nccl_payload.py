"""The answer of comm/nccl_probe.py: per rank the NCCL version, exact results at the EAGLE-3 verify size and at the
message sizes of NVIDIA/nccl#2418 (512 KiB and more) up to the 64 MiB bandwidth buffer, latency per token count and
bus bandwidth; merged over the ranks, and the link kind between the GPUs (`nvidia-smi topo -m`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sm120check.doctor.collective_payload import LaunchFacts, RankHead, drop_none, keyed_stats, numbers, stats_map_json
from sm120check.doctor.payload import Fields, PayloadError
from sm120check.doctor.stats import LatencyStats

PROBE = "nccl"


def size_label(nbytes: int) -> str:
    """524288 -> "512 KiB", 67108864 -> "64 MiB"."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


@dataclass(frozen=True)
class SizeCheck:
    """One allreduce of a pattern whose exact sum is known, at `bytes` bytes of bf16."""

    bytes: int
    correct: bool
    mismatches: int  # elements that differ from the exact sum (summed over the ranks once merged)

    def to_json(self) -> dict[str, object]:
        return {"bytes": self.bytes, "correct": self.correct, "mismatches": self.mismatches}

    @classmethod
    def from_json(cls, f: Fields) -> SizeCheck:
        return cls(f.integer("bytes"), f.flag("correct"), f.integer("mismatches"))


@dataclass(frozen=True)
class Bandwidth:
    bytes: int
    seconds: float  # per allreduce
    algbw_gbps: float
    busbw_gbps: float

    def to_json(self) -> dict[str, object]:
        return {
            "bytes": self.bytes,
            "seconds": self.seconds,
            "algbw_gbps": self.algbw_gbps,
            "busbw_gbps": self.busbw_gbps,
        }

    @classmethod
    def from_json(cls, f: Fields) -> Bandwidth:
        return cls(f.integer("bytes"), f.number("seconds"), f.number("algbw_gbps"), f.number("busbw_gbps"))


@dataclass(frozen=True)
class NcclRank:
    head: RankHead = field(default_factory=RankHead)
    nccl: str | None = None  # torch.cuda.nccl.version(), "2.28.9"
    correct: bool | None = None  # the verify size: max(tokens) x hidden
    mismatches: int | None = None
    sizes: tuple[SizeCheck, ...] = ()
    failed_bytes: int | None = None  # the message size whose allreduce raised (the rank's `error` says how)
    latency_us: Mapping[str, LatencyStats] | None = None  # tokens -> per-call latency
    bandwidth: Bandwidth | None = None

    def to_json(self) -> dict[str, object]:
        values: dict[str, object] = {
            "nccl": self.nccl,
            "correct": self.correct,
            "mismatches": self.mismatches,
            "sizes": [s.to_json() for s in self.sizes] if self.sizes else None,
            "failed_bytes": self.failed_bytes,
            "latency_us": None if self.latency_us is None else stats_map_json(self.latency_us),
            "bandwidth": None if self.bandwidth is None else self.bandwidth.to_json(),
        }
        return self.head.to_json() | drop_none(values)

    @classmethod
    def from_json(cls, f: Fields) -> NcclRank:
        return cls(
            RankHead.from_json(f),
            f.maybe_text("nccl"),
            f.maybe_flag("correct"),
            f.maybe_integer("mismatches"),
            tuple(SizeCheck.from_json(s) for s in f.objects("sizes")) if f.has("sizes") else (),
            f.maybe_integer("failed_bytes"),
            keyed_stats(f, "latency_us") if f.has("latency_us") else None,
            Bandwidth.from_json(f.object("bandwidth")) if f.has("bandwidth") else None,
        )


@dataclass(frozen=True)
class PairLink:
    """How two GPUs are connected, from `nvidia-smi topo -m`: code "NV18", "PHB", ...; kind "nvlink", "pcie" or
    "unknown"."""

    pair: tuple[int, int]
    code: str
    kind: str

    def to_json(self) -> dict[str, object]:
        return {"pair": list(self.pair), "code": self.code, "kind": self.kind}

    @classmethod
    def from_json(cls, f: Fields) -> PairLink:
        pair = f.integers("pair")
        if len(pair) != 2:
            raise PayloadError(f.probe, f.at("pair"), f"expected [gpu, gpu], got {list(pair)}")
        return cls((pair[0], pair[1]), f.text("code"), f.text("kind"))


@dataclass(frozen=True)
class NcclAnswer:
    launch: LaunchFacts
    ranks: tuple[NcclRank, ...]
    links: tuple[PairLink, ...] = ()  # empty when `nvidia-smi topo -m` could not say (links_error)
    links_error: str = ""
    # Merged over the ranks, present when every rank delivered:
    correct: bool | None = None  # the verify size and every checked size, on every rank
    sizes: tuple[SizeCheck, ...] = ()  # per size: correct on every rank, mismatches summed
    latency_us: Mapping[str, float] = field(default_factory=dict)  # tokens -> slowest rank's median
    busbw_gbps: float | None = None  # the slowest rank's, at 64 MiB

    @property
    def nccl(self) -> str:
        """The NCCL version the ranks ran ("" when no rank said)."""
        return next((r.nccl for r in self.ranks if r.nccl), "")

    @property
    def over_pcie(self) -> bool:
        return any(link.kind == "pcie" for link in self.links)

    def to_json(self) -> dict[str, object]:
        merged: dict[str, object] = {}
        if self.correct is not None:
            merged = {
                "correct": self.correct,
                "sizes": [s.to_json() for s in self.sizes],
                "latency_us": dict(self.latency_us),
            }
        if self.busbw_gbps is not None:
            merged["busbw_gbps"] = self.busbw_gbps
        links = {"links": [link.to_json() for link in self.links], "links_error": self.links_error}
        return self.launch.to_json() | {"ranks": [r.to_json() for r in self.ranks]} | links | merged

    @classmethod
    def from_json(cls, data: object) -> NcclAnswer:
        f = Fields(PROBE, data)
        return cls(
            LaunchFacts.from_json(f),
            tuple(NcclRank.from_json(r) for r in f.objects("ranks")),
            tuple(PairLink.from_json(link) for link in f.objects("links")),
            f.text("links_error"),
            f.maybe_flag("correct"),
            tuple(SizeCheck.from_json(s) for s in f.objects("sizes")) if f.has("correct") else (),
            numbers(f, "latency_us") if f.has("correct") else {},
            f.maybe_number("busbw_gbps"),
        )

"""Pieces the level-3 payloads share (topology, nccl, symm_mem, fusion): a rank's head, latency statistics, and
strict reads of JSON objects keyed by token count or operation."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from sm120check.doctor.payload import Fields
from sm120check.doctor.stats import LatencyStats

FUSION_TOLERANCE = 2e-2  # bf16 outputs against an fp32 reference

T = TypeVar("T")


def drop_none(values: Mapping[str, object]) -> dict[str, object]:
    return {k: v for k, v in values.items() if v is not None}


def keyed(f: Fields, name: str, read: Callable[[Fields], T]) -> dict[str, T]:
    """An object of objects ({"1": {...}, "8": {...}}), each read by `read`."""
    inner = f.object(name)
    return {str(key): read(inner.object(str(key))) for key in inner.data}


def numbers(f: Fields, name: str) -> dict[str, float]:
    inner = f.object(name)
    return {str(key): inner.number(str(key)) for key in inner.data}


def flags(f: Fields, name: str) -> dict[str, bool]:
    inner = f.object(name)
    return {str(key): inner.flag(str(key)) for key in inner.data}


def texts(f: Fields, name: str) -> dict[str, str]:
    inner = f.object(name)
    return {str(key): inner.text(str(key)) for key in inner.data}


def stats_json(stats: LatencyStats) -> dict[str, object]:
    return dict(stats.as_dict())


def stats_from(f: Fields) -> LatencyStats:
    return LatencyStats(
        f.integer("n"),
        f.number("median_us"),
        f.number("p10_us"),
        f.number("p90_us"),
        f.number("mean_us"),
        f.number("min_us"),
    )


def keyed_stats(f: Fields, name: str) -> dict[str, LatencyStats]:
    return keyed(f, name, stats_from)


def stats_map_json(stats: Mapping[str, LatencyStats]) -> dict[str, object]:
    return {k: stats_json(v) for k, v in stats.items()}


@dataclass(frozen=True)
class RankHead:
    """What every rank of a collective probe says about itself; a rank that failed has `error` (and `traceback`)
    and perhaps what it had measured before, one that was killed has nothing."""

    rank: int | None = None
    device: int | None = None
    name: str | None = None
    cc: str | None = None  # "12.0"
    error: str | None = None
    traceback: str | None = None

    def to_json(self) -> dict[str, object]:
        return drop_none(
            {
                "rank": self.rank,
                "device": self.device,
                "name": self.name,
                "cc": self.cc,
                "error": self.error,
                "traceback": self.traceback,
            }
        )

    @classmethod
    def from_json(cls, f: Fields) -> RankHead:
        return cls(
            f.maybe_integer("rank"),
            f.maybe_integer("device"),
            f.maybe_text("name"),
            f.maybe_text("cc"),
            f.maybe_text("error"),
            f.maybe_text("traceback"),
        )


@dataclass(frozen=True)
class LaunchFacts:
    """How the rank launch went (ranks.py `Launch`), as every collective probe reports it."""

    ok: bool  # every rank delivered
    timed_out: bool
    problem: str  # why not, one line
    seconds: float
    shm_removed: tuple[str, ...] = ()
    evidence: str = ""  # each failing rank's phase and log tail

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "timed_out": self.timed_out,
            "problem": self.problem,
            "seconds": self.seconds,
            "shm_removed": list(self.shm_removed),
            "evidence": self.evidence,
        }

    @classmethod
    def from_json(cls, f: Fields) -> LaunchFacts:
        return cls(
            f.flag("ok"),
            f.flag("timed_out"),
            f.text("problem"),
            f.number("seconds"),
            f.texts("shm_removed"),
            f.text("evidence"),
        )

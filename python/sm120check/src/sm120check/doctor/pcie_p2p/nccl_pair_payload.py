"""The answer of pcie_p2p/nccl_pair_probe.py: a two-rank NCCL all-reduce on one GPU pair, with P2P on or with
NCCL_P2P_DISABLE=1, under the rank launcher's hard time limit; and what each rank said (a failed or killed rank says
little: every field of a rank may be absent)."""

from __future__ import annotations

from dataclasses import dataclass

from sm120check.doctor.collective_payload import drop_none
from sm120check.doctor.payload import Fields, PayloadError

PROBE = "nccl_pair"


@dataclass(frozen=True)
class PairRank:
    """What one rank returned: its NCCL, whether the all-reduce of a known pattern came back exact, and the bus
    bandwidth of the timed all-reduces."""

    device: int | None = None
    nccl: str | None = None
    mismatches: int | None = None  # elements that differ from the exact sum
    busbw_gbps: float | None = None
    error: str | None = None

    def to_json(self) -> dict[str, object]:
        return drop_none(
            {
                "device": self.device,
                "nccl": self.nccl,
                "mismatches": self.mismatches,
                "busbw_gbps": self.busbw_gbps,
                "error": self.error,
            }
        )

    @classmethod
    def from_json(cls, f: Fields) -> PairRank:
        return cls(
            f.maybe_integer("device"),
            f.maybe_text("nccl"),
            f.maybe_integer("mismatches"),
            f.maybe_number("busbw_gbps"),
            f.maybe_text("error"),
        )


@dataclass(frozen=True)
class PairRun:
    """One run of the pair. `finished`: both ranks delivered and the sum was exact. `hung`: the watchdog killed the
    ranks (or the probe) after `seconds`; `problem` says where (the ranks' phase) or why it failed."""

    gpus: tuple[int, int]  # NVML indices
    p2p: bool  # False: run with NCCL_P2P_DISABLE=1
    finished: bool
    hung: bool
    seconds: float
    problem: str = ""
    nccl: str = ""
    busbw_gbps: float | None = None  # the slower rank's
    evidence: str = ""  # each failing rank's phase and log tail (Python stacks on a hang)

    def to_json(self) -> dict[str, object]:
        return {
            "gpus": list(self.gpus),
            "p2p": self.p2p,
            "finished": self.finished,
            "hung": self.hung,
            "seconds": self.seconds,
            "problem": self.problem,
            "nccl": self.nccl,
            "busbw_gbps": self.busbw_gbps,
            "evidence": self.evidence,
        }

    @classmethod
    def from_json(cls, data: object) -> PairRun:
        f = Fields(PROBE, data)
        gpus = f.integers("gpus")
        if len(gpus) != 2 or gpus[0] == gpus[1]:
            raise PayloadError(PROBE, "gpus", f"expected two different GPU indices, got {list(gpus)}")
        seconds = f.number("seconds")
        if seconds < 0:
            raise PayloadError(PROBE, "seconds", f"expected seconds >= 0, got {seconds}")
        run = cls(
            (gpus[0], gpus[1]),
            f.flag("p2p"),
            f.flag("finished"),
            f.flag("hung"),
            seconds,
            f.text("problem"),
            f.text("nccl"),
            f.maybe_number("busbw_gbps"),
            f.text("evidence"),
        )
        if run.finished and run.hung:
            raise PayloadError(PROBE, "hung", "a run cannot both finish and hang")
        return run

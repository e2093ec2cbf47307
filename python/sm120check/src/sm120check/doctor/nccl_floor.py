"""The one table of NCCL releases known to break on RTX PRO 6000 / SM120, and the floor sm120kit accepts.

Evidence (upstream reports):
- before 2.26: no SM120 support, fails with "ncclMaxSharedMem ... exceeds" (sm120kit's earlier note, the reason
  for the old floor 2.26.2 in doctor/python_stack/torch.py and roles/preflight).
- NVIDIA/nccl#2418: dual RTX PRO 6000 Blackwell, NCCL 2.26.2 illegal memory access for collectives >= 512 KiB,
  not reproducible with 2.31.2 (driver 580.173.02, open modules, topo NODE). The old floor (2.26.2) is exactly it.
- NVIDIA/nccl#1637: the 2.26 series fails on RTX 5090 (SM120).
- NVIDIA/nccl#1999 and NVIDIA/nccl#2079 (hangs with P2P on dual RTX PRO 6000, 2.26.5-2.29.2) are a platform problem
  (IOMMU in translated mode, ACS redirect), not a release to avoid: the topology check and `nccl_allreduce` catch
  them.

FLOOR = 2.27.3, the first release of the series after 2.26 (tag v2.27.3-1): every 2.26.x is out, because both
reports above are against 2.26 releases, and nothing in the notes says 2.27-2.30 break on SM120. Only 2.31.2 is
confirmed good for NVIDIA/nccl#2418; 2.28.9 (torch's wheel) and 2.30.7 (sm120kit's pin) are accepted but unconfirmed, so
`judge_nccl` says so and leaves the proof to `nccl_allreduce` with >= 512 KiB messages.

The table itself is nccl_floor.json beside this file (package data), the one source both this module and
preflight's filter plugin (roles/preflight/filter_plugins/manifest_rules.py, by a path relative to its own file)
read: change the floor there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sm120check import versions

TABLE = Path(__file__).with_name("nccl_floor.json")


def _release(text: str) -> tuple[int, int, int]:
    release = versions.triple(text)
    if release is None:
        raise ValueError(f"{TABLE.name}: {text!r} is not MAJOR.MINOR.PATCH")
    return release


@dataclass(frozen=True)
class BadRelease:
    first: tuple[int, int, int]
    last: tuple[int, int, int]  # inclusive
    problem: str
    evidence: str


def _load() -> tuple[tuple[int, int, int], tuple[int, int, int], str, tuple[BadRelease, ...]]:
    data = json.loads(TABLE.read_text(encoding="utf-8"))
    bad = tuple(
        BadRelease(_release(b["first"]), _release(b["last"]), str(b["problem"]), str(b["evidence"]))
        for b in data["known_bad"]
    )
    return _release(data["floor"]), _release(data["confirmed_good"]), str(data["suggested"]), bad


FLOOR, CONFIRMED_GOOD, SUGGESTED, KNOWN_BAD = _load()  # CONFIRMED_GOOD: NVIDIA/nccl#2418's IMA does not reproduce


@dataclass(frozen=True)
class NcclJudgement:
    status: str  # "pass", "fail"
    summary: str
    details: str = ""
    remedy: str = ""


def floor() -> str:
    return ".".join(map(str, FLOOR))


def parse(version: str) -> tuple[int, int, int] | None:
    """(2, 30, 7) from "2.30.7", "2.30.7-1", "2.30.7-1+cuda13.0"; None when it is not a version."""
    return versions.triple(version)


def known_bad(version: tuple[int, int, int]) -> tuple[BadRelease, ...]:
    return tuple(bad for bad in KNOWN_BAD if bad.first <= version <= bad.last)


def judge_nccl(version: str) -> NcclJudgement:
    remedy = (
        f'pin an NCCL >= {floor()} (sm120kit_nccl_version, default "{SUGGESTED}"; '
        f"{'.'.join(map(str, CONFIRMED_GOOD))} is confirmed on nccl#2418)"
    )
    parsed = parse(version)
    if parsed is None:
        return NcclJudgement("fail", f"NCCL version {version!r} is not a version such as 2.30.7", remedy=remedy)
    bad = known_bad(parsed)
    if bad:
        details = "; ".join(f"{b.problem} ({b.evidence})" for b in bad)
        return NcclJudgement("fail", f"NCCL {version} is a known-bad release on SM120", details, remedy)
    if parsed < FLOOR:
        return NcclJudgement("fail", f"NCCL {version} is older than the floor {floor()}", remedy=remedy)
    if parsed < CONFIRMED_GOOD:
        return NcclJudgement(
            "pass",
            f"NCCL {version} >= floor {floor()}",
            "not yet confirmed against NVIDIA/nccl#2418 (IMA at >= 512 KiB; confirmed fixed in 2.31.2): the "
            "nccl_allreduce check with >= 512 KiB messages is the proof",
        )
    return NcclJudgement("pass", f"NCCL {version} >= {'.'.join(map(str, CONFIRMED_GOOD))} (confirmed on nccl#2418)")

"""The envelope's sweeps grouped by server start (tests/gpu/test_sglang_envelope.py, SM120KIT_ENVELOPE_STARTS): the
bench label of a sweep names its start (`base`, `base-r2` for start 1; `base-s2`, `base-s2-r2` for start 2), and the
spread between the starts' means per level is the noise a comparison between two servers' starts must clear."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

_SUFFIX = re.compile(r"-s(\d+)(?:-r\d+)?$|-r\d+$")


def label_of(name: str, start: int, repeat: int) -> str:
    """The bench label of sweep `repeat` (0-based) of start `start` (0-based) of server `name`."""
    tail = (f"-s{start + 1}" if start else "") + (f"-r{repeat + 1}" if repeat else "")
    return f"{name}{tail}"


def start_of(label: str, name: str) -> int:
    """The 0-based start a bench label of server `name` belongs to; a label of another server is refused."""
    if label == name:
        return 0
    if not label.startswith(name) or not (found := _SUFFIX.fullmatch(label[len(name) :])):
        raise ValueError(f"bench label {label!r} is not one of server {name!r}'s sweeps")
    return int(found.group(1)) - 1 if found.group(1) else 0


def by_start(rows: Iterable[dict[str, Any]], name: str) -> dict[int, dict[int, list[float]]]:
    """Per start (0-based), per level, every sweep's output tok/s in sweep order, from the bench's JSON lines."""
    out: dict[int, dict[int, list[float]]] = {}
    for row in rows:
        level = out.setdefault(start_of(str(row["label"]), name), {})
        level.setdefault(int(row["concurrency"]), []).append(float(row["throughput_tok_s"]))
    return out


def start_spread(starts: dict[int, dict[int, list[float]]]) -> dict[int, float]:
    """Per level: (largest - smallest) mean of one start over the mean of the starts' means; 0 with one start."""
    levels = sorted({c for per in starts.values() for c in per})
    spread = {}
    for c in levels:
        means = [sum(v) / len(v) for per in starts.values() if (v := per.get(c))]
        spread[c] = round((max(means) - min(means)) / (sum(means) / len(means)), 4)
    return spread

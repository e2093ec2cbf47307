"""The envelope-profile phase's reading of SGLang's profiler traces (tests/gpu/test_sglang_envelope.py): the Chrome
trace torch.profiler writes (`<id>-TP-0.trace.json.gz` from `/start_profile` with `num_steps`), summed per kernel
name, the GPU's idle time, the host's own time per Python function and op (SGLang profiles with its stack), and two
servers' traces set side by side."""

from __future__ import annotations

import bisect
import gzip
import itertools
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver"})  # the host's CUDA calls: synchronizations show here
# the host events that nest; record_function annotations ("user_annotation") can open inside one Python call and
# close after it, so they are left out
HOST_CATS = frozenset({"python_function", "cpu_op"}) | RUNTIME_CATS
MAX_TRACE_BYTES = 512 << 20  # a few prefill steps' trace is tens of MB; refuse to inflate more


def load(path: Path) -> dict[str, Any]:
    """A trace file, gzip or plain JSON, with its `traceEvents` list."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as stream:
        raw = stream.read(MAX_TRACE_BYTES + 1)
    if len(raw) > MAX_TRACE_BYTES:
        raise ValueError(f"{path}: more than {MAX_TRACE_BYTES >> 20} MiB of trace; profile fewer steps")
    trace = json.loads(raw)
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"{path}: not a Chrome trace (no traceEvents list)")
    return trace


def _complete(e: Any, cats: frozenset[str]) -> bool:
    return (
        isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in cats
        and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0
    )  # fmt: skip


def totals(trace: Mapping[str, Any], cats: Iterable[str] = GPU_CATS) -> dict[str, float]:
    """Milliseconds per event name over the complete ("X") events of the given categories."""
    wanted = frozenset(cats)
    out: dict[str, float] = {}
    for e in trace["traceEvents"]:
        if _complete(e, wanted):
            name = str(e.get("name", "?"))
            out[name] = out.get(name, 0.0) + e["dur"] / 1000.0
    return out


def _busy(trace: Mapping[str, Any]) -> list[tuple[float, float]]:
    """The union of the GPU events' intervals (microseconds), in order."""
    spans = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in trace["traceEvents"] if _complete(e, GPU_CATS)
    )
    merged: list[tuple[float, float]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def gpu_time(trace: Mapping[str, Any]) -> dict[str, float]:
    """The GPU's timeline in the trace: `span_ms` from the first GPU event's start to the last one's end, `busy_ms`
    the union of their intervals, `idle_ms` the rest (the GPU waiting on the host)."""
    busy = _busy(trace)
    if not busy:
        return {"span_ms": 0.0, "busy_ms": 0.0, "idle_ms": 0.0}
    span = busy[-1][1] - busy[0][0]
    on = sum(b - a for a, b in busy)
    return {"span_ms": round(span / 1000, 4), "busy_ms": round(on / 1000, 4), "idle_ms": round((span - on) / 1000, 4)}


def _own_segments(trace: Mapping[str, Any], cats: Iterable[str]) -> Iterator[tuple[str, float, float]]:
    """(name, start, end) of each host event's own time: its interval less those of the events nested in it on its
    thread (a Python function's time outside the functions, ops and CUDA calls it made)."""
    wanted = frozenset(cats)
    threads: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in trace["traceEvents"]:
        if _complete(e, wanted):
            threads.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for events in threads.values():
        yield from _thread_segments(sorted(events, key=lambda e: (float(e["ts"]), -float(e["dur"]))))


def _close_until(stack: list[list[Any]], t: float) -> Iterator[tuple[str, float, float]]:
    """Close the open events that end by `t`: their last own segment, and their parent's own time resumes."""
    while stack and stack[-1][0] <= t:
        end, name, cursor = stack.pop()
        if end > cursor:
            yield name, cursor, end
        if stack:
            stack[-1][2] = max(stack[-1][2], end)


def _thread_segments(events: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, float, float]]:
    stack: list[list[Any]] = []  # [end, name, start of its running own segment] of the open events
    for e in events:
        ts, dur = float(e["ts"]), float(e["dur"])
        yield from _close_until(stack, ts)
        if stack and ts > stack[-1][2]:
            yield stack[-1][1], stack[-1][2], ts
        if stack:
            stack[-1][2] = max(stack[-1][2], ts)
        stack.append([ts + min(dur, stack[-1][0] - ts if stack else dur), str(e.get("name", "?")), ts])
    yield from _close_until(stack, float("inf"))


def host_self(trace: Mapping[str, Any], cats: Iterable[str] = HOST_CATS) -> dict[str, float]:
    """Milliseconds of the host's own time per event name (see _own_segments)."""
    own: dict[str, float] = {}
    for name, a, b in _own_segments(trace, cats):
        own[name] = own.get(name, 0.0) + (b - a) / 1000.0
    return own


def idle_blame(trace: Mapping[str, Any], cats: Iterable[str] = HOST_CATS) -> dict[str, float]:
    """Milliseconds per host event name of its own time that fell while the GPU idled within the traced span: what
    the host was doing when the GPU waited for it."""
    busy = _busy(trace)
    gaps = [(a[1], b[0]) for a, b in itertools.pairwise(busy)]
    if not gaps:
        return {}
    starts = [g[0] for g in gaps]
    out: dict[str, float] = {}
    for name, a, b in _own_segments(trace, cats):
        i = max(0, bisect.bisect_right(starts, a) - 1)
        while i < len(gaps) and gaps[i][0] < b:
            overlap = min(b, gaps[i][1]) - max(a, gaps[i][0])
            if overlap > 0:
                out[name] = out.get(name, 0.0) + overlap / 1000.0
            i += 1
    return out


def count(trace: Mapping[str, Any], suffix: str, cats: Iterable[str] = ("python_function",)) -> int:
    """How many complete events of the given categories have a name ending in `suffix` (": run_batch" counts the
    scheduler's steps)."""
    wanted = frozenset(cats)
    return sum(1 for e in trace["traceEvents"] if _complete(e, wanted) and str(e.get("name", "")).endswith(suffix))


def compare(base: Sequence[Mapping[str, float]], other: Sequence[Mapping[str, float]], top: int = 20) -> dict[str, Any]:
    """Mean milliseconds per trace of each server, in all and per name; the `top` names by the size of their change
    (a name only one server ran counts 0 on the other)."""
    if not base or not other:
        raise ValueError(f"no trace to compare: {len(base)} of the first server, {len(other)} of the second")

    def mean(traces: Sequence[Mapping[str, float]]) -> dict[str, float]:
        names = {n for t in traces for n in t}
        return {n: sum(t.get(n, 0.0) for t in traces) / len(traces) for n in names}

    b, o = mean(base), mean(other)
    delta = {n: o.get(n, 0.0) - b.get(n, 0.0) for n in b.keys() | o.keys()}
    ranked = sorted(delta, key=lambda n: (-abs(delta[n]), n))[:top]
    rows = [
        {
            "name": n,
            "base_ms": round(b.get(n, 0.0), 4),
            "other_ms": round(o.get(n, 0.0), 4),
            "delta_ms": round(delta[n], 4),
        }
        for n in ranked
    ]
    total_b, total_o = sum(b.values()), sum(o.values())
    return {
        "traces": [len(base), len(other)],
        "base_ms_per_trace": round(total_b, 4),
        "other_ms_per_trace": round(total_o, 4),
        "other_over_base": round(total_o / total_b, 4) if total_b > 0 else None,
        "top": rows,
    }

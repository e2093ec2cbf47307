"""tests/lab/trace_kernels.py on a real torch.profiler Chrome trace (CPU ops here; the GPU machine's traces carry
the same events with cat "kernel"), and the side-by-side arithmetic."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab import trace_kernels

pytest.importorskip("torch")


def test_a_real_trace_is_summed_per_op_name(tmp_path: Path) -> None:
    plain = tmp_path / "t.json"
    # A fresh interpreter: torch.profiler imports torch._dynamo, which fails where ansible (imported by other tests in
    # this process) has replaced sys.intern.
    script = (  # with_stack as SGLang's /start_profile sets it: the trace carries the Python calls
        "import sys, torch\n"
        "a = torch.ones(64, 64)\n"
        "def run_batch():\n"
        "    return torch.mm(a, a)\n"
        "with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True) as prof:\n"
        "    for _ in range(3):\n"
        "        run_batch()\n"
        "prof.export_chrome_trace(sys.argv[1])\n"
    )
    run = subprocess.run([sys.executable, "-c", script, str(plain)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    packed = tmp_path / "t.trace.json.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))

    trace = trace_kernels.load(packed)
    assert trace == trace_kernels.load(plain)
    ops = trace_kernels.totals(trace, cats={"cpu_op"})
    mm = [e for e in trace["traceEvents"] if e.get("name") == "aten::mm" and e.get("cat") == "cpu_op"]
    assert len(mm) == 3 and ops["aten::mm"] == pytest.approx(sum(e["dur"] for e in mm) / 1000)
    assert trace_kernels.totals(trace) == {}  # no GPU here: no kernel events

    assert trace_kernels.count(trace, ": run_batch") == 3  # the Python events name <file>(<line>): <function>
    own = trace_kernels.host_self(trace)
    step = next(n for n in own if n.endswith(": run_batch"))
    inclusive = trace_kernels.totals(trace, cats={"python_function"})[step]
    assert 0 <= own[step] < inclusive  # the matmuls it called are not its own time
    assert own["aten::mm"] <= ops["aten::mm"]


def test_a_file_that_is_not_a_trace_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"events": []}))
    with pytest.raises(ValueError, match=r"x.json: not a Chrome trace"):
        trace_kernels.load(bad)


def test_host_self_time_takes_out_what_each_call_made_on_its_thread() -> None:
    def host(name: str, ts: float, dur: float, tid: int = 1, cat: str = "python_function") -> dict[str, object]:
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid}

    trace = {"traceEvents": [
        host("loop", 0, 10000),
        host("run_batch", 1000, 4000),
        host("aten::mm", 1500, 1000, cat="cpu_op"),
        host("cudaLaunchKernel", 1600, 500, cat="cuda_runtime"),
        host("process_result", 6000, 3000),
        host("run_batch", 0, 2000, tid=2),  # another thread: not nested in "loop"
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 1700, "dur": 9000},  # the GPU's: not host time
    ]}  # fmt: skip
    assert trace_kernels.host_self(trace) == {
        "loop": 3.0, "run_batch": 3.0 + 2.0, "aten::mm": 0.5, "cudaLaunchKernel": 0.5, "process_result": 3.0,
    }  # fmt: skip
    assert trace_kernels.count(trace, "run_batch") == 2


def test_idle_blame_is_the_host_own_time_while_the_gpu_waited() -> None:
    def ev(cat: str, name: str, ts: float, dur: float) -> dict[str, object]:
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}

    trace = {"traceEvents": [
        ev("kernel", "a", 0, 1000), ev("kernel", "b", 3000, 1000), ev("kernel", "c", 4500, 500),  # idle 1-3, 4-4.5 ms
        ev("python_function", "process_result", 500, 3000),  # own time 0.5-2.0 and 2.5-3.5 ms
        ev("cpu_op", "aten::copy_", 2000, 500),
        ev("python_function", "prepare", 3900, 800),
    ]}  # fmt: skip
    assert trace_kernels.idle_blame(trace) == pytest.approx({"process_result": 1.5, "aten::copy_": 0.5, "prepare": 0.5})
    assert trace_kernels.host_self(trace) == pytest.approx({"process_result": 2.5, "aten::copy_": 0.5, "prepare": 0.8})
    assert trace_kernels.idle_blame({"traceEvents": [ev("kernel", "a", 0, 10)]}) == {}


def test_compare_means_per_trace_and_ranks_the_changes() -> None:
    base = [{"gemm": 10.0, "attn": 4.0}, {"gemm": 12.0, "attn": 4.0}]
    other = [{"gemm": 11.0, "attn": 6.0, "cat_aux": 3.0}]
    got = trace_kernels.compare(base, other, top=2)
    assert got["traces"] == [2, 1] and got["base_ms_per_trace"] == 15.0 and got["other_ms_per_trace"] == 20.0
    assert got["other_over_base"] == pytest.approx(20 / 15, abs=1e-4)
    assert [r["name"] for r in got["top"]] == ["cat_aux", "attn"]  # gemm's mean did not change
    assert got["top"][0] == {"name": "cat_aux", "base_ms": 0.0, "other_ms": 3.0, "delta_ms": 3.0}
    with pytest.raises(ValueError, match="no trace to compare: 0 of the first server"):
        trace_kernels.compare([], other)


def test_the_gpu_timeline_counts_overlaps_once_and_the_gaps_as_idle() -> None:
    def kernel(ts: float, dur: float) -> dict[str, object]:
        return {"ph": "X", "cat": "kernel", "name": "k", "ts": ts, "dur": dur}

    sync = {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 1500, "dur": 2500}
    trace = {"traceEvents": [kernel(0, 1000), kernel(500, 1000), kernel(4000, 1000), sync]}
    assert trace_kernels.gpu_time(trace) == {"span_ms": 5.0, "busy_ms": 2.5, "idle_ms": 2.5}
    assert trace_kernels.totals(trace, cats=trace_kernels.RUNTIME_CATS) == {"cudaStreamSynchronize": 2.5}
    assert trace_kernels.gpu_time({"traceEvents": []}) == {"span_ms": 0.0, "busy_ms": 0.0, "idle_ms": 0.0}

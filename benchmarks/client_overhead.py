"""What the bench client itself costs: one client process driving C streams against a server whose steps take no time.

The simulated plain server (sm120check.bench.simserver, all step times 0, --start-batch C so all C streams are in
flight together) leaves only the client's own work: keeping C streams going, parsing and counting every chunk.
Reported per run: chunks parsed per wall second and per client CPU-second, the client's wait before send
(scheduled -> on the wire) and the server->parsed lag (the server stamps each step's chunks with CLOCK_MONOTONIC;
the client notes when it parsed each: server write + loopback + client queueing + parsing), p50 and p99.
Targets (checked here, not in the tests, because they are clocks): client wait p50 < 50 ms, server lag p50 < 500 ms,
over 2000 chunks per client CPU-second. Prints a table and writes benchmarks/results/client_overhead.json.

    .venv/bin/python benchmarks/client_overhead.py [--concurrency 250] [--output-len 32] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from simserver_proc import start_sim

from sm120check.bench.apis import Api, RequestSpec
from sm120check.bench.closedloop import LevelPlan, run_level, summarize
from sm120check.bench.http import Endpoint

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "client_overhead.json"
TARGETS = {"client_wait_p50_ms": ("<", 50.0), "server_lag_p50_ms": ("<", 500.0), "chunks_per_cpu_s": (">", 2000.0)}


def start_server(concurrency: int) -> tuple[subprocess.Popen[str], str]:
    return start_sim("--a-ms", "0", "--b-ms", "0", "--start-batch", str(concurrency), "--max-seconds", "3600")


def one_run(url: str, concurrency: int, output_len: int) -> dict[str, float]:
    plan = LevelPlan(concurrency, requests=2 * concurrency, warmup=1, request_timeout=120, level_timeout=600)
    spec = RequestSpec("hello world", output_len)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    records, t0, t1, timed_out = asyncio.run(run_level(Endpoint.parse(url), Api.SGLANG, plan, lambda i: spec))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    summary = summarize(concurrency, records, t0, t1, timed_out)
    if timed_out or summary.errors or summary.client_wait_s is None or summary.server_lag_s is None:
        raise RuntimeError(f"the run did not complete cleanly: timed_out={timed_out} errors={summary.errors}")
    chunks = sum(len(r.chunks) for r in records)
    return {
        "requests": len(records),
        "chunks": chunks,
        "wall_s": wall,
        "cpu_s": cpu,
        "chunks_per_wall_s": chunks / wall,
        "chunks_per_cpu_s": chunks / cpu if cpu > 0 else float("inf"),
        "throughput_tok_s": summary.throughput_tok_s,
        "client_wait_p50_ms": summary.client_wait_s.p50 * 1e3,
        "client_wait_p99_ms": summary.client_wait_s.p99 * 1e3,
        "server_lag_p50_ms": summary.server_lag_s.p50 * 1e3,
        "server_lag_p99_ms": summary.server_lag_s.p99 * 1e3,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=250)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3, help="runs; the table shows each and the median")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.concurrency < 1 or args.output_len < 1 or args.runs < 1:
        parser.error("--concurrency, --output-len and --runs must be at least 1")

    runs = []
    for _ in range(args.runs):
        server, url = start_server(args.concurrency)  # a fresh server per run: --start-batch holds its first step
        try:
            runs.append(one_run(url, args.concurrency, args.output_len))
        finally:
            server.terminate()
            server.wait(timeout=10)
    keys = list(runs[0])
    median = {k: statistics.median(r[k] for r in runs) for k in keys}
    verdicts = {}
    for key, (op, bound) in TARGETS.items():
        ok = median[key] < bound if op == "<" else median[key] > bound
        verdicts[key] = {"target": f"{op} {bound:g}", "median": round(median[key], 3), "met": ok}

    columns = [
        "chunks_per_cpu_s",
        "chunks_per_wall_s",
        "client_wait_p50_ms",
        "client_wait_p99_ms",
        "server_lag_p50_ms",
        "server_lag_p99_ms",
    ]
    print(f"C={args.concurrency}, {runs[0]['requests']:.0f} requests x {args.output_len} tokens per run")
    print("| run | " + " | ".join(columns) + " |")
    print("|" + "---|" * (len(columns) + 1))
    for i, row in enumerate([*runs, median]):
        name = str(i + 1) if i < len(runs) else "median"
        print(f"| {name} | " + " | ".join(f"{row[k]:.1f}" for k in columns) + " |")
    for key, v in verdicts.items():
        print(f"target {key} {v['target']}: median {v['median']} -> {'met' if v['met'] else 'MISSED'}")
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    record = {
        "benchmark": "client_overhead",
        "machine": platform.node(),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": load,
        "concurrency": args.concurrency,
        "output_len": args.output_len,
        "runs": [{k: round(v, 6) for k, v in r.items()} for r in runs],
        "median": {k: round(v, 6) for k, v in median.items()},
        "targets": verdicts,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

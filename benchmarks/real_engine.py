"""`sm120check bench` and `crossover` against llama.cpp's llama-server on CPU, each level checked against the server's
own account of it (its log, rebuilt as real-engine.md "How truth was measured" describes).

Four sweeps with the bench's default request count (no --requests-per-level) at C = 1,2,4,8,16: BASE and SPEC
(draft noise 0.1, about half the drafted tokens accepted) x `--api openai-completions` and `--api openai-chat`,
64-token outputs and 32-word prompts (each llama-server slot holds 512 tokens). Per level: bench and server
throughput, bench TTFT p50 against the server's prompt time plus queueing (closed-loop arrivals rebuilt from the
release order), bench and server accept length. Per API: the crossover from the bench's records (`sm120check
crossover`) against the same interpolation of the server's numbers.
Targets: throughput within 5 %, TTFT within 50 ms, crossover within 15 %; each row says PASS or MISS (a miss is a
result, not a crash). Prints markdown tables and writes benchmarks/results/real_engine.json.

    .venv/bin/python benchmarks/real_engine.py [--quick]    # --quick: C = 1,4,16
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from lab.gguf_models import ModelParams, cached_models  # noqa: E402
from lab.llama_server import (  # noqa: E402
    LevelTruth,
    LlamaServer,
    level_spans,
    parse_log,
    running_server,
    sweep_truth,
    wait_idle,
)
from lab.llamacpp import BuildError, build  # noqa: E402
from sm120check.bench.crossover import interpolate  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "real_engine.json"
LEVELS, QUICK_LEVELS = (1, 2, 4, 8, 16), (1, 4, 16)
APIS = ("openai-completions", "openai-chat")
SWEEP_ARGS = ("--output-len", "64", "--input-len", "32")
THROUGHPUT_TARGET, TTFT_TARGET_MS, CROSSOVER_TARGET = 0.05, 50.0, 0.15
SWEEP_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Row:
    sweep: str
    concurrency: int
    bench_tok_s: float
    truth_tok_s: float
    bench_ttft_p50_s: float
    server_ttft_p50_s: float  # queueing + prompt time
    server_prompt_p50_s: float
    bench_accept: float | None
    server_accept: float | None
    cached_prompt_tokens: int
    prompt_tokens: int

    @property
    def error(self) -> float:
        return (self.bench_tok_s - self.truth_tok_s) / self.truth_tok_s

    @property
    def ttft_diff_ms(self) -> float:
        return (self.bench_ttft_p50_s - self.server_ttft_p50_s) * 1e3

    @property
    def verdict(self) -> str:
        ok = abs(self.error) <= THROUGHPUT_TARGET and abs(self.ttft_diff_ms) <= TTFT_TARGET_MS
        return "PASS" if ok else "MISS"


def _num(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def run_sweep(server: LlamaServer, api: str, label: str, levels: tuple[int, ...], out: Path) -> list[Row]:
    wait_idle(server)
    skip = len(parse_log(server.log_text()))
    argv = [sys.executable, "-m", "sm120check", "bench", "--url", server.url, "--api", api, "--label", label]
    argv += ["--concurrency", ",".join(map(str, levels)), *SWEEP_ARGS, "--out", str(out), "--quiet"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S, check=False)
    wait_idle(server)
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
    if len(records) != len(levels):
        raise RuntimeError(f"{label}/{api}: bench exited {proc.returncode}, {len(records)} records\n{proc.stderr}")
    measured = [int(r["requests"]) for r in records]
    spans = level_spans(records)
    try:
        truths: list[LevelTruth] = sweep_truth(server.log_text(), levels, measured, 1, skip, spans, server.started_at)
    except ValueError as exc:  # the cut by time disagrees with the cut by count: say so, use the count
        print(f"warning: {label}/{api}: {exc}", file=sys.stderr)
        truths = sweep_truth(server.log_text(), levels, measured, 1, skip)
    rows = []
    for record, truth in zip(records, truths, strict=True):
        ttft = record.get("ttft_s") or {}
        accept = record.get("accept_length")
        rows.append(
            Row(
                sweep=f"{label}-{api.removeprefix('openai-')}",
                concurrency=truth.concurrency,
                bench_tok_s=_num(record.get("throughput_tok_s")),
                truth_tok_s=truth.tok_s,
                bench_ttft_p50_s=_num(ttft.get("p50")) if isinstance(ttft, dict) else math.nan,
                server_ttft_p50_s=truth.ttft_s_p50,
                server_prompt_p50_s=truth.prompt_s_p50,
                bench_accept=None if accept is None else _num(accept),
                server_accept=truth.accept_length,
                cached_prompt_tokens=truth.cached_prompt_tokens,
                prompt_tokens=truth.prompt_tokens,
            )
        )
    return rows


def crossover(base: Path, spec: Path) -> tuple[str, float | None]:
    argv = [sys.executable, "-m", "sm120check", "crossover", str(base), str(spec), "--format", "json"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        return f"error (exit {proc.returncode}: {proc.stderr.strip()[-200:]})", None
    found = json.loads(proc.stdout).get("crossover", {})
    value = found.get("value")
    return str(found.get("status")), None if value is None else float(value)


def _finite(value: object) -> object:
    """NaN and infinities as null: the JSON stays strict."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"levels {QUICK_LEVELS} instead of {LEVELS}")
    args = parser.parse_args()
    levels = QUICK_LEVELS if args.quick else LEVELS
    try:
        llama = build()
    except BuildError as exc:
        print(f"real_engine.py: {exc}", file=sys.stderr)
        return 1
    models = cached_models(llama, ModelParams(draft_noise=0.1))
    rows: list[Row] = []
    crossovers: list[dict[str, Any]] = []  # written to the results JSON as they are
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="real-engine-") as tmp:
        work = Path(tmp)
        files: dict[tuple[str, str], Path] = {}
        for label, speculative in (("base", False), ("spec", True)):
            with running_server(llama, models, work / f"{label}.log", speculative) as server:
                for api in APIS:
                    files[label, api] = work / f"{label}-{api}.jsonl"
                    print(f"== {label} / {api}: C = {levels}", file=sys.stderr, flush=True)
                    rows += run_sweep(server, api, label, levels, files[label, api])
        for api in APIS:
            status, value = crossover(files["base", api], files["spec", api])
            name = api.removeprefix("openai-")
            base = [r for r in rows if r.sweep == f"base-{name}"]
            spec = [r for r in rows if r.sweep == f"spec-{name}"]
            t_status, t_value, _ = interpolate(
                [r.concurrency for r in base], [r.truth_tok_s for r in base], [r.truth_tok_s for r in spec]
            )
            err: float | None = None
            if value is not None and t_value is not None:
                err = (value - t_value) / t_value
                verdict = "PASS" if abs(err) <= CROSSOVER_TARGET else "MISS"
            else:
                verdict = "PASS" if status == t_status else "MISS"
            crossovers.append(
                {"api": api, "bench": [status, value], "truth": [t_status, t_value], "error": err, "verdict": verdict}
            )
    header = "| sweep | C | bench tok/s | truth tok/s | error % | bench TTFT p50 ms | server prompt+queue p50 ms "
    header += "| diff ms | bench accept len | server accept len | cached prompt % | verdict |"
    print(header)
    print("|" + "---|" * 12)
    for r in rows:
        cached = 100.0 * r.cached_prompt_tokens / r.prompt_tokens if r.prompt_tokens else math.nan
        print(
            f"| {r.sweep} | {r.concurrency} | {_f(r.bench_tok_s)} | {_f(r.truth_tok_s)} | {r.error * 100:+.1f} "
            f"| {_f(r.bench_ttft_p50_s * 1e3)} | {_f(r.server_ttft_p50_s * 1e3)} | {r.ttft_diff_ms:+.1f} "
            f"| {_f(r.bench_accept, 2)} | {_f(r.server_accept, 2)} | {_f(cached)} | {r.verdict} |"
        )
    print("\n| api | bench crossover | server crossover | error % | verdict |\n|---|---|---|---|---|")
    for c in crossovers:
        b, t = c["bench"], c["truth"]
        err = c["error"]
        print(
            f"| {c['api']} | {b[0]} {_f(b[1], 2)} | {t[0]} {_f(t[1], 2)} "
            f"| {'-' if err is None else f'{err * 100:+.1f}'} | {c['verdict']} |"
        )
    misses = sum(r.verdict == "MISS" for r in rows) + sum(c["verdict"] == "MISS" for c in crossovers)
    print(
        f"\n{misses} miss(es); targets: throughput within {THROUGHPUT_TARGET:.0%}, TTFT within {TTFT_TARGET_MS:g} ms,"
    )
    print(f"crossover within {CROSSOVER_TARGET:.0%}. {time.time() - started:.0f} s.")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "levels": list(levels),
        "llama_cpp_commit": llama.commit,
        "machine": platform.platform(),
        "targets": {"throughput": THROUGHPUT_TARGET, "ttft_ms": TTFT_TARGET_MS, "crossover": CROSSOVER_TARGET},
        "rows": [dict(vars(r), error=r.error, ttft_diff_ms=r.ttft_diff_ms, verdict=r.verdict) for r in rows],
        "crossover": crossovers,
    }
    RESULTS.write_text(json.dumps(_finite(data), indent=1, allow_nan=False, default=str) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

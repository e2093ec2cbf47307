"""Side by side: `sm120check bench` and SGLang's own client (sglang.benchmark.serving) against the same server.

Both clients drive one simulated plain server (sm120check.bench.simserver, step time 10 + 0.4*B ms, so the true
throughput at concurrency C is C / (0.010 + 0.0004*C) tok/s) through SGLang's /generate API at C = 1, 10, 100, 250
with the same number of requests, output length and prompt length. For each client and level it records the
throughput and TTFT the client reports, its wall time and its CPU time (user + system, from the child's rusage;
SGLang's client also pays about 10 s of CPU importing torch and transformers, reported separately).

    python benchmarks/bench_client.py --sglang-python /tmp/sglbench-venv/bin/python

SGLang's client needs a venv with `pip install --no-deps sglang` plus its import-time dependencies (see
benchmarks/bench_client.md) and a tokenizer directory; a tiny word-level tokenizer is built with that venv's
`tokenizers` if --tokenizer does not exist. Without --sglang-python only sm120check's client runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from simserver_proc import start_sim

ROOT = Path(__file__).resolve().parents[1]
A, B = 0.010, 0.0004  # the simulated plain server's step time a + b*B, seconds

_TOKENIZER_SNIPPET = """
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "tok": 3, **{f"w{i}": i for i in range(4, 2000)}}
tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>", eos_token="</s>").save_pretrained(
    sys.argv[1]
)
"""


def run_measured(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 900) -> tuple[str, float, float]:
    """Run a child; return its stdout, wall seconds and CPU seconds (user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc.stdout, wall, cpu


def start_server() -> tuple[subprocess.Popen[str], str]:
    return start_sim("--a-ms", str(A * 1e3), "--b-ms", str(B * 1e3), "--max-seconds", "3600")


def ours(url: str, c: int, n: int, output_len: int, input_len: int) -> dict[str, float]:
    cmd = [sys.executable, "-m", "sm120check", "bench", "--url", url, "--api", "sglang", "--concurrency", str(c)]
    cmd += ["--requests-per-level", str(n), "--output-len", str(output_len), "--input-len", str(input_len)]
    out, wall, cpu = run_measured([*cmd, "--json", "--quiet"])
    record = json.loads(out.splitlines()[-1])
    return {
        "throughput_tok_s": record["throughput_tok_s"],
        "ttft_mean_ms": record["ttft_s"]["mean"] * 1e3,
        "ttft_p50_ms": record["ttft_s"]["p50"] * 1e3,
        "errors": record["errors"],
        "wall_s": wall,
        "cpu_s": cpu,
    }


def sglang(python: str, tokenizer: Path, url: str, c: int, n: int, output_len: int, input_len: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out_file = Path(tmp) / "out.jsonl"
        cmd = [python, "-m", "sglang.benchmark.serving", "--backend", "sglang", "--base-url", url, "--model", "sim"]
        cmd += ["--tokenizer", str(tokenizer), "--dataset-name", "random-ids", "--random-range-ratio", "1.0"]
        cmd += ["--random-input-len", str(input_len), "--random-output-len", str(output_len)]
        cmd += ["--num-prompts", str(n), "--max-concurrency", str(c), "--request-rate", "inf", "--disable-tqdm"]
        cmd += ["--output-file", str(out_file)]
        _, wall, cpu = run_measured(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        record = json.loads(out_file.read_text().splitlines()[-1])
    return {
        "throughput_tok_s": record["output_throughput"],
        "ttft_mean_ms": record["mean_ttft_ms"],
        "ttft_p50_ms": record["median_ttft_ms"],
        "errors": n - record["completed"],
        "wall_s": wall,
        "cpu_s": cpu,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,10,100,250")
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--sglang-python", help="python of a venv where `import sglang.benchmark.serving` works")
    parser.add_argument("--tokenizer", type=Path, default=Path(tempfile.gettempdir()) / "sm120-bench-tokenizer")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]

    sglang_import_cpu = None
    if args.sglang_python:
        if not (args.tokenizer / "tokenizer.json").exists():
            subprocess.run([args.sglang_python, "-c", _TOKENIZER_SNIPPET, str(args.tokenizer)], check=True)
        _, _, sglang_import_cpu = run_measured([args.sglang_python, "-c", "import sglang.benchmark.serving"])

    server, url = start_server()
    rows = []
    try:
        for c in levels:
            n = max(2 * c, 10)
            truth = c / (A + B * c)
            row: dict[str, object] = {"concurrency": c, "requests": n, "true_throughput_tok_s": truth}
            row["sm120check"] = ours(url, c, n, args.output_len, args.input_len)
            if args.sglang_python:
                row["sglang"] = sglang(args.sglang_python, args.tokenizer, url, c, n, args.output_len, args.input_len)
            rows.append(row)
            print(f"C={c} done", file=sys.stderr, flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)

    clients = ["sm120check"] + (["sglang"] if args.sglang_python else [])
    columns = ("tok/s", "TTFT p50 ms", "CPU s", "wall s")
    header = "| C | true tok/s | " + " | ".join(f"{k} {col}" for k in clients for col in columns)
    print(header + " |")
    print("|" + "---|" * (2 + 4 * len(clients)))
    for row in rows:
        cells = [str(row["concurrency"]), f"{row['true_throughput_tok_s']:.1f}"]
        for k in clients:
            m = row[k]
            assert isinstance(m, dict)
            cells += [f"{m['throughput_tok_s']:.1f}", f"{m['ttft_p50_ms']:.1f}"]
            cells += [f"{m['cpu_s']:.2f}", f"{m['wall_s']:.1f}"]
        print("| " + " | ".join(cells) + " |")
    if sglang_import_cpu is not None:
        print(f"(sglang client CPU includes about {sglang_import_cpu:.1f} s of importing torch/transformers per run)")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    result = {
        "server": {"kind": "sm120check.bench.simserver plain", "a_s": A, "b_s": B},
        "output_len": args.output_len,
        "input_len": args.input_len,
        "sglang_import_cpu_s": sglang_import_cpu,
        "cpu_count": os.cpu_count(),
        "rows": rows,
    }
    path = args.out_dir / f"bench_client-{stamp}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

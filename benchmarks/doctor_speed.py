"""`sm120check doctor --level 1` beside `python -c "import torch"` on this machine (CPU only).

Level 1 never imports torch; the target is under 1 s. torch is the CPU build from the local pip configuration
(installed once into .cache/bench-torch-venv). Prints a table and writes benchmarks/results/doctor_speed.json.

    .venv/bin/python benchmarks/doctor_speed.py [--runs N] [--doctor PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "benchmarks" / "results" / "doctor_speed.json"
TORCH_VENV = REPO_ROOT / ".cache" / "bench-torch-venv"
TORCH = "torch==2.13.0"  # the CPU build this machine's pip configuration provides


def timed(argv: list[str], runs: int) -> dict[str, float]:
    walls = []
    for _ in range(runs):
        start = time.monotonic()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        walls.append(time.monotonic() - start)
    return {"median_s": round(statistics.median(walls), 3), "min_s": round(min(walls), 3), "runs": runs}


def torch_python() -> str | None:
    python = TORCH_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(TORCH_VENV)], check=True)
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", TORCH], check=False)
        if done.returncode != 0:
            return None
    return str(python)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--doctor", default=shutil.which("sm120check") or "", help="sm120check to time")
    opts = parser.parse_args()
    if not opts.doctor:
        print("no sm120check on PATH: run `make provision` first or pass --doctor", file=sys.stderr)
        return 2
    rows = {"sm120check doctor --level 1": timed([opts.doctor, "doctor", "--level", "1"], opts.runs)}
    python = torch_python()
    if python:
        rows['python -c "import torch"'] = timed([python, "-c", "import torch"], opts.runs)
    print(f"{'command':34} {'median s':>9} {'min s':>7}")
    for name, row in rows.items():
        print(f"{name:34} {row['median_s']:>9.3f} {row['min_s']:>7.3f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    record = {"machine": platform.node(), "cpus": platform.processor() or platform.machine(), "results": rows}
    RESULTS.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

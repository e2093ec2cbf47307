"""`make bench`: run every benchmark this machine can run; each prints its table and writes benchmarks/results/.

Benchmarks that need what this machine lacks (the container lab, SGLang's own client venv) say so and are skipped.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SGLANG_CLIENT_PYTHON = Path("/tmp/sglbench-venv/bin/python")


def _llama_server_cached() -> bool:
    probe = [sys.executable, str(HERE.parent / "tests" / "lab" / "llamacpp.py"), "path"]
    return subprocess.run(probe, capture_output=True, timeout=60, check=False).returncode == 0


BENCHMARKS: list[tuple[str, list[str], str | None]] = [
    ("doctor speed", ["doctor_speed.py"], None),
    ("bench client overhead at C=250 (chunks per CPU-second, client wait, server lag)", ["client_overhead.py"], None),
    ("core converge vs pip install", ["converge.py"], None if shutil.which("podman") else "podman missing: make lab"),
    ("fleet doctor at 1, 3, 6 nodes", ["fleet_doctor.py"], None if shutil.which("podman") else "podman missing"),
    (
        "bench and crossover against llama.cpp's llama-server, checked against the server's log",
        ["real_engine.py"],
        None if shutil.which("cmake") or _llama_server_cached() else "cmake missing: make lab (builds llama-server)",
    ),
    (
        "bench client vs SGLang's client",
        ["bench_client.py", "--sglang-python", str(SGLANG_CLIENT_PYTHON)],
        None if SGLANG_CLIENT_PYTHON.exists() else f"{SGLANG_CLIENT_PYTHON} missing (see benchmarks/bench_client.md)",
    ),
]


def main() -> int:
    failed = []
    for title, argv, missing in BENCHMARKS:
        print(f"\n== {title}")
        if not (HERE / argv[0]).exists():
            print(f"skipped: benchmarks/{argv[0]} not present")
            continue
        if missing:
            print(f"skipped: {missing}")
            continue
        if subprocess.run([sys.executable, str(HERE / argv[0]), *argv[1:]], check=False).returncode != 0:
            failed.append(title)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Start the simulated SGLang server (`sm120check mock-server`) for a benchmark: a process and its URL."""

from __future__ import annotations

import re
import subprocess
import sys


def start_sim(*options: str) -> tuple[subprocess.Popen[str], str]:
    """`sm120check mock-server --mode plain --port 0 OPTIONS`; the URL is the first line it prints."""
    cmd = [sys.executable, "-m", "sm120check", "mock-server", "--mode", "plain", "--port", "0", *options]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    match = re.search(r"http://127\.0\.0\.1:\d+", proc.stdout.readline())
    if not match:
        proc.kill()
        raise RuntimeError("the simulated server did not start")
    return proc, match.group(0)

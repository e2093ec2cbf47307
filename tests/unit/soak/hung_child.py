"""A child that announces one step, writes its pid, then sleeps forever: an NVML call that never returns."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from sm120check.doctor import child

if __name__ == "__main__":
    args = dict(zip(sys.argv[1::2], sys.argv[2::2], strict=False))
    Path(args.get("--pid-file", args["--out"] + ".pid")).write_text(str(os.getpid()))
    child.step("nvmlDeviceGetClockInfo on GPU 0")
    while True:
        time.sleep(3600)

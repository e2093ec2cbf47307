"""A named stand-in for the soak's NVML sampler child, used only because no GPU exists on the CPU test machine.

It replaces the one call `python -m sm120check.soak.sampler ...`: same arguments, one GpuSample line per interval
in the same file, the same step lines and last JSON line. Its values are fixed (a busy RTX PRO 6000's shape).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from sm120check.doctor import child
from sm120check.soak.samples import GpuSample, to_line


def main(argv: list[str]) -> int:
    args = dict(zip(argv[::2], argv[1::2], strict=False))
    out, stop = Path(args["--out"]), Path(args["--stop"])
    deadline = time.monotonic() + float(args["--duration"])
    count = 0
    with out.open("a", encoding="utf-8") as stream:
        while time.monotonic() < deadline and not stop.exists():
            child.step(f"interval {count}")
            sample = GpuSample(
                time.time(), 0, "stand-in", 2400, 13801, 1590, 0x4, 580_000, 600_000, 70, None, 92, 60, 100
            )
            stream.write(to_line(sample) + "\n")
            stream.flush()
            count += 1
            time.sleep(float(args["--interval"]))
    child.emit({"ok": True, "intervals": count})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

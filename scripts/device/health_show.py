"""Print the verdicts of a node_health payload: `python scripts/device/health_show.py payload.json [--sglang DIR]`.

Test and device support, not part of the package: for node-health.sh and by hand, on a saved payload; the doctor judges
the same verdicts through its node_health checks (doctor/node_health/health.py). DIR is an installed sglang
package directory; without it, the one importlib finds (not imported) is used, if any.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from sm120check import bounded
from sm120check.doctor.gpu.payloads import NodeHealth
from sm120check.doctor.model import Result
from sm120check.doctor.node_health import sglang_configs, verdicts
from sm120check.safetext import terminal_text


def _sglang_dir(given: str) -> str:
    if given:
        return given
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return ""
    return str(Path(spec.origin).parent) if spec is not None and spec.origin else ""


def judge(health: NodeHealth, sglang_dir: str = "") -> list[Result]:
    gpus = health.gpus
    per_gpu = (
        ("pcie_link", verdicts.pcie_link),
        ("pcie_replay", verdicts.pcie_replay),
        ("gpu_ecc", verdicts.ecc),
        ("gpu_clocks", verdicts.clocks),
        ("gpu_mig", verdicts.mig),
        ("gpu_bar1", verdicts.bar1),
        ("gpu_processes", verdicts.gpu_processes),
        ("gpu_copy_bandwidth", verdicts.h2d_bandwidth),
    )
    empty = f"no GPU readings: {health.nvml_error}" if health.nvml_error else "no GPU to judge"
    found = [verdicts.combine(vid, [one(g) for g in gpus], empty) for vid, one in per_gpu]
    found.append(verdicts.xid(health.kernel_log))
    configs = sglang_configs.find(sglang_dir, gpus[0].name) if gpus and sglang_dir else None
    found.append(verdicts.gpu_product(gpus, configs))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="health.show")
    parser.add_argument("payload", help="the probe's JSON line in a file, or - for stdin")
    parser.add_argument("--sglang", default="", help="an installed sglang package directory")
    args = parser.parse_args(argv)
    try:
        text = sys.stdin.read(1 << 24) if args.payload == "-" else bounded.read_text(Path(args.payload), 1 << 24)
    except bounded.Unreadable as exc:
        parser.error(str(exc))
    line = [ln for ln in text.strip().splitlines() if ln.startswith("{")][-1]
    health = NodeHealth.from_json(json.loads(line))
    worst = 0
    for v in judge(health, _sglang_dir(args.sglang)):
        print(f"{v.status.upper():4} {v.id}: {terminal_text(v.summary, one_line=True)}")
        for detail in v.details.splitlines():
            print(f"       {terminal_text(detail, one_line=True)}")
        if v.remedy and v.status in (verdicts.WARN, verdicts.FAIL):
            print(f"       fix: {v.remedy}")
        worst = max(worst, {verdicts.FAIL: 2, verdicts.WARN: 1}.get(v.status, 0))
    return worst


if __name__ == "__main__":
    sys.exit(main())

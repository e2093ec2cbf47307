"""Time the fleet doctor (playbooks/doctor.yml) over 1, 3 and 6 container nodes.

Provisions six lab containers once (one core converge of all six, from the mounted wheelhouse), then times
playbooks/doctor.yml with --limit on the first 1, 3 and 6 of them, each size `--repeat` times (sizes interleaved so
a machine-wide slowdown hits every size alike). Target: 6 nodes take at most 1.5 times as long as 1 node.
Prints a table and writes benchmarks/results/fleet_doctor.json. Needs the container lab (scripts/lab/setup, root).

    .venv/bin/python benchmarks/fleet_doctor.py [--repeat 3] [--levels 1,2] [--note TEXT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO_ROOT / "tests")]

from lab.converge import converge  # noqa: E402
from lab.fleet_lab import run_doctor, write_inventory  # noqa: E402
from lab.podman import DEFAULT_IMAGE, Mount, lab_problem, podman, running_node  # noqa: E402
from lab.wheelhouse import NODE_PATH, build_wheelhouse  # noqa: E402

RESULTS = REPO_ROOT / "benchmarks" / "results" / "fleet_doctor.json"
SIZES = (1, 3, 6)
TARGET = 1.5


def node_doctor_seconds(run_dir: Path) -> list[float]:
    """The doctor's own run time on each node of the latest run (from the node reports)."""
    document = json.loads((run_dir / "latest" / "fleet.json").read_text())
    return [node["seconds"] for node in document["nodes"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per fleet size (default 3)")
    parser.add_argument("--levels", default="1,2", help="doctor levels to time, comma-separated (default 1,2)")
    parser.add_argument("--note", default="", help="free text recorded with the results (what was special)")
    args = parser.parse_args()
    if problem := lab_problem():
        print(f"container lab unavailable: {problem}", file=sys.stderr)
        return 2
    wheelhouse, _ = build_wheelhouse("core")
    levels = [int(level) for level in args.levels.split(",")]
    walls: dict[tuple[int, int], list[float]] = {(level, size): [] for level in levels for size in SIZES}
    doctor: dict[tuple[int, int], list[float]] = {(level, size): [] for level in levels for size in SIZES}
    with ExitStack() as stack:
        nodes = [
            stack.enter_context(running_node(f"fleetbench{i}", DEFAULT_IMAGE, [Mount(wheelhouse, NODE_PATH)]))
            for i in range(max(SIZES))
        ]
        inventory = write_inventory("bench", [n.name for n in nodes])
        stack.callback(inventory.unlink, missing_ok=True)
        runs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sm120kit-fleet-bench-")))
        converged = converge(inventory)
        if converged.rc != 0:
            print(converged.tail(), file=sys.stderr)
            return 1
        run_doctor(inventory, runs)  # warm-up: first-run caches on every node
        for _ in range(args.repeat):
            for level in levels:
                for size in SIZES:
                    limit = ",".join(n.name for n in nodes[:size])
                    run = run_doctor(inventory, runs, limit=limit, fleet_doctor_level=level)
                    if run.rc != 0:
                        print(run.tail(), file=sys.stderr)
                        return 1
                    walls[level, size].append(run.seconds)
                    doctor[level, size].append(max(node_doctor_seconds(runs)))
    median = {key: statistics.median(values) for key, values in walls.items()}
    ratios = {level: median[level, max(SIZES)] / median[level, min(SIZES)] for level in levels}
    result = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "podman": podman("--version").stdout.strip(),
            "image": DEFAULT_IMAGE,
            "load_average_at_end": os.getloadavg()[0],
        },
        "note": args.note,
        "repeat": args.repeat,
        "converge_seconds": {"nodes": len(nodes), "seconds": round(converged.seconds, 1)},
        "levels": {
            str(level): {
                "wall_seconds": {str(size): [round(s, 2) for s in walls[level, size]] for size in SIZES},
                "median_wall_seconds": {str(size): round(median[level, size], 2) for size in SIZES},
                "slowest_node_doctor_seconds": {
                    str(size): round(statistics.median(doctor[level, size]), 2) for size in SIZES
                },
                "ratio_6_to_1": round(ratios[level], 2),
                "meets_target": ratios[level] <= TARGET,
            }
            for level in levels
        },
        "target_ratio": TARGET,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"core converge of {len(nodes)} nodes in one run: {converged.seconds:.0f} s")
    print(f"{'level':>5}  {'nodes':>5}  {'median wall s':>13}  {'runs':<24}  {'doctor s (slowest node)':>23}")
    for level in levels:
        for size in SIZES:
            runs_text = ", ".join(f"{s:.1f}" for s in walls[level, size])
            slowest = statistics.median(doctor[level, size])
            print(f"{level:>5}  {size:>5}  {median[level, size]:>13.1f}  {runs_text:<24}  {slowest:>23.2f}")
        verdict = "meets" if ratios[level] <= TARGET else "misses"
        print(f"level {level}: 6 nodes / 1 node = {ratios[level]:.2f} ({verdict} the target of {TARGET})")
    print(f"written: {RESULTS.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

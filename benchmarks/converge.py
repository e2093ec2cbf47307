"""Time a core converge in a lab container against a plain pip install of the same wheels.

Measures, on this machine:
  1. the first `core` converge of a fresh node (site.yml, wheelhouse mounted read-only: no downloads),
  2. the idempotent rerun on the same node,
  3. `pip install` of the same wheel set (the wheelhouse's toolkit.txt and python.txt) into an empty venv.
Prints a table and writes benchmarks/results/converge.json. Needs the container lab (scripts/lab/setup, root).

    .venv/bin/python benchmarks/converge.py [--extra-vars JSON] [--note TEXT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))

from lab.converge import NODE_GROUPS, converge  # noqa: E402
from lab.playbook import PlaybookRun, write_inventory  # noqa: E402
from lab.podman import DEFAULT_IMAGE, Mount, lab_problem, podman, running_node  # noqa: E402
from lab.wheelhouse import NODE_PATH, build_wheelhouse  # noqa: E402

RESULTS = REPO_ROOT / "benchmarks" / "results" / "converge.json"


def pip_install_seconds(wheelhouse: Path) -> tuple[float, float]:
    """Seconds to create an empty venv, and to pip install the wheelhouse's wheel set into it (no index)."""
    with tempfile.TemporaryDirectory(prefix="sm120kit-bench-") as scratch:
        venv = Path(scratch) / "venv"
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "ensurepip", "--default-pip"], check=True, capture_output=True
        )
        created = time.monotonic() - started
        # --isolated: this machine's pip configuration (local indexes, constraints) must not take part.
        pip = [str(venv / "bin" / "python"), "-m", "pip", "--isolated", "install", "--no-index"]
        pip += ["--progress-bar", "off", "--require-hashes", "-q"]
        started = time.monotonic()
        for part in ("toolkit", "python"):
            subprocess.run(
                [*pip, "--find-links", str(wheelhouse / part), "-r", str(wheelhouse / f"{part}.txt")], check=True
            )
        return created, time.monotonic() - started


def counts(run: PlaybookRun, host: str) -> dict[str, int]:
    recap = run.host(host)
    return {"ok": recap.ok, "changed": recap.changed, "failed": recap.failed, "unreachable": recap.unreachable}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra-vars", default="{}", help="JSON extra vars for both converges (default: none)")
    parser.add_argument("--note", default="", help="free text recorded with the results (what was special)")
    args = parser.parse_args()
    extra_vars = json.loads(args.extra_vars)
    if problem := lab_problem():
        print(f"container lab unavailable: {problem}", file=sys.stderr)
        return 2
    wheelhouse, _ = build_wheelhouse("core")
    wheels = sorted(wheelhouse.rglob("*.whl"))
    with (
        running_node("bench", DEFAULT_IMAGE, [Mount(wheelhouse, NODE_PATH)]) as node,
        tempfile.TemporaryDirectory() as tmp,
    ):
        inventory = write_inventory(Path(tmp), [node], NODE_GROUPS)
        first = converge(inventory, **extra_vars)
        if first.rc != 0:
            print(first.tail(), file=sys.stderr)
            return 1
        rerun = converge(inventory, **extra_vars)
        if rerun.rc != 0:
            print(rerun.tail(), file=sys.stderr)
            return 1
        tasks = counts(first, node.name), counts(rerun, node.name)
    venv_seconds, pip_seconds = pip_install_seconds(wheelhouse)
    result = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "podman": podman("--version").stdout.strip(),
            "image": DEFAULT_IMAGE,
        },
        "extra_vars": extra_vars,
        "note": args.note,
        "wheel_set": {"wheels": len(wheels), "bytes": sum(w.stat().st_size for w in wheels)},
        "seconds": {
            "first_converge": round(first.seconds, 1),
            "idempotent_rerun": round(rerun.seconds, 1),
            "venv_create": round(venv_seconds, 1),
            "pip_install": round(pip_seconds, 1),
        },
        "recap": {"first_converge": tasks[0], "idempotent_rerun": tasks[1]},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    size_mb = result["wheel_set"]["bytes"] / 1e6
    print(f"core wheel set: {len(wheels)} wheels, {size_mb:.0f} MB (compressed)")
    print(f"{'step':<44} {'seconds':>8}  tasks (ok/changed)")
    rows = [
        ("first core converge (fresh container)", first.seconds, tasks[0]),
        ("idempotent rerun (same container)", rerun.seconds, tasks[1]),
        ("pip install of the same wheels (host venv)", pip_seconds, None),
        ("  venv creation for it", venv_seconds, None),
    ]
    for label, seconds, recap in rows:
        detail = f"{recap['ok']}/{recap['changed']}" if recap else ""
        print(f"{label:<44} {seconds:>8.1f}  {detail}")
    print(f"written: {RESULTS.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

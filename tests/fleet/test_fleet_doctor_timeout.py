"""playbooks/doctor.yml with one node whose doctor hangs (a pynvml that never finishes importing, in a probe that the
doctor would wait 30 s for): fleet_doctor_timeout ends it, the node is reported as an error saying so, the other node
is reported as usual, and the hung probe does not outlive the run. No containers: the local connection."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from lab.fleet_lab import doctor_argv
from lab.playbook import REPO_ROOT, run_playbook

DEV_VENV = Path(sys.executable).parent.parent
SRC = REPO_ROOT / "python" / "sm120check" / "src"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_a_node_whose_doctor_hangs_is_cut_off_at_the_fleet_timeout(tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    fake.mkdir()
    pidfile = tmp_path / "probe.pid"
    (fake / "pynvml.py").write_text(
        f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(1000)\n", encoding="utf-8"
    )
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    checker = venv / "bin" / "sm120check"
    checker.write_text(
        f'#!/bin/sh\nPYTHONPATH={fake}:{SRC} exec {sys.executable} -m sm120check "$@"\n', encoding="utf-8"
    )
    checker.chmod(0o755)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {"hung": {**local, "sm120kit_venv": str(venv)}, "here": {**local, "sm120kit_venv": str(DEV_VENV)}}
    inventory = REPO_ROOT / "inventory" / f"lab-fleet-timeout-{os.getpid()}.yml"
    inventory.write_text(json.dumps({"all": {"hosts": hosts}}))
    runs = tmp_path / "runs"
    try:
        argv = doctor_argv(inventory, runs, fleet_doctor_level=1, fleet_doctor_timeout=4)
        run = run_playbook([*argv, "-e", "fleet_doctor_fail_on_error=false"], timeout=240)
    finally:
        inventory.unlink(missing_ok=True)
    assert run.rc == 0, run.tail()
    nodes = {node["host"]: node for node in json.loads((runs / "latest" / "fleet.json").read_text())["nodes"]}
    assert nodes["hung"]["state"] == "error"
    # cut off by fleet_doctor_timeout (4 s), not ended by the doctor's own 30 s NVML limit: that would be a report
    assert "the doctor did not finish within 4 s (fleet_doctor_timeout)" in str(nodes["hung"]["error"])
    assert nodes["here"]["state"] != "error", nodes["here"]
    probe = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(probe) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(probe), "the hung NVML probe outlived the node's doctor"

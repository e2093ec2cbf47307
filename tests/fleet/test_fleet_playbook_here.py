"""playbooks/doctor.yml on this machine, without containers: a node checked for real (the local connection and the
dev venv's sm120check), a node without sm120check, and a host whose SSH port refuses connections."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab.fleet_lab import doctor_argv
from lab.playbook import REPO_ROOT, PlaybookRun, run_playbook

DEV_VENV = Path(sys.executable).parent.parent  # its bin/sm120check is the checker under test


@dataclass(frozen=True)
class LocalFleet:
    inventory: Path
    runs: Path
    run: PlaybookRun

    def report(self) -> dict[str, dict[str, object]]:
        document = json.loads((self.runs / "latest" / "fleet.json").read_text())
        return {node["host"]: node for node in document["nodes"]}


@pytest.fixture(scope="module")
def local_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {
        "here": {**local, "sm120kit_venv": str(DEV_VENV)},
        "unprovisioned": {**local, "sm120kit_venv": "/nonexistent/venv"},
        "refused": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 9},
    }
    inventory = REPO_ROOT / "inventory" / f"lab-fleet-here-{os.getpid()}.yml"
    inventory.write_text(json.dumps({"all": {"hosts": hosts}}))
    runs = tmp_path_factory.mktemp("fleet-here")
    try:
        yield LocalFleet(inventory, runs, run_playbook(doctor_argv(inventory, runs), timeout=300))
    finally:
        inventory.unlink(missing_ok=True)


def test_a_host_that_refuses_connections_is_reported_unreachable_with_ansibles_reason(local_fleet: LocalFleet) -> None:
    node = local_fleet.report()["refused"]
    assert node["state"] == "unreachable", local_fleet.run.tail()
    assert "Connection refused" in str(node["error"])


def test_a_host_without_sm120check_is_reported_as_such(local_fleet: LocalFleet) -> None:
    node = local_fleet.report()["unprovisioned"]
    assert node["state"] == "no_checker"
    assert str(node["error"]).startswith("no sm120check at /nonexistent/venv/bin/sm120check")


def test_a_reachable_host_has_the_doctors_results(local_fleet: LocalFleet) -> None:
    node = local_fleet.report()["here"]
    cells = node["cells"]
    assert isinstance(cells, dict) and cells["platform"] == "pass"
    assert node["state"] == ("failed" if "fail" in cells.values() else "ready")


def test_the_play_fails_and_names_the_report_when_a_host_is_not_ready(local_fleet: LocalFleet) -> None:
    assert local_fleet.run.rc == 2, local_fleet.run.tail()
    assert "Not every node is ready" in local_fleet.run.output
    assert (local_fleet.runs / "latest" / "fleet.md").is_file()


def test_limit_leaves_the_other_hosts_out_of_the_report(local_fleet: LocalFleet) -> None:
    argv = doctor_argv(local_fleet.inventory, local_fleet.runs, limit="unprovisioned,refused")
    run = run_playbook([*argv, "-e", "fleet_doctor_fail_on_error=false"], timeout=300)
    assert run.rc == 0, run.tail()
    assert sorted(local_fleet.report()) == ["refused", "unprovisioned"]


def test_a_level_that_is_not_a_doctor_level_is_refused_before_any_host_is_touched(
    local_fleet: LocalFleet, tmp_path: Path
) -> None:
    run = run_playbook(doctor_argv(local_fleet.inventory, tmp_path, fleet_doctor_level=5), timeout=300)
    assert run.rc == 2
    assert "fleet_doctor_level: '5' is not a doctor level; use 1 (static)" in run.output
    assert list(tmp_path.iterdir()) == []

"""`sm120check fleet collect`: node files from the doctor results Ansible registered (real ones, recorded from a
playbooks/doctor.yml run over lab containers: fixtures/registered-results.json)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from sm120check.cli import main
from sm120check.fleet.collect import REACHED, node_file, write_run
from sm120check.fleet.load import load
from sm120check.fleet.model import NodeState

FIXTURES = Path(__file__).parent / "fixtures"
REGISTERED = json.loads((FIXTURES / "registered-results.json").read_text())


def test_a_doctor_report_is_kept_as_the_doctor_wrote_it() -> None:
    result = REGISTERED["sm120kit-fleetdev-2"]
    assert result["rc"] == 1
    assert json.loads(node_file("sm120kit-fleetdev-2", result)) == json.loads(result["stdout"])


def test_a_node_ansible_calls_unreachable_gets_a_stub_with_ansibles_message() -> None:
    ghost = json.loads((FIXTURES / "run-broken" / "nodes" / "sm120kit-fleetdev-ghost.json").read_text())
    result = {"unreachable": True, "msg": ghost["error"], "changed": False}
    stub = json.loads(node_file("sm120kit-fleetdev-ghost", result))
    assert (stub["host"], stub["state"], stub["error"]) == ("sm120kit-fleetdev-ghost", "unreachable", ghost["error"])


def test_a_command_that_never_ran_on_the_node_makes_it_unreachable() -> None:
    # The podman connection reports a missing container as `podman exec` exit 125, not as unreachable.
    stub = json.loads(node_file("sm120kit-fleetdev-ghost", REGISTERED["sm120kit-fleetdev-ghost"]))
    assert stub["state"] == "unreachable"
    assert stub["error"].startswith("the command did not run on the node (exit 125): Error: no container with name")


def test_a_node_without_the_checker_gets_a_no_checker_stub() -> None:
    stub = json.loads(node_file("sm120kit-fleetdev-bare", REGISTERED["sm120kit-fleetdev-bare"]))
    assert stub["state"] == "no_checker"
    assert stub["error"].startswith("no sm120check at /opt/sm120kit/venv/bin/sm120check")


def test_a_doctor_usage_error_gets_an_error_stub_with_its_message() -> None:
    # Recorded on this machine: `sm120check doctor --json --manifest /nonexistent.json` exits 2.
    stderr = (FIXTURES / "doctor-rc2-stderr.txt").read_text()
    stub = json.loads(node_file("gpu-node-09", {"rc": 2, "stdout": "", "stderr": f"{REACHED}\n{stderr}"}))
    assert stub["state"] == "error"
    assert stub["error"].startswith("the doctor exited 2: sm120check doctor: error: --manifest:")


def test_collect_writes_a_run_that_reports_every_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "20261130T130000Z"
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(REGISTERED)))
    assert main(["fleet", "collect", str(run)]) == 1
    states = {n.host: n.state for n in load(run).nodes}
    assert states["sm120kit-fleetdev-ghost"] is NodeState.UNREACHABLE
    assert states["sm120kit-fleetdev-bare"] is NodeState.NO_CHECKER
    assert states["sm120kit-fleetdev-2"] is NodeState.FAILED
    assert (run / "fleet.md").is_file() and (run / "fleet.xml").is_file()


def test_latest_points_at_the_newest_run(tmp_path: Path) -> None:
    result = {"sm120kit-fleetdev-3": REGISTERED["sm120kit-fleetdev-3"]}
    write_run(tmp_path / "20261130T120000Z", result)
    write_run(tmp_path / "20261130T130000Z", result)
    assert (tmp_path / "latest").readlink() == Path("20261130T130000Z")


def test_results_that_are_not_an_object_are_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("[]"))
    assert main(["fleet", "collect", str(tmp_path / "run")]) == 2
    assert "non-empty JSON object {host: registered result}" in capsys.readouterr().err


def test_a_host_name_that_cannot_be_a_file_name_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps({"../etc": {"rc": 0, "stdout": "{}"}})))
    assert main(["fleet", "collect", str(tmp_path / "run")]) == 2
    assert "host name '../etc' cannot be a file name" in capsys.readouterr().err

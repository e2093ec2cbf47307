"""playbooks/doctor.yml over real container nodes: two ready, one broken twice, one never provisioned, one host
without a container. One converge and one full doctor run are shared by these tests (conftest.py)."""

from __future__ import annotations

import json

import pytest

from lab.fleet_lab import FleetLab, run_doctor

pytestmark = pytest.mark.container


def latest_report(fleet: FleetLab) -> dict[str, object]:
    document: dict[str, object] = json.loads((fleet.runs / "latest" / "fleet.json").read_text())
    return document


def test_the_play_fails_when_a_node_is_not_ready(fleet: FleetLab) -> None:
    assert fleet.doctor.rc == 2, fleet.doctor.tail()
    assert "Not every node is ready" in fleet.doctor.output


def test_every_inventory_host_gets_a_node_report(fleet: FleetLab) -> None:
    files = (fleet.runs / "latest" / "nodes").iterdir()
    assert sorted(p.name.removesuffix(".json") for p in files) == fleet.hosts


def test_the_printed_matrix_names_the_broken_node_and_its_failing_checks(fleet: FleetLab) -> None:
    output = fleet.doctor.output
    row = next(line.split() for line in output.splitlines() if line.strip().startswith(fleet.broken.name + " "))
    header = next(line.split() for line in output.splitlines() if line.strip().startswith("NODE "))
    cells = dict(zip(header, row, strict=True))
    assert (cells["STATE"], cells["nvrtc"], cells["abi_wheels"]) == ("failed", "FAIL", "FAIL")


def test_the_markdown_report_gives_the_broken_nodes_remedies(fleet: FleetLab) -> None:
    md = (fleet.runs / "latest" / "fleet.md").read_text()
    section = md[md.index(f"### {fleet.broken.name} (failed)") :].split("\n### ")[0]
    assert "**FAIL `nvrtc`**" in section and "--tags cuda_env" in section
    assert "**FAIL `abi_wheels`**" in section and "pip uninstall -y nvidia-cuda-runtime-cu12" in section


def test_ready_nodes_are_ready(fleet: FleetLab) -> None:
    states = {n["host"]: n["state"] for n in latest_report(fleet)["nodes"]}  # type: ignore[attr-defined]
    assert [states[n.name] for n in fleet.ready] == ["ready", "ready"]


def test_a_host_without_a_container_is_reported_unreachable(fleet: FleetLab) -> None:
    states = {n["host"]: n["state"] for n in latest_report(fleet)["nodes"]}  # type: ignore[attr-defined]
    assert states[fleet.ghost] == "unreachable"
    assert f"{fleet.ghost} (unreachable)" in fleet.doctor.output


def test_a_node_never_provisioned_is_reported_without_sm120check(fleet: FleetLab) -> None:
    states = {n["host"]: n["state"] for n in latest_report(fleet)["nodes"]}  # type: ignore[attr-defined]
    assert states[fleet.bare.name] == "no_checker"


def test_limit_reports_only_the_limited_hosts_and_passes_when_they_are_ready(fleet: FleetLab) -> None:
    limit = ",".join(n.name for n in fleet.ready)
    run = run_doctor(fleet.inventory, fleet.runs, limit=limit)
    assert run.rc == 0, run.tail()
    hosts = [n["host"] for n in latest_report(fleet)["nodes"]]  # type: ignore[attr-defined]
    assert hosts == sorted(n.name for n in fleet.ready)


def test_fail_on_error_false_reports_without_failing(fleet: FleetLab) -> None:
    run = run_doctor(fleet.inventory, fleet.runs, limit=fleet.broken.name, fleet_doctor_fail_on_error=False)
    assert run.rc == 0, run.tail()
    assert latest_report(fleet)["ok"] is False

"""`sm120check fleet report` on real fleet runs (tests/fleet/fixtures/README.md says where each came from)."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from sm120check.cli import main
from sm120check.fleet import render
from sm120check.fleet.load import FleetInputError, load
from sm120check.fleet.model import NodeState

FIXTURES = Path(__file__).parent / "fixtures"
BROKEN_RUN = FIXTURES / "run-broken"  # node 2 broken twice, node 3 healthy, a bare node, an unreachable node
READY_RUN = FIXTURES / "run-ready"  # the same nodes before node 2 was broken
BROKEN = "sm120kit-fleetdev-2"
HEALTHY = "sm120kit-fleetdev-3"
BARE = "sm120kit-fleetdev-bare"
GHOST = "sm120kit-fleetdev-ghost"


def report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["fleet", "report", *args])
    return code, capsys.readouterr().out


def matrix_row(table: str, host: str) -> list[str]:
    return next(line.split() for line in table.splitlines() if line.startswith(host + " "))


def test_matrix_names_the_broken_node_and_its_failing_checks(capsys: pytest.CaptureFixture[str]) -> None:
    _, table = report(capsys, str(BROKEN_RUN))
    header = table.splitlines()[1].split()
    row = dict(zip(header, matrix_row(table, BROKEN), strict=True))
    assert row["STATE"] == "failed"
    assert (row["nvrtc"], row["abi_wheels"]) == ("FAIL", "FAIL")
    assert row["sm120_jit"] == "SKIP"  # needs nvrtc


def test_every_failure_is_listed_under_its_node_with_its_remedy(capsys: pytest.CaptureFixture[str]) -> None:
    _, table = report(capsys, str(BROKEN_RUN))
    section = table[table.index(f"\n{BROKEN} (failed)") :]
    assert "FAIL nvrtc: " in section
    assert "remedy: ansible-playbook site.yml --tags cuda_env" in section
    assert "FAIL abi_wheels: " in section and "nvidia-cuda-runtime-cu12" in section
    assert "pip uninstall -y nvidia-cuda-runtime-cu12" in section


def test_unreachable_node_appears_as_unreachable_with_dashes(capsys: pytest.CaptureFixture[str]) -> None:
    _, table = report(capsys, str(BROKEN_RUN))
    row = matrix_row(table, GHOST)
    assert row[1] == "unreachable"
    assert set(row[2:]) == {"-"}
    assert f"\n{GHOST} (unreachable)\n  unreachable: " in table


def test_node_without_the_checker_is_reported_as_such(capsys: pytest.CaptureFixture[str]) -> None:
    _, table = report(capsys, str(BROKEN_RUN))
    assert matrix_row(table, BARE)[1:3] == ["no", "sm120check"]
    assert "no sm120check at /opt/sm120kit/venv/bin/sm120check" in table


def test_healthy_node_is_ready_and_has_no_failure_section(capsys: pytest.CaptureFixture[str]) -> None:
    _, table = report(capsys, str(BROKEN_RUN))
    assert matrix_row(table, HEALTHY)[1] == "ready"
    assert f"\n{HEALTHY} (" not in table


def test_nodes_are_sorted_and_checks_follow_the_doctors_order() -> None:
    fleet = load(BROKEN_RUN)
    assert [n.host for n in fleet.nodes] == sorted(n.host for n in fleet.nodes)
    assert fleet.checks.index("platform") < fleet.checks.index("manifest") < fleet.checks.index("nvrtc")
    assert fleet.checks.index("nvrtc") < fleet.checks.index("sm120_jit")  # level 1 before level 2


def test_report_exits_1_when_a_node_is_not_ready_and_0_when_all_are(capsys: pytest.CaptureFixture[str]) -> None:
    assert report(capsys, str(BROKEN_RUN))[0] == 1
    assert report(capsys, str(READY_RUN / "nodes" / f"{HEALTHY}.json"))[0] == 0


def test_headline_counts_nodes_by_state(capsys: pytest.CaptureFixture[str]) -> None:
    _, table = report(capsys, str(BROKEN_RUN))
    assert table.splitlines()[0] == (
        "sm120check fleet: NOT READY: 5 nodes: 2 ready, 1 failed, 1 unreachable, 1 no sm120check (level 2)"
    )


def test_markdown_has_a_row_per_node_and_the_remedies(capsys: pytest.CaptureFixture[str]) -> None:
    _, md = report(capsys, str(BROKEN_RUN), "--format", "md")
    rows = [line for line in md.splitlines() if line.startswith("| sm120kit-")]
    assert [r.split("|")[1].strip() for r in rows] == sorted(n.host for n in load(BROKEN_RUN).nodes)
    assert f"### {BROKEN} (failed)" in md
    assert "- **FAIL `nvrtc`**" in md and "  - remedy: `ansible-playbook site.yml --tags cuda_env" in md


def test_json_report_gives_state_cells_and_problems_per_node(capsys: pytest.CaptureFixture[str]) -> None:
    _, text = report(capsys, str(BROKEN_RUN), "--format", "json")
    document = json.loads(text)
    assert (document["schema"], document["tool"], document["ok"]) == (1, "sm120check fleet", False)
    assert document["summary"] == {
        "nodes": 5, "ready": 2, "failed": 1, "unreachable": 1, "no_checker": 1, "error": 0,
    }  # fmt: skip
    nodes = {n["host"]: n for n in document["nodes"]}
    assert nodes[BROKEN]["cells"]["nvrtc"] == "fail"
    assert {p["id"] for p in nodes[BROKEN]["problems"] if p["status"] == "fail"} == {"nvrtc", "abi_wheels"}
    assert nodes[GHOST]["state"] == "unreachable" and nodes[GHOST]["error"]


def test_junit_has_a_suite_per_node_and_counts_failures(capsys: pytest.CaptureFixture[str]) -> None:
    _, xml = report(capsys, str(BROKEN_RUN), "--format", "junit")
    suites = {s.get("name"): s for s in ET.fromstring(xml).iter("testsuite")}
    assert suites[BROKEN].get("failures") == "2"
    assert suites[HEALTHY].get("failures") == "0"
    ghost_case = suites[GHOST].find("testcase")
    assert ghost_case is not None and ghost_case.find("failure") is not None
    assert ghost_case.find("failure").get("type") == "unreachable"  # type: ignore[union-attr]


def test_write_puts_every_format_beside_the_node_reports(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(BROKEN_RUN, run)
    report(capsys, str(run), "--write", str(run))
    assert sorted(p.name for p in run.iterdir() if p.is_file()) == ["fleet.json", "fleet.md", "fleet.txt", "fleet.xml"]
    # A second report of the same directory reads the node reports only, not its own outputs.
    assert len(load(run).nodes) == 5


def test_out_writes_the_chosen_format_to_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, printed = report(capsys, str(BROKEN_RUN), "--format", "md", "--out", str(tmp_path / "fleet.md"))
    assert (code, printed) == (1, "")
    assert (tmp_path / "fleet.md").read_text().startswith("# sm120check fleet report")


def test_a_node_file_that_is_not_json_makes_an_error_node(tmp_path: Path) -> None:
    (tmp_path / "gpu-node-07.json").write_text("Traceback (most recent call last):\n")
    node = load(tmp_path).nodes[0]
    assert (node.host, node.state) == ("gpu-node-07", NodeState.ERROR)
    assert "not JSON" in node.error and "Traceback" in node.error


def test_missing_run_directory_is_a_usage_error_naming_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["fleet", "report", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{tmp_path / 'nope'} does not exist" in err and "build/fleet/latest" in err


def test_directory_without_node_reports_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(FleetInputError, match="holds no node reports"):
        load(tmp_path)


def test_every_format_renders_a_single_real_node_report() -> None:
    fleet = load(FIXTURES / "vm-level2.json")
    assert [n.host for n in fleet.nodes] == ["vm-level2"]
    for fmt in render.FORMATS:
        assert "vm-level2" in render.render(fleet, fmt)

"""The node-health checks wired into the doctor: one probe per run (a fact), the level split, data shapes the fleet
view reads, the doctor's own children left out of the process lists, and a CPU machine never failing."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sm120check.doctor import child, cli, facts, report
from sm120check.doctor.catalogue import all_checks
from sm120check.doctor.gpu import ancestry
from sm120check.doctor.gpu.payloads import NodeHealth
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.node_health import health as health_checks

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "health"
HEALTH_IDS = {
    "pcie_link",
    "pcie_replay",
    "gpu_ecc",
    "gpu_clocks",
    "gpu_mig",
    "gpu_bar1",
    "gpu_processes",
    "gpu_copy_bandwidth",
    "gpu_xid",
    "gpu_product",
}


def _payload(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return data


def _ctx(health: facts.HealthFacts) -> Context:
    return Context(facts=facts.NodeFacts(health_read=health))


def _run_all(ctx: Context) -> dict[str, Result]:
    return {c.id: c.run(ctx) for c in all_checks() if c.family == health_checks.FAMILY}


def _doctor_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return parser.parse_args(["doctor", *argv])


def test_the_catalogue_holds_every_health_check_with_its_level() -> None:
    checks = {c.id: c for c in all_checks() if c.family == health_checks.FAMILY}
    assert set(checks) == HEALTH_IDS
    assert {i for i, c in checks.items() if c.level == 2} == {"pcie_link", "gpu_clocks", "gpu_copy_bandwidth"}
    assert checks["gpu_xid"].requires == ()  # the kernel log needs no driver
    assert all(c.requires == ("driver",) for i, c in checks.items() if i != "gpu_xid")


def test_the_plan_runs_the_probe_only_for_health_checks_and_loads_only_for_level_2() -> None:
    checks = all_checks()
    assert health_checks.plan([c for c in checks if c.family != health_checks.FAMILY]) is None
    rest = health_checks.plan([c for c in checks if c.id in ("gpu_xid", "gpu_ecc")])
    assert rest is not None and not rest.load and "--no-load" in rest.args()
    loaded = health_checks.plan([c for c in checks if c.id in ("gpu_xid", "pcie_link")], gpus=(0, 2))
    assert loaded is not None and loaded.load and "--no-load" not in loaded.args()
    assert loaded.args() == ["--exclude-tree", str(os.getpid()), "--gpus", "0,2"]


def test_the_recorded_busy_h200_passes_with_the_fleet_data_shapes() -> None:
    results = _run_all(_ctx(facts.health_facts(_payload("h200-2026-12-01-busy.json"), loaded=True)))
    statuses = {i: r.status for i, r in results.items()}
    # gpu_clocks: the recording predates the SM load, so it judges the reasons seen during the copies
    assert statuses == dict.fromkeys(HEALTH_IDS, Status.PASS), {i: r.summary for i, r in results.items()}
    links = results["pcie_link"].data["gpus"]
    assert isinstance(links, list) and len(links) == 1
    link: dict[str, object] = links[0]
    assert link == {
        "index": 0,
        "name": "NVIDIA H200",
        "bus_id": link["bus_id"],
        "gen": 5,
        "width": 16,
        "gen_max": 5,
        "width_max": 16,
        "busy": True,
    }
    assert isinstance(link["bus_id"], str) and link["bus_id"]
    copies = results["gpu_copy_bandwidth"].data["gpus"]
    assert isinstance(copies, list) and len(copies) == 1
    assert copies[0] == {"index": 0, "name": "NVIDIA H200", "h2d_gbps": 54.92, "d2h_gbps": 54.98, "link_gbps": 63.02}
    json.dumps({i: r.data for i, r in results.items()})  # JSON-serialisable


def test_the_report_formats_accept_the_health_results() -> None:
    results = list(_run_all(_ctx(facts.health_facts(_payload("h200-2026-12-01-busy.json"), loaded=True))).values())
    results = [dataclasses.replace(r, family=health_checks.FAMILY, level=1) for r in results]
    info = report.RunInfo(
        host="h200", version="0", started="2026-12-01T00:00:00+00:00", seconds=1.0, level=2, manifest=""
    )
    doc = json.loads(report.to_json(results, info))
    assert {r["id"] for r in doc["results"]} == HEALTH_IDS
    assert 'classname="sm120check.node_health"' in report.to_junit(results, info)
    assert 'sm120check_check_status{check="gpu_xid",family="node_health",status="pass"} 1' in report.to_prometheus(
        results, info
    )


def test_a_probe_that_hung_fails_every_check_naming_its_step() -> None:
    hung = facts.HealthFacts(
        loaded=True, problem="timed out after 90 s", step="nvmlInit_v2", stderr_tail="sm120check-step: x\n"
    )
    results = _run_all(_ctx(hung))
    assert {r.status for r in results.values()} == {Status.FAIL}
    assert results["gpu_ecc"].summary == "the node-health probe timed out after 90 s during nvmlInit_v2"


def test_a_malformed_probe_answer_is_a_problem_not_a_crash() -> None:
    answer = facts.health_facts({"gpus": "many"}, loaded=False)
    assert answer.health is None and answer.problem.startswith("printed a malformed answer")


def test_without_a_driver_the_checks_skip_and_the_kernel_log_is_still_judged() -> None:
    """This machine: NVML does not load. The real probe still answers; no health check fails."""
    answer = facts.read_health(facts.HealthPlan(load=True), timeout=60)
    assert answer.health is not None, answer.problem
    results = _run_all(_ctx(answer))
    if answer.health.nvml_error:
        gpu_ids = HEALTH_IDS - {"gpu_xid"}
        assert {results[i].status for i in gpu_ids} == {Status.SKIP}
        assert all(answer.health.nvml_error in results[i].summary for i in gpu_ids - {"gpu_product"})
    assert all(r.status is not Status.FAIL for r in results.values()), {i: r.summary for i, r in results.items()}
    assert results["gpu_xid"].status in (Status.PASS, Status.SKIP) and results["gpu_xid"].summary


def test_the_doctor_at_level_2_asks_the_probe_once_and_never_fails_a_health_check_here(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked: list[tuple[str, tuple[str, ...]]] = []
    real = child.run_probe

    def counted(module: str, args: Any = (), **kwargs: Any) -> child.ChildOutcome:  # the real probe, counted
        asked.append((module, tuple(args)))
        return real(module, args, **kwargs)

    monkeypatch.setattr(child, "run_probe", counted)
    args = _doctor_args("--level", "2", "--json", "--select", ",".join(sorted(HEALTH_IDS)))
    cli.main(args)
    results = {r["id"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    probes = [a for m, a in asked if m == facts.HEALTH_PROBE]
    assert len(probes) == 1 and "--no-load" not in probes[0] and str(os.getpid()) in probes[0]
    for check_id in HEALTH_IDS:
        assert results[check_id]["family"] == "node_health"
        assert results[check_id]["status"] != "fail", results[check_id]
    levels = {r["id"]: r["level"] for r in results.values() if r["id"] in HEALTH_IDS}
    assert levels["gpu_xid"] == 1 and levels["pcie_link"] == 2


def test_level_1_runs_the_probe_at_rest() -> None:
    chosen = [c for c in all_checks() if c.level == 1]
    plan = health_checks.plan(chosen)
    assert plan is not None and "--no-load" in plan.args()


def test_the_process_tree_walk_finds_the_doctors_own_children() -> None:
    """Real processes: a child of ours that starts a grandchild; both descend from us, pid 1 does not."""
    script = "import subprocess, sys, time; p = subprocess.Popen(['sleep', '30']); print(p.pid, flush=True); p.wait()"
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        grandchild = int(parent.stdout.readline())
        assert ancestry.parent(grandchild) == parent.pid
        assert ancestry.descends_from(grandchild, os.getpid())
        assert ancestry.descends_from(parent.pid, os.getpid())
        assert not ancestry.descends_from(os.getpid(), grandchild)
        assert not ancestry.descends_from(1, os.getpid())
    finally:
        subprocess.run(["kill", str(grandchild)], check=False)
        parent.wait(timeout=30)
    assert ancestry.parent(grandchild) is None  # gone: unreadable, not an error
    assert not ancestry.descends_from(grandchild, os.getpid())


def test_the_payload_round_trips_with_the_compute_load() -> None:
    health = NodeHealth.from_json(_payload("h200-2026-12-01-busy.json"))
    assert health.gpus[0].compute is None  # recorded before the SM load existed: still read
    assert NodeHealth.from_json(json.loads(json.dumps(health.to_json()))) == health

"""`sm120check doctor` end to end on this machine (python -m sm120check.doctor, a temporary manifest)."""

from __future__ import annotations

import json
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from doctor_helpers import doctor, write_manifest

from sm120check.doctor.child import run_probe


def test_level_1_runs_only_static_checks_with_expected_verdicts(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path)
    run = doctor("--level", "1", "--json", "--manifest", str(manifest))
    doc = json.loads(run.stdout)
    results = {r["id"]: r for r in doc["results"]}
    assert {r["level"] for r in doc["results"]} == {1}
    assert results["platform"]["status"] == "pass"
    assert results["manifest"]["status"] == "pass" and results["manifest"]["data"]["path"] == str(manifest)
    assert results["abi_wheels"]["status"] == "pass"
    assert results["stack"]["status"] == "pass"  # nothing pinned, nothing missing
    if not Path("/proc/driver/nvidia/version").exists():
        assert results["driver"]["status"] == "skip" and results["driver"]["summary"] == "no NVIDIA driver"
        assert results["gpu_nodes"]["summary"] == "needs driver, which was skipped: no NVIDIA driver"
    failed = any(r["status"] == "fail" for r in doc["results"])
    assert run.returncode == (1 if failed else 0)
    assert doc["manifest"] == str(manifest)


def test_failing_check_gives_exit_1(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, nvcc="12.8.93")  # the pin differs from any CUDA 13 nvcc
    run = doctor("--select", "toolkit", "--manifest", str(manifest))
    assert run.returncode == 1
    assert "FAIL" in run.stdout


def test_unknown_select_id_exits_2_naming_it_and_the_valid_ids() -> None:
    run = doctor("--select", "nvrtcc")
    assert run.returncode == 2
    assert "unknown check id 'nvrtcc'" in run.stderr and "sm120_jit" in run.stderr


def test_unreadable_explicit_manifest_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "manifest.json"
    bad.write_text("{not json", encoding="utf-8")
    run = doctor("--manifest", str(bad))
    assert run.returncode == 2 and str(bad) in run.stderr


def test_list_shows_every_check_with_level_and_runs_nothing() -> None:
    run = doctor("--list")
    assert run.returncode == 0
    rows = {line.split()[0]: line.split()[1] for line in run.stdout.splitlines()[1:]}
    assert rows["driver"] == "1" and rows["sm120_jit"] == "2" and rows["torch"] == "2"


def test_junit_and_prometheus_files_are_written(tmp_path: Path) -> None:
    junit, prom = tmp_path / "doctor.xml", tmp_path / "doctor.prom"
    manifest = write_manifest(tmp_path)
    doctor("--level", "1", "--manifest", str(manifest), "--junit", str(junit), "--prometheus", str(prom))
    assert ET.parse(junit).getroot().find("testsuite") is not None
    assert 'sm120check_check_status{check="platform",family="preflight",status="pass"} 1' in prom.read_text()


@pytest.mark.timeout(120)  # a guard against a hang, not a speed target: timed_out below says the timeout worked
def test_hung_child_is_killed_with_its_process_group_at_the_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    (tmp_path / "hang_probe.py").write_text(
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(600)\n",
        encoding="utf-8",
    )
    outcome = run_probe("hang_probe", timeout=3, env={"PYTHONPATH": str(tmp_path)}, python=sys.executable)
    assert outcome.timed_out and not outcome.ok  # ended by the 3 s timeout, not by the probe's own 600 s sleep
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{grandchild}").exists() and time.monotonic() < deadline:
        status = Path(f"/proc/{grandchild}/status").read_text() if Path(f"/proc/{grandchild}/status").exists() else ""
        if "zombie" in status:
            break
        time.sleep(0.1)
    alive = (
        Path(f"/proc/{grandchild}/status").exists() and "zombie" not in Path(f"/proc/{grandchild}/status").read_text()
    )
    assert not alive, "the probe's own child outlived the timeout"
    assert "timed out after 3 s" in outcome.problem

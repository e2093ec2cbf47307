"""Output formats: JSON schema, JUnit XML, Prometheus textfile, the table."""

from __future__ import annotations

import dataclasses
import json
import xml.etree.ElementTree as ET

from sm120check.doctor import report
from sm120check.doctor.gpu import kernel_log
from sm120check.doctor.gpu.payloads import KernelLog
from sm120check.doctor.model import Result, Status
from sm120check.doctor.node_health import verdicts

INFO = report.RunInfo(
    host="node1",
    version="0.1.0",
    started="2026-11-30T12:00:00+00:00",
    seconds=1.5,
    level=2,
    manifest="/etc/sm120kit/manifest.json",
    started_epoch=1796040000.0,
)
RESULTS = [
    Result(
        "nvrtc",
        Status.PASS,
        "NVRTC 13.0",
        data={"version": "13.0", "supported_archs": [75, 120]},
        seconds=0.01,
        family="nvrtc",
        level=1,
    ),
    Result("driver", Status.SKIP, "no NVIDIA driver", remedy="install a driver", family="preflight", level=1),
    Result(
        "sm120_jit",
        Status.FAIL,
        "NVRTC cannot compile",
        details='log "quoted"\nline2',
        remedy="ldconfig",
        data={"sm_120_ms": 51.0, "ok": False, "gpus": [{"gpu": 0}]},
        family="cuda_toolkit",
        level=2,
    ),
    Result("env", Status.WARN, "sitecustomize shadowed", details="dead file", family="cuda_env", level=1),
]


def test_json_report_has_the_stable_top_level_fields() -> None:
    doc = json.loads(report.to_json(RESULTS, INFO))
    assert doc["schema"] == report.JSON_SCHEMA == 1
    assert (doc["host"], doc["version"], doc["started"], doc["level"]) == ("node1", "0.1.0", INFO.started, 2)
    assert doc["summary"] == {"pass": 1, "warn": 1, "fail": 1, "skip": 1, "total": 4}


def test_json_results_carry_every_result_field() -> None:
    first = json.loads(report.to_json(RESULTS, INFO))["results"][2]
    assert set(first) == {"id", "family", "level", "status", "summary", "details", "remedy", "data", "seconds"}
    assert first["status"] == "fail" and first["data"]["gpus"] == [{"gpu": 0}]


def test_junit_parses_and_maps_fail_skip_warn() -> None:
    root = ET.fromstring(report.to_junit(RESULTS, INFO))
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("4", "1", "1")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    failure = cases["sm120_jit"].find("failure")
    assert failure is not None and failure.get("message") == "NVRTC cannot compile"
    assert 'log "quoted"' in (failure.text or "") and "remedy: ldconfig" in (failure.text or "")
    assert cases["driver"].find("skipped") is not None
    assert (cases["env"].findtext("system-out") or "").startswith("WARN: sitecustomize shadowed")
    assert cases["nvrtc"].get("classname") == "sm120check.nvrtc"


def test_prometheus_status_is_one_hot_per_check() -> None:
    lines = report.to_prometheus(RESULTS, INFO).splitlines()
    assert 'sm120check_check_status{check="sm120_jit",family="cuda_toolkit",status="fail"} 1' in lines
    assert 'sm120check_check_status{check="sm120_jit",family="cuda_toolkit",status="pass"} 0' in lines
    assert sum(1 for line in lines if line.startswith("sm120check_check_status{")) == 4 * 4


def test_prometheus_exports_durations_and_numeric_data_only() -> None:
    lines = report.to_prometheus(RESULTS, INFO).splitlines()
    assert 'sm120check_check_duration_seconds{check="nvrtc"} 0.010000' in lines
    assert 'sm120check_check_data{check="sm120_jit",key="sm_120_ms"} 51' in lines
    assert 'sm120check_check_data{check="sm120_jit",key="ok"} 0' in lines
    assert not any('key="version"' in line or 'key="gpus"' in line for line in lines)
    assert 'sm120check_checks{status="fail"} 1' in lines


def test_prometheus_lines_are_valid_exposition_format() -> None:
    for line in report.to_prometheus(RESULTS, INFO).splitlines():
        if line.startswith("#"):
            assert line.split()[1] in ("HELP", "TYPE")
            continue
        name, value = line.rsplit(" ", 1)
        float(value)
        assert name.startswith("sm120check_")


def test_table_shows_evidence_and_remedy_only_for_non_passing_checks() -> None:
    text = report.table(RESULTS, INFO)
    assert "nvrtc      PASS    NVRTC 13.0" in text
    assert "remedy: install a driver" in text
    assert 'details: log "quoted"' in text and "  line2" in text
    assert text.rstrip().endswith("4 checks: 1 pass, 1 warn, 1 fail, 1 skip (1.50 s)")


def test_the_table_makes_an_xid_process_name_and_a_host_name_inert() -> None:
    # Probe 2, N70: an Xid line's name= is the process that caused it (any user picks it), the host name is anyone's.
    line = "NVRM: Xid (PCI:0000:3b:00): 13, pid=42, name=\x1b[2J\x1b]0;pwned\x07\x00x, Graphics Exception"
    verdict = verdicts.xid(KernelLog("/dev/kmsg", kernel_log.parse([line]), lines=1))
    result = Result("gpu_xid", Status.FAIL, verdict.summary, verdict.details, family="health", level=1)
    text = report.table([result], dataclasses.replace(INFO, host="n1\x1b[31m\rfake"))
    assert not any(c in text for c in "\x1b\x07\x00\r")
    assert "sm120check 0.1.0 doctor on n1\\x0dfake (level <= 2)" in text
    assert "0000:3b:00: Xid 13, pid=42, name=\\x00x, Graphics Exception" in text

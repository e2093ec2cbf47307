"""`sm120check soak` end to end on the CPU: the bench's stand-in server (`sm120check mock-server`) as the load, the NVML
sampler child replaced by a named stand-in (tests/unit/soak/nvml_standin.py) because no GPU exists here."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bench.conftest import SIM_ARGS, start_sim, stop_sim
from sm120check import cli
from sm120check.doctor import child
from sm120check.exitcodes import Exit
from sm120check.soak import cli as soak_cli
from sm120check.soak.samples import GpuSample, ServerInterval, parse_lines

STANDIN = "unit.soak.nvml_standin"
HUNG = "unit.soak.hung_child"


TESTS = Path(__file__).resolve().parents[2]  # the stand-ins are imported as unit.soak.* by the child interpreter


@pytest.fixture(autouse=True)
def _standin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(soak_cli, "SAMPLER", STANDIN)
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", f"{TESTS}{os.pathsep}{path}" if path else str(TESTS))


def _samples(out: Path) -> tuple[list[GpuSample], list[ServerInterval]]:
    samples, _ = parse_lines((out / "soak.jsonl").read_text())
    return [s for s in samples if isinstance(s, GpuSample)], [s for s in samples if isinstance(s, ServerInterval)]


def test_soak_against_the_stand_in_server_records_and_passes(tmp_path: Path) -> None:
    sim = start_sim("plain", *SIM_ARGS)
    try:
        out = tmp_path / "soak"
        argv = ["soak", "--url", sim.url, "--concurrency", "4", "--duration", "4", "--output-len", "16", "--out"]
        code = cli.main([*argv, str(out), "--no-png", "--interval", "0.5"])
    finally:
        stop_sim(sim)
    assert code == Exit.OK
    gpus, server = _samples(out)
    assert gpus and server
    assert sum(i.tokens for i in server) > 0 and sum(i.errors for i in server) == 0
    report = json.loads((out / "soak.json").read_text())
    assert {r["id"]: r["status"] for r in report["results"]}["soak_server"] == "pass"
    assert (out / "soak.junit.xml").exists()
    assert 'sm120check_check_status{check="soak_xid",family="soak",status="pass"} 1' in (out / "soak.prom").read_text()


def test_server_killed_mid_soak_is_reported_with_the_records_kept(tmp_path: Path) -> None:
    sim = start_sim("plain", *SIM_ARGS)
    killer = threading.Timer(2.0, sim.proc.kill)
    killer.start()
    try:
        out = tmp_path / "soak"
        argv = ["soak", "--url", sim.url, "--concurrency", "4", "--duration", "6", "--output-len", "16", "--out"]
        code = cli.main([*argv, str(out), "--no-png"])
    finally:
        killer.cancel()
        stop_sim(sim)
    assert code == Exit.FOUND
    report = {r["id"]: r for r in json.loads((out / "soak.json").read_text())["results"]}
    assert report["soak_server"]["status"] == "fail"
    assert "the server died" in report["soak_server"]["summary"]
    gpus, server = _samples(out)
    assert sum(i.tokens for i in server) > 0 and gpus  # what came before the kill is kept


def test_png_is_drawn(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    assert cli.main(["soak", "--duration", "2", "--interval", "0.5", "--out", str(out)]) == Exit.OK
    assert (out / "soak.png").read_bytes()[:4] == b"\x89PNG"


def test_url_without_concurrency_is_a_usage_error(tmp_path: Path) -> None:
    assert cli.main(["soak", "--url", "http://127.0.0.1:9", "--out", str(tmp_path)]) == Exit.USAGE


def test_hung_sampler_is_killed_and_fails_the_soak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(soak_cli, "SAMPLER", HUNG)
    monkeypatch.setattr(soak_cli, "HANG_S", 1.0)
    out = tmp_path / "soak"
    code = cli.main(["soak", "--duration", "4", "--out", str(out), "--no-png"])
    assert code == Exit.FOUND
    report = {r["id"]: r for r in json.loads((out / "soak.json").read_text())["results"]}
    assert report["soak_nvml"]["status"] == "fail"
    assert (
        "went silent" in report["soak_nvml"]["summary"] and "nvmlDeviceGetClockInfo" in report["soak_nvml"]["summary"]
    )
    _gone(int((out / "soak.jsonl.pid").read_text()))


def test_watchdog_kills_a_child_that_sleeps_forever(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    outcome = child.run_probe(
        HUNG, ["--out", str(tmp_path / "x"), "--pid-file", str(pid_file)], timeout=60, env=child.probe_env(), idle=1.0
    )
    assert not outcome.ok and outcome.silent == 1.0
    assert "went silent for 1 s" in outcome.problem and outcome.step == "nvmlDeviceGetClockInfo on GPU 0"
    _gone(int(pid_file.read_text()))


def _gone(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_ctrl_c_ends_the_soak_cleanly_with_its_record(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    sim = start_sim("plain", *SIM_ARGS)
    try:
        cmd = [sys.executable, "-m", "sm120check", "soak", "--url", sim.url, "--concurrency", "2", "--duration", "60"]
        proc = subprocess.Popen([*cmd, "--output-len", "16", "--out", str(out), "--no-png"], stdout=subprocess.PIPE)
        for _ in range(100):  # the server's first intervals are being measured once the meta line is there
            if (out / "soak.jsonl").exists():
                break
            time.sleep(0.1)
        time.sleep(2)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        stop_sim(sim)
    assert proc.returncode == Exit.INTERRUPTED
    report = json.loads((out / "soak.json").read_text())
    assert report["interrupted"]["signal"] == "SIGINT"
    _, server = _samples(out)
    assert sum(i.tokens for i in server) > 0


def test_sm_load_that_cannot_run_here_is_said_and_the_soak_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    assert cli.main(["soak", "--sm-load", "--duration", "2", "--interval", "0.5", "--out", str(out), "--no-png"]) == 0
    report = {r["id"]: r for r in json.loads((out / "soak.json").read_text())["results"]}
    assert report["soak_nvml"]["status"] == "warn"
    assert "the SM load did not run to the end" in report["soak_nvml"]["summary"]


def test_sm_load_with_a_url_is_a_usage_error(tmp_path: Path) -> None:
    argv = ["soak", "--url", "http://127.0.0.1:9", "--concurrency", "1", "--sm-load", "--out", str(tmp_path)]
    assert cli.main(argv) == Exit.USAGE


def test_from_sweep_soaks_at_the_sweeps_highest_level(tmp_path: Path) -> None:
    sweep = Path(__file__).resolve().parents[2] / "fixtures" / "bench" / "h200-sglang-0.5.16-base.jsonl"
    out = tmp_path / "soak"
    argv = ["soak", "--url", "http://127.0.0.1:9", "--from-sweep", str(sweep), "--duration", "1", "--no-png"]
    cli.main([*argv, "--out", str(out)])
    meta = json.loads((out / "soak.jsonl").read_text().splitlines()[0])
    assert meta["concurrency"] == 250  # the H200 base sweep's levels run 1 .. 250


def test_from_sweep_of_a_file_that_is_no_sweep_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "x.jsonl").write_text("{}\n")
    argv = ["soak", "--url", "http://127.0.0.1:9", "--from-sweep", str(tmp_path / "x.jsonl"), "--out", str(tmp_path)]
    assert cli.main(argv) == Exit.USAGE

"""The doctor survives what it loads and stops when told: NVML and NVRTC load in bounded child processes (a hang
or a crash is a verdict, the report is still printed), and SIGINT / SIGTERM end it at once, every probe process
group killed (the probe's own helpers included), with what finished still reported.

Real processes and signals on fake environments: a pynvml that hangs or segfaults on import, ELF libraries whose
constructor blocks or whose first call segfaults, a torch whose import spawns `sleep` and hangs, an nvcc that hangs
and forks. The time limits below are only the tests' own guards against a doctor that would hang.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from doctor_helpers import SRC, doctor, write_manifest

from sm120check.doctor import nvml_api, nvrtc_api
from sm120check.doctor.child import ChildOutcome, run_command
from sm120check.doctor.cuda_toolkit.nvrtc_verdict import nvrtc_probe_verdict
from sm120check.doctor.gpu.nvml_info_payload import NvmlAnswer
from sm120check.doctor.model import Status
from sm120check.doctor.preflight.driver import nvml_answer, nvml_probe_verdict

GUARD = 60  # seconds: the test's own limit for a doctor run that must end within --timeout (a few s) or at once
HAS_CC = shutil.which("cc") is not None or shutil.which("gcc") is not None


def _results(stdout: str) -> dict[str, dict[str, object]]:
    return {r["id"]: r for r in json.loads(stdout)["results"]}


def _fake_module(tmp_path: Path, name: str, source: str) -> Path:
    root = tmp_path / f"fake-{name}"
    root.mkdir()
    (root / f"{name}.py").write_text(source, encoding="utf-8")
    return root


def _c_library(tmp_path: Path, soname: str, source: str) -> Path:
    """Build an ELF shared library `soname` from C `source` into its own directory (for LD_LIBRARY_PATH)."""
    directory = tmp_path / f"lib-{soname}"
    directory.mkdir()
    (tmp_path / f"{soname}.c").write_text(source, encoding="utf-8")
    compiler = shutil.which("cc") or shutil.which("gcc") or "cc"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", str(directory / soname), str(tmp_path / f"{soname}.c")],
        check=True,
        timeout=GUARD,
    )
    return directory


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as dead)."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state not in ("Z", "X")


def _group(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(stat.parent.name))
    return members


def _gone(pids: list[int], pgid: int, within: float = 10) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids) and not _group(pgid):
            return True
        time.sleep(0.1)
    return False


# --- NVML and NVRTC in bounded children --------------------------------------------------------------------------


def test_pynvml_that_hangs_on_import_is_a_driver_fail_not_a_hang(tmp_path: Path) -> None:
    fake = _fake_module(tmp_path, "pynvml", "import time\ntime.sleep(1000)\n")
    manifest = write_manifest(tmp_path)
    run = doctor(
        "--level", "1", "--timeout", "3", "--json", "--manifest", str(manifest),
        env={"PYTHONPATH": f"{fake}{os.pathsep}{SRC}"},
        timeout=GUARD,
    )  # fmt: skip
    results = _results(run.stdout)
    driver = results["driver"]
    assert driver["status"] == "fail", driver
    assert "hung" in str(driver["summary"]) and "import pynvml" in str(driver["summary"])
    assert str(fake / "pynvml.py") in str(driver["summary"]) and "timed out after 3 s" in str(driver["summary"])
    assert results["platform"]["status"] == "pass"  # the rest of the report is there
    assert results["gpu_nodes"]["status"] == "skip"
    assert run.returncode == 1


def test_pynvml_that_segfaults_is_a_driver_fail_naming_the_signal_and_json_is_printed(tmp_path: Path) -> None:
    fake = _fake_module(tmp_path, "pynvml", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    run = doctor("--level", "1", "--json", env={"PYTHONPATH": f"{fake}{os.pathsep}{SRC}"}, timeout=GUARD)
    results = _results(run.stdout)
    assert results["driver"]["status"] == "fail"
    assert "crashed" in str(results["driver"]["summary"]) and "SIGSEGV" in str(results["driver"]["summary"])
    assert "platform" in results and run.returncode == 1


@pytest.mark.skipif(not HAS_CC, reason="no C compiler to build a fake libnvidia-ml.so.1")
def test_libnvidia_ml_that_segfaults_in_nvml_init_names_the_call_and_the_file(tmp_path: Path) -> None:
    lib = _c_library(
        tmp_path,
        "libnvidia-ml.so.1",
        "int nvmlInit_v2(void) { volatile int *p = 0; return *p; }\nint nvmlShutdown(void) { return 0; }\n",
    )
    run = doctor(
        "--select", "driver", "--json", env={"LD_LIBRARY_PATH": str(lib), "PYTHONPATH": str(SRC)}, timeout=GUARD
    )
    driver = _results(run.stdout)["driver"]
    assert driver["status"] == "fail" and "SIGSEGV" in str(driver["summary"])
    assert f"nvmlInit_v2 in {lib / 'libnvidia-ml.so.1'}" in str(driver["summary"])
    assert run.returncode == 1


@pytest.mark.skipif(not HAS_CC, reason="no C compiler to build a fake libnvrtc.so.13")
def test_libnvrtc_whose_constructor_never_returns_is_an_nvrtc_fail(tmp_path: Path) -> None:
    lib = _c_library(
        tmp_path,
        "libnvrtc.so.13",
        "#include <unistd.h>\n__attribute__((constructor)) static void hang(void) { for (;;) sleep(1000); }\n"
        "int nvrtcVersion(int *a, int *b) { return 0; }\n",
    )
    run = doctor("--select", "nvrtc", "--timeout", "3", "--json", env={"LD_LIBRARY_PATH": str(lib)}, timeout=GUARD)
    nvrtc = _results(run.stdout)["nvrtc"]
    assert nvrtc["status"] == "fail" and "hung during dlopen libnvrtc.so.13" in str(nvrtc["summary"])
    assert run.returncode == 1


@pytest.mark.skipif(not HAS_CC, reason="no C compiler to build a fake libnvrtc.so.13")
def test_libnvrtc_that_segfaults_in_nvrtc_version_is_an_nvrtc_fail_with_the_report(tmp_path: Path) -> None:
    lib = _c_library(
        tmp_path, "libnvrtc.so.13", "int nvrtcVersion(int *a, int *b) { volatile int *p = 0; return *p; }\n"
    )
    run = doctor("--level", "1", "--json", env={"LD_LIBRARY_PATH": str(lib)}, timeout=GUARD)
    results = _results(run.stdout)
    assert results["nvrtc"]["status"] == "fail"
    assert "SIGSEGV" in str(results["nvrtc"]["summary"]) and "nvrtcVersion in" in str(results["nvrtc"]["summary"])
    assert results["platform"]["status"] == "pass" and run.returncode == 1


def test_nvml_probe_verdicts_are_pure_and_name_what_happened() -> None:
    hang = ChildOutcome(ok=False, timed_out=True, seconds=5, stderr_tail="sm120check-step: import pynvml (from /x)\n")
    result = nvml_probe_verdict(hang.problem, hang.step, hang.stderr_tail, None)
    assert result.status is Status.FAIL and result.summary.startswith("NVML hung during import pynvml (from /x)")
    crash = ChildOutcome(ok=False, returncode=-11, stderr_tail="sm120check-step: nvmlInit_v2 in /lib/libnvidia-ml.so.1")
    assert (
        crash.problem == "was killed by SIGSEGV (signal 11)" and crash.step == "nvmlInit_v2 in /lib/libnvidia-ml.so.1"
    )
    assert "NVML crashed" in nvml_probe_verdict(crash.problem, crash.step, "", "NVRM version: x").summary
    assert nvrtc_probe_verdict("nvrtc", crash.problem, "dlopen libnvrtc.so.13", "", ()).status is Status.FAIL


def test_nvml_and_nvrtc_answers_survive_the_json_round_trip() -> None:
    info = nvml_api.NvmlInfo("580.159.04", 13000, (nvml_api.Gpu(0, "NVIDIA H200", (9, 0), None, "0000:01:00.0"),), "x")
    assert nvml_answer(json.loads(json.dumps(NvmlAnswer(info).to_json()))) == (info, "")
    assert nvml_answer({"error": "libnvidia-ml.so.1 does not load"}) == (None, "libnvidia-ml.so.1 does not load")
    answer = nvrtc_api.answer_from(
        {"path": "/l/libnvrtc.so.13", "version": [13, 0], "archs": [90, 120], "compiled": [
            {"arch": "sm_120", "ok": True, "code": 0, "cubin": "AAEC", "log": "", "seconds": 0.1}]}
    )  # fmt: skip
    assert answer.opened is not None and answer.opened.version == (13, 0) and answer.opened.archs == (90, 120)
    assert answer.opened.compiled[0].cubin == b"\x00\x01\x02"
    assert nvrtc_api.answer_from({"open_error": "nope"}).open_error == "nope"
    assert nvrtc_api.answer_from({"version": [13]}).problem  # malformed: a problem, not an exception


# --- nvcc bounded by --timeout ------------------------------------------------------------------------------------


def test_hung_nvcc_is_bounded_by_the_timeout_and_its_helpers_are_killed(tmp_path: Path) -> None:
    pids = tmp_path / "nvcc.pids"
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    calls = tmp_path / "nvcc.calls"
    script = f"#!/bin/sh\necho call >> {calls}\nsleep 991 &\necho $$ $! > {pids}\nsleep 992\n"
    (home / "bin" / "nvcc").write_text(script, encoding="utf-8")
    (home / "bin" / "nvcc").chmod(0o755)
    run = doctor("--select", "toolkit", "--timeout", "2", "--json", env={"CUDA_HOME": str(home)}, timeout=GUARD)
    # one nvcc call, bounded by --timeout (the verdict names it), not a second one after the first hung
    assert calls.read_text().split() == ["call"]
    toolkit = _results(run.stdout)["toolkit"]
    assert toolkit["status"] == "fail" and "did not answer in 2 s" in str(toolkit["details"])
    shell, helper = map(int, pids.read_text().split())
    assert _gone([shell, helper], shell), "nvcc's helper outlived the timeout"


def test_run_command_kills_the_whole_group_at_the_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    done = run_command(["sh", "-c", f"sleep 993 & echo $! > {pidfile}; sleep 994"], timeout=1)
    assert done.timed_out and done.returncode == 124
    helper = int(pidfile.read_text())
    assert _gone([helper], helper)


# --- SIGINT / SIGTERM ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hanging_torch_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv whose torch (2.14.1 by its metadata) spawns `sleep 997`, writes both pids, then hangs on import."""
    root = tmp_path_factory.mktemp("hanging-torch")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=GUARD)
    (site,) = (root / "venv").glob("lib/python3*/site-packages")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(
        "import os, subprocess, time\n"
        "helper = subprocess.Popen(['sleep', '997'])\n"
        "path = os.environ['FAKE_TORCH_PIDS']\n"
        "open(path + '.tmp', 'w').write(f'{os.getpid()} {helper.pid}')\n"
        "os.replace(path + '.tmp', path)\n"
        "time.sleep(1000)\n",
        encoding="utf-8",
    )
    (site / "torch-2.14.1.dist-info").mkdir()
    (site / "torch-2.14.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.14.1\n", encoding="utf-8"
    )
    return root / "venv"


def _doctor_with_hung_probe(venv: Path, tmp_path: Path) -> tuple[subprocess.Popen[str], int, int]:
    """Start the doctor (its own session, like a shell job) on torch + platform with a 900 s timeout; wait until
    the torch probe hangs with its helper. Returns the doctor, the probe's pid (its process group) and the helper's."""
    manifest = write_manifest(tmp_path)
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "venv": str(venv)}), encoding="utf-8")
    pids = tmp_path / "torch.pids"
    env = dict(os.environ, PYTHONPATH=str(SRC), FAKE_TORCH_PIDS=str(pids))
    cmd = [sys.executable, "-m", "sm120check.doctor", "--select", "platform,torch", "--timeout", "900", "--json"]
    proc = subprocess.Popen(
        [*cmd, "--manifest", str(manifest)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + GUARD
    while not pids.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the torch probe never started: rc {proc.returncode}\n{out}\n{err}")
        time.sleep(0.05)
    probe, helper = map(int, pids.read_text().split())
    return proc, probe, helper


def _cleanup(proc: subprocess.Popen[str], probe: int) -> None:
    """After a failed test: a SIGKILLed doctor cannot kill its probe's helpers, so end the group here."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(probe, signal.SIGKILL)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_the_doctor_at_once_reports_what_finished_and_kills_the_probe_group(
    hanging_torch_venv: Path, tmp_path: Path, signum: signal.Signals, code: int
) -> None:
    proc, probe, helper = _doctor_with_hung_probe(hanging_torch_venv, tmp_path)
    try:
        assert _alive(helper) and probe in _group(probe)
        os.killpg(proc.pid, signum)  # Ctrl-C reaches the doctor's group; the probe is in a session of its own
        out, err = proc.communicate(timeout=GUARD)  # not the 900 s of the probe's timeout
    finally:
        _cleanup(proc, probe)
    assert proc.returncode == code, err
    doc = json.loads(out)
    results = {r["id"]: r for r in doc["results"]}
    assert results["platform"]["status"] == "pass"
    assert results["torch"]["status"] == "skip" and results["torch"]["data"] == {"interrupted": True}
    assert f"interrupted by {signum.name}" in results["torch"]["summary"]
    assert doc["interrupted"] == {"signal": signum.name, "unfinished": ["torch"]}
    assert _gone([probe, helper], probe), f"left running: {_group(probe)}"


def test_second_signal_while_stopping_still_leaves_no_probe_processes(hanging_torch_venv: Path, tmp_path: Path) -> None:
    proc, probe, helper = _doctor_with_hung_probe(hanging_torch_venv, tmp_path)
    try:
        os.killpg(proc.pid, signal.SIGINT)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=GUARD)
    finally:
        _cleanup(proc, probe)
    assert proc.returncode in (130, 143)
    assert _gone([probe, helper], probe), f"left running: {_group(probe)}"

"""Facts before checks: NVML is asked once, before the checks, and every check judges the same typed GPU list;
the probes' payloads are one type each, printed by the probe and read strictly by the judge."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from doctor_helpers import SRC, facts_for, gpu, write_manifest

from sm120check import manifest
from sm120check.doctor import child, cli, facts, nvrtc_api
from sm120check.doctor.comm import collectives as comm
from sm120check.doctor.cuda_toolkit import nvrtc_launch
from sm120check.doctor.cuda_toolkit.nvrtc_launch_payload import JitLaunch, LaunchRow
from sm120check.doctor.gpu.nvml_info_payload import NvmlAnswer
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.nvml_api import Gpu, NvmlInfo
from sm120check.doctor.nvrtc_api import Compiled, NvrtcInfo, answer_from
from sm120check.doctor.payload import PayloadError
from sm120check.doctor.preflight import driver
from sm120check.doctor.python_stack import torch
from sm120check.doctor.python_stack.torch_info_payload import TorchInfo
from sm120check.doctor.sglang_sm120 import sglang
from sm120check.doctor.sglang_sm120.sglang_comm_payload import SglangCommAnswer

GUARD = 60  # seconds: a hang guard for a doctor that must stop at once
H200 = NvmlInfo(
    "580.159.04",
    13000,
    (Gpu(0, "NVIDIA H200", (9, 0), True, "00000000:01:00.0"), Gpu(1, "NVIDIA H200", (9, 0), False, "00000000:02:00.0")),
    "pynvml",
)


def _doctor_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return parser.parse_args(["doctor", *argv])


def test_nvml_is_asked_once_and_the_driver_and_persistence_checks_judge_its_list(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    asked: list[str] = []

    def run_probe(module: str, *args: Any, **kwargs: Any) -> child.ChildOutcome:
        asked.append(module)
        return child.ChildOutcome(ok=True, data=NvmlAnswer(H200).to_json())

    monkeypatch.setattr(child, "run_probe", run_probe)
    manifest = write_manifest(tmp_path)
    args = _doctor_args("--select", "gpu_persistence", "--json", "--manifest", str(manifest))
    assert cli.main(args) == 0
    results = {r["id"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert asked == [facts.NVML_PROBE]  # once, for both checks
    assert results["driver"]["data"]["gpus"][1] == {
        "index": 1,
        "name": "NVIDIA H200",
        "cc": "9.0",
        "persistence": False,
        "bus_id": "00000000:02:00.0",
    }
    assert results["gpu_persistence"]["summary"] == "persistence mode is off on GPU 1"


def test_a_run_without_the_driver_check_does_not_ask_nvml(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def run_probe(module: str, *args: Any, **kwargs: Any) -> child.ChildOutcome:
        raise AssertionError(f"no probe may start: {module}")

    monkeypatch.setattr(child, "run_probe", run_probe)
    args = _doctor_args("--select", "stack", "--json", "--manifest", str(write_manifest(tmp_path)))
    cli.main(args)
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert result["id"] == "stack"


@pytest.mark.parametrize("check", ["flashinfer_jit", "sglang_sm120"])
def test_a_check_that_reads_the_gpu_list_asks_nvml_when_run_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, check: str
) -> None:
    """Run alone (no driver check in the run), a check that declares `needs_nvml` still gets NVML's list, asked
    once: on a GPU box `doctor --select flashinfer_jit` must not say "no GPU seen"."""
    asked: list[str] = []

    def run_probe(module: str, *args: Any, **kwargs: Any) -> child.ChildOutcome:
        asked.append(module)
        if module != facts.NVML_PROBE:
            return child.ChildOutcome(ok=False, stderr_tail="not this test's probe")
        return child.ChildOutcome(ok=True, data=NvmlAnswer(H200).to_json())

    monkeypatch.setattr(child, "run_probe", run_probe)
    args = _doctor_args("--select", check, "--json", "--manifest", str(write_manifest(tmp_path)))
    cli.main(args)
    results = {r["id"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert set(results) == {check} and asked.count(facts.NVML_PROBE) == 1, asked
    assert "no GPU seen" not in results[check]["summary"]
    from sm120check.doctor.catalogue import all_checks

    assert {c.id for c in all_checks() if facts.needs_nvml(c)} >= {"driver", "flashinfer_jit", "sglang_sm120"}


def test_checks_that_read_the_gpu_list_no_longer_declare_the_driver_for_it() -> None:
    assert sglang.SglangSm120.uses == () and sglang.SglangSm120.requires == ()
    # A failed driver must still skip these: the list is there, the driver is too old for it.
    assert driver.PersistenceCheck.requires == ("driver",) and comm.NcclAllreduce.requires == ("driver", "torch")
    # These judge the driver's status (a too-old driver: no GPU work expected), the GPU list comes from the facts.
    assert nvrtc_launch.Sm120JitCheck.uses == ("driver",) and "driver" in torch.TorchCheck.uses


def test_sglang_check_reads_the_first_gpus_capability_from_the_facts() -> None:
    assert sglang._gpu_cc(Context(facts=facts_for((gpu(0, cc=(12, 0)), gpu(1, cc=(9, 0)))))) == "12.0"
    assert sglang._gpu_cc(Context(facts=facts_for(None, nvml_error="libnvidia-ml.so.1 does not load"))) is None


def test_gpu_work_is_expected_only_when_the_driver_passed_and_nvml_listed_gpus() -> None:
    compiled = [Compiled(a, True, 0, b"x") for a in nvrtc_launch.TARGETS]
    launched: list[str] = []

    def probe(timeout: float, compile_for: Any = ()) -> Any:
        from sm120check.doctor.nvrtc_api import Opened, ProbeAnswer

        return ProbeAnswer(opened=Opened("/l/libnvrtc.so.13", (13, 0), (120,), tuple(compiled)))

    def run_probe(module: str, *args: Any, **kwargs: Any) -> child.ChildOutcome:
        launched.append(module)
        row = LaunchRow(0, "NVIDIA H200", "9.0", "sm_90", True, mismatches=0, elements=4099)
        return child.ChildOutcome(ok=True, data=JitLaunch("/l/libnvrtc.so.13", (row,)).to_json())

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(nvrtc_api, "probe", probe)
        mp.setattr(child, "run_probe", run_probe)
        old = {"driver": Result("driver", Status.FAIL, "driver 570 is older than 580.65.06")}
        too_old = Context(facts=facts_for((gpu(0),)), results=old)
        assert "nothing launched" in nvrtc_launch.Sm120JitCheck().run(too_old).summary and launched == []
        ok = Context(facts=facts_for((gpu(0),)), results={"driver": Result("driver", Status.PASS, "driver ok")})
        result = nvrtc_launch.Sm120JitCheck().run(ok)
    assert launched == [nvrtc_launch.PROBE] and result.status is Status.PASS, result
    assert result.data["gpus"] == [
        {"gpu": 0, "name": "NVIDIA H200", "cc": "9.0", "arch": "sm_90", "ok": True, "mismatches": 0, "elements": 4099}
    ]


def test_facts_follow_the_manifests_venv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.12" / "site-packages"
    (site / "flashinfer_python-0.7.2.dist-info").mkdir(parents=True)
    (site / "flashinfer_python-0.7.2.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: flashinfer_python\nVersion: 0.7.2\n", encoding="utf-8"
    )
    manifest_path = write_manifest(tmp_path)
    data = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**data, "venv": str(venv)}), encoding="utf-8")
    from sm120check import manifest

    found = facts.local(manifest.load(manifest_path))
    assert found.venv == venv and found.venv_python == venv / "bin" / "python"
    assert dict(found.distributions) == {"flashinfer-python": "0.7.2"} and found.flashinfer == "0.7.2"
    assert found.gpus is None and "not asked" in found.gpus_missing


# --- payloads: one type, printed by the probe, read strictly by the judge -----------------------------------------


def test_payloads_survive_the_json_round_trip() -> None:
    torch_info = TorchInfo(
        True, import_s=1.5, version="2.11.0+cu130", cuda="13.0", file="/v/torch/__init__.py",
        arch_list=("sm_90", "sm_120"), nccl="2.28.9", cuda_available=True, device_count=2, op_ok=True,
        capabilities=("12.0", "12.0"), maps={"libnccl": ("/v/nvidia/nccl/lib/libnccl.so.2",)}, seconds=3.0,
    )  # fmt: skip
    launch = JitLaunch("/l/libnvrtc.so.13", (LaunchRow(0, "H200", "9.0", "sm_90", False, error="CUDA_ERROR_X"),))
    nvrtc = NvrtcInfo(path="/l/libnvrtc.so.13", version=(13, 0), archs=(90, 120))
    for payload in (torch_info, launch, nvrtc, NvmlAnswer(H200), NvmlAnswer(None, "no NVML"), TorchInfo(False)):
        assert type(payload).from_json(json.loads(json.dumps(payload.to_json()))) == payload


HUNG = {"ok": False, "problem": "ranks hung", "timed_out": True, "seconds": 60.0, "ranks": [], "evidence": ""}
GOOD_INFO: dict[str, Any] = NvmlAnswer(H200).to_json()["info"]  # type: ignore[assignment]
MALFORMED = [
    (NvmlAnswer.from_json, {"info": {**GOOD_INFO, "cuda_driver": "13.0"}}, "info.cuda_driver"),
    (NvmlAnswer.from_json, {"info": {**GOOD_INFO, "gpus": [{"index": 0, "cc": [12]}]}}, "info.gpus[0].cc"),
    (TorchInfo.from_json, {"installed": True, "version": "2.11", "cuda": 13.0}, "cuda"),
    (JitLaunch.from_json, {"nvrtc": "/l", "gpus": [{"gpu": "0"}]}, "gpus[0].gpu"),
    (NvrtcInfo.from_json, {"path": "/l", "version": [13]}, "version"),
    (SglangCommAnswer.from_json, {**HUNG, "ranks": [{"symm_mem": {"disabled": "no"}}]}, "ranks[0].symm_mem.disabled"),
]


@pytest.mark.parametrize(("read", "data", "field"), MALFORMED, ids=[m[2] for m in MALFORMED])
def test_a_malformed_payload_names_the_field(read: Any, data: dict[str, Any], field: str) -> None:
    with pytest.raises(PayloadError) as caught:
        read(data)
    assert caught.value.field == field and field in str(caught.value)


def test_the_recorded_sglang_comm_answers_are_its_payload_type() -> None:
    record = json.loads(
        (SRC.parents[2] / "docs/validation/2026-12-01-h200-sglang-preflight/sglang_preflight.json").read_text()
    )
    for answer in (record["unpatched"], record["patched"]):
        assert SglangCommAnswer.from_json(answer).to_json() == answer


def test_a_malformed_nvml_answer_is_an_nvml_error_naming_the_field() -> None:
    found = facts.nvml_facts({"info": {"driver": "580", "cuda_driver": 13000, "gpus": "none", "backend": "x"}})
    assert found.info is None and "info.gpus: expected a list" in found.error


def test_the_real_probes_print_their_payload_type() -> None:
    """The torch (CPU build in the dev venv) and NVRTC probes run for real here; NVML answers or says why not."""
    env = dict(os.environ, PYTHONPATH=str(SRC))
    for module, payload in (
        ("sm120check.doctor.python_stack.torch_info_probe", TorchInfo),
        ("sm120check.doctor.gpu.nvml_info_probe", NvmlAnswer),
    ):
        out = subprocess.run(
            [sys.executable, "-m", module],
            capture_output=True, text=True, env=env, timeout=GUARD, check=True,
        ).stdout  # fmt: skip
        data = json.loads(out.strip().splitlines()[-1])
        assert payload.from_json(data).to_json() == data, module  # type: ignore[attr-defined]
    answer = answer_from(
        child.run_probe("sm120check.doctor.cuda_toolkit.nvrtc_info_probe", ["--compile", "sm_120"], timeout=GUARD).data
    )
    assert not answer.problem, answer.problem


def test_ctrl_c_while_nvml_hangs_reports_what_finished_and_ends_the_probe(tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    fake.mkdir()
    pid_file = tmp_path / "nvml.pid"
    (fake / "pynvml.py").write_text(
        f"import os, time\nopen({str(pid_file)!r} + '.tmp', 'w').write(str(os.getpid()))\n"
        f"os.replace({str(pid_file)!r} + '.tmp', {str(pid_file)!r})\ntime.sleep(1000)\n",
        encoding="utf-8",
    )
    env = dict(os.environ, PYTHONPATH=f"{fake}{os.pathsep}{SRC}")
    cmd = [sys.executable, "-m", "sm120check.doctor", "--select", "platform,gpu_persistence", "--json"]
    proc = subprocess.Popen(
        [*cmd, "--manifest", str(write_manifest(tmp_path))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + GUARD
    while not pid_file.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        probe = int(pid_file.read_text())
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=GUARD)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    doc = json.loads(out)
    assert doc["interrupted"]["signal"] == "SIGINT"
    # NVML is asked in the background: platform, which reads no GPU fact, did not wait for it.
    assert doc["interrupted"]["unfinished"] == ["driver", "gpu_persistence"]
    assert {r["id"]: r["status"] for r in doc["results"]} == {
        "platform": "pass",
        "driver": "skip",
        "gpu_persistence": "skip",
    }
    assert _ended(probe), "the NVML probe was left running"


def _ended(pid: int, within: float = 10) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def test_the_health_probe_starts_in_the_background_and_every_reader_gets_the_same_answer() -> None:
    """gather starts the real node-health probe (at rest here: no GPU) beside NVML; readers wait for one answer."""
    gathered = facts.gather(facts.NodeFacts(), timeout=60, nvml=False, health=facts.HealthPlan(load=False))
    first, second = gathered.health, gathered.health
    assert first is not None and first is second and not first.loaded
    assert first.health is not None, first.problem
    assert first.health.load_error in ("skipped: --no-load", "skipped: no NVML")
    assert facts.gather(facts.NodeFacts(), timeout=60, nvml=False).health is None  # no health check: not asked


def _judge_this_venv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No manifest, so the doctor judges the dev venv (its CPU torch), not the stack venv of a machine that was
    provisioned as a node (its /etc/sm120kit/manifest.json names a venv without torch)."""
    monkeypatch.setenv(manifest.ENV_VAR, str(tmp_path / "no-manifest.json"))


def test_the_torch_probe_starts_with_the_facts_once_and_the_torch_check_judges_its_answer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The slowest level-2 child starts before the checks (not after `toolkit` and `driver`); the real torch probe
    runs (the dev venv's CPU torch), once, from the facts thread, and the torch check judges that answer."""
    started: list[tuple[str, str]] = []
    real = child.run_probe

    def run_probe(module: str, *args: Any, **kwargs: Any) -> child.ChildOutcome:
        import threading

        started.append((module, threading.current_thread().name))
        return real(module, *args, **kwargs)

    monkeypatch.setattr(child, "run_probe", run_probe)
    _judge_this_venv(monkeypatch, tmp_path)
    assert cli.main(_doctor_args("--select", "torch", "--json")) in (0, 1)
    results = {r["id"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    torch_runs = [thread for module, thread in started if module == torch.PROBE]
    assert len(torch_runs) == 1 and torch_runs[0].startswith("sm120check-torch"), started
    assert results["torch"]["data"]["version"] == metadata.version("torch")  # judged from the real probe's answer


def test_without_torch_in_the_venv_no_torch_probe_starts_early() -> None:
    ctx = Context(facts=facts.NodeFacts(distributions={}))
    assert torch.early_probe([torch.TorchCheck()], ctx) is None
    installed = Context(facts=facts.NodeFacts(distributions={"torch": "2.14.1"}))
    assert torch.early_probe([torch.TorchCheck()], installed) is not None
    assert torch.early_probe([], installed) is None  # the torch check is not in the run


def test_a_level_2_run_starts_the_torch_probe_before_it_reads_the_venv_and_plans(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """No --select, torch not skipped: the probe starts before the local facts (the distributions scan) and the
    catalogue's plan, so their time overlaps with torch's import; still one probe, judged by the torch check."""
    events: list[str] = []
    real_probe, real_local, real_start = child.run_probe, facts.local, facts.start

    def run_probe(module: str, *args: Any, **kwargs: Any) -> child.ChildOutcome:
        if module == torch.PROBE:
            events.append("torch probe ran")
        return real_probe(module, *args, **kwargs)

    def start(probe: Any, name: str) -> Any:
        events.append(f"{name} started")
        return real_start(probe, name)

    def local(*args: Any, **kwargs: Any) -> facts.NodeFacts:
        events.append("local facts")
        return real_local(*args, **kwargs)

    monkeypatch.setattr(child, "run_probe", run_probe)
    monkeypatch.setattr(facts, "start", start)
    monkeypatch.setattr(facts, "local", local)
    _judge_this_venv(monkeypatch, tmp_path)
    skip = ",".join(c.id for c in cli_checks() if c.id != "torch")
    assert cli.main(_doctor_args("--skip", skip, "--json")) in (0, 1)
    results = {r["id"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    main_thread = [e for e in events if e != "torch probe ran"]  # the probe's own thread runs when it runs
    assert main_thread[:2] == ["torch started", "local facts"], events
    assert events.count("torch probe ran") == 1 and events.count("torch started") == 1, events
    assert results["torch"]["data"]["version"] == metadata.version("torch")


def test_a_usage_error_after_the_early_torch_probe_ends_it_and_children_start_again(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(_doctor_args("--skip", "no_such_check")) == 2
    assert "no_such_check" in capsys.readouterr().err
    assert not child.stopping()  # a later run in this process may start children
    assert child.run_command([sys.executable, "-c", "print(1)"], timeout=30).stdout.strip() == "1"


def cli_checks() -> list[Any]:
    from sm120check.doctor.catalogue import all_checks

    return list(all_checks())

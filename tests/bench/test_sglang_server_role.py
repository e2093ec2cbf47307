"""roles/sglang_server renders the launch command the doctor's verdicts call for and waits for a live server.

Runs the real role with ansible-playbook on this machine (connection local, files under a temporary directory,
no systemd start); the health wait is tested against the simulated server and against a closed port.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.conftest import Sim
from lab.loopback import QuietHandler, serve, url

ROOT = Path(__file__).resolve().parents[2]
# The policy `sm120check crossover --write-policies` wrote on the H200 from the 3-step EAGLE-3 sweeps (largest
# candidate step 3), that a real SGLang 0.5.16 server started with at --speculative-num-steps 3.
REAL_POLICY = ROOT / "docs" / "validation" / "2026-12-02-h200-sglang-server" / "policy-file-run3.json"
PLAY = "- hosts: localhost\n  connection: local\n  gather_facts: false\n  roles: [sglang_server]\n"


def doctor_report(path: Path, fusion: str, symm: str, sglang: dict[str, str] | None = None) -> Path:
    """A report shaped like `sm120check doctor --json` (schema, results with id and status; sglang_comm's data)."""
    results: list[dict[str, object]] = [
        {"id": "driver", "status": "pass", "summary": "driver 580.159.04"},
        {"id": "allreduce_fusion", "status": fusion, "summary": "FlashInfer allreduce fusion"},
        {"id": "symm_mem", "status": symm, "summary": "torch symmetric memory"},
    ]
    if sglang is not None:
        off = "off" in sglang.values()
        results.append({"id": "sglang_comm", "status": "fail" if off else "pass", "summary": "", "data": sglang})
    path.write_text(json.dumps({"schema": "sm120check.doctor/1", "tool": "sm120check doctor", "results": results}))
    return path


def run_role(
    tmp: Path, *tags: str, check: bool = False, path: Path | None = None, **overrides: object
) -> subprocess.CompletedProcess[str]:
    """The role's tasks of `tags` with ansible-playbook; `path` goes first on PATH (a stand-in's directory)."""
    variables: dict[str, object] = {
        "sglang_server_model_path": "/models/Kimi-K2.5-NVFP4",
        "sglang_server_draft_model_path": "/models/Kimi-K2.5-EAGLE3",
        "sglang_server_python": "/opt/sm120kit/venv/bin/python",
        "sglang_server_config_dir": str(tmp / "etc"),
        "sglang_server_unit_dir": str(tmp / "units"),
        "sglang_server_doctor_report": str(tmp / "doctor.json"),
        "ansible_python_interpreter": sys.executable,
    }
    variables.update(overrides)
    (tmp / "units").mkdir(exist_ok=True)
    (tmp / "play.yml").write_text(PLAY)
    (tmp / "vars.json").write_text(json.dumps(variables))
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), str(tmp / "play.yml"), "-i", "localhost,"]
    cmd += ["-e", f"@{tmp / 'vars.json'}"]
    if tags:
        cmd += ["--tags", ",".join(tags)]
    if check:
        cmd.append("--check")
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_NOCOLOR": "1"}
    if path is not None:
        env["PATH"] = f"{path}:{env.get('PATH', '')}"
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300, check=False)


def command(tmp: Path) -> str:
    return (tmp / "etc" / "launch-command.txt").read_text()


def spec_numbers(cmd: str) -> tuple[int, int, int]:
    """--speculative-num-steps, --speculative-eagle-topk and --speculative-num-draft-tokens of a launch command."""
    argv = shlex.split(cmd)
    flags = ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")
    steps, topk, tokens = (int(argv[argv.index(flag) + 1]) for flag in flags)
    return steps, topk, tokens


def flat(output: str) -> str:
    """The play's output with Ansible's YAML line folding undone, so a message reads as one line."""
    return " ".join(output.split()).replace("''", "'")


def test_passed_checks_turn_on_fusion_and_symmetric_memory_for_eagle3(tmp_path: Path) -> None:
    doctor_report(tmp_path / "doctor.json", "pass", "pass", {"allreduce_fusion": "on", "symmetric_memory": "on"})
    result = run_role(tmp_path, "sglang_server_configure")
    assert result.returncode == 0, result.stdout[-3000:]
    cmd = command(tmp_path)
    assert cmd.startswith("/opt/sm120kit/venv/bin/python -m sglang.launch_server --model-path /models/Kimi-K2.5-NVFP4")
    assert "--speculative-algorithm EAGLE3 --speculative-draft-model-path /models/Kimi-K2.5-EAGLE3" in cmd
    assert "--flashinfer-allreduce-fusion-backend auto" in cmd and "--enable-torch-symm-mem" in cmd
    assert "enforce-disable" not in cmd
    unit = (tmp_path / "units" / "sglang-server.service").read_text()
    assert f"ExecStart={cmd.strip()}" in unit


def test_failed_checks_force_fusion_off_and_leave_symmetric_memory_out(tmp_path: Path) -> None:
    doctor_report(tmp_path / "doctor.json", "fail", "skip")
    assert run_role(tmp_path, "sglang_server_configure").returncode == 0
    cmd = command(tmp_path)
    assert "--enforce-disable-flashinfer-allreduce-fusion" in cmd
    assert "--flashinfer-allreduce-fusion-backend" not in cmd and "--enable-torch-symm-mem" not in cmd


def test_sglang_turning_fusion_off_wins_over_flashinfers_pass(tmp_path: Path) -> None:
    """FlashInfer's own fusion works, but SGLang's preflight would skip it: the launch must not ask for it."""
    doctor_report(tmp_path / "doctor.json", "pass", "pass", {"allreduce_fusion": "off", "symmetric_memory": "on"})
    result = run_role(tmp_path, "sglang_server_configure")
    assert result.returncode == 0, result.stdout[-3000:]
    cmd = command(tmp_path)
    assert "--enforce-disable-flashinfer-allreduce-fusion" in cmd and "--enable-torch-symm-mem" in cmd
    assert "SGLang itself: off -> fusion off" in result.stdout
    doctor_report(tmp_path / "doctor.json", "pass", "pass", {"allreduce_fusion": "on", "symmetric_memory": "on"})
    assert run_role(tmp_path, "sglang_server_configure").returncode == 0
    assert "--flashinfer-allreduce-fusion-backend auto" in command(tmp_path)


def test_passes_without_sglangs_own_verdict_leave_both_off_and_say_why(tmp_path: Path) -> None:
    """FlashInfer and torch pass, but SGLang's own code never ran (no sglang_comm result): no feature turns on."""
    doctor_report(tmp_path / "doctor.json", "pass", "pass")
    result = run_role(tmp_path, "sglang_server_configure")
    assert result.returncode == 0, result.stdout[-3000:]
    cmd = command(tmp_path)
    assert "--enforce-disable-flashinfer-allreduce-fusion" in cmd and "--enable-torch-symm-mem" not in cmd
    assert "sglang_comm not run -> no data, treated as off" in result.stdout


def test_missing_report_says_how_to_write_it_and_turns_both_off(tmp_path: Path) -> None:
    result = run_role(tmp_path, "sglang_server_configure")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "sm120check doctor --level 3 --json >" in result.stdout
    assert "--enable-torch-symm-mem" not in command(tmp_path)


def test_adaptive_config_and_legacy_fusion_flag_are_rendered(tmp_path: Path) -> None:
    doctor_report(tmp_path / "doctor.json", "pass", "fail", {"allreduce_fusion": "on", "symmetric_memory": "on"})
    policy = tmp_path / "sglang-spec-adaptive.json"
    shutil.copyfile(REAL_POLICY, policy)
    result = run_role(
        tmp_path,
        "sglang_server_configure",
        sglang_server_speculative_adaptive_config=str(policy),
        sglang_server_legacy_fusion_flag=True,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    cmd = command(tmp_path)
    assert f"--speculative-adaptive --speculative-adaptive-config {policy}" in cmd
    assert "--enable-flashinfer-allreduce-fusion" in cmd and "--enable-torch-symm-mem" not in cmd


def test_speculation_without_a_draft_model_is_refused(tmp_path: Path) -> None:
    result = run_role(tmp_path, "sglang_server_configure", sglang_server_draft_model_path="")
    assert result.returncode != 0
    assert "sglang_server_draft_model_path" in result.stdout


def test_wait_returns_once_the_server_is_healthy(tmp_path: Path, plain_sim: Sim) -> None:
    result = run_role(
        tmp_path, "sglang_server_start", sglang_server_wait=True, sglang_server_health_url=f"{plain_sim.url}/health"
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "answered 200 after 1 poll(s)" in result.stdout and "sm120check bench --url" in result.stdout


def test_wait_is_bounded_and_prints_a_line_per_poll(tmp_path: Path) -> None:
    result = run_role(
        tmp_path,
        "sglang_server_start",
        sglang_server_wait=True,
        sglang_server_health_url="http://127.0.0.1:9/health",
        sglang_server_health_retries=3,
        sglang_server_health_delay=0,
    )
    assert result.returncode != 0
    assert result.stdout.count("FAILED - RETRYING") == 3


@pytest.mark.parametrize("setting", ["yes", "maybe"])
def test_bad_choice_is_rejected_by_the_argument_spec(tmp_path: Path, setting: str) -> None:
    result = run_role(tmp_path, "sglang_server_configure", sglang_server_symm_mem=setting)
    assert result.returncode != 0
    assert "sglang_server_symm_mem" in result.stdout


def test_second_run_changes_nothing_and_check_mode_writes_nothing(tmp_path: Path) -> None:
    doctor_report(tmp_path / "doctor.json", "pass", "pass")
    check = run_role(tmp_path, "sglang_server_configure", check=True)
    assert check.returncode == 0, check.stdout[-3000:]
    assert not (tmp_path / "etc" / "launch-command.txt").exists()
    assert run_role(tmp_path, "sglang_server_configure").returncode == 0
    again = run_role(tmp_path, "sglang_server_configure")
    assert again.returncode == 0 and "changed=0" in again.stdout


# /server_info of a healthy 0.5.23 EAGLE-3 launch (real ServerArgs field names of 0.5.23: arg_groups/fields/*.py).
SERVER_INFO = {
    "version": "0.5.23",
    "speculative_algorithm": "EAGLE3",
    "speculative_adaptive": False,
    "enable_torch_symm_mem": True,
    "flashinfer_allreduce_fusion_backend": "auto",
    "enforce_disable_flashinfer_allreduce_fusion": False,
    "disable_cuda_graph": False,
    "cuda_graph_config": {"decode": {"backend": "full"}, "prefill": {"backend": "disabled"}},
    "internal_states": [{"memory_usage": {"graph": {"target_verify": 1.2}}}],
}
# Lines of SGLang 0.5.23 (srt/entrypoints/engine.py, layers/flashinfer_comm_fusion.py,
# model_executor/model_runner_components/cuda_graph_setup.py, entrypoints/http_server.py), sample values filled in.
GOOD_LOG = [
    "[2026-12-01 10:00:00] server_args={'model_path': '/models/Kimi-K2.5-NVFP4', 'tp_size': 8}",
    "[2026-12-01 10:01:10 TP0] FlashInfer AllReduce Fusion enabled and workspace initialized: backend=trtllm, rank=0, "
    "world_size=8, max_token_num=2048, hidden_dim=7168",
    "[2026-12-01 10:01:40 TP0] Capture target verify CUDA graph end. bs=[1, 2, 4, 8], elapsed=30.12 s, "
    "mem usage=1.20 GB, avail mem=20.31 GB.",
    "[2026-12-01 10:02:00] The server is fired up and ready to roll!",
]
PREFLIGHT_SKIP = (
    "[2026-12-01 10:01:05 TP0] FlashInfer workspace preflight probe failed (cuMulticastGetGranularity failed for "
    "FlashInfer workspace preflight: CUresult.CUDA_ERROR_NOT_SUPPORTED). Skipping allreduce fusion."
)


class _SGLang(QuietHandler):
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        body = b"" if path == "/health" else json.dumps(SERVER_INFO).encode()
        self.send(200 if path in ("/health", "/server_info", "/get_server_info") else 404, "application/json", body)


@pytest.fixture(scope="module")
def sglang_url() -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 answering /health and /server_info like a live SGLang 0.5.23."""
    with serve(_SGLang) as server:
        yield url(server)


def run_verified(tmp: Path, url: str, log: list[str], check: bool = False) -> subprocess.CompletedProcess[str]:
    """Configure, wait and verify against `url`, with `log` as the server's log; sm120check from this venv."""
    doctor_report(tmp / "doctor.json", "pass", "pass", {"allreduce_fusion": "on", "symmetric_memory": "on"})
    (tmp / "sglang.log").write_text("\n".join(log) + "\n")
    return run_role(
        tmp,
        "sglang_server_configure",
        "sglang_server_start",
        "sglang_server_verify",
        check=check,
        sglang_server_python=str(Path(sys.executable).parent / "python"),
        sglang_server_wait=True,
        sglang_server_health_url=f"{url}/health",
        sglang_server_verify_url=url,
        sglang_server_verify_log=str(tmp / "sglang.log"),
    )


def test_verify_passes_when_the_server_runs_what_the_launch_asked_for(tmp_path: Path, sglang_url: str) -> None:
    result = run_verified(tmp_path, sglang_url, GOOD_LOG)
    assert result.returncode == 0, result.stdout[-3000:]
    for line in ("ok cuda-graph", "ok speculative", "ok fusion", "ok symm-mem"):
        assert line in result.stdout


def test_verify_fails_the_play_naming_the_preflight_skip_and_its_fix(tmp_path: Path, sglang_url: str) -> None:
    log = [GOOD_LOG[0], PREFLIGHT_SKIP, *GOOD_LOG[2:]]
    result = run_verified(tmp_path, sglang_url, log)
    assert result.returncode != 0
    failure = result.stdout[result.stdout.index("Fail when the server runs degraded") :]
    assert "does not run what its launch asked for" in failure
    assert "degraded fusion" in failure and "FlashInfer workspace preflight probe failed" in failure
    assert "Fix: the preflight asks for multicast granularity" in failure and "sm120check sglang patch" in failure
    check = run_verified(tmp_path, sglang_url, log, check=True)  # check mode never runs the verification
    assert check.returncode == 0, check.stdout[-3000:]


def test_sglangs_own_adaptive_mode_is_rendered_without_a_file(tmp_path: Path) -> None:
    """SGLang's adaptive speculation with its built-in steps (the anchor a policy file is measured against), launched
    at its largest candidate step 7: below it SGLang 0.5.16 died in CUDA-graph capture on the H200 (sglang#30549)."""
    doctor_report(tmp_path / "doctor.json", "fail", "fail")
    result = run_role(tmp_path, "sglang_server_configure", sglang_server_speculative_adaptive=True)
    assert result.returncode == 0, result.stdout[-3000:]
    cmd = command(tmp_path)
    assert "--speculative-algorithm EAGLE3" in cmd and cmd.count("--speculative-adaptive") == 1
    assert "--speculative-adaptive-config" not in cmd
    assert spec_numbers(cmd) == (7, 1, 8)
    said = flat(result.stdout)
    assert "largest candidate step is 7, so --speculative-num-steps is raised from 3 to 7" in said
    assert "sglang#30549" in said
    off = run_role(tmp_path, "sglang_server_configure", sglang_server_speculative_adaptive=True,
                   sglang_server_speculative=False)  # fmt: skip
    assert off.returncode == 0 and "--speculative-adaptive" not in command(tmp_path)


def adaptive_config(tmp: Path, text: str) -> Path:
    path = tmp / "sglang-spec-adaptive.json"
    path.write_text(text)
    return path


def test_a_config_files_largest_candidate_step_raises_the_launch_steps(tmp_path: Path) -> None:
    config = adaptive_config(tmp_path, json.dumps({
        "ema_alpha": 0.3, "1": {"candidate_steps": [1, 5]}, "8": {"candidate_steps": [0, 1]}, "17": {
            "candidate_steps": [0]}}))  # fmt: skip
    result = run_role(tmp_path, "sglang_server_configure", sglang_server_speculative_adaptive_config=str(config))
    assert result.returncode == 0, result.stdout[-3000:]
    assert spec_numbers(command(tmp_path)) == (5, 1, 6)
    assert "largest candidate step is 5, so --speculative-num-steps is raised from 3 to 5" in flat(result.stdout)


def test_a_policy_whose_largest_candidate_is_the_configured_step_keeps_it(tmp_path: Path) -> None:
    policy = tmp_path / "sglang-spec-adaptive.json"
    shutil.copyfile(REAL_POLICY, policy)
    result = run_role(tmp_path, "sglang_server_configure", sglang_server_speculative_adaptive_config=str(policy))
    assert result.returncode == 0, result.stdout[-3000:]
    assert spec_numbers(command(tmp_path)) == (3, 1, 4)
    assert "--speculative-num-steps 3 covers it" in flat(result.stdout)


def test_configured_steps_above_every_candidate_are_kept_and_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """Steps 3 with candidates up to 2: the role does not lower them to 2 on its own, and SGLang would refuse 3 at start
    ("is not in the adaptive config candidate_steps"), so the play stops before writing a launch that cannot start."""
    config = adaptive_config(tmp_path, json.dumps({"1": {"candidate_steps": [1, 2]}, "8": {"candidate_steps": [0]}}))
    result = run_role(tmp_path, "sglang_server_configure", sglang_server_speculative_adaptive_config=str(config))
    assert result.returncode != 0
    said = flat(result.stdout)
    assert f"sglang_server_speculative_num_steps 3 is above every candidate step of {config}" in said
    assert "Lower sglang_server_speculative_num_steps to 2 or add 3 to a slot's candidate_steps" in said
    assert not (tmp_path / "etc").exists() and not list((tmp_path / "units").iterdir())
    fixed = run_role(tmp_path, "sglang_server_configure", sglang_server_speculative_adaptive_config=str(config),
                     sglang_server_speculative_num_steps=2)  # fmt: skip
    assert fixed.returncode == 0, fixed.stdout[-3000:]
    assert spec_numbers(command(tmp_path)) == (2, 1, 3)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"1": {"candidate_steps": [1, 3]}', "is not JSON (Expecting ',' delimiter"),
        ('[{"candidate_steps": [1, 3]}]', "the file is JSON but not an object"),
        ('{"ema_alpha": 0.2}', 'no batch-size slot (an integer-string key such as "1")'),
        ('{"1": {"candidate_steps": [1, -3]}}', 'non-negative ints, not "1": [1, -3]'),
        ('{"1": {"candidate_steps": []}, "8": {"steps": [0]}}', 'not "1": []; "8": "no candidate_steps"'),
        ('{"1": {"candidate_steps": ["3"]}, "8": [0]}', 'not "1": ["3"]; "8": [0] (not an object)'),
    ],
    ids=["not-json", "a-list", "no-slot", "negative", "empty-and-missing", "string-and-not-an-object"],
)
def test_a_malformed_adaptive_config_fails_naming_the_file_before_anything_is_written(
    tmp_path: Path, text: str, problem: str
) -> None:
    config = adaptive_config(tmp_path, text)
    result = run_role(tmp_path, "sglang_server_configure", sglang_server_speculative_adaptive_config=str(config))
    assert result.returncode != 0
    said = flat(result.stdout)
    assert f"{config} (sglang_server_speculative_adaptive_config) is" in said and problem in said
    assert "sm120check crossover --write-policies" in said
    assert not (tmp_path / "etc").exists() and not list((tmp_path / "units").iterdir())


def test_an_adaptive_config_missing_on_the_node_is_refused_unless_its_largest_step_is_stated(tmp_path: Path) -> None:
    missing = str(tmp_path / "later" / "sglang-spec-adaptive.json")
    refused = run_role(tmp_path, "sglang_server_configure", sglang_server_speculative_adaptive_config=missing)
    assert refused.returncode != 0
    said = flat(refused.stdout)
    assert f"{missing} (sglang_server_speculative_adaptive_config) is not there on localhost" in said
    assert "set sglang_server_speculative_adaptive_max_candidate_step to its largest candidate step" in said
    assert not (tmp_path / "etc").exists()
    stated = run_role(tmp_path, "sglang_server_configure", sglang_server_speculative_adaptive_config=missing,
                      sglang_server_speculative_adaptive_max_candidate_step=6)  # fmt: skip
    assert stated.returncode == 0, stated.stdout[-3000:]
    assert spec_numbers(command(tmp_path)) == (6, 1, 7)
    assert "(sglang_server_speculative_adaptive_max_candidate_step: the file is not on the node yet)" in flat(
        stated.stdout
    )


def test_a_stated_largest_step_that_the_file_contradicts_is_refused(tmp_path: Path) -> None:
    config = adaptive_config(tmp_path, json.dumps({"1": {"candidate_steps": [1, 5]}}))
    result = run_role(tmp_path, "sglang_server_configure", sglang_server_speculative_adaptive_config=str(config),
                      sglang_server_speculative_adaptive_max_candidate_step=3)  # fmt: skip
    assert result.returncode != 0
    assert f"the largest candidate step of {config} on the node is 5: drop the variable" in flat(result.stdout)


def test_max_running_requests_is_rendered_and_lifts_the_48_request_warning(tmp_path: Path) -> None:
    capped = run_role(tmp_path, "sglang_server_configure")
    assert capped.returncode == 0, capped.stdout[-3000:]
    assert "--max-running-requests" not in command(tmp_path)
    assert "WARNING: SGLang caps a speculative server at 48 running requests" in flat(capped.stdout)
    assert "Set sglang_server_max_running_requests" in flat(capped.stdout)
    uncapped = run_role(tmp_path, "sglang_server_configure", sglang_server_max_running_requests=256)
    assert uncapped.returncode == 0, uncapped.stdout[-3000:]
    assert "--port 30000 --max-running-requests 256 --speculative-algorithm EAGLE3" in command(tmp_path)
    assert "WARNING: SGLang caps" not in uncapped.stdout
    zero = run_role(tmp_path, "sglang_server_configure", sglang_server_max_running_requests=0)
    assert zero.returncode == 0 and "--max-running-requests" not in command(tmp_path)
    base = run_role(tmp_path, "sglang_server_configure", sglang_server_speculative=False)
    assert base.returncode == 0 and "WARNING: SGLang caps" not in base.stdout


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (-1, "must be a positive int, or null or 0 for SGLang's choice (it is -1)"),
        ("many", "sglang_server_max_running_requests"),
    ],
)
def test_a_bad_max_running_requests_is_refused(tmp_path: Path, value: object, said: str) -> None:
    result = run_role(tmp_path, "sglang_server_configure", sglang_server_max_running_requests=value)
    assert result.returncode != 0
    assert said in flat(result.stdout) and not (tmp_path / "etc").exists()


def test_a_noncharacter_in_the_extra_args_is_refused(tmp_path: Path) -> None:
    doctor_report(tmp_path / "doctor.json", "pass", "pass")
    result = run_role(tmp_path, "sglang_server_configure", sglang_server_extra_args=["--served-model-name", "a\uffffb"])
    assert result.returncode != 0  # systemd ignored the unit's ExecStart (probe 3 EN2)
    assert "no value may hold a NUL byte or a Unicode noncharacter" in flat(result.stdout)
    assert not (tmp_path / "units" / "sglang-server.service").exists()


def test_a_model_path_ending_in_a_backslash_keeps_the_units_next_line(tmp_path: Path) -> None:
    doctor_report(tmp_path / "doctor.json", "pass", "pass")
    result = run_role(tmp_path, "sglang_server_configure", sglang_server_model_path="/models/odd\\")
    assert result.returncode == 0, result.stdout[-3000:]
    lines = (tmp_path / "units" / "sglang-server.service").read_text().splitlines()
    assert "Description=SGLang server for /models/odd" in lines  # was ".../odd\" swallowing After= (probe 3 EN6)
    assert "After=network-online.target" in lines


# --- the port: refused when another process holds it, and the listener must be the unit's ----------------------------

LISTENER = (
    "import socket, sys, time\n"
    "s = socket.socket()\n"
    "s.bind(('127.0.0.1', 0))\n"
    "s.listen()\n"
    "print(s.getsockname()[1], flush=True)\n"
    "time.sleep(300)\n"
)


@dataclass
class Listening:
    proc: subprocess.Popen[str]
    port: int


@pytest.fixture
def listener() -> Iterator[Listening]:
    """A real process listening on 127.0.0.1 (a stray server, or the unit's own main process)."""
    proc = subprocess.Popen([sys.executable, "-c", LISTENER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield Listening(proc, int(proc.stdout.readline()))
    finally:
        proc.kill()
        proc.wait(timeout=10)


def systemd_stand_in(tmp: Path, main_pid: int) -> Path:
    """A `systemctl` that answers `show` with the unit's properties (systemd does not run on this machine): the
    role's port check asks it for the unit's MainPID and ControlGroup. Its directory goes first on PATH."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "systemctl").write_text(
        "#!/bin/sh\n"
        '[ "$1" = show ] || { echo "stand-in systemctl: only show" >&2; exit 1; }\n'
        f"printf 'MainPID={main_pid}\\nControlGroup=/system.slice/sglang-server.service\\nActiveState=active\\n'\n"
    )
    (bin_dir / "systemctl").chmod(0o755)
    return bin_dir


def run_port_check(
    tmp: Path, port: int, main_pid: int, *tags: str, wait: bool = False
) -> subprocess.CompletedProcess[str]:
    return run_role(
        tmp,
        *tags,
        path=systemd_stand_in(tmp, main_pid),
        sglang_server_python=str(Path(sys.executable).parent / "python"),
        sglang_server_port=port,
        sglang_server_start=True,
        sglang_server_wait=wait,
        sglang_server_health_url=f"http://127.0.0.1:{port}/health",
    )


def test_a_port_held_by_another_process_is_refused_before_the_unit_starts(tmp_path: Path, listener: Listening) -> None:
    unit_main = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        result = run_port_check(tmp_path, listener.port, unit_main.pid, "sglang_server_start")
    finally:
        unit_main.kill()
        unit_main.wait(timeout=10)
    assert result.returncode != 0
    out = flat(result.stdout)
    failure = out[out.index("Refuse a port held by a process outside the unit") :]
    assert (
        f"sglang-server cannot start on port {listener.port}: port {listener.port} is held by pid {listener.proc.pid}"
        in failure
    )
    assert "-c import socket, sys, time" in failure  # its command line
    assert f"not by unit sglang-server (MainPID {unit_main.pid}, active" in failure
    assert f"Fix: stop it (`kill {listener.proc.pid}`" in failure
    assert "Start and enable the SGLang server" not in out  # nothing started or restarted


def test_the_units_own_listener_passes_before_the_start_and_after_the_wait(tmp_path: Path, listener: Listening) -> None:
    result = run_port_check(tmp_path, listener.port, listener.proc.pid, "sglang_server_port", wait=True)
    assert result.returncode == 0, result.stdout[-3000:]
    assert (
        "Find who holds the server's port" in result.stdout and "Find who answers on the server's port" in result.stdout
    )
    assert "Refuse a port held" in result.stdout and "Fail when the server answering" in result.stdout
    assert "failed=0" in result.stdout and "skipped=2" in result.stdout  # the two judges, with nothing to judge


def test_the_port_check_is_skipped_in_check_mode_and_when_turned_off(tmp_path: Path, listener: Listening) -> None:
    """A stray listener, but nothing would start: check mode and sglang_server_port_check: false pass."""
    stand_in, port = systemd_stand_in(tmp_path, 1), listener.port
    off = run_role(
        tmp_path, "sglang_server_port", path=stand_in, sglang_server_port=port, sglang_server_start=True,
        sglang_server_port_check=False,
    )  # fmt: skip
    check = run_role(
        tmp_path, "sglang_server_port", check=True, path=stand_in, sglang_server_port=port, sglang_server_start=True
    )
    for result in (off, check):
        assert result.returncode == 0, result.stdout[-3000:]
        assert "failed=0" in result.stdout and "skipped=4" in result.stdout


# --- the speculation switch's threshold: in the unit's environment, or refused ----------------------------------------


@pytest.mark.parametrize(("value", "line"), [(30, 'SGLANG_SM120KIT_PLAIN_DECODE_MIN_BS="30"'), (0, None)])
def test_the_switch_threshold_goes_into_the_units_environment(tmp_path: Path, value: int, line: str | None) -> None:
    doctor_report(tmp_path / "doctor.json", "pass", "pass")
    result = run_role(tmp_path, "sglang_server_configure", sglang_server_plain_decode_min_bs=value)
    assert result.returncode == 0, result.stdout[-3000:]
    env = (tmp_path / "etc" / "environment").read_text().splitlines()
    assert (line in env) if line else not any("SGLANG_SM120KIT" in e for e in env)
    assert "--speculative-adaptive" not in command(tmp_path)  # a static launch: the threshold needs no adaptive mode


@pytest.mark.parametrize("value", [-1, "abc", 2.5])
def test_a_bad_switch_threshold_is_refused_before_anything_is_written(tmp_path: Path, value: object) -> None:
    result = run_role(tmp_path, "sglang_server_configure", sglang_server_plain_decode_min_bs=value)
    assert result.returncode != 0
    assert "sglang_server_plain_decode_min_bs" in flat(result.stdout)  # the argument spec's or the role's check
    assert not (tmp_path / "etc").exists()


def test_tokenizer_workers_render_sglangs_http_processes(tmp_path: Path) -> None:
    one = run_role(tmp_path, "sglang_server_configure", sglang_server_speculative=False)
    assert one.returncode == 0, one.stdout[-3000:]
    assert "--tokenizer-worker-num" not in command(tmp_path)
    four = run_role(
        tmp_path, "sglang_server_configure", sglang_server_speculative=False, sglang_server_tokenizer_workers=4
    )
    assert four.returncode == 0, four.stdout[-3000:]
    assert "--port 30000 --tokenizer-worker-num 4 --enforce-disable" in command(tmp_path)
    assert 'SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT="120"' in environment(tmp_path)  # uvicorn's 10 s kills workers


def environment(tmp: Path) -> list[str]:
    return (tmp / "etc" / "environment").read_text().splitlines()


@pytest.mark.parametrize(
    ("workers", "seconds", "env", "line"),
    [
        (1, 120, {}, None),  # one HTTP process: no supervisor, nothing to set
        (2, 300, {}, 'SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT="300"'),
        (2, 120, {"SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT": "45"}, 'SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT="45"'),
    ],
)
def test_the_http_workers_health_check_goes_into_the_units_environment(
    tmp_path: Path, workers: int, seconds: int, env: dict[str, str], line: str | None
) -> None:
    result = run_role(
        tmp_path, "sglang_server_configure", sglang_server_speculative=False, sglang_server_tokenizer_workers=workers,
        sglang_server_http_worker_healthcheck_s=seconds, sglang_server_env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    found = [e for e in environment(tmp_path) if e.startswith("SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT=")]
    assert found == ([line] if line else [])


@pytest.mark.parametrize("value", [0, "2m", 100000])
def test_a_bad_health_check_is_refused_before_anything_is_written(tmp_path: Path, value: object) -> None:
    result = run_role(tmp_path, "sglang_server_configure", sglang_server_tokenizer_workers=2,
                      sglang_server_http_worker_healthcheck_s=value)  # fmt: skip
    assert result.returncode != 0
    assert "sglang_server_http_worker_healthcheck_s" in flat(result.stdout) and not (tmp_path / "etc").exists()


@pytest.mark.parametrize(
    ("value", "extra", "said"),
    [
        (0, [], "the number of SGLang HTTP processes, 1 or more (it is 0)"),
        ("4x", [], "sglang_server_tokenizer_workers"),  # the argument spec's own refusal names the variable
        (1, ["--tokenizer-worker-num=4"], "set there and not as --tokenizer-worker-num in sglang_server_extra_args"),
    ],
)
def test_bad_tokenizer_workers_are_refused_before_anything_is_written(
    tmp_path: Path, value: object, extra: list[str], said: str
) -> None:
    result = run_role(tmp_path, "sglang_server_configure", sglang_server_tokenizer_workers=value,
                      sglang_server_extra_args=extra)  # fmt: skip
    assert result.returncode != 0
    assert said in flat(result.stdout) and not (tmp_path / "etc").exists()

"""What a newcomer reads from the doctor: progress on a terminal, one remedy per cause, what to fix first, the
level-3 hint on a multi-GPU node, and whole first sentences in --list."""

from __future__ import annotations

import inspect
import os
import pty
import select
import subprocess
import sys

from doctor_helpers import SRC, doctor, fixture, gpu

from sm120check.doctor import report
from sm120check.doctor.catalogue import all_checks
from sm120check.doctor.model import Result, Status
from sm120check.doctor.nvml_api import NvmlInfo
from sm120check.doctor.preflight.driver import driver_verdict

INFO = report.RunInfo("node1", "0.1.0", "2026-12-06T03:00:00+00:00", 3.4, 2, "")
# The level-2 run on this GPU-less CPU machine (main at b76eafb): no driver, so eleven checks skip with its remedy.
DRIVER_FIX = (
    "install an NVIDIA driver >= the manifest's driver_min with the open kernel modules (for example `apt install "
    "nvidia-open-580`), reboot; the preflight role checks it: ansible-playbook site.yml --tags preflight"
)
TORCH_FIX = (
    "ansible-playbook site.yml --tags python_stack (sm120kit_profiles: torch pinned to a CUDA 13 build, >= 2.11)"
)
NO_DRIVER = [
    Result("driver", Status.SKIP, "no NVIDIA driver", remedy=DRIVER_FIX),
    *(
        Result(check, Status.SKIP, "needs driver, which was skipped: no NVIDIA driver", remedy=DRIVER_FIX)
        for check in ("gpu_ecc", "pcie_replay", "gpu_mig")
    ),
    Result("torch", Status.FAIL, "torch 2.13.0+cpu (CUDA none, NCCL ?): a CPU-only build", remedy=TORCH_FIX),
    Result("abi_libs", Status.SKIP, "needs torch, which failed: torch 2.13.0+cpu", remedy=TORCH_FIX),
]


def test_a_prerequisites_remedy_is_printed_once_and_cited_after() -> None:
    text = report.table(NO_DRIVER, INFO)
    assert text.count("install an NVIDIA driver") == 2  # under the driver row, and in the footer
    assert text.count("remedy: needs driver, see above") == 3
    assert text.count("remedy: needs torch, see above") == 1


def test_the_footer_names_what_to_fix_first() -> None:
    lines = report.table(NO_DRIVER, INFO).splitlines()
    assert lines[-2] == f"fix first: driver (skip; 3 other check(s) wait on it): {DRIVER_FIX}"
    assert lines[-1] == "6 checks: 0 pass, 0 warn, 1 fail, 5 skip (3.40 s)"


def test_all_passing_has_no_footer() -> None:
    lines = report.table([Result("platform", Status.PASS, "Debian 12")], INFO).splitlines()
    assert not any(line.startswith(("fix first", "this node has")) for line in lines)


def _driver_with(gpus: int) -> Result:
    info = NvmlInfo("580.159.04", 13000, tuple(gpu(i) for i in range(gpus)), "ctypes")
    verdict = driver_verdict(info, "", fixture("proc-driver-version-580.159.04-open.txt"), "580.65.06", "manifest")
    assert verdict.status is Status.PASS
    return verdict


def test_a_multi_gpu_node_below_level_3_is_told_to_run_it() -> None:
    text = report.table([_driver_with(8)], INFO)
    assert (
        "this node has 8 GPUs: `sm120check doctor --level 3` also runs the multi-GPU checks (NCCL on every GPU pair, "
        "P2P), which level 2 leaves out"
    ) in text
    assert "--level 3" not in report.table([_driver_with(8)], report.RunInfo("n", "0", "", 1.0, 3, ""))
    assert "--level 3" not in report.table([_driver_with(1)], INFO)


def test_list_shows_whole_first_sentences() -> None:
    run = doctor("--list")
    descriptions = {line.split()[0]: line.split("  ")[-1].strip() for line in run.stdout.splitlines()[1:]}
    assert len(descriptions) == len(all_checks())
    for check in all_checks():
        text = descriptions[check.id]
        assert text.endswith((".", "!", "?")), f"{check.id}: {text!r} is cut"
        docstring = " ".join((inspect.getdoc(check) or "").split())
        assert docstring.startswith(text), check.id


def _doctor_stderr(on_terminal: bool) -> str:
    """`doctor --level 1` with stderr on a pseudo-terminal (as a user's shell) or on a pipe."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    argv = [sys.executable, "-m", "sm120check.doctor", "--level", "1", "--select", "platform,manifest,abi_wheels"]
    if not on_terminal:
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False).stderr
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=follower, env=env)
    os.close(follower)
    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([leader], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=120)
    os.close(leader)
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_progress_goes_to_a_terminal_one_line_per_check() -> None:
    lines = [line.rsplit(" ", 3)[0] for line in _doctor_stderr(on_terminal=True).splitlines()]
    assert lines == ["[1/3] platform", "[2/3] manifest", "[3/3] abi_wheels"]


def test_no_progress_when_stderr_is_a_pipe() -> None:
    assert "[1/3]" not in _doctor_stderr(on_terminal=False)

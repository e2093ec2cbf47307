"""Commands and probes that never stop writing (reliability probe 3, defect 2: DR1, PC13): the doctor reads a
child's pipes as they fill and stops the child once its stdout passes the bound, so memory stays at the bound
(an nvcc under CUDA_HOME that printed forever took 5.7 GB in 5 s, an endless lspci 23 GB)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from doctor_helpers import SRC

from sm120check.doctor import child
from sm120check.doctor.pcie import lspci

ENDLESS = [sys.executable, "-c", "import sys\nwhile True: sys.stdout.write('nvcc: NVIDIA (R) Cuda compiler ' * 64)"]


@pytest.mark.timeout(60)
def test_a_command_that_writes_forever_is_stopped_at_its_bound() -> None:
    done = child.run_command(ENDLESS, timeout=50, limit=64 << 10)
    assert done.cut and not done.timed_out
    assert len(done.stdout) == 64 << 10  # the first bytes, nothing past the bound
    assert done.stdout.startswith("nvcc: NVIDIA (R) Cuda compiler")
    assert done.returncode != 0
    assert done.stderr.endswith("wrote more than 64 KiB of output; stopped (killed with its process group)")


@pytest.mark.timeout(60)
def test_a_command_that_writes_forever_to_stderr_keeps_only_its_newest_bytes() -> None:
    script = "import sys\nfor i in range(200000): sys.stderr.write('%08d\\n' % i)\nprint('done')"
    done = child.run_command([sys.executable, "-c", script], timeout=50)
    assert done.returncode == 0 and done.stdout == "done\n"
    assert len(done.stderr) == child.MAX_STDERR and done.stderr.endswith("00199999\n")


@pytest.mark.timeout(60)
def test_a_probe_that_writes_forever_is_stopped_and_fails_naming_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "endless_probe.py").write_text("import sys\nwhile True: sys.stdout.write('x' * 65536)\n")
    monkeypatch.setattr(child, "MAX_PROBE_OUTPUT", 1 << 20)
    outcome = child.run_probe("endless_probe", timeout=50, env={"PYTHONPATH": str(tmp_path)})
    assert not outcome.ok and outcome.cut and not outcome.timed_out
    assert outcome.problem == "wrote more than 1 MiB of output (stopped, killed with its process group)"


@pytest.mark.timeout(60)
def test_an_endless_lspci_is_cut_at_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "lspci"
    fake.write_text("#!/bin/sh\nexec yes '\tACSCap: SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    text = lspci.run_lspci(["-vvv", "-s", "0000:00:01.0"])
    assert text.ok and len(text.text) == lspci.MAX_OUTPUT


@pytest.mark.timeout(120)
def test_an_nvcc_that_prints_forever_fails_the_toolkit_check_with_the_reason(tmp_path: Path) -> None:
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "nvcc").write_text('#!/bin/sh\nexec yes "nvcc: NVIDIA (R) Cuda compiler driver AAAA"\n')
    (home / "bin" / "nvcc").chmod(0o755)
    env = dict(os.environ, PYTHONPATH=str(SRC), CUDA_HOME=str(home))
    # an address-space bound as a safety net: the fix keeps the doctor far below it
    cmd = (
        f"ulimit -v 3000000; exec {sys.executable} -m sm120check.doctor --level 1 --select toolkit --timeout 30 --json"
    )
    run = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env, timeout=100, check=False)
    assert run.returncode == 1, run.stderr
    toolkit = next(r for r in json.loads(run.stdout)["results"] if r["id"] == "toolkit")
    assert toolkit["status"] == "fail"
    assert "MemoryError" not in toolkit["details"] and "report this traceback" not in toolkit["details"]
    assert toolkit["details"].endswith("wrote more than 1 MiB of output; stopped (killed with its process group)")

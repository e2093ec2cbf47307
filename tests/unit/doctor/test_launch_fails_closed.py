"""A doctor verdict that could not be reached never turns a feature on: the `sglang_server` role renders its launch
command from real doctor reports in which `sglang_comm`'s probe hung, crashed or printed a malformed answer.

The reports are written by the real check (`SglangComm.run`, `run_probe`, the doctor's JSON writer). Stand-ins, since
this machine has no GPU and no SGLang: the node facts list two GPUs, and the stack venv's interpreter is a two-line
script that behaves as the probe did (sleeps past the limit, dies by SIGSEGV, prints a malformed answer).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from doctor_helpers import facts_for, gpu

from bench.test_sglang_server_role import command, run_role
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.report import RunInfo, to_json
from sm120check.doctor.sglang_sm120.sglang_comm import SglangComm

INTERPRETERS = {
    "hung": "exec sleep 600",
    "crashed": "echo 'RuntimeError: CUDA error: an illegal memory access was encountered' >&2\nkill -SEGV $$",
    "malformed": """echo '{"ok": true, "timed_out": false, "seconds": 1.0, "ranks": [{"rank": "zero"}]}'""",
}


def probe_report(tmp: Path, behaviour: str) -> tuple[Result, Path]:
    """Run the real sglang_comm check against a probe interpreter that behaves so; write the doctor's real report,
    in which FlashInfer's fusion and torch's symmetric memory both passed."""
    python = tmp / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\n{INTERPRETERS[behaviour]}\n")
    python.chmod(0o755)
    facts = facts_for((gpu(0), gpu(1)), venv=tmp / "venv", distributions={"sglang": "0.5.16"})
    prior = {name: Result(name, Status.PASS, f"{name} passed") for name in ("driver", "torch")}
    result = SglangComm().run(Context(facts=facts, timeout=2.0, results=prior))
    passes = [Result(name, Status.PASS, f"{name} passed", level=3) for name in ("allreduce_fusion", "symm_mem")]
    info = RunInfo(host="node", version="test", started="2026-12-01T00:00:00Z", seconds=3.0, level=3, manifest="")
    report = tmp / "doctor.json"
    report.write_text(to_json([*prior.values(), *passes, result], info), encoding="utf-8")
    return result, report


@pytest.mark.parametrize(
    ("behaviour", "said"),
    [("hung", "timed out"), ("crashed", "SIGSEGV"), ("malformed", "malformed answer")],
)
def test_a_probe_that_gave_no_verdict_leaves_fusion_and_symmetric_memory_off(
    tmp_path: Path, behaviour: str, said: str
) -> None:
    result, report = probe_report(tmp_path, behaviour)
    assert result.status is Status.FAIL and said in result.summary, result.summary
    assert "allreduce_fusion" not in result.data and "symmetric_memory" not in result.data
    assert json.loads(report.read_text())["results"][-1]["id"] == "sglang_comm"
    play = run_role(tmp_path, "sglang_server_configure")
    assert play.returncode == 0, play.stdout[-3000:]
    cmd = command(tmp_path)
    assert "--enforce-disable-flashinfer-allreduce-fusion" in cmd
    assert "--flashinfer-allreduce-fusion-backend" not in cmd and "--enable-torch-symm-mem" not in cmd
    assert "sglang_comm fail: " in play.stdout and "no data, treated as off" in play.stdout
    assert said in play.stdout  # the probe's own failure is in the play's output

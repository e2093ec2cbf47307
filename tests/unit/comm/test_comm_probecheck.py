"""ProbeCheck (doctor/probecheck.py): the probe a check declares runs once, with the check's limit, and its answer
reaches the judge; a probe that dies or answers malformed is the check's fail without a judge."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from comm_answers import fusion_failed, symm_answer
from test_comm_checks import context, gpu

from sm120check.doctor import probecheck
from sm120check.doctor.child import ChildOutcome
from sm120check.doctor.comm import collectives as comm
from sm120check.doctor.model import Status

H200S = [gpu(0, "NVIDIA H200", "9.0"), gpu(1, "NVIDIA H200", "9.0")]


def test_a_cold_jit_cache_gives_the_fusion_probe_its_own_limit_under_the_long_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[tuple[str, list[str], float]] = []

    def probe(module: str, args: Sequence[str], *, timeout: float, env: Any = None, python: Any = None) -> ChildOutcome:
        seen.append((module, list(args), timeout))
        return ChildOutcome(ok=True, data=fusion_failed("stop here").to_json())

    monkeypatch.setattr(probecheck, "run_probe", probe)
    monkeypatch.setattr(metadata, "version", lambda name: "0.7.2")
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path))
    monkeypatch.setenv(comm.JIT_TIMEOUT_ENV, "700")
    comm.AllreduceFusion().run(context(H200S, timeout=120))
    assert seen == [(comm.FUSION_PROBE, ["--gpus", "0,1", "--timeout", "695.0"], 700.0)]


def test_the_declared_probe_runs_once_and_its_answer_reaches_the_judge(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def probe(module: str, args: Sequence[str], *, timeout: float, env: Any = None, python: Any = None) -> ChildOutcome:
        seen.append(module)
        return ChildOutcome(ok=True, data=symm_answer().to_json())

    monkeypatch.setattr(probecheck, "run_probe", probe)
    result = comm.SymmMem().run(context(H200S))
    assert seen == [comm.SYMM_MEM_PROBE]
    assert result.status is Status.PASS and result.family == "comm" and result.level == 3


def test_a_probe_that_died_is_a_fail_naming_it_without_a_judge(monkeypatch: pytest.MonkeyPatch) -> None:
    def probe(module: str, args: Sequence[str], *, timeout: float, env: Any = None, python: Any = None) -> ChildOutcome:
        return ChildOutcome(ok=False, returncode=3, stderr_tail="Traceback: boom")

    monkeypatch.setattr(probecheck, "run_probe", probe)
    result = comm.SymmMem().run(context(H200S))
    assert result.status is Status.FAIL
    assert result.summary == "symmetric-memory probe exited 3: Traceback: boom"
    assert result.details == "Traceback: boom" and result.remedy == comm.P2P_REMEDY

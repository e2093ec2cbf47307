"""The `sglang_comm` verdict on the probe output recorded on the lent H200 (docs/validation/2026-12-01-...), and on
two-rank outputs shaped as the probe writes them (the two-GPU run is its own issue)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from sm120check.doctor.model import Status
from sm120check.doctor.remedies import SGLANG_PATCH_RERUN as PATCH
from sm120check.doctor.sglang_sm120.sglang_comm import judge_sglang_comm
from sm120check.doctor.sglang_sm120.sglang_comm_payload import SglangCommAnswer

RECORD = Path(__file__).resolve().parents[3] / "docs/validation/2026-12-01-h200-sglang-preflight/sglang_preflight.json"


@pytest.fixture(scope="module")
def record() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(RECORD.read_text(encoding="utf-8"))
    return data


def test_unpatched_sglang_on_a_gpu_without_multicast_skips_fusion(record: dict[str, Any]) -> None:
    result = judge_sglang_comm(SglangCommAnswer.from_json(record["unpatched"]))
    assert result.status is Status.FAIL
    assert "allreduce fusion OFF" in result.summary and "Skipping allreduce fusion." in result.summary
    assert "cuMulticastGetGranularity" in result.summary
    assert result.remedy == PATCH and result.family == "sglang_sm120"


def test_patched_sglang_passes_the_preflight(record: dict[str, Any]) -> None:
    result = judge_sglang_comm(SglangCommAnswer.from_json(record["patched"]))
    assert result.status is Status.PASS, result.summary
    assert result.data["preflight_sizes"] == [31457280, 2097152, 90177536]


def _two_ranks(record: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = copy.deepcopy(record["patched"])
    rank = data["ranks"][0]
    checks = [{"elements": n, "ran": True, "max_abs_diff": 0.0, "ok": True} for n in (7168, 57344, 262144, 1048576)]
    rank["symm_mem"] = {"disabled": False, "log": [], "checks": checks}
    rank["fusion"] = {"ran": True, "max_rel_err": {"1": 0.004, "3": 0.005, "8": 0.006}, "log": []}
    data["ranks"] = [rank, dict(copy.deepcopy(rank), rank=1)]
    return data


def test_two_ranks_with_fusion_and_symmetric_memory_pass(record: dict[str, Any]) -> None:
    result = judge_sglang_comm(SglangCommAnswer.from_json(_two_ranks(record)))
    assert result.status is Status.PASS, result.summary
    assert "allreduce fusion on" in result.summary and "symmetric memory on" in result.summary
    assert result.data["allreduce_fusion"] == "on" and result.data["symmetric_memory"] == "on"


def test_a_disabled_communicator_names_sglangs_reason(record: dict[str, Any]) -> None:
    data = _two_ranks(record)
    line = "WARNING: TorchSymmMemCommunicator: symmetric memory multicast operations are not supported."
    data["ranks"][1]["symm_mem"] = {"disabled": True, "log": [line], "checks": []}
    result = judge_sglang_comm(SglangCommAnswer.from_json(data))
    assert result.status is Status.FAIL and line in result.summary and result.remedy == PATCH
    assert "allreduce fusion on" in result.summary and "symmetric memory OFF" in result.summary


def test_fusion_that_does_not_run_or_differs_fails(record: dict[str, Any]) -> None:
    data = _two_ranks(record)
    data["ranks"][0]["fusion"] = {
        "ran": False,
        "reason": "ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.",
    }
    result = judge_sglang_comm(SglangCommAnswer.from_json(data))
    assert result.status is Status.FAIL and "SM90 or SM10X" in result.summary and result.remedy == PATCH
    data = _two_ranks(record)
    data["ranks"][1]["fusion"]["max_rel_err"]["8"] = 0.5
    assert judge_sglang_comm(SglangCommAnswer.from_json(data)).status is Status.FAIL


def test_a_probe_that_hung_fails() -> None:
    result = judge_sglang_comm(SglangCommAnswer(False, "ranks hung for 60 s", timed_out=True, seconds=60.0, ranks=()))
    assert result.status is Status.FAIL and "did not finish" in result.summary
